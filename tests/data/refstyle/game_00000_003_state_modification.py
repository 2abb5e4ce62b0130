"""SPADE self-play generated game"""


class ThermostatScheduleEnv(ToolUseBaseEnv):
    """Flat tool schemas from get_tools(); solution() as <tool_call> blocks and an answer."""

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.turn_count = 0
        self._call_history = []
        rooms = ["kitchen", "study", "attic", "hall", "cellar"]
        self._state = {"temps": {r: rng.randint(14, 24) for r in rooms}, "locked": True}
        self._room = rng.choice(rooms)
        self._goal = self._state["temps"][self._room] + rng.choice([-3, -2, 2, 3])
        self._expected_answer = "done"
        return ("Unlock the thermostat panel, then set the %s to %d degrees, then submit "
                "<answer>done</answer>." % (self._room, self._goal)), {}

    def get_tools(self):
        return [
            {"name": "unlock", "description": "Unlock the panel with its code",
             "parameters": {"type": "object", "properties": {"code": {"type": "integer"}},
                            "required": ["code"]}},
            {"name": "panel_code", "description": "Read the panel's unlock code",
             "parameters": {"type": "object", "properties": {}}},
            {"name": "set_temp", "description": "Set a room's temperature",
             "parameters": {"type": "object",
                            "properties": {"room": {"type": "string"},
                                           "degrees": {"type": "integer"}},
                            "required": ["room", "degrees"]}},
        ]

    def _code(self):
        return sum(self._state["temps"].values()) % 1000

    def tool_panel_code(self):
        return str(self._code())

    def tool_unlock(self, code=0):
        if int(code) != self._code():
            return "Error: wrong code"
        self._state["locked"] = False
        return "Panel unlocked"

    def tool_set_temp(self, room="", degrees=0):
        if self._state["locked"]:
            return "Error: the panel is locked"
        if room not in self._state["temps"]:
            return "Error: no room %r" % room
        self._state["temps"][room] = int(degrees)
        return "%s set to %d" % (room, int(degrees))

    def _check_answer(self, answer):
        return answer.strip().lower() == "done" and not self._state["locked"] \
            and self._state["temps"][self._room] == self._goal

    def solution(self):
        calls = [("panel_code", {}), ("unlock", {"code": self._code()}),
                 ("set_temp", {"room": self._room, "degrees": self._goal})]
        text = "".join('<tool_call>%s</tool_call>\n' % json.dumps({"name": n, "arguments": a})
                       for n, a in calls)
        return text + "<answer>done</answer>"
