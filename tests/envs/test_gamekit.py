"""The game kit in process: every part combines with every other into a winnable game, bad
parameters fail naming the part and the parameter, the observation is written from the parts
and the theme (and never shows the secret), the solution is derived, overrides are used as
written, and a program's kit version is read from its source.

The real validator in real sandboxes checks the same programs in test_gamekit_sandbox.py; the
attacks on the kit are in test_gamekit_hacks.py, the frozen versions in
test_gamekit_versions.py.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings, strategies as st

from spadekit.envs.gamekit import LATEST, VERSIONS, kit_meta, kit_version
from spadekit.envs.gamekit.v1 import (BudgetTurns, Clue, GatedTurns, Hidden, HiddenCause,
                                      HiddenCell, HiddenCode, HiddenNumber, HiddenOrder, KitEnv,
                                      KitError, OpenTurns, Probe, Reveal, ScoreBanded,
                                      ScoreExact, ScoreSteep, ScoreThrifty)
from spadekit.sandbox.probes import GAME_EDGE_PROBES

HIDDEN = {"number": HiddenNumber, "code": HiddenCode, "cell": HiddenCell, "cause": HiddenCause,
          "order": HiddenOrder}
INFO = {"probe": Probe, "reveal": Reveal, "clue": Clue}
SCORING = {"exact": ScoreExact, "steep": ScoreSteep, "banded": ScoreBanded,
           "thrifty": ScoreThrifty}
TURNS = {"open": OpenTurns, "budget": BudgetTurns, "gated": GatedTurns}
SMALLEST = {"number": HiddenNumber(low=1, high=20), "code": HiddenCode(length=4, symbols="ab"),
            "cell": HiddenCell(rows=3, cols=3),
            "cause": HiddenCause(items="ash elm fir oak yew fig"),
            "order": HiddenOrder(items=["ash", "elm", "fir", "oak"])}
"""Each hidden state with the fewest secrets its parameters allow."""
GENEROUS = {"exact": ScoreExact(), "steep": ScoreSteep(power=5),
            "banded": ScoreBanded(near=0.75, partial=0.5),
            "thrifty": ScoreThrifty(cost=0.02, floor=0.5)}
"""Each scoring rule with the most partial credit its parameters allow."""
EXTREME_TURNS = {"open": OpenTurns(limit=25), "budget": BudgetTurns(limit=2, looks=1),
                 "gated": GatedTurns(limit=5, looks=4)}
COMBOS = list(itertools.product(HIDDEN, INFO, SCORING, TURNS))


def make(hidden, info, scoring, turns, theme="a test of the kit", **body):
    """A ``KitEnv`` subclass (parts given as parts or as names, default parameters)."""
    parts = {"hidden": hidden, "info": info, "scoring": scoring, "turns": turns}
    for slot, registry in (("hidden", HIDDEN), ("info", INFO), ("scoring", SCORING),
                           ("turns", TURNS)):
        if isinstance(parts[slot], str):
            parts[slot] = registry[parts[slot]]()
    return type("KitTestEnv", (KitEnv,), {"theme": theme, **parts, **body})


def play(env, seed, actions):
    obs, info = env.reset(seed=seed)
    assert isinstance(obs, str) and obs and info == {}
    out = None
    for action in actions:
        out = env.step(action)
        obs, reward, terminated, truncated, info = out
        assert isinstance(obs, str) and isinstance(reward, float) and 0.0 <= reward <= 1.0
        assert type(terminated) is bool and type(truncated) is bool and info == {}
        if terminated or truncated:
            break
    return out


@pytest.mark.parametrize("kind", ["default", "extreme"])
def test_every_part_combines_with_every_other_into_a_winnable_game(kind):
    assert len(COMBOS) == 5 * 3 * 4 * 3
    for h, i, s, t in COMBOS:
        if kind == "default":
            cls = make(h, i, s, t)
        else:
            cls = make(SMALLEST[h], i, GENEROUS[s], EXTREME_TURNS[t])
        env = cls(max_turns=30)
        openings = set()
        for seed in range(6):
            openings.add(env.reset(seed=seed)[0])
            solution = env.solution()
            assert 2 <= len(solution) <= env.max_turns
            assert play(env, seed, solution)[1:4] == (1.0, True, False), (h, i, s, t)
            assert play(cls(), seed, solution) == play(env, seed, solution)  # deterministic
            ends = play(env, seed, list(GAME_EDGE_PROBES) * 4)
            assert ends[1] < 1.0 and ends[3] is True  # the edge probes never win, time runs out
            wrong = solution[-1].replace("answer", "answr")
            assert play(env, seed, solution[:-1] + [wrong] * 30)[1] == 0.0
        assert len(openings) == 1  # the opening states the rules: the same for every secret


def test_the_observation_is_written_from_the_theme_and_the_parts():
    cls = make(HiddenNumber(low=10, high=40), Probe(verb="sound"), ScoreSteep(power=5),
               BudgetTurns(limit=7, looks=2), theme="a sonar operator listening for a whale")
    obs, _ = cls().reset(seed=1)
    assert obs == ("A sonar operator listening for a whale. A whole number from 10 to 40 is "
                   "hidden. Commands: \\boxed{sound 25} tells how close a candidate is, from 0 "
                   "to 1 (1 is exact); \\boxed{answer 25} gives your final answer. An answer "
                   "scores its closeness to the hidden one to the power 5 (exact: 1). You may "
                   "look at most 2 times. You have 7 turns.")
    env = cls(max_turns=4)  # the caller's lower cap wins, and the observation says so
    assert env.max_turns == 4 and env.reset(seed=1)[0].endswith("You have 4 turns.")
    assert cls(max_turns=99).max_turns == 7 and cls(max_turns=0).max_turns == 7


@pytest.mark.parametrize("expr, message", [
    ("HiddenNumber(low=1, high=1)", "HiddenNumber.high: must be at least low + 19"),
    ("HiddenNumber(low=-1)", "HiddenNumber.low: must be an int in [0, 1000000], got -1"),
    ("HiddenNumber(1, '50')", "HiddenNumber.high: must be an int in [1, 1000000], got '50'"),
    ("HiddenNumber(True)", "HiddenNumber.low: must be an int"),
    ("HiddenNumber(top=9)", "HiddenNumber.top: no such parameter (HiddenNumber has: low, high)"),
    ("HiddenNumber(1, 50, 3)", "HiddenNumber: takes at most 2 parameters in order"),
    ("HiddenNumber(1, low=2)", "HiddenNumber.low: given twice"),
    ("HiddenCode(length=9)", "HiddenCode.length: must be an int in [2, 8], got 9"),
    ("HiddenCode(symbols='aab')", "HiddenCode.symbols: must be 2 to 10 distinct lowercase"),
    ("HiddenCode(length=3, symbols='ab')", "HiddenCode.length: 2 symbols make only 8 codes"),
    ("HiddenCell(rows=2, cols=4)", "HiddenCell.cols: a grid of 2 x 4 has fewer than 9 cells"),
    ("HiddenCause(items=['ash', 'elm'])", "HiddenCause.items: must be 6 to 12 distinct"),
    ("HiddenCause(items='ash elm fir oak yew ash')", "HiddenCause.items: must be 6 to 12"),
    ("HiddenOrder(items='a1 b c d')", "HiddenOrder.items: must be 4 to 8 distinct"),
    ("Probe(verb='two words')", "Probe.verb: must be one lowercase word of 2 to 12 letters"),
    ("Probe(decimals=0)", "Probe.decimals: must be an int in [1, 3], got 0"),
    ("ScoreSteep(power=1)", "ScoreSteep.power: must be an int in [5, 10], got 1"),
    ("ScoreBanded(partial=0.9)", "ScoreBanded.partial: must be a number in [0.05, 0.5]"),
    ("ScoreBanded(near=float('nan'))", "ScoreBanded.near: must be a number in [0.75, 0.95]"),
    ("ScoreThrifty(cost=0)", "ScoreThrifty.cost: must be a number in [0.02, 0.3], got 0"),
    ("OpenTurns(limit=1)", "OpenTurns.limit: must be an int in [2, 25], got 1"),
    ("BudgetTurns(limit=3, looks=3)", "BudgetTurns.looks: must be below limit (3)"),
    ("GatedTurns(limit=9, looks=5)", "GatedTurns.looks: must be an int in [1, 4], got 5"),
])
def test_a_bad_parameter_fails_naming_the_part_and_the_parameter(expr, message):
    names = {cls.__name__: cls for cls in (*HIDDEN.values(), *INFO.values(), *SCORING.values(),
                                           *TURNS.values())}
    with pytest.raises(KitError) as caught:
        eval(expr, names)
    assert str(caught.value).startswith(message), str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_parameters_are_normalised_and_shown():
    assert HiddenCause(items="Ash, ELM; fir oak yew fig").items == ("ash", "elm", "fir", "oak",
                                                                   "yew", "fig")
    assert HiddenCode(symbols="A, B, C").symbols == "abc"
    assert ScoreBanded(near=1 - 0.2, partial=1 / 4).params() == {"near": 0.8, "partial": 0.25}
    assert repr(BudgetTurns(9, 2)) == "BudgetTurns(limit=9, looks=2)"


@pytest.mark.parametrize("body, message", [
    ({"hidden": None}, "KitTestEnv.hidden: must be a hidden-state part such as HiddenNumber(), "
                       "got nothing"),
    ({"info": ScoreExact()}, "KitTestEnv.info: must be an information part such as Probe(), "
                             "got ScoreExact"),
    ({"turns": OpenTurns}, "KitTestEnv.turns: must be a turn-structure part"),
    ({"theme": ""}, "KitTestEnv.theme: must be one line of 3 to 160 characters"),
    ({"theme": "two\nlines"}, "KitTestEnv.theme: must be one line"),
    ({"answer_verb": "probe"}, "KitTestEnv.answer_verb: must be one lowercase word other than"),
    ({"step": lambda self, action: ("won", 1.0, True, False, {})}, "KitTestEnv.step: a kit "
                                                                    "program does not override"),
    ({"reset": lambda self, seed=None, options=None: ("x", {})}, "KitTestEnv.reset: a kit"),
])
def test_the_class_is_checked_when_it_is_made(body, message):
    parts = dict(hidden=HiddenNumber(), info=Probe(), scoring=ScoreExact(), turns=OpenTurns())
    parts.update(body)
    with pytest.raises(KitError) as caught:
        make(**{k: parts.pop(k) for k in ("hidden", "info", "scoring", "turns")}, **parts)
    assert str(caught.value).startswith(message), str(caught.value)


def test_a_hidden_state_that_does_not_change_with_the_seed_is_refused():
    class Two(HiddenNumber):
        def draw(self, rng):
            return rng.choice([3, 4])

    with pytest.raises(KitError, match=r"^Two.draw: the hidden state took 2 value\(s\) on 32"):
        make(Two(), "probe", "exact", "open")
    for hidden in SMALLEST.values():  # the fewest secrets a kit part allows pass with room
        make(hidden, "probe", "exact", "open")


def test_an_opening_that_shows_the_secret_is_refused_at_reset():
    cls = make("cell", "probe", "exact", "open",
               intro=lambda self: KitEnv.intro(self) + " Row %d." % self.secret[0])
    env = cls()
    with pytest.raises(KitError, match="KitTestEnv.intro: its text changes with the hidden state"):
        env.reset(seed=3)
    flavour = make("cell", "probe", "exact", "open",  # secret-free text of its own is fine,
                   intro=lambda self: "Ship %d. " % self.rng.randint(1, 9) + KitEnv.intro(self))
    env = flavour()  # also drawn from the episode's generator
    assert env.reset(seed=3) == env.reset(seed=3) and env.reset(seed=3)[0].startswith("Ship ")
    assert play(env, 3, env.solution())[1] == 1.0


def test_overrides_are_used_as_written():
    class Weekday(Hidden):
        DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")

        def draw(self, rng):
            return rng.choice(self.DAYS)

        def read(self, words):
            return words[0] if words and words[0] in self.DAYS else None

        def facts(self, secret):
            return ("it starts with " + secret[0], "it ends with " + secret[-1])

        def goal(self):
            return "A day of the week is hidden (mon to sun)."

        def example(self):
            return "mon"

    def plain(self, action):  # commands without \boxed{}
        words = action.lower().split()
        return (words[0], words[1:]) if words else ("", [])

    cls = make(Weekday(), Clue(verb="ask"), "exact", GatedTurns(limit=6, looks=2),
               answer_verb="guess", reminder=lambda self: "Say ask or guess.", command=plain)
    env = cls()
    obs, _ = env.reset(seed=5)
    assert "A day of the week is hidden" in obs and "\\boxed{guess mon}" in obs
    assert env.solution() == ["\\boxed{ask}", "\\boxed{ask}", "\\boxed{guess %s}" % env.secret]
    assert env.step("hello") == ("Say ask or guess.", 0.0, False, False, {})
    assert env.step("ASK")[0] == "Clue 1: it starts with %s." % env.secret[0]
    assert env.step("guess " + env.secret)[1:3] == (0.0, False)  # gated: two looks first
    assert env.step("ask")[0].startswith("Clue 2: it ends with")
    assert env.step("guess " + env.secret)[1:3] == (1.0, True)
    # the derived solution goes through the program's own command() too: it does not read
    # boxes, so the solution does not win (the validator would say so: solution_fails)
    assert play(cls(), 5, env.solution())[1:4] == (0.0, False, False)


def test_the_turn_structures_and_scoring_rules_do_what_they_say():
    budget = make("number", "reveal", "exact", BudgetTurns(limit=6, looks=2))()
    budget.reset(seed=0)
    seen = [budget.step("\\boxed{reveal %d}" % k)[0] for k in (1, 2, 3)]
    assert seen[0].endswith("Looks left: 1.") and seen[2] == "No looks left: answer now."
    gated = make("cause", "clue", "exact", GatedTurns(limit=4, looks=1))()
    gated.reset(seed=2)
    answer = gated.solution()[-1]
    assert gated.step(answer)[1:3] == (0.0, False)  # refused before a look
    assert gated.step("\\boxed{clue}")[0].startswith("Clue 1:")
    assert gated.step(answer)[1:3] == (1.0, True)
    thrifty = make("code", "clue", ScoreThrifty(cost=0.1, floor=0.2),
                   GatedTurns(limit=9, looks=2))()
    thrifty.reset(seed=1)
    look, _, answer = thrifty.solution()
    rewards = [thrifty.step(a)[1] for a in [look] * 5 + [answer]]
    assert rewards == [0.0] * 5 + [pytest.approx(0.7)]  # 3 looks past the 2 required
    steep = make(HiddenNumber(low=0, high=1_000_000), "probe", ScoreSteep(power=5), "open")()
    steep.reset(seed=4)
    near = steep.secret + 1 if steep.secret < 1_000_000 else steep.secret - 1
    probe = steep.step("\\boxed{probe %d}" % near)[0]
    assert probe == "Closeness of that candidate: 0.99."  # rounded down: only exact shows 1
    assert steep.step("\\boxed{answer %d}" % near)[1] == 0.999  # never 1.0 when not exact
    banded = make("cell", "probe", ScoreBanded(near=0.75, partial=0.4), "open")()
    banded.reset(seed=0)
    row, col = banded.secret
    near_cell = "%d %d" % (row + 1 if row < 5 else row - 1, col)
    assert banded.step("\\boxed{answer %s}" % near_cell)[1] == 0.4


def test_reset_is_keyword_only_and_steps_after_the_end_change_nothing():
    env = make("order", "reveal", "steep", "open")()
    with pytest.raises(TypeError):
        env.reset(3)
    assert env.step("\\boxed{answer x}") == ("The episode is over.", 0.0, True, False, {})
    env.reset(seed=3)
    for action in env.solution():
        env.step(action)
    assert env.step("\\boxed{answer x}") == ("The episode is over.", 0.0, True, False, {})


@settings(max_examples=150)
@given(action=st.text(max_size=80) | st.builds(lambda a, b: "\\boxed{%s %s}" % (a, b),
                                               st.sampled_from(["probe", "reveal", "clue",
                                                                "answer"]),
                                               st.text(max_size=30)),
       combo=st.sampled_from(COMBOS), seed=st.integers(0, 2 ** 31 - 1))
def test_any_action_gets_a_well_typed_step(action, combo, seed):
    env = make(*combo)()
    env.reset(seed=seed)
    obs, reward, terminated, truncated, info = env.step(action)
    assert isinstance(obs, str) and 0.0 <= reward <= 1.0 and info == {}
    assert reward < 1.0 or action in env.solution() or terminated


def test_kit_version_is_read_from_the_program_source():
    code = "from spadekit.envs.gamekit.v1 import KitEnv, HiddenNumber\nclass AEnv(KitEnv): pass\n"
    assert VERSIONS == ("v1",) and LATEST == "v1"
    assert kit_version(code) == "v1" and kit_meta(code) == {"gamekit": "v1"}
    assert kit_version("import spadekit.envs.gamekit.v1 as kit\n") == "v1"
    assert kit_version("from spadekit.envs.gamekit import v1\n") == "v1"
    assert kit_version("from spadekit.envs.gamekit.v1.hidden import HiddenCode\n") == "v1"
    assert kit_version("from spadekit.envs.gamekit.v9 import KitEnv\n") is None  # unreleased
    assert kit_version("from spadekit.envs.tooluse import ToolEnv\n") is None
    assert kit_version("class (") is None and kit_meta("import random\n") == {}


def test_importing_a_kit_name_without_a_version_names_the_versions():
    with pytest.raises(ImportError, match=r"imported by version: write `from spadekit\.envs\."
                                          r"gamekit\.v1 import KitEnv` \(released: v1\)"):
        exec("from spadekit.envs.gamekit import KitEnv", {})
    import spadekit.envs.gamekit as kit
    assert not hasattr(kit, "not_a_name")
    namespace: dict = {}
    exec("from spadekit.envs.gamekit import v1", namespace)  # a version is a module: fine
    assert namespace["v1"].VERSION == "v1"


@settings(max_examples=300)
@given(st.lists(st.sampled_from(["\\boxed{", "\\boxed {", "{", "}", "a", " ", "1"]),
                max_size=14).map("".join))
def test_commands_are_read_from_the_box_as_the_library_reads_them(text):
    from spadekit.envs.actions import extract_boxed
    from spadekit.envs.gamekit.v1.env import last_box

    got = last_box(text)
    assert (None if got is None else got.strip()) == extract_boxed(text)
