"""A validator that cannot be gamed: programs that tell validation from play.

Every program in ``validate_gaming_cases.GAMING`` passed (or crashed) the validator before this
change; each must now get its verdict. Also here: the validation seed (drawn per validation,
recorded, and enough to repeat one exactly), fresh instances, advertised actions, the turn cap and
the probe generators in ``spadekit.sandbox.probes`` (property-based). Real sandboxes, once per tier.
"""

from __future__ import annotations

import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.register_assert_rewrite("validate_cases")

from conftest import ECHO, assert_pool_works  # noqa: E402
from spadekit.common.errors import ConfigError  # noqa: E402
from spadekit.sandbox.probes import (MAX_ADVERTISED, MAX_GARBAGE_CHARS,  # noqa: E402
                                    advertised_actions, garbage_actions, mutate, mutate_action,
                                    mutate_solution, random_policy_actions, tool_probes)
from spadekit.sandbox.validate import Validator, ValidatorSettings, turn_cap  # noqa: E402
from validate_cases import GUESS, GUESS_BASE, STOCK, expect, validator  # noqa: E402,F401
from validate_gaming_cases import GAMING, HUGE_MAX_TURNS, NO_SOLUTION_VERDICTS  # noqa: E402


# ---------------------------------------------------------------------------------------------
# the gaming programs


@pytest.mark.parametrize("name", sorted(GAMING))
def test_gaming_program_is_rejected(validator, pool, name):
    code, stage, reason = GAMING[name]
    report = validator.validate(code)
    assert not report.ok, f"{name} passed validation: {report.details!r}"
    assert report.reason == reason, f"{report.stage}/{report.reason}: {report.message}"
    if stage is not None:
        assert report.stage == stage, report.message
    assert_pool_works(pool)


@pytest.mark.parametrize("name", sorted(NO_SOLUTION_VERDICTS))
def test_gaming_program_without_solution_check_is_still_rejected(pool, name):
    validator = Validator(pool, ValidatorSettings(require_solution=False))
    expect(validator.validate(GAMING[name][0]), False, *NO_SOLUTION_VERDICTS[name])


def test_advertised_crash_names_the_advertised_action(validator):
    report = validator.validate(GAMING["advertised_action_crashes"][0])
    expect(report, False, "interface", "env_raised")
    assert report.details["error"]["exc_type"] == "IndexError"
    assert "\\boxed{probe 123}" in report.details["advertised"]
    # the advertised action or its out-of-range mutation, whichever the drawn order sent first
    assert re.fullmatch(r"\\boxed\{probe -?[0-9]+\}", report.details["action"])


def test_action_advertised_by_a_step_observation_is_probed(pool):
    # drawn garbage ("\\boxed{open 5}": a common verb, a small number) may find the crash
    # first; on most validation seeds the advertised "\\boxed{open 4}" does
    reports = [Validator(pool, seed=s).validate(GAMING["advertised_later_crashes"][0])
               for s in range(6)]
    for report in reports:
        expect(report, False, "interface", "env_raised")
        assert re.fullmatch(r"\\boxed\{open [4-9][0-9]*\}", report.details["action"])
    found = [r for r in reports if r.details["action"] == "\\boxed{open 4}"]
    assert len(found) >= 3
    assert all(r.details["advertised"] == ["\\boxed{look}", "\\boxed{open 4}"] for r in found)


def test_slow_program_is_stopped_long_before_the_budget(pool):
    v = Validator(pool=pool, settings=ValidatorSettings(slow_step_s=0.3, slow_steps=2))
    report = v.validate(GAMING["fast_then_slow"][0])
    assert (report.ok, report.reason) == (False, "slow"), report.message
    assert report.details["slow_calls"] == 2
    assert report.details["timings_ms"]["total"] < 20_000
    assert report.details["step_ms"]["slow"] == 2


def test_max_turns_above_the_cap_is_clamped(validator):
    honest_huge = GUESS.replace("self.max_turns = max_turns", "self.max_turns = 10 ** 12")
    report = validator.validate(honest_huge)
    expect(report, True, "done", "ok")
    assert report.details["max_turns"] == 12
    # the sandbox may already clamp what it reports; if not, the validator records the claim
    assert report.details.get("max_turns_declared") in (None, 10 ** 12)
    assert report.details["reference_episode"]["rewards"] and \
        len(report.details["reference_episode"]["rewards"]) <= 12
    assert validator.validate(HUGE_MAX_TURNS).details["max_turns"] == 12


def test_program_below_the_cap_keeps_its_own(pool):
    code = GUESS_BASE.replace("self.max_turns = max_turns", "self.max_turns = 3")
    # no solution (it would need more than 3 guesses): checked as a reference import would be
    report = Validator(pool=pool, settings=ValidatorSettings(require_solution=False)).validate(code)
    assert report.details["max_turns"] == 3
    assert len(report.details["reference_episode"]["rewards"]) == 3
    assert report.details["ends"] == "truncated after 3 steps"


@given(st.one_of(st.none(), st.booleans(), st.integers(-10 ** 15, 10 ** 15), st.floats(),
                 st.text(max_size=5)), st.integers(1, 100))
def test_turn_cap_is_always_between_one_and_the_cap(declared, cap):
    got = turn_cap(declared, cap)
    assert isinstance(got, int) and 1 <= got <= cap
    if isinstance(declared, int) and not isinstance(declared, bool) and 1 <= declared <= cap:
        assert got == declared
    else:
        assert got == cap


@pytest.mark.parametrize("bad", [dict(max_turns=0), dict(max_turns=-1), dict(max_turns=True),
                                 dict(max_turns=2.5), dict(garbage_episodes=0),
                                 dict(slow_step_s=0), dict(slow_steps=0), dict(drawn_seeds=-1),
                                 dict(seeds=()), dict(seeds=("0",)),
                                 dict(total_timeout=float("nan"))])
def test_settings_are_checked(bad):
    with pytest.raises(ConfigError):
        ValidatorSettings(**bad)


# ---------------------------------------------------------------------------------------------
# the validation seed


def _drawn(report):
    return report.details["seeds"], report.details["reference_episode"]


def test_validation_is_repeatable_from_its_recorded_seed(pool):
    first = Validator(pool=pool).validate(STOCK)
    expect(first, True, "done", "ok")
    again = Validator(pool=pool).validate(STOCK, seed=first.details["validation_seed"])
    assert again.details["validation_seed"] == first.details["validation_seed"]
    assert _drawn(again) == _drawn(first)
    for key in ("advertised", "solution_turns", "garbage_best_reward", "ends", "tools"):
        assert again.details[key] == first.details[key]


def test_every_validation_draws_new_seeds_and_garbage(pool):
    v = Validator(pool=pool)
    reports = v.validate_many([GUESS, GUESS, GUESS], workers=3)
    assert len({r.details["validation_seed"] for r in reports}) == 3
    interface = [tuple(r.details["seeds"]["interface"]) for r in reports]
    assert len(set(interface)) == 3 and (42, 123) not in interface
    actions = [tuple(r.details["reference_episode"]["actions"]) for r in reports]
    assert len(set(actions)) == 3  # (a drawn small number may equal an edge probe now)


def test_validator_seed_fixes_the_sequence(pool):
    a = Validator(pool=pool, seed=7).validate_many([ECHO, GUESS_BASE])
    b = Validator(pool=pool, seed=7).validate_many([ECHO, GUESS_BASE])
    assert [r.details["validation_seed"] for r in a] == [r.details["validation_seed"] for r in b]
    assert [_drawn(r) for r in a] == [_drawn(r) for r in b]
    with pytest.raises(ConfigError):
        Validator(pool=pool).validate_many([ECHO, ECHO], seeds=[1])


def test_each_check_gets_a_fresh_instance(validator):
    counting = GUESS.replace("        self.turn, self.done = 0, False\n",
                             "        self.turn, self.done = 0, False\n"
                             "        self.resets = getattr(self, 'resets', 0) + 1\n"
                             "        assert self.resets <= 6, 'instance reused'\n")
    assert counting != GUESS
    expect(validator.validate(counting), True, "done", "ok")


# ---------------------------------------------------------------------------------------------
# probe generators


def test_advertised_actions_are_found_in_order():
    obs = ("Reply with \\boxed{guess 1234} or \\boxed{submit {12}}; reply in \\boxed{} with "
           "'inspect 1 2 3' or 'pack 1 4 6'. Call <tool_call>{\"name\": \"f\"}</tool_call>, "
           "or <answer>done</answer>. Unclosed: \\boxed{open")
    assert advertised_actions(obs) == [
        "\\boxed{guess 1234}", "\\boxed{submit {12}}", "\\boxed{}", "\\boxed{inspect 1 2 3}",
        "\\boxed{pack 1 4 6}", '<tool_call>{"name": "f"}</tool_call>', "<answer>done</answer>"]
    assert "\\boxed{inspect 1 2 3}" not in advertised_actions(obs, tooluse=True)


@given(st.text(max_size=400))
@settings(max_examples=200, deadline=None)
def test_advertised_actions_never_raise_and_stay_bounded(text):
    found = advertised_actions(text)
    assert len(found) <= MAX_ADVERTISED and len(set(found)) == len(found)
    assert all(isinstance(a, str) and len(a) <= 240 for a in found)


@given(st.integers(0, 2 ** 63), st.integers(0, 30), st.booleans())
@settings(max_examples=100, deadline=None)
def test_garbage_is_fixed_by_its_seed(seed, n, tooluse):
    schemas = [{"type": "function", "function": {"name": "get", "parameters": {
        "type": "object", "properties": {"sku": {"type": "string"}}}}}]
    advertised = ["\\boxed{probe 123}"]
    one = garbage_actions(seed, n, tooluse, advertised, schemas)
    assert one == garbage_actions(seed, n, tooluse, advertised, schemas)
    assert len(one) == n and all(isinstance(a, str) for a in one)
    assert all(a.encode("utf-8") for a in one)  # valid Unicode, no lone surrogates
    assert all(len(a) <= MAX_GARBAGE_CHARS + 40 for a in one)


def test_garbage_differs_between_seeds_and_looks_like_a_model():
    # the old garbage had a grammar of its own (5-9 letter words, 7+ digit numbers,
    # symbol runs): a program could pay for anything else, e.g. \boxed{next}
    lists = [tuple(garbage_actions(s, 12, advertised=["\\boxed{probe 12}"])) for s in range(50)]
    assert len(set(lists)) == 50
    drawn = {a for acts in lists for a in acts}
    assert {"\\boxed{next}", "\\boxed{yes}"} <= drawn
    assert any(re.fullmatch(r"\\boxed\{[0-9]{1,2}\}", a) for a in drawn)  # small numbers
    assert any(re.fullmatch(r"\\boxed\{probe [0-9]+\}", a) for a in drawn)  # its own verb
    assert any(a.endswith(".") and " " in a for a in drawn)  # prose sentences
    tool = {a for s in range(50) for a in garbage_actions(s, 12, True, (), SCHEMAS)}
    answers = {a for a in tool if a.startswith("<answer>")}
    assert len(answers - {"<answer>done</answer>"}) >= 10
    assert any('"name": "get"' in a and '"sku": "' in a for a in tool)  # typed, known tool


SCHEMAS = [{"type": "function", "function": {"name": "get", "parameters": {
    "type": "object", "properties": {"sku": {"type": "string"}, "n": {"type": "integer"}}}}}]


@given(st.integers(0, 2 ** 63), st.integers(0, 30), st.booleans(),
       st.lists(st.text(max_size=80), max_size=6))
@settings(max_examples=100, deadline=None)
def test_garbage_with_solution_and_random_policy_are_fixed_and_bounded(seed, n, tooluse, sol):
    longest = max(map(len, sol), default=0)
    for make in (garbage_actions, random_policy_actions):
        one = make(seed, n, tooluse, ["\\boxed{probe 12}"], SCHEMAS, solution=sol)
        assert one == make(seed, n, tooluse, ["\\boxed{probe 12}"], SCHEMAS, solution=sol)
        assert len(one) == n and all(isinstance(a, str) for a in one)
        assert all(len(a) <= max(MAX_GARBAGE_CHARS, longest) + 40 for a in one)
    if sol:  # a one-action solution is never sent unchanged by the random policy
        assert sol[0] not in random_policy_actions(seed, n, solution=sol[:1])


@given(st.text(max_size=60), st.integers(0, 2 ** 32), st.booleans())
def test_mutated_action_is_never_the_action(action, seed, near):
    out = mutate_action(action, random.Random(seed), near)
    assert out != action and len(out) <= len(action) + 40


@given(st.lists(st.text(max_size=20), min_size=1, max_size=6), st.integers(0, 2 ** 32))
def test_mutated_solution_is_never_the_solution(solution, seed):
    assert mutate_solution(solution, random.Random(seed)) != solution


@given(st.text(max_size=60), st.integers(0, 2 ** 32))
def test_mutate_replaces_every_number(action, seed):
    out = mutate(action, random.Random(seed))
    assert (out is None) == (re.search("[0-9]", action) is None)
    if out is not None:
        assert all(len(run) >= 7 for run in re.findall("[0-9]+", out)), out
        if "-" not in action:  # only the numbers changed (each perhaps now negative)
            assert re.sub("-?[0-9]+", "#", out) == re.sub("[0-9]+", "#", action)


def test_tool_probes_call_every_listed_tool():
    schemas = [{"type": "function", "function": {"name": n, "parameters": {
        "type": "object", "properties": {"a": {}, "b": {}}}}} for n in ("f", "g")]
    probes = tool_probes(schemas + ["junk", {"function": 3}], random.Random(1))
    assert probes[0] == '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    assert probes[2] == '<tool_call>{"name": "g", "arguments": {}}</tool_call>'
    assert '"a": ' in probes[1] and '"b": ' in probes[1] and len(probes) == 4
