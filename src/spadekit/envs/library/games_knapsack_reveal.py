"""Knapsack reveal: inspect hidden items, then pack the most valuable load within capacity.

Eight items are listed by name only; ``inspect i j k`` reveals the weight and value of up to three
items per turn. ``pack i j ...`` commits a selection and ends the game: the score is its total
value divided by the best achievable value (0 if the load exceeds the capacity).
"""

import random
import re

SKILL = "Optimization"
SETTING = "games"
HINT = (
    "Reveal every item before committing; greedy value-per-weight choices can miss the optimum, "
    "so compare the best combinations that fit the capacity exactly or nearly."
)
TAGS = ["knapsack", "combinatorial-optimization", "information-gathering"]

N_ITEMS, PER_TURN = 8, 3
NO_COMMAND = "No command found: wrap it as \\boxed{inspect 1 2 3}."
NAMES = ["lantern", "rope", "compass", "tent", "stove", "camera", "map", "blanket", "radio",
         "kettle", "axe", "binoculars", "first-aid kit", "water filter", "hammock", "sketchbook"]


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


def best_subset(weights, values, capacity):
    """Exact optimum by enumerating all subsets: (best value, sorted 0-based indices)."""
    best = (0, [])
    for mask in range(1 << len(weights)):
        chosen = [i for i in range(len(weights)) if mask >> i & 1]
        if sum(weights[i] for i in chosen) <= capacity:
            best = max(best, (sum(values[i] for i in chosen), chosen), key=lambda b: b[0])
    return best


class KnapsackRevealEnv:
    """0/1 knapsack whose item weights and values must be uncovered first."""

    def __init__(self, max_turns: int = 12, **kwargs):
        self.max_turns = int(max_turns)
        self.turn, self.done = 0, True

    def reset(self, seed=None, options=None):
        self.rng = random.Random(seed)
        self.names = self.rng.sample(NAMES, N_ITEMS)
        self.weights = [self.rng.randint(2, 12) for _ in range(N_ITEMS)]
        self.values = [self.rng.randint(3, 30) for _ in range(N_ITEMS)]
        self.capacity = sum(self.weights) * self.rng.randint(35, 50) // 100
        self.optimum, self.best = best_subset(self.weights, self.values, self.capacity)
        self.turn, self.done = 0, False
        listing = ", ".join(f"{i + 1}: {name}" for i, name in enumerate(self.names))
        obs = (
            f"Pack a bag with capacity {self.capacity}. Items (weights and values hidden): "
            f"{listing}. Reply in \\boxed{{}} with 'inspect 1 2 3' (up to {PER_TURN} items per "
            "turn) or 'pack 1 4 6' to commit your selection and end the game; the score is your "
            f"value divided by the best possible value (0 if overweight). {self.max_turns} turns."
        )
        return obs, {"capacity": self.capacity}

    def _play(self, command):
        words = command.lower().replace(",", " ").split()
        if not words or words[0] not in ("inspect", "pack") or len(words) < 2:
            return f"Unknown command {command[:40]!r}. Use 'inspect 1 2' or 'pack 1 3'.", 0.0, False
        if not all(re.fullmatch(r"[0-9]{1,2}", w) and 1 <= int(w) <= N_ITEMS for w in words[1:]):
            return f"Item numbers must be between 1 and {N_ITEMS}.", 0.0, False
        picks = [int(w) - 1 for w in words[1:]]
        if len(set(picks)) != len(picks):
            return "Each item may be listed only once.", 0.0, False
        if words[0] == "inspect":
            if len(picks) > PER_TURN:
                return f"You can inspect at most {PER_TURN} items per turn.", 0.0, False
            found = "; ".join(f"{i + 1} {self.names[i]}: weight {self.weights[i]}, value "
                              f"{self.values[i]}" for i in picks)
            return f"Inspected {found}.", 0.0, False
        weight = sum(self.weights[i] for i in picks)
        value = sum(self.values[i] for i in picks)
        reward = 0.0 if weight > self.capacity else value / self.optimum
        return (f"Packed weight {weight}/{self.capacity}, value {value}; best possible value "
                f"{self.optimum}. Score {reward:.2f}."), reward, True

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
        return obs, reward, terminated, truncated, {"turn": self.turn}

    def solution(self):
        ids = [str(i + 1) for i in range(N_ITEMS)]
        inspects = ["\\boxed{inspect %s}" % " ".join(ids[i : i + PER_TURN])
                    for i in range(0, N_ITEMS, PER_TURN)]
        return inspects + ["\\boxed{pack %s}" % " ".join(str(i + 1) for i in self.best)]
