"""SPADE self-play generated game"""


class ConveyorPackingEnv:
    """Pack parcels onto two trucks so that both loads hit their exact targets."""

    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns
        self.reset()

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.turn_count = 0
        weights = [rng.randint(2, 9) for _ in range(8)]
        picks = sorted(rng.sample(range(8), 3))
        self.queue = deque(weights)
        self.plan = ["A" if i in picks else "B" for i in range(8)]
        self.targets = Counter()
        for w, truck in zip(weights, self.plan):
            self.targets[truck] += w
        self.loads = defaultdict(int)
        return self._obs("Parcels arrive in order; load each onto truck A or B."), {}

    def _obs(self, lead):
        return ("%s Next parcels: %s. Loads: A=%d/%d, B=%d/%d. Reply \\boxed{A} or \\boxed{B}."
                % (lead, list(self.queue), self.loads["A"], self.targets["A"],
                   self.loads["B"], self.targets["B"]))

    def solution(self):
        return " ".join("\\boxed{%s}" % t for t in self.plan[8 - len(self.queue):])

    def step(self, action):
        self.turn_count += 1
        found = re.findall(r"\\boxed\{\s*([ABab])\s*\}", action)
        if not found:
            lead = "Use \\boxed{A} or \\boxed{B}."
        else:
            truck = found[-1].upper()
            weight = self.queue.popleft()
            self.loads[truck] += weight
            if self.loads[truck] > self.targets[truck]:
                return ("Truck %s is overloaded." % truck), 0.0, True, False, {}
            if not self.queue:
                return "All parcels loaded on target.", 1.0, True, False, {}
            lead = "Loaded %d onto %s." % (weight, truck)
        if self.turn_count >= self.max_turns:
            return "Out of time.", 0.0, False, True, {}
        return self._obs(lead), 0.0, False, False, {}

    def close(self):
        pass
