"""SPADE self-play generated game"""

import random
from typing import Tuple

from tool_use_base_env import ToolUseBaseEnv


class RecipeScalerEnv(ToolUseBaseEnv):
    """Imports its base class the other way; nested schemas; a prose solution."""

    def reset(self, seed=None) -> Tuple[str, dict]:
        rng = random.Random(seed)
        self.turn_count = 0
        self._call_history = []
        self._state = {"grams": rng.randint(120, 480), "servings": rng.randint(2, 6)}
        self._want = self._state["servings"] * rng.randint(2, 4)
        self._tools = [
            {"type": "function", "function": {
                "name": "recipe", "description": "Flour (grams) and servings of the recipe",
                "parameters": {"type": "object", "properties": {}}}},
            {"type": "function", "function": {
                "name": "weather", "description": "Today's weather",
                "parameters": {"type": "object", "properties": {}}}},
        ]
        self._expected_answer = str(self._state["grams"] * self._want //
                                    self._state["servings"])
        return ("How many grams of flour are needed for %d servings? Answer with "
                "<answer>N</answer>." % self._want), {}

    def tool_recipe(self):
        return json.dumps(self._state)

    def tool_weather(self):
        return "sunny"

    def solution(self):
        return ("Read the recipe, scale the flour by the ratio of servings, and answer %s."
                % self._expected_answer)
