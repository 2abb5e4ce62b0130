"""SPADE self-play generated game"""

# Reference style: no imports at all. random, re and Tuple come from the compatibility layer,
# np is numpy and parse/verify are math_verify's, all pre-loaded by name.


def verify_answer(player_answer, solution):
    if str(player_answer).strip() == str(solution).strip():
        return True
    try:
        return verify(parse(player_answer), parse(solution))
    except Exception:
        return False


class MatrixTraceRatioEnv:
    """Give trace(A) / det(A) of a random 2x2 integer matrix as a reduced fraction."""

    def __init__(self, max_turns=3, **kwargs):
        self.max_turns = max_turns
        self.turn_count = 0
        self._answer = ""
        self.reset()

    def reset(self, seed=None) -> Tuple[str, dict]:
        rng = random.Random(seed)
        self.turn_count = 0
        while True:
            m = np.array([[rng.randint(2, 9), rng.randint(1, 9)],
                          [rng.randint(1, 9), rng.randint(2, 9)]])
            det = int(round(np.linalg.det(m)))
            if det not in (0, 1, -1):
                break
        self._matrix = m.tolist()
        num, den = int(np.trace(m)), det
        g = math.gcd(num, den)
        num, den = num // g, den // g
        if den < 0:
            num, den = -num, -den
        self._answer = str(num) if den == 1 else "%d/%d" % (num, den)
        return ("Matrix A = %s. What is trace(A) divided by det(A)? Reply with the exact value "
                "as \\boxed{p/q}." % (self._matrix,)), {}

    def solution(self) -> str:
        return "\\boxed{%s}" % self._answer

    def step(self, action: str) -> Tuple[str, float, bool, bool, dict]:
        self.turn_count += 1
        match = re.search(r"\\boxed\{([^}]*)\}", action)
        if match and verify_answer(match.group(1), self._answer):
            return "Correct.", 1.0, True, False, {}
        if self.turn_count >= self.max_turns:
            return "Out of turns. The answer was %s." % self._answer, 0.0, False, True, {}
        return "Not right; try again with \\boxed{p/q}.", 0.0, False, False, {}

    def close(self):
        pass
