"""Switchboard: infer which switch drives each light by intervening on the switches.

Five switches and four lights; each light follows exactly one switch, possibly inverted (on when
the switch is off). A log of past observations is shown, but in it two switches always moved
together, so it cannot separate their effects. ``set 10110`` fixes all switches (1 = on) and
shows the lights; ``answer 3 1 1 5`` names the switch of each light and ends the game, scoring the
fraction of lights attributed correctly.
"""

import random
import re

SKILL = "Causal_Inference"
SETTING = "games"
HINT = (
    "Passive logs can be confounded; run controlled interventions instead. A baseline with all "
    "switches off reveals inversions, and a few binary-coded settings identify every wire."
)
TAGS = ["interventions", "confounding", "system-identification"]

N_SWITCHES, N_LIGHTS, LOG_ROWS = 5, 4, 4


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


class SwitchboardEnv:
    """Hidden wiring identification from interventions."""

    def __init__(self, max_turns: int = 12, **kwargs):
        self.max_turns = int(max_turns)
        self.turn, self.done = 0, True

    def lights(self, switches):
        """Light states (0/1) for a tuple of switch states."""
        return [switches[w] ^ inv for w, inv in zip(self.wires, self.inverted)]

    def reset(self, seed=None, options=None):
        self.rng = random.Random(seed)
        self.wires = [self.rng.randrange(N_SWITCHES) for _ in range(N_LIGHTS)]
        self.inverted = [self.rng.randint(0, 1) for _ in range(N_LIGHTS)]
        first = self.rng.choice(self.wires)
        twin = self.rng.choice([s for s in range(N_SWITCHES) if s != first])
        rows = []
        for _ in range(LOG_ROWS):
            switches = [self.rng.randint(0, 1) for _ in range(N_SWITCHES)]
            switches[twin] = switches[first]  # the confound: these two always moved together
            lights = "".join(map(str, self.lights(switches)))
            rows.append("".join(map(str, switches)) + " -> " + lights)
        self.turn, self.done = 0, False
        obs = (
            f"{N_SWITCHES} switches (S1..S{N_SWITCHES}) and {N_LIGHTS} lights (L1..L{N_LIGHTS}). "
            "Each light follows exactly one switch, possibly inverted. Past log "
            "(switches -> lights):\n"
            + "\n".join(rows)
            + f"\nReply in \\boxed{{}} with 'set 10110' (S1..S{N_SWITCHES}, 1 = on) to see the "
            f"lights, or 'answer 3 1 1 5' (the switch number of L1..L{N_LIGHTS}) to finish; the "
            f"score is the fraction of lights attributed correctly. {self.max_turns} turns."
        )
        return obs, {}

    def _play(self, command):
        words = command.lower().replace(",", " ").split()
        setting = re.fullmatch(f"set ([01]{{{N_SWITCHES}}})", " ".join(words))
        if setting:
            lights = self.lights([int(ch) for ch in setting.group(1)])
            shown = " ".join(f"L{i + 1}={'on' if v else 'off'}" for i, v in enumerate(lights))
            return f"Switches {words[1]} -> {shown}.", 0.0, False
        if (len(words) == N_LIGHTS + 1 and words[0] == "answer"
                and all(re.fullmatch(f"[1-{N_SWITCHES}]", w) for w in words[1:])):
            right = sum(int(w) - 1 == wire for w, wire in zip(words[1:], self.wires))
            reward = right / N_LIGHTS
            truth = " ".join(str(w + 1) for w in self.wires)
            obs = f"{right}/{N_LIGHTS} lights correct (wiring: {truth}). Score {reward:.2f}."
            return obs, reward, True
        return (f"Unknown command {command[:40]!r}. Use 'set 10110' or 'answer 3 1 1 5' "
                f"(switch numbers 1-{N_SWITCHES})."), 0.0, False

    def step(self, action):
        if self.done:
            return "The episode is over; call reset().", 0.0, True, False, {}
        self.turn += 1
        command = extract_boxed(action)
        if command is None:
            obs, reward, terminated = "No command found: wrap it as \\boxed{set 10110}.", 0.0, False
        else:
            obs, reward, terminated = self._play(command)
        truncated = not terminated and self.turn >= self.max_turns
        if truncated:
            obs += " Turn limit reached."
        self.done = terminated or truncated
        return obs, reward, terminated, truncated, {"turn": self.turn}

    def solution(self):
        """Baseline, then three settings where switch j is on iff bit b of (j + 1) is set."""
        settings = ["0" * N_SWITCHES] + [
            "".join(str((j + 1) >> b & 1) for j in range(N_SWITCHES)) for b in range(3)]
        answer = " ".join(str(w + 1) for w in self.wires)
        return ["\\boxed{set %s}" % s for s in settings] + ["\\boxed{answer %s}" % answer]
