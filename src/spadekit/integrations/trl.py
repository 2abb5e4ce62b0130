"""A pool's environments as the environments TRL's ``GRPOTrainer`` plays (``environment_factory``).

:class:`PoolEnvironments` loads the programs of any environment source ``load_programs`` reads
and gives ``dataset()`` (one row per environment and seed: ``prompt``, ``env_id``, ``seed``) and
``factory`` (for ``environment_factory``). Guarantees: every program runs in a worker of one
shared ``SandboxPool``, never in the trainer's process (one worker per running episode, given
back when it ends, at the next ``reset`` and by :meth:`PoolEnvironments.close`); the one tool is
``act(action)``; ``get_reward()`` is the environment's own return (the last reward if the episode
terminated, else 0, as spadekit's rollout scores it; a sandbox failure scores 0.0, the floor of
the [0, 1] rewards the sandbox enforces, so crashing never beats playing); no program failure
raises into TRL; the hint is in no row, prompt or tool schema, and an observation that echoes it
(any case or spacing) shows ``[withheld]``; an observation cannot spell special tokens
(``<|...|>``). :func:`tool_chat_template` gives a ChatML tokenizer TRL's Qwen2.5 tool-calling
template; :func:`teach_act_format` shows a model the ``act`` call first. Built on trl 1.16.0.
"""

from __future__ import annotations

import functools
import json
import re
import threading
from pathlib import Path
from typing import Any

from spadekit.common.errors import ConfigError, SandboxError
from spadekit.envs.actions import boxed, extract_boxed
from spadekit.envs.program import EnvProgram
from spadekit.sandbox import SandboxConfig, SandboxPool
from spadekit.sandbox.gym_adapter import SandboxedTextEnv, fit_to_charset
from spadekit.sandbox.play import episode_return

__all__ = ["FAILED_EPISODE_REWARD", "PoolEnv", "PoolEnvironments", "check_tool_template",
           "teach_act_format", "tool_chat_template"]

DEMO_SEED_OFFSET = 1_000_003
"""``teach_act_format`` demonstrates on seed ``last dataset seed + this``: never a trained one."""
FAILED_EPISODE_REWARD = 0.0
"""What an episode that failed in the sandbox scores: the lowest reward a program can give."""

TRL_MISSING = ("TRL is not installed: the `trl` extra provides it (trl==1.16.0, datasets); "
               "`bash install.sh` installs it by default, or `pip install 'spadekit[trl]'`")

GAMES_SYSTEM = (
    "You are playing a text game. You play it only through the `act` tool: call act with one "
    "command per call, for example act(action=\"guess 42\"). Each call returns the game's next "
    "observation. Keep calling act until the game says it is over.")
TOOLUSE_SYSTEM = (
    "You complete a task inside an environment through the `act` tool. Pass act the text of your "
    "turn: tool calls written as <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>, and "
    "<answer>done</answer> when the task is complete. Each call returns the environment's reply.")
USER_OPENING = "The environment's first observation:\n\n"


def _trl_modules() -> None:
    try:
        import datasets  # noqa: F401
        import trl  # noqa: F401
    except ImportError:
        raise ConfigError(TRL_MISSING) from None


MIN_HINT_WORD_CHARS = 4
"""A hint with fewer letters and digits than this is not looked for in observations (a hint
``"x"`` would blank every x of a board)."""
_WORD = re.compile(r"\w+")


@functools.lru_cache(maxsize=256)
def _hint_pattern(hint: str | None) -> tuple[tuple[str, ...], ...] | None:
    """What an echo of ``hint`` looks like in an observation: its words (as written, and as
    ``fit_to_charset`` spells them), casefolded, in order; any punctuation, spacing or line
    breaks may stand between and around them. None for a hint of under
    :data:`MIN_HINT_WORD_CHARS` letters and digits."""
    if not hint:
        return None
    forms = []
    for form in dict.fromkeys((hint, fit_to_charset(hint))):
        words = tuple(w.casefold() for w in _WORD.findall(form))
        if sum(len(w) for w in words) >= MIN_HINT_WORD_CHARS and words not in forms:
            forms.append(words)
    return tuple(forms) or None


def _occurrences(words: list[str], pattern: tuple[str, ...]) -> list[int]:
    """Where ``pattern`` starts in ``words``, left to right without overlaps (Knuth-Morris-Pratt:
    linear in both lengths, whatever the hint and the observation hold)."""
    fail, k = [0] * len(pattern), 0
    for i in range(1, len(pattern)):
        while k and pattern[i] != pattern[k]:
            k = fail[k - 1]
        k += pattern[i] == pattern[k]
        fail[i] = k
    found, k = [], 0
    for i, word in enumerate(words):
        while k and word != pattern[k]:
            k = fail[k - 1]
        k += word == pattern[k]
        if k == len(pattern):
            found.append(i - k + 1)
            k = 0
    return found


def _withheld(text: str, pattern: tuple[tuple[str, ...], ...] | None) -> str:
    """``text`` with every echo of the hint (``pattern``) replaced by ``[withheld]``."""
    if pattern is None:
        return text
    for words in pattern:
        spans = [(m.start(), m.end()) for m in _WORD.finditer(text)]
        folded = [text[a:b].casefold() for a, b in spans]
        starts = _occurrences(folded, words)
        if not starts:
            continue
        out, last = [], 0
        for i in starts:
            out.append(text[last:spans[i][0]])
            out.append("[withheld]")
            last = spans[i + len(words) - 1][1]
        text = "".join(out) + text[last:]
    return text


def _defused(text: str) -> str:
    """``text`` with ``<|``/``|>`` spaced apart, so an observation cannot spell a chat
    template's special tokens (``<|im_end|>``) and forge a turn of the conversation."""
    return text.replace("<|", "< |").replace("|>", "| >")


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[... {len(text) - limit} characters cut]"


class PoolEnvironments:
    """The environments of ``source`` (anything ``spadekit.runs.sources.load_programs`` reads).

    Args:
        source: a run directory, a pool directory or ``pool.jsonl``, ``library[:games|:tooluse]``,
            or a directory of ``.py`` programs.
        setting: keep only ``games`` or ``tooluse`` programs (None: all).
        max_turns: each episode's turn cap (given to the program and enforced; TRL's
            ``max_tool_calling_iterations`` bounds the calls of one completion on its own).
        seeds_per_env: dataset rows per environment (seeds ``first_seed`` .. ``+ seeds_per_env``).
        first_seed: the first seed.
        sandbox_config: the sandbox's ``SandboxConfig`` (None: defaults).
        warm: sandbox workers booted ahead of demand.
        max_action_chars: longer actions are cut to this many characters before the program
            sees them.
        max_observation_chars: longer observations are cut before the model sees them.
    """

    def __init__(self, source: str | Path, *, setting: str | None = None, max_turns: int = 8,
                 seeds_per_env: int = 4, first_seed: int = 0,
                 sandbox_config: SandboxConfig | None = None, warm: int = 1,
                 max_action_chars: int = 512, max_observation_chars: int = 4000) -> None:
        from spadekit.runs.sources import load_programs

        for name, value in (("max_turns", max_turns), ("seeds_per_env", seeds_per_env),
                            ("max_action_chars", max_action_chars),
                            ("max_observation_chars", max_observation_chars)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive int, got {value!r}")
        if isinstance(first_seed, bool) or not isinstance(first_seed, int) or first_seed < 0:
            raise ConfigError(f"first_seed must be a non-negative int, got {first_seed!r}")
        programs = load_programs(source, setting)  # ConfigError when it holds none
        self.programs: dict[str, EnvProgram] = {}
        for program in programs:
            self.programs.setdefault(program.short_id, program)
        self.max_turns = max_turns
        self.seeds = list(range(first_seed, first_seed + seeds_per_env))
        self.max_action_chars = max_action_chars
        self.max_observation_chars = max_observation_chars
        self.pool = SandboxPool(sandbox_config, warm=warm)
        self._instances: list[PoolEnv] = []
        self._lock = threading.Lock()
        self._closed = False

    # -- what TRL takes ----------------------------------------------------------------------

    def dataset(self):
        """A ``datasets.Dataset``: one row per (environment, seed), hints withheld."""
        _trl_modules()
        from datasets import Dataset

        rows = {"prompt": [], "env_id": [], "seed": []}
        for env_id, program in self.programs.items():
            for seed in self.seeds:
                rows["prompt"].append(self.prompt(program))
                rows["env_id"].append(env_id)
                rows["seed"].append(seed)
        return Dataset.from_dict(rows)

    def prompt(self, program: EnvProgram) -> list[dict[str, str]]:
        """The chat messages of a row; TRL appends ``reset``'s first observation to the last."""
        system = TOOLUSE_SYSTEM if program.domain == "tooluse" else GAMES_SYSTEM
        return [{"role": "system", "content": system}, {"role": "user", "content": USER_OPENING}]

    @property
    def factory(self):
        """A zero-argument callable for ``GRPOTrainer(environment_factory=...)``."""
        return self.new_env

    def new_env(self) -> PoolEnv:
        """A new environment instance (no worker until its first ``reset``)."""
        with self._lock:
            if self._closed:
                raise ConfigError("these PoolEnvironments were closed")
            env = PoolEnv(self)
            self._instances.append(env)
            return env

    def program(self, env_id: Any) -> EnvProgram:
        """The program of ``env_id`` (its short id or full sha256); ConfigError when unknown."""
        if isinstance(env_id, str):
            if env_id in self.programs:
                return self.programs[env_id]
            for program in self.programs.values():
                if program.sha256 == env_id:
                    return program
        raise ConfigError(f"unknown env_id {env_id!r}: this pool holds "
                          f"{len(self.programs)} environments (ids as in dataset()['env_id'])")

    # -- lifetime ----------------------------------------------------------------------------

    def close(self) -> None:
        """Kill every worker of every instance and the pool's warm ones; idempotent."""
        with self._lock:
            self._closed = True
            instances, self._instances = self._instances, []
        for env in instances:
            env._release()
        self.pool.close()

    def __enter__(self) -> PoolEnvironments:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __len__(self) -> int:
        return len(self.programs)


class PoolEnv:
    """One rollout's environment, as TRL drives it: ``reset`` per example, the ``act`` tool,
    ``get_reward``. Read-only state: ``env_id``, ``seed``, ``turns``, ``done``, ``failure``."""

    def __init__(self, owner: PoolEnvironments) -> None:
        self._owner = owner
        self._env: SandboxedTextEnv | None = None
        self._program: EnvProgram | None = None
        self._hint: tuple[tuple[str, ...], ...] | None = None
        self._state: dict[str, Any] = {"env_id": None, "seed": None, "turns": 0, "done": True,
                                       "terminated": False, "last_reward": None, "failure": None}

    def reset(self, env_id: str | None = None, seed: int | None = None, **_row: Any) -> str:
        """Load the row's program into a fresh sandbox worker and return its first observation.

        An unknown ``env_id`` is a ConfigError; a program that fails to start ends the episode
        (it scores 0.0) and the returned text says so.
        """
        program = self._owner.program(env_id)
        self._release()
        self._program = program
        self._hint = _hint_pattern(program.hint)
        self._state = {"env_id": program.short_id, "seed": seed, "turns": 0, "done": False,
                       "terminated": False, "last_reward": None, "failure": None}
        try:
            self._env = SandboxedTextEnv(program, pool=self._owner.pool,
                                         max_turns=self._owner.max_turns, on_error="truncate")
            observation, _info = self._env.reset(seed=None if seed is None else int(seed))
            if program.domain == "tooluse":
                observation += _tool_listing(self._env.tools())
        except SandboxError as exc:
            return self._fail(exc)
        return self._shown(observation)

    def act(self, action: str) -> str:
        """Play one turn of the game.

        Args:
            action: the command for this turn, for example "guess 42".

        Returns:
            The environment's next observation, or a note that the episode is over.
        """
        state = self._state
        if state["done"] or self._env is None:
            return self._over_text()
        text = action if isinstance(action, str) else str(action)
        text = text[: self._owner.max_action_chars]
        if self._program is not None and self._program.domain != "tooluse":
            text = text if extract_boxed(text) is not None else boxed(text)
        try:
            observation, reward, terminated, truncated, info = self._env.step(text)
        except SandboxError as exc:  # on_error="truncate" covers step; this is a backstop
            return self._fail(exc)
        if "error" in info:
            state["failure"] = info["error"]
            state["done"] = True
            self._release()
            return self._over_text()
        state["turns"] += 1
        state["last_reward"] = reward
        state["terminated"] = terminated
        if terminated or truncated:
            state["done"] = True
            ending = ("The episode is over." if terminated else
                      "The episode is over: the turn limit was reached.")
            self._release()  # the worker goes back now, not at the next reset
            return f"{self._shown(observation)}\n\n{ending} Score: {self.get_reward():.2f}."
        return self._shown(observation)

    def get_reward(self) -> float:
        """The episode's return: the last reward if the program ended it, 0.0 otherwise (turn
        limit, no move, or a sandbox failure)."""
        state = self._state
        if state["failure"] is not None:
            return FAILED_EPISODE_REWARD
        return episode_return(state["last_reward"], state["terminated"])

    # -- read-only state (properties are not tools) --------------------------------------------

    @property
    def env_id(self) -> str | None:
        return self._state["env_id"]

    @property
    def seed(self) -> int | None:
        return self._state["seed"]

    @property
    def turns(self) -> int:
        return self._state["turns"]

    @property
    def done(self) -> bool:
        return self._state["done"]

    @property
    def failure(self) -> dict | None:
        return self._state["failure"]

    # -- internals -----------------------------------------------------------------------------

    def _shown(self, observation: str) -> str:
        """What the model sees: cut first (so matching the hint costs at most the shown
        length), the hint withheld, special tokens defused."""
        return _defused(_withheld(_clip(observation, self._owner.max_observation_chars),
                                  self._hint))

    def _fail(self, exc: SandboxError) -> str:
        self._state["failure"] = exc.to_dict() if hasattr(exc, "to_dict") else {
            "type": type(exc).__name__}
        self._state["done"] = True
        self._release()
        return self._over_text()

    def _over_text(self) -> str:
        failure = self._state["failure"]
        if failure is not None:
            kind = failure.get("type", "error") if isinstance(failure, dict) else "error"
            return (f"The environment failed ({kind}); the episode is over and scores "
                    f"{FAILED_EPISODE_REWARD:.2f}. Further actions do nothing.")
        return (f"The episode is over (score {self.get_reward():.2f}). "
                "Further actions do nothing.")

    def _release(self) -> None:
        env, self._env = self._env, None
        if env is not None:
            env.close()


def _tool_listing(schemas: list[dict]) -> str:
    """The program's own tools, for a tool-use task's first observation."""
    lines = "\n".join(fit_to_charset(json.dumps(schema, sort_keys=True, ensure_ascii=False))
                      for schema in schemas)
    return ("\n\nThe environment's tools (call them inside act's action as <tool_call>{\"name\": "
            f"..., \"arguments\": {{...}}}}</tool_call>):\n{lines}")


def tool_chat_template(tokenizer: Any) -> Any:
    """``tokenizer`` with TRL's Qwen2.5 tool-calling ChatML template, when it has none that TRL
    can drive tools with; returned for chaining (changed in place).

    GRPOTrainer needs a template that renders tool calls (``supports_tool_calling``) and that TRL
    knows how to parse (``add_response_schema``). The bundled SmolLM2 and the tiny model speak
    ChatML (``<|im_start|>``) without tools; Qwen2.5's template is ChatML with tools. A template
    TRL already accepts is kept; a tokenizer that is not ChatML is a ConfigError.
    """
    _trl_modules()
    from trl.chat_template_utils import (add_response_schema, qwen2_5_chat_template,
                                         supports_tool_calling)

    if _tool_ready(tokenizer, supports_tool_calling, add_response_schema):
        return tokenizer
    if "<|im_start|>" not in tokenizer.get_vocab():
        raise ConfigError("this tokenizer's chat template cannot call tools and it is not ChatML: "
                          "set a tool-capable chat template on it (one TRL's "
                          "add_response_schema knows, e.g. Qwen2.5's or Qwen3's)")
    tokenizer.chat_template = qwen2_5_chat_template
    return add_response_schema(tokenizer)


def check_tool_template(tokenizer: Any) -> None:
    """ConfigError unless GRPOTrainer can drive tools with ``tokenizer``'s chat template."""
    _trl_modules()
    from trl.chat_template_utils import add_response_schema, supports_tool_calling

    if not _tool_ready(tokenizer, supports_tool_calling, add_response_schema):
        raise ConfigError("the tokenizer's chat template cannot do tool calls as TRL needs them: "
                          "set a tool-capable ChatML template, e.g. "
                          "spadekit.integrations.trl.tool_chat_template(tokenizer)")


def _tool_ready(tokenizer: Any, supports, add_schema) -> bool:
    if getattr(tokenizer, "chat_template", None) is None:
        return False
    try:
        if not supports(tokenizer):
            return False
    except Exception:  # a template that fails to render a tool conversation cannot do tools
        return False
    if getattr(tokenizer, "response_template", None) or getattr(tokenizer, "response_schema", None):
        return True
    try:
        add_schema(tokenizer)
    except ValueError:
        return False
    return True


def teach_act_format(model: Any, tokenizer: Any, envs: PoolEnvironments, *, steps: int = 4,
                     lr: float = 5e-5, max_programs: int = 8) -> float:
    """A few supervised steps on one ``act`` call per environment, so that a model that never
    calls tools starts to (without a call every reward is 0 and GRPO has nothing to learn from).

    Each example is an environment's first prompt on a seed the dataset never uses (so no
    trained episode's answer is shown; hint withheld as always) followed by the call that plays
    the first action of the program's own ``solution()`` there, rendered by ``tokenizer``'s chat
    template. Returns the last mean loss.
    """
    import torch

    examples = []
    env = envs.new_env()
    for env_id, program in list(envs.programs.items())[:max_programs]:
        observation = env.reset(env_id=env_id, seed=envs.seeds[-1] + DEMO_SEED_OFFSET)
        try:
            actions = env._env.solution() if env._env is not None else []
        except SandboxError:
            actions = []
        if not actions:
            continue
        action = actions[0] if program.domain == "tooluse" else (
            extract_boxed(actions[0]) or actions[0])
        messages = envs.prompt(program)
        messages[-1]["content"] += observation
        call = {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "act", "arguments": {"action": action}}}]}
        prompt = tokenizer.apply_chat_template(messages, tools=[env.act], tokenize=False,
                                               add_generation_prompt=True)
        full = tokenizer.apply_chat_template(messages + [call], tools=[env.act], tokenize=False)
        if full.startswith(prompt):
            examples.append((tokenizer(prompt, add_special_tokens=False).input_ids,
                             tokenizer(full[len(prompt):], add_special_tokens=False).input_ids))
    env._release()
    if not examples:
        raise ConfigError("no program of this pool gave a solution() to demonstrate the act call")
    device = next(model.parameters()).device
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    loss_value = float("nan")
    for _ in range(steps):
        optimizer.zero_grad()
        total = 0.0
        for prompt_ids, target_ids in examples:
            ids = torch.tensor([prompt_ids + target_ids], device=device)
            labels = ids.clone()
            labels[:, : len(prompt_ids)] = -100
            loss = model(input_ids=ids, labels=labels).loss / len(examples)
            loss.backward()
            total += float(loss.detach())
        optimizer.step()
        loss_value = total
    return loss_value
