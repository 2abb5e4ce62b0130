"""Maze gems: walk a walled 8x8 grid under fog, collect gems, then step onto the exit.

Gem and exit coordinates are announced, but walls are only visible within two cells of the
agent, so the route has to be planned and revised as the map is uncovered. A turn is a sequence
of up to 6 moves (``up down left right``); a move into a wall stops the sequence. Stepping onto
the exit ends the game with score (1 + gems collected) / (1 + gems), so 1.0 needs every gem.
"""

import random
from collections import deque

SKILL = "Spatial_Reasoning"
SETTING = "games"
HINT = (
    "Keep a mental map of the walls you have seen, plan the gem order that keeps the total walk "
    "short, and avoid the exit until every gem is collected."
)
TAGS = ["grid-navigation", "partial-observability", "path-planning"]

SIZE, GEMS, VIEW, MAX_MOVES = 8, 2, 2, 6
MOVES = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
ALIASES = {"u": "up", "d": "down", "l": "left", "r": "right", "n": "up", "s": "down", "e": "right",
           "w": "left", "north": "up", "south": "down", "east": "right", "west": "left"}
NO_COMMAND = "No command found: wrap moves as \\boxed{up left}."


def extract_boxed(text):
    """Return the content of the last balanced \\boxed{...} in text, or None."""
    start = text.rfind("\\boxed{") if isinstance(text, str) else -1
    if start < 0:
        return None
    depth, i = 1, start + len("\\boxed{")
    begin = i
    while i < len(text) and depth:
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
    return text[begin : i - 1].strip() if depth == 0 else None


class MazeGemsEnv:
    """Fog-of-war grid walk with gems and an exit."""

    def __init__(self, max_turns: int = 12, **kwargs):
        self.max_turns = int(max_turns)
        self.turn, self.done = 0, True

    def _path(self, src, dst, blocked):
        """Shortest list of move names from src to dst avoiding walls and `blocked` cells."""
        prev, queue = {src: None}, deque([src])
        while queue:
            cell = queue.popleft()
            if cell == dst:
                moves = []
                while prev[cell] is not None:
                    cell, name = prev[cell]
                    moves.append(name)
                return moves[::-1]
            for name, (dr, dc) in MOVES.items():
                nxt = (cell[0] + dr, cell[1] + dc)
                if self._open(nxt) and nxt not in prev and (nxt not in blocked or nxt == dst):
                    prev[nxt] = (cell, name)
                    queue.append(nxt)
        return None

    def _open(self, cell):
        return 0 <= cell[0] < SIZE and 0 <= cell[1] < SIZE and cell not in self.walls

    def _plan(self):
        """Shortest full route start -> gems (best order) -> exit, or None."""
        best = None
        for order in (self.gems, self.gems[::-1]):
            route, here = [], self.start
            for target in list(order) + [self.exit]:
                leg = self._path(here, target, {self.exit})
                if leg is None:
                    break
                route, here = route + leg, target
            else:
                if best is None or len(route) < len(best):
                    best = route
        return best

    def reset(self, seed=None, options=None):
        self.rng = random.Random(seed)
        cells = [(r, c) for r in range(SIZE) for c in range(SIZE)]
        while True:
            self.walls = {cell for cell in cells if self.rng.random() < 0.3}
            free = [cell for cell in cells if cell not in self.walls]
            self.start, self.exit, *self.gems = self.rng.sample(free, 2 + GEMS)
            distance = abs(self.start[0] - self.exit[0]) + abs(self.start[1] - self.exit[1])
            plan = self._plan()
            if distance >= 5 and plan is not None and 10 <= len(plan) <= MAX_MOVES * 10:
                break
        self.pos, self.collected = self.start, []
        self.turn, self.done = 0, False
        return self._describe("Collect the gems, then reach the exit."), {"size": SIZE}

    def _describe(self, message):
        rows = []
        for r in range(self.pos[0] - VIEW, self.pos[0] + VIEW + 1):
            row = ""
            for c in range(self.pos[1] - VIEW, self.pos[1] + VIEW + 1):
                cell = (r, c)
                row += ("@" if cell == self.pos else "#" if not self._open(cell) else
                        "X" if cell == self.exit else "*" if cell in self.gems else ".")
            rows.append(row)
        left = [g for g in self.gems if g not in self.collected]
        return (f"{message}\nGrid {SIZE}x{SIZE}, (row, col) from (0, 0) at the top left. "
                f"You are at {self.pos}. Gems left: {left or 'none'}. Exit: {self.exit} "
                "(stepping on it ends the game). View (# wall/edge, @ you, * gem, X exit):\n"
                + "\n".join(rows)
                + f"\nReply \\boxed{{up up left}}: up to {MAX_MOVES} moves per turn.")

    def _play(self, command):
        words = command.lower().replace(",", " ").split()
        moves = [ALIASES.get(w, w) for w in words]
        if not moves or len(moves) > MAX_MOVES or any(m not in MOVES for m in moves):
            usage = f"give 1-{MAX_MOVES} of up/down/left/right"
            return f"Invalid moves {command[:40]!r}: {usage}.", 0.0, False
        note = ""
        for move in moves:
            nxt = (self.pos[0] + MOVES[move][0], self.pos[1] + MOVES[move][1])
            if not self._open(nxt):
                note = f" Blocked moving {move}; remaining moves skipped."
                break
            self.pos = nxt
            if nxt in self.gems and nxt not in self.collected:
                self.collected.append(nxt)
                note += f" Gem collected at {nxt}."
            if nxt == self.exit:
                reward = (1 + len(self.collected)) / (1 + GEMS)
                got = len(self.collected)
                obs = f"You reached the exit with {got}/{GEMS} gems. Score {reward:.2f}."
                return obs, reward, True
        return self._describe("Moved." + note), 0.0, False

    def step(self, action):
        if self.done:
            return "The episode is over; call reset().", 0.0, True, False, {}
        self.turn += 1
        command = extract_boxed(action)
        if command is None:
            obs, reward, terminated = NO_COMMAND, 0.0, False
        else:
            obs, reward, terminated = self._play(command)
        truncated = not terminated and self.turn >= self.max_turns
        if truncated:
            obs += " Turn limit reached."
        self.done = terminated or truncated
        return obs, reward, terminated, truncated, {"turn": self.turn, "position": self.pos}

    def solution(self):
        route = self._plan()
        chunks = [route[i : i + MAX_MOVES] for i in range(0, len(route), MAX_MOVES)]
        return ["\\boxed{%s}" % " ".join(chunk) for chunk in chunks]
