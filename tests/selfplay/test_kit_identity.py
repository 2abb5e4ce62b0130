"""The near-duplicate gate tells kit programs apart by what they are (issue 39): the same parts,
parameters and own code is a copy whatever the theme, names, texts or dead code; another
composition, setting or override is another game. Read from source without running it; never
raises on any text. Through the real memory of a real run database."""

from __future__ import annotations

from hypothesis import given, strategies as st

from spadekit.envs.program import EnvProgram
from spadekit.runs.store import RunStore
from spadekit.selfplay.kit_identity import kit_identity
from spadekit.selfplay.memory import EnvironmentMemory

BASE = '''\
from spadekit.envs.gamekit.v1 import KitEnv, HiddenNumber, Probe, ScoreSteep, BudgetTurns


class LighthouseEnv(KitEnv):
    theme = "a lighthouse keeper counts the ships"
    hidden = HiddenNumber(low=1, high=60)
    info = Probe()
    scoring = ScoreSteep(power=6)
    turns = BudgetTurns(limit=8, looks=4)


HINT = "Probe the middle first."
'''


def _edit(old: str, new: str, code: str = BASE) -> str:
    assert code.count(old) == 1
    return code.replace(old, new)


def test_identity_reads_parts_parameters_theme_and_composition():
    ident = kit_identity(BASE)
    assert ident.composition == "number+probe+steep+budget"
    assert ident.theme == "a lighthouse keeper counts the ships"
    assert ident.parts == ("HiddenNumber", "Probe", "ScoreSteep", "BudgetTurns")
    assert ident.params[0] == "low=1,high=60" and ident.own == ()


def test_defaults_written_out_or_left_out_are_one_setting():
    a = _edit("info = Probe()", "info = Probe(verb='probe', decimals=2)")
    b = _edit("HiddenNumber(low=1, high=60)", "HiddenNumber(1, 60)")
    assert kit_identity(a).key == kit_identity(BASE).key == kit_identity(b).key


def test_a_rethemed_renamed_copy_with_dead_code_is_a_copy():
    copy = _edit('theme = "a lighthouse keeper counts the ships"', 'theme = "bees in a hive"')
    copy = copy.replace("LighthouseEnv", "HiveEnv").replace("Probe the middle", "Count bees")
    copy = _edit("    turns = BudgetTurns(limit=8, looks=4)\n",
                 "    turns = BudgetTurns(limit=8, looks=4)\n\n    def unused(self):\n"
                 "        return 42\n", copy)
    assert kit_identity(copy).key == kit_identity(BASE).key


def test_another_composition_setting_or_override_is_another_game():
    other_part = _edit("ScoreSteep(power=6)", "ScoreExact()").replace("ScoreSteep", "ScoreExact")
    other_param = _edit("high=60", "high=90")
    override = _edit("    turns = BudgetTurns(limit=8, looks=4)\n",
                     "    turns = BudgetTurns(limit=8, looks=4)\n\n    def reminder(self):\n"
                     "        return 'Use probe or answer.' * 2\n")
    keys = {kit_identity(c).key for c in (BASE, other_part, other_param, override)}
    assert len(keys) == 4
    assert kit_identity(other_part).composition == "number+probe+exact+budget"
    assert kit_identity(override).overrides == ("reminder",)


def test_a_part_of_its_own_is_own_code():
    own = '''\
from spadekit.envs.gamekit.v1 import KitEnv, Hidden, Reveal, ScoreExact, OpenTurns


class Day(Hidden):
    def draw(self, rng):
        return rng.randint(1, 28)


class AlmanacEnv(KitEnv):
    theme = "an almanac"
    hidden = Day()
    info = Reveal()
    scoring = ScoreExact()
    turns = OpenTurns()
'''
    ident = kit_identity(own)
    assert ident.parts[0] == "own:Day" and ident.composition == "own+reveal+exact+open"
    assert ident.overrides == ("part:hidden",)
    changed = own.replace("randint(1, 28)", "randint(1, 31)")
    assert kit_identity(changed).key != ident.key


def test_whole_programs_and_broken_text_have_no_identity():
    assert kit_identity("class FooEnv:\n    pass\n") is None
    assert kit_identity("from spadekit.envs.gamekit.v9 import KitEnv\nclass AEnv(KitEnv): pass") \
        is None
    assert kit_identity("def (") is None
    assert kit_identity(BASE.replace("(KitEnv)", "")) is None


def test_deeply_nested_source_has_no_identity_and_raises_nothing():
    deep = "0" + "+0" * 3000
    for code in (_edit("high=60", f"high={deep}"),
                 _edit("    turns = BudgetTurns(limit=8, looks=4)\n",
                       f"    turns = BudgetTurns(limit=8, looks=4)\n    answer_verb = 'a' if "
                       f"{deep} else 'b'\n")):
        kit_identity(code)  # None or an identity; never RecursionError


def test_forwarders_and_empty_subclasses_are_no_own_code():
    code = _edit("Probe()", "Scan()").replace("\n\nclass Lighthouse",
                                              "\n\nclass Scan(Probe):\n    \"A probe.\"\n\n\n"
                                              "class Lighthouse")
    code = _edit("    turns = BudgetTurns(limit=8, looks=4)\n",
                 "    turns = BudgetTurns(limit=8, looks=4)\n\n    def look(self, words):\n"
                 "        return super().look(words)\n", code)
    assert kit_identity(code).key == kit_identity(BASE).key


@given(st.text(max_size=400))
def test_identity_never_raises(text):
    kit_identity(text)
    kit_identity("from spadekit.envs.gamekit.v1 import *\n" + text)


@given(st.sampled_from(["HiddenNumber", "HiddenCell", "HiddenCode"]),
       st.lists(st.integers(-5, 200), max_size=3))
def test_odd_arguments_are_compared_as_written(part, args):
    code = _edit("HiddenNumber(low=1, high=60)", f"{part}({', '.join(map(str, args))})")
    code = _edit("import KitEnv, HiddenNumber, Probe, ScoreSteep, BudgetTurns", "import *", code)
    ident = kit_identity(code)
    assert ident is not None and ident.parts[0] == part and ident.params[0]


def test_the_memory_gate_refuses_kit_copies_and_admits_other_compositions(tmp_path):
    store = RunStore(tmp_path / "run", create=True)
    try:
        memory = EnvironmentMemory(store)
        memory.add(EnvProgram(code=BASE, skill="Mathematical_Reasoning", domain="games"), step=0)
        copy = _edit('"a lighthouse keeper counts the ships"', '"a baker counts loaves"')
        dup, closest, sim = memory.is_near_duplicate(copy)
        assert dup and sim == 1.0 and closest is not None
        other = _edit("ScoreSteep(power=6)", "ScoreBanded()").replace("ScoreSteep",
                                                                      "ScoreBanded")
        dup, _closest, sim = memory.is_near_duplicate(other)
        assert not dup and sim < 1.0
        # within one composition the shingles judge: a one-number change is a copy, and so are
        # the review's equivalent rewrites (each behaves exactly as BASE)
        for copy in (_edit("looks=4", "looks=2"), _edit("high=60", "high=59+1"),
                     _edit("high=60", "high=int(60)"),
                     _edit("    hidden = HiddenNumber(low=1, high=60)",
                           "    hidden: object = HiddenNumber(low=1, high=60)"),
                     _edit("    turns = BudgetTurns(limit=8, looks=4)\n",
                           "    turns = BudgetTurns(limit=8, looks=4)\n    answer_verb = 'answer'"
                           "\n\n    def intro(self):\n        return super().intro()\n"),
                     _edit("Probe()", "P()").replace("\n\nclass Lighthouse",
                                                     "\n\nclass P(Probe):\n    pass\n\n\n"
                                                     "class Lighthouse")):
            dup, _closest, sim = memory.is_near_duplicate(copy)
            assert dup, (copy, sim)
        # the shingle gate alone would call the one-part change a copy (ten lines, one token)
        whole = "class AEnv:\n" + "\n".join(f"    x{i} = {i}" for i in range(30))
        assert not memory.is_near_duplicate(whole)[0]
    finally:
        store.close()
