"""Sequence rule: infer the rule behind an integer sequence, then extrapolate far-off terms.

The first four terms a(1)..a(4) are shown; ``term k`` (5 <= k <= 9) reveals one more term per
turn. The rule comes from a hidden family (arithmetic, quadratic, geometric, Fibonacci-like,
alternating steps, affine recurrence, interleaved progressions) with hidden parameters.
``answer x y z`` predicts the three requested far terms and ends the game; the score is the
fraction predicted exactly.
"""

import random
import re

SKILL = "Pattern_Recognition"
SETTING = "games"
HINT = (
    "Several rule families fit four terms; reveal a few more terms and check first and second "
    "differences, ratios and odd/even positions before committing to one rule."
)
TAGS = ["integer-sequences", "induction", "extrapolation"]

SHOWN, MAX_QUERY = 4, 9


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


FAMILIES = ["arithmetic", "quadratic", "geometric", "fibonacci", "alternating", "affine",
            "interleaved"]


def make_sequence(rng, length=20):
    """Draw a rule family and parameters; return (family, [a(1), ..., a(length)])."""
    family = rng.choice(FAMILIES)
    a, b, c = rng.randint(1, 9), rng.randint(2, 7), rng.randint(-6, 6)
    if family == "arithmetic":
        step = b * rng.choice([1, -1])
        return family, [a + step * (n - 1) for n in range(1, length + 1)]
    if family == "quadratic":
        return family, [(1 + b % 3) * n * n + c * n + a for n in range(1, length + 1)]
    if family == "geometric":
        ratio = rng.choice([2, 3])
        return family, [a * ratio ** (n - 1) for n in range(1, length + 1)]
    if family == "interleaved":
        return family, [a + b * (n // 2) if n % 2 else 20 + c * (n // 2)
                        for n in range(1, length + 1)]
    terms = [a, b] if family == "fibonacci" else [a]
    while len(terms) < length:
        if family == "fibonacci":
            terms.append(terms[-1] + terms[-2])
        elif family == "alternating":
            terms.append(terms[-1] + (b if len(terms) % 2 else c))
        else:  # affine recurrence a(n) = 2 a(n-1) + c
            terms.append(2 * terms[-1] + c)
    return family, terms


class SequenceRuleEnv:
    """Query a few terms of a hidden sequence, then predict three far-off terms."""

    def __init__(self, max_turns: int = 12, **kwargs):
        self.max_turns = int(max_turns)
        self.turn, self.done = 0, True

    def reset(self, seed=None, options=None):
        self.rng = random.Random(seed)
        self.family, self.terms = make_sequence(self.rng)
        self.targets = sorted(self.rng.sample(range(11, 21), 3))
        self.turn, self.done = 0, False
        shown = ", ".join(f"a({n})={self.terms[n - 1]}" for n in range(1, SHOWN + 1))
        asked = ", ".join(f"a({n})" for n in self.targets)
        obs = (
            f"An integer sequence follows a hidden rule. Known: {shown}. Each turn reply with one "
            f"command in \\boxed{{}}: 'term k' ({SHOWN + 1} <= k <= {MAX_QUERY}) reveals a(k); "
            f"'answer x y z' gives your predictions for {asked} (in that order) and ends the game. "
            f"You have {self.max_turns} turns."
        )
        return obs, {"targets": list(self.targets)}

    def _play(self, command):
        words = command.lower().replace(",", " ").split()
        numbers = words[1:]
        if not words or not all(re.fullmatch(r"-?[0-9]{1,15}", w) for w in numbers):
            return f"Unknown command {command[:40]!r}. Use 'term 5' or 'answer x y z'.", 0.0, False
        if words[0] == "term" and len(numbers) == 1:
            k = int(numbers[0])
            if not 1 <= k <= MAX_QUERY:
                return f"You may only reveal terms a(1)..a({MAX_QUERY}).", 0.0, False
            return f"a({k}) = {self.terms[k - 1]}.", 0.0, False
        if words[0] == "answer" and len(numbers) == len(self.targets):
            truth = [self.terms[n - 1] for n in self.targets]
            right = sum(int(x) == t for x, t in zip(numbers, truth))
            reward = right / len(truth)
            return (f"{right}/{len(truth)} predictions correct (true values: {truth}; the rule was "
                    f"{self.family}). Score {reward:.2f}."), reward, True
        usage = "Use 'term 5' or 'answer x y z' (3 numbers)."
        return f"Bad command {command[:40]!r}. {usage}", 0.0, False

    def step(self, action):
        if self.done:
            return "The episode is over; call reset().", 0.0, True, False, {}
        self.turn += 1
        command = extract_boxed(action)
        if command is None:
            obs, reward, terminated = "No command found: wrap it as \\boxed{term 5}.", 0.0, False
        else:
            obs, reward, terminated = self._play(command)
        truncated = not terminated and self.turn >= self.max_turns
        if truncated:
            obs += " Turn limit reached."
        self.done = terminated or truncated
        return obs, reward, terminated, truncated, {"turn": self.turn}

    def solution(self):
        truth = " ".join(str(self.terms[n - 1]) for n in self.targets)
        queries = ["\\boxed{term %d}" % k for k in (5, 6, 7)]
        return queries + ["\\boxed{answer %s}" % truth]
