"""SPADE self-play generated game"""

# Reference tool-use style: ToolUseBaseEnv is pre-loaded (never imported), tools are declared in
# the _tools dict, and solution() is a string of calls plus the final answer.


class WarehouseLookupEnv(ToolUseBaseEnv):
    def reset(self, seed=None) -> Tuple[str, dict]:
        rng = random.Random(seed)
        self.turn_count = 0
        self._call_history = []
        names = ["bolt", "gear", "valve", "spring", "pulley", "hinge", "clamp", "rivet"]
        self._state = {
            "bins": {n: "B%02d" % rng.randint(1, 40) for n in names},
            "stock": {},
        }
        for n, b in self._state["bins"].items():
            self._state["stock"][b] = self._state["stock"].get(b, 0) + rng.randint(3, 60)
        self._target = rng.choice(names)
        self._tools = {
            "find_bin": {"description": "The storage bin of a part",
                         "parameters": {"type": "object",
                                        "properties": {"part": {"type": "string"}},
                                        "required": ["part"]}},
            "bin_count": {"description": "How many items a bin holds",
                          "parameters": {"type": "object",
                                         "properties": {"bin_id": {"type": "string"}},
                                         "required": ["bin_id"]}},
            "list_parts": {"description": "All part names",
                           "parameters": {"type": "object", "properties": {}}},
        }
        self._expected_answer = str(self._state["stock"][self._state["bins"][self._target]])
        return ("How many items are in the bin that stores the %s? Submit the number with "
                "<answer>N</answer>." % self._target), {}

    def tool_find_bin(self, part=""):
        if part not in self._state["bins"]:
            return "Error: unknown part %r" % part
        return self._state["bins"][part]

    def tool_bin_count(self, bin_id=""):
        if bin_id not in self._state["stock"]:
            return "Error: unknown bin %r" % bin_id
        return str(self._state["stock"][bin_id])

    def tool_list_parts(self):
        return json.dumps(sorted(self._state["bins"]))

    def solution(self) -> str:
        bin_id = self._state["bins"][self._target]
        return ("1. find_bin(part=%r) -> %s 2. bin_count(bin_id=%r) ANSWER: %s"
                % (self._target, bin_id, bin_id, self._expected_answer))
