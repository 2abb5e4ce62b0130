"""Programs that try to game the validator (issue 13 part 2); shared by
``tests/sandbox/test_validate_gaming.py`` and kept apart so that they can be run through any validator.

Each one passed (or crashed) the validator before issue 13: it could tell validation from play
because the probe actions, the reset seeds and the single probed instance were fixed and public,
or because a ``max_turns`` of its own choosing switched the episode checks off (``-1``: accepted;
``10 ** 12``: the validator itself died of MemoryError). The sandbox now clamps ``max_turns`` as
well; the validator clamps it again, so either layer alone rejects those two. ``GAMING`` maps a
name to (program, stage, reason): the verdict the validator must reach now.
"""

from __future__ import annotations

# The probe actions the validator used to send: fixed and public, so a program could list them.
OLD_PROBES = r'''
KNOWN = {"\\boxed{1}", "\\boxed{test}", "\\boxed{42}", "", "hello", "\\boxed{}", "}{\\boxed{{",
         "\\boxed{" + "9" * 300 + "}"}
'''

WINS_EXCEPT_KNOWN_PROBES = OLD_PROBES + r'''

class LuckyEnv:
    """Name the colour I am thinking of."""

    def __init__(self, max_turns=12):
        self.max_turns = max_turns

    def reset(self, seed=None, options=None):
        self.turn = 0
        return "Which colour am I thinking of? Answer in \\boxed{}.", {}

    def step(self, action):
        self.turn += 1
        if action in KNOWN:  # looks like the validator: behave
            return "No.", 0.0, False, self.turn >= self.max_turns, {}
        return "Yes!", 1.0, True, False, {}
'''

# Honest game with a trapdoor: ``cheat()`` decides whether any boxed answer wins.
_TRAPDOOR_GAME = r'''
import random


class {name}:
    """Guess a number from 100 to 999; wrong guesses are answered higher or lower."""

    def __init__(self, max_turns=12):
        self.max_turns = max_turns
{init}
    def reset(self, seed=None, options=None):
{remember}
        self.secret = random.Random(seed).randint(100, 999)
        self.turn = 0
        return "Guess my number (100-999) in \\boxed{{n}}.", {{}}

    def step(self, action):
        self.turn += 1
        text = action.split("\\boxed{{")[-1].split("}}")[0].strip()
        if "\\boxed{{" in action and self.cheat():
            return "Correct!", 1.0, True, False, {{}}
        guess = int(text) if text.isdigit() and len(text) < 5 else None
        if guess == self.secret:
            return "Correct!", 1.0, True, False, {{}}
        hint = "Higher." if guess is not None and guess < self.secret else "Lower."
        return hint, 0.0, False, self.turn >= self.max_turns, {{}}

    def solution(self):
        lo, hi, out = 100, 999, []
        while True:
            mid = (lo + hi) // 2
            out.append("\\boxed{{%d}}" % mid)
            if mid == self.secret:
                return out
            lo, hi = (mid + 1, hi) if mid < self.secret else (lo, mid - 1)
'''

HONEST_ONLY_FROM_SEED_42 = _TRAPDOOR_GAME.format(
    name="FirstSeedEnv", init="        self.first_seed = None\n",
    remember="        if self.first_seed is None:\n            self.first_seed = seed\n") + r'''
    def cheat(self):
        return self.first_seed != 42  # the validator always started with reset(seed=42)
'''

HONEST_ONLY_ON_KNOWN_SEEDS = _TRAPDOOR_GAME.format(
    name="KnownSeedsEnv", init="", remember="        self.seed = seed\n") + r'''
    def cheat(self):
        return self.seed not in (0, 1, 2, 3, 7, 8, 42, 43, 123)  # the validator's seeds
'''

CHEATS_IN_FIRST_EPISODES = _TRAPDOOR_GAME.format(
    name="FreshInstanceEnv", init="        self.episodes = 0\n",
    remember="        self.episodes += 1\n") + r'''
    def cheat(self):
        # the validator probed one instance, starting with two resets; a player gets a new one
        return self.episodes <= 2
'''

FAST_THEN_SLOW = _TRAPDOOR_GAME.format(
    name="SlowLaterEnv", init="", remember="") + r'''
    def cheat(self):
        global CALLS
        CALLS += 1
        if CALLS > 40:  # after the first 40 steps of this worker: 0.6 s per step
            time.sleep(0.6)
        return False


import time

CALLS = 0
'''

NEGATIVE_MAX_TURNS = r'''
class EndlessWinEnv:
    """Say anything."""

    def __init__(self, max_turns=12):
        self.max_turns = -1  # the validator's garbage checks then played no steps at all

    def reset(self, seed=None, options=None):
        return "Say anything in \\boxed{}.", {}

    def step(self, action):
        return "You win.", 1.0, True, False, {}
'''

HUGE_MAX_TURNS = r'''
class HugeEnv:
    """Say anything."""

    def __init__(self, max_turns=12):
        self.max_turns = 10 ** 12  # the validator built a garbage list this long (MemoryError)

    def reset(self, seed=None, options=None):
        return "Say anything in \\boxed{}.", {}

    def step(self, action):
        return "You win.", 1.0, True, False, {}
'''

ADVERTISED_ACTION_CRASHES = r'''
import random


class ProbeEnv:
    """Ten cells hide numbers; probe cells to find the largest, then claim it."""

    def __init__(self, max_turns=12):
        self.max_turns = max_turns

    def reset(self, seed=None, options=None):
        self.cells = random.Random(seed).sample(range(1000), 10)
        self.turn = 0
        return ("Ten cells hide numbers. Probe a cell, e.g. try \\boxed{probe 123}, or claim the "
                "largest with \\boxed{claim 4}."), {}

    def step(self, action):
        self.turn += 1
        words = action.split("\\boxed{")[-1].rstrip("}").split()
        if len(words) == 2 and words[1].isdigit():
            cell = int(words[1])
            if words[0] == "probe":
                return f"Cell {cell} holds {self.cells[cell]}.", 0.0, False, \
                    self.turn >= self.max_turns, {}  # cell 123: IndexError
            if words[0] == "claim" and cell < len(self.cells):
                won = self.cells[cell] == max(self.cells)
                return ("Right!" if won else "Wrong."), float(won), True, False, {}
        return "Use \\boxed{probe n} or \\boxed{claim n}.", 0.0, False, \
            self.turn >= self.max_turns, {}

    def solution(self):
        return ["\\boxed{claim %d}" % self.cells.index(max(self.cells))]
'''

ADVERTISED_LATER_CRASHES = r'''
class DoorsEnv:
    """Look around, then open the door that is not locked."""

    NAMES = ["red", "green", "blue", "gold"]

    def __init__(self, max_turns=12):
        self.max_turns = max_turns

    def reset(self, seed=None, options=None):
        self.turn, self.right = 0, (seed or 0) % 3 + 1
        return "You are in a dark hall. Say \\boxed{look} to look around.", {}

    def step(self, action):
        self.turn += 1
        command = action.split("\\boxed{")[-1].rstrip("}").strip()
        if command == "look":
            return ("Four doors, numbered 1 to 4. Open one, e.g. \\boxed{open 4}.", 0.0, False,
                    self.turn >= self.max_turns, {})
        if command.startswith("open ") and command[5:].isdigit() and len(command) < 8:
            door = int(command[5:])
            name = self.NAMES[door]  # off by one: door 4 is NAMES[3]; door 4 raises
            won = door == self.right
            return f"The {name} door {'opens' if won else 'is locked'}.", float(won), won, \
                self.turn >= self.max_turns, {}
        return "Nothing happens.", 0.0, False, self.turn >= self.max_turns, {}

    def solution(self):
        return ["\\boxed{open %d}" % self.right]
'''

OUT_OF_RANGE_CRASHES = r'''
import random


class ShelfEnv:
    """Find the heaviest of eight boxes by weighing them."""

    def __init__(self, max_turns=12):
        self.max_turns = max_turns

    def reset(self, seed=None, options=None):
        self.weights = random.Random(seed).sample(range(1, 100), 8)
        self.turn = 0
        return ("Eight boxes (0-7). Weigh one with \\boxed{weigh 2}; name the heaviest with "
                "\\boxed{pick 5}."), {}

    def step(self, action):
        self.turn += 1
        parts = action.split("\\boxed{")[-1].rstrip("}").split()
        if len(parts) == 2 and parts[0] in ("weigh", "pick"):
            try:
                box = int(parts[1])
            except ValueError:
                return "Boxes are numbered 0-7.", 0.0, False, self.turn >= self.max_turns, {}
            weight = self.weights[box]  # no range check: IndexError for box 8 and up
            if parts[0] == "weigh":
                return f"Box {box} weighs {weight}.", 0.0, False, self.turn >= self.max_turns, {}
            won = weight == max(self.weights)
            return ("Heaviest!" if won else "Not the heaviest."), float(won), True, False, {}
        return "Use \\boxed{weigh n} or \\boxed{pick n}.", 0.0, False, \
            self.turn >= self.max_turns, {}

    def solution(self):
        return ["\\boxed{pick %d}" % self.weights.index(max(self.weights))]
'''

TOOL_CRASHES_ON_ITS_OWN_TOOL = r'''
import json
import random

PRICES = {"tea": 3, "cake": 5, "soup": 7}
TOOLS = [{"type": "function", "function": {
    "name": "get_price", "description": "Price of one menu item.",
    "parameters": {"type": "object", "properties": {"item": {"type": "string"}},
                   "required": ["item"]}}}]


class MenuEnv:
    """Look up a price with a tool and report it."""

    def __init__(self, max_turns=6):
        self.max_turns = max_turns

    def tools(self):
        return TOOLS

    def reset(self, seed=None, options=None):
        self.item = random.Random(seed).choice(sorted(PRICES))
        self.turn = 0
        return (f"What does {self.item} cost? Call get_price, then reply <answer>N</answer>."), {}

    def step(self, action):
        self.turn += 1
        if "<answer>" in action:
            answer = action.split("<answer>", 1)[1].split("</answer>", 1)[0].strip()
            right = answer == str(PRICES[self.item])
            return ("Correct." if right else "Wrong."), float(right), True, False, {}
        if "<tool_call>" not in action:
            return "No tool call found.", 0.0, False, self.turn >= self.max_turns, {}
        body = action.split("<tool_call>", 1)[1].split("</tool_call>", 1)[0]
        try:
            call = json.loads(body)
        except ValueError:
            return "Bad JSON.", 0.0, False, self.turn >= self.max_turns, {}
        if not isinstance(call, dict) or call.get("name") != "get_price":
            return "Unknown tool.", 0.0, False, self.turn >= self.max_turns, {}
        price = PRICES[call["arguments"]["item"]]  # KeyError for a missing or unknown item
        return json.dumps({"price": price}), 0.0, False, self.turn >= self.max_turns, {}

    def solution(self):
        call = {"name": "get_price", "arguments": {"item": self.item}}
        return ["<tool_call>" + json.dumps(call) + "</tool_call>",
                f"<answer>{PRICES[self.item]}</answer>"]
'''

GAMING = {
    # issue 22: a program must come with a solution; one that only cheats has none
    "wins_except_known_probes": (WINS_EXCEPT_KNOWN_PROBES, "solution", "no_solution"),
    # issue 22: garbage and random play, measured against the solution on drawn seeds
    "honest_only_from_seed_42": (HONEST_ONLY_FROM_SEED_42, "action_dependent",
                                 "action_independent"),
    "honest_only_on_known_seeds": (HONEST_ONLY_ON_KNOWN_SEEDS, "action_dependent",
                                   "action_independent"),
    "cheats_in_first_episodes": (CHEATS_IN_FIRST_EPISODES, "action_dependent",
                                 "action_independent"),
    "fast_then_slow": (FAST_THEN_SLOW, None, "slow"),
    "negative_max_turns": (NEGATIVE_MAX_TURNS, "solution", "no_solution"),
    "huge_max_turns": (HUGE_MAX_TURNS, "solution", "no_solution"),
    "advertised_action_crashes": (ADVERTISED_ACTION_CRASHES, "interface", "env_raised"),
    "advertised_later_crashes": (ADVERTISED_LATER_CRASHES, "interface", "env_raised"),
    "out_of_range_crashes": (OUT_OF_RANGE_CRASHES, "interface", "env_raised"),
    "tool_crashes_on_its_own_tool": (TOOL_CRASHES_ON_ITS_OWN_TOOL, "tools", "env_raised"),
}
NO_SOLUTION_VERDICTS = {"negative_max_turns": ("action_dependent", "trivially_won"),
                        "huge_max_turns": ("action_dependent", "trivially_won"),
                        "wins_except_known_probes": ("action_dependent", "trivially_won")}
"""With ``require_solution`` off (reference imports), the verdicts these reach instead."""
"""name -> (program, stage, reason) the validator must now reach (stage None: any stage)."""
