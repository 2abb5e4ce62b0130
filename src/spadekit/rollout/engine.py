"""The multi-turn rollout engine: many episodes at once, token-in/token-out, in sandboxes.

Each turn, every live episode goes into one batched ``policy.generate`` call, then every
environment steps concurrently. A trajectory keeps the exact sampled ids and behaviour logprobs
(None, never zeros, if a turn had none); ``loss_mask`` marks sampled tokens only. Episodes end on
termination or truncation, at the turn cap (``EpisodeSpec.max_turns``, else
``RolloutConfig.max_turns``, or the program's smaller one), on context overflow
(``stop_reason="context"``), or on a typed environment failure (that episode only). Return (SPEC
point 4): the last reward if terminated, else 0. Hints go on the first observation only.
Scripted episodes play given actions in the same batch and produce no sample. Environments run
behind ``EnvBackend`` (``spadekit.rollout.sessions``); trusted ``env_factory`` environments
never do. Details: docs/design/rollout.md.
"""

from __future__ import annotations

import contextlib
import time
import zlib
from dataclasses import asdict, dataclass, field
from typing import Annotated, Any, Callable, Iterator

from pydantic import Field, StrictFloat

from spadekit.common.config_fields import Bool, Count, Int, NonNegative, PosInt, Str, Strings, section
from spadekit.policy.chat import ChatRenderer
from spadekit.envs.program import EnvProgram
from spadekit.common.errors import SandboxError
from spadekit.rollout.local_env import LocalEnv
from spadekit.sandbox.play import episode_return, with_hint
from spadekit.policy.base import GenerationRequest, Policy, SamplingParams, encode_texts
from spadekit.rollout.aids import (action_grammar_for, demonstration_messages, opening_text,
                                   prefix_for)
from spadekit.sandbox.pool import SandboxPool
from spadekit.rollout.thinking import split_thinking
from spadekit.rollout.sessions import (  # noqa: F401  (re-exported: the backend seam)
    EnvBackend, EnvSession, LocalPoolBackend, LocalPoolSession, StartItem, Started, StepResult)

GAMES_SYSTEM = (
    "You are playing a text game. Read each observation carefully and reply with exactly one "
    "command per turn, written inside \\boxed{...}, for example \\boxed{guess 42}. You may think "
    "briefly before the box; only the last box counts.")
TOOLUSE_SYSTEM = (
    "You complete tasks by calling tools. Call a tool by writing "
    '<tool_call>{"name": "TOOL_NAME", "arguments": {...}}</tool_call>; you may make several calls '
    "in one turn. Tool results come back in the next message. When the task is complete, reply "
    "<answer>done</answer>.")
END_OF_TURN_TEXTS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>")


@section(knob="rollout")
class RolloutConfig:
    max_turns: PosInt = 12
    """Turn cap of episodes whose ``EpisodeSpec.max_turns`` is None. Self-play gives every
    episode ``SelfPlayConfig.turn_cap`` = ``min(env_max_turns, rollout.max_turns)``."""
    max_new_tokens: PosInt = 256
    """Per assistant turn."""
    max_context_tokens: PosInt = 4096
    """Whole conversation; an episode that would exceed it ends truncated."""
    temperature: NonNegative = 1.0
    """0: greedy (self-play needs at least ``policy.base.MIN_TEMPERATURE``)."""
    top_p: Annotated[StrictFloat, Field(gt=0, le=1)] = 1.0
    stop: Strings = ()
    system_prompt: Str | None = None
    """None: the built-in prompt of the program's setting (games or tool use)."""
    native_tools: Bool = True
    """Give tool schemas to the chat template (models with native tool calling render them)."""
    seed: Int | None = None
    """Derive each episode's and turn's sampling seed from this (reproducible rollouts)."""
    load_workers: PosInt = 8
    """Programs loaded into sandboxes in parallel at the start of a run (steps need no threads:
    ``spadekit.sandbox.batch`` multiplexes every worker's pipe)."""
    strip_thinking: Bool = True
    """Give the environment only the text after a turn's ``<think>...</think>`` block
    (:func:`spadekit.rollout.thinking.split_thinking`); the trajectory keeps the full text and
    every sampled token stays trainable."""
    response_prefix: dict[Str, Str] = field(default_factory=dict)
    """Format aid, per setting (``games``, ``tooluse``): text that opens every assistant turn,
    e.g. ``{games: "\\boxed{"}``. Its tokens are prompt tokens (never trained); the
    environment receives prefix + reply (``spadekit.rollout.aids``). Empty: none."""
    demonstrations: Strings = ()
    """Format aid: the settings whose episodes open with the built-in example turns of a toy
    task before the first observation (prompt tokens, never trained). Empty: none."""
    action_grammar: Strings = ()
    """Format aid: the settings (``games``) whose replies are decoded within the grammar of one
    ``\\boxed{...}`` action (``spadekit.rollout.aids.action_grammar_for``). Empty: none."""

    max_staleness: Count = 0
    """Asynchronous rollouts (read by the self-play loop, ``spadekit.selfplay.pipeline``): 0 is
    the synchronous loop (generate, then train on it); 1 or more generates round s while the
    trainer updates on round s-1, and no batch is trained more than ``max_staleness`` policy
    versions after the one that generated it (older ones are cancelled, counted). Needs a
    separate generation engine (``generation_model``) and ``checkpoint_every: 1``. TRL's
    ``max_staleness``."""

    def __post_init__(self) -> None:
        from spadekit.rollout.aids import check_rollout_aids
        check_rollout_aids(self.response_prefix, self.demonstrations, self.action_grammar)


@dataclass
class EpisodeSpec:
    program: EnvProgram | None
    """An untrusted program, played in a sandbox; None when ``env_factory`` is given."""
    seed: int
    hint: str | None = None
    tag: dict[str, Any] = field(default_factory=dict)
    """Free metadata carried to the trajectory (env id, group, with_hint, ...)."""
    env_factory: Callable[[], Any] | None = None
    """Trusted code only (benchmark adapters, packaged environments such as rlve-gym): builds an
    object with the Gymnasium text contract (``reset(*, seed, options)``, 5-tuple ``step``, and
    optionally ``tools()``) that is stepped in this process, without a sandbox."""
    system: str | None = None
    """This episode's system prompt (default: the config's, else the setting's built-in one)."""
    max_turns: int | None = None
    """This episode's turn cap, given to the program's constructor (``max_turns=``) and the most
    turns it plays (fewer if the program reports a smaller ``max_turns``); None: the config's."""
    scripted: tuple[str, ...] | None = None
    """Actions to play instead of asking the policy (the watch's spot checks): turn ``i`` sends
    ``scripted[i]``; the episode ends ``script_end`` when they run out. No generation, no
    tokens (``num_sampled`` 0), never a training sample; it starts and steps in the same
    session and the same lockstep as the sampled episodes."""

    def __post_init__(self) -> None:
        if (self.program is None) == (self.env_factory is None):
            raise ValueError("an EpisodeSpec needs exactly one of program and env_factory")
        if self.scripted is not None:
            if isinstance(self.scripted, str) or not all(isinstance(a, str)
                                                         for a in self.scripted):
                raise ValueError("EpisodeSpec.scripted must be a sequence of str actions")
            self.scripted = tuple(self.scripted)
        if self.max_turns is not None and (isinstance(self.max_turns, bool) or not isinstance(
                self.max_turns, int) or self.max_turns < 1):
            raise ValueError(f"EpisodeSpec.max_turns must be a positive int or None, got "
                             f"{self.max_turns!r}")

    @property
    def env_key(self) -> str:
        """The program's sha256, or ``local:<id>`` for an in-process environment."""
        return self.program.sha256 if self.program is not None else f"local:{id(self)}"


@dataclass
class TurnRecord:
    action: str
    observation: str
    reward: float
    terminated: bool
    truncated: bool
    new_tokens: int
    finish_reason: str
    exact_render: bool = True
    generate_s: float = 0.0
    step_s: float = 0.0
    thinking_chars: int = 0
    """Characters of thinking taken out of the sampled text before the environment saw it
    (``action`` is what the environment got); 0 when nothing was stripped."""
    worker_turn_s: float | None = None
    """Seconds the worker serving this episode spent on this turn's step call, all of its
    episodes together (the backend's ``session.turn_seconds`` where it reports them; else the
    sum of this turn's step times of the episodes of the same program, which the local
    backend steps in one sandbox); None when unmeasured."""


@dataclass
class Trajectory:
    spec: EpisodeSpec
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] | None = field(default_factory=list)
    """Behaviour logprobs at sampled positions, 0.0 elsewhere (aligned with token_ids); None
    once a sampled turn came without logprobs (the sample then has no behaviour logprobs)."""
    messages: list[dict[str, str]] = field(default_factory=list)
    turns: list[TurnRecord] = field(default_factory=list)
    prompt_len: int = 0
    terminated: bool = False
    truncated: bool = False
    stop_reason: str = ""
    """terminated | truncated | max_turns | context | env_error | policy_error | script_end"""
    failure: dict[str, Any] | None = None
    episode_return: float = 0.0
    tools: list[dict] | None = None
    max_turns: int = 0
    """The turn cap this episode was played under (0 until it started)."""
    _env: Any = field(default=None, repr=False)
    """A backend's episode handle (``RemoteEnv`` locally), a ``LocalEnv``, or None when over."""
    _index: int = field(default=0, repr=False)
    _sampled_end: bool = field(default=False, repr=False)

    @property
    def live(self) -> bool:
        return not self.stop_reason

    @property
    def num_sampled(self) -> int:
        return sum(self.loss_mask)

    @property
    def scripted(self) -> bool:
        """Whether the episode played scripted actions (``EpisodeSpec.scripted``)."""
        return self.spec.scripted is not None

    def to_dict(self) -> dict[str, Any]:
        return {"program_sha256": self.spec.program.sha256 if self.spec.program else None,
                "seed": self.spec.seed,
                "hint": self.spec.hint, "tag": self.spec.tag, "token_ids": self.token_ids,
                "loss_mask": self.loss_mask, "logprobs": self.logprobs, "messages": self.messages,
                "turns": [asdict(t) for t in self.turns], "prompt_len": self.prompt_len,
                "terminated": self.terminated, "truncated": self.truncated,
                "stop_reason": self.stop_reason, "failure": self.failure,
                "episode_return": self.episode_return, "num_sampled": self.num_sampled,
                "max_turns": self.max_turns}


class RolloutEngine:
    """Plays episodes of programs with a policy. Owns nothing: give it a policy and a pool
    (or any ``EnvBackend``)."""

    def __init__(self, policy: Policy, pool: SandboxPool | EnvBackend | None,
                 config: RolloutConfig | None = None, *,
                 chat_template_kwargs: dict[str, Any] | None = None):
        """``pool``: a ``SandboxPool`` (wrapped in ``LocalPoolBackend``), an ``EnvBackend``
        (e.g. ``RayEnvBackend``), or None when every episode runs an in-process
        ``env_factory``. ``chat_template_kwargs``: the agent's chat-template options
        (``enable_thinking`` ...), used for every prompt and observation."""
        self.policy = policy
        self.config = config or RolloutConfig()
        if isinstance(pool, SandboxPool):
            self.backend: EnvBackend | None = LocalPoolBackend(pool, self.config.load_workers)
        elif pool is None or isinstance(pool, EnvBackend):
            self.backend = pool
        else:
            raise TypeError(f"RolloutEngine needs a SandboxPool, an EnvBackend or None, got "
                            f"{type(pool).__name__}")
        self.pool: SandboxPool | None = getattr(self.backend, "pool", None)
        vocab = policy.tokenizer.get_vocab()
        stops = tuple(t for t in END_OF_TURN_TEXTS if t in vocab)
        eos = getattr(policy.tokenizer, "eos_token", None)
        self.stop_texts = tuple(dict.fromkeys(((eos,) if eos else ()) + stops))
        self.renderer = ChatRenderer(policy.tokenizer, self.stop_texts, chat_template_kwargs)
        self._stop_ids = {vocab[t] for t in self.stop_texts if t in vocab}
        self.stats: dict[str, float] = {}
        self.on_turn: Callable[[Trajectory, TurnRecord], None] | None = None
        """Called with each turn the moment its environment answered it (live display)."""
        self.on_episode: Callable[[Trajectory], None] | None = None
        """Called with each episode once it has ended (won, lost, cut or failed), during
        :meth:`run`, not after the whole batch: per-episode progress."""

    # -- public ---------------------------------------------------------------------------

    def run(self, specs: list[EpisodeSpec]) -> list[Trajectory]:
        t0 = time.perf_counter()
        self.stats = {"model_s": 0.0, "env_s": 0.0, "sampled_tokens": 0, "turns": 0,
                      "trajectories_without_logprobs": 0}
        trajs = [Trajectory(spec=s, _index=i) for i, s in enumerate(specs)]
        for tr in trajs:
            tr.max_turns = self._cap(tr)
        if self.backend is None and any(s.program is not None for s in specs):
            raise ValueError("episodes of untrusted programs need a SandboxPool or an EnvBackend")
        reported: set[int] = set()

        def report_ended() -> None:
            if self.on_episode is None:
                return
            for tr in trajs:
                if not tr.live and tr._index not in reported:
                    reported.add(tr._index)
                    self.on_episode(tr)

        with self._session() as session:
            self._start(trajs, session)
            report_ended()
            turn = 0
            while any(t.live for t in trajs):
                self._turn([t for t in trajs if t.live], turn, session)
                report_ended()
                turn += 1
        self.stats["total_s"] = time.perf_counter() - t0
        return trajs

    @contextlib.contextmanager
    def _session(self) -> Iterator[EnvSession | None]:
        if self.backend is None:
            yield None
            return
        with self.backend.session() as session:
            yield session

    # -- phases ---------------------------------------------------------------------------

    def _start(self, trajs: list[Trajectory], session: EnvSession | None) -> None:
        """One sandbox per distinct program; one environment instance per episode; reset."""
        local = [t for t in trajs if t.spec.program is None]
        live = [t for t in trajs if t.spec.program is not None]
        t = time.perf_counter()
        started: list[Any] = session.start(
            [(tr.spec.program.sha256, tr.spec.program.code, self._cap(tr), tr.spec.seed)
             for tr in live]
        ) if live else []
        for tr in local:
            env = LocalEnv(tr.spec.env_factory)
            result = env.reset(tr.spec.seed)
            tools = env.tools() if not isinstance(result, SandboxError) else None
            live.append(tr)
            started.append(result if isinstance(result, SandboxError) else
                           tools if isinstance(tools, SandboxError) else (env, *result, tools))
        prompts: list[tuple[Trajectory, str]] = []
        for tr, result in zip(live, started):
            if isinstance(result, SandboxError):
                self._fail(tr, result, "env_error")
                continue
            env, obs, _info, tools = result
            tr._env, tr.tools = env, tools
            own = getattr(env.env if isinstance(env, LocalEnv) else env, "max_turns", None)
            if isinstance(own, int) and not isinstance(own, bool) and own >= 1:
                tr.max_turns = min(tr.max_turns, own)  # the program's own smaller cap holds
            setting = "tooluse" if tools else "games"
            system = tr.spec.system or self.config.system_prompt or (
                TOOLUSE_SYSTEM if tools else GAMES_SYSTEM)
            setting = tr.spec.tag.setdefault("setting", setting)
            demos = demonstration_messages(self.config, setting)
            tr.messages = [{"role": "system", "content": system}, *demos,
                           {"role": "user", "content": with_hint(obs, tr.spec.hint)}]
            if tr.scripted:  # no policy reads it: no prompt tokens
                continue
            native = tools if (tools and self.config.native_tools) else None
            prompts.append((tr, opening_text(self.renderer, system, demos,
                                             tr.messages[-1]["content"], native,
                                             prefix_for(self.config, setting))))
        for (tr, _text), ids in zip(prompts, encode_texts(self.policy.tokenizer,
                                                          [p[1] for p in prompts])):
            tr.token_ids = ids
            tr.loss_mask = [0] * len(tr.token_ids)
            tr.logprobs = [0.0] * len(tr.token_ids)
            tr.prompt_len = len(tr.token_ids)
        self.stats["env_s"] += time.perf_counter() - t

    def _turn(self, live: list[Trajectory], turn: int, session: EnvSession | None) -> None:
        cfg = self.config
        ready, requests, scripts = [], [], []
        for tr in live:
            if tr.scripted:
                if len(tr.turns) >= len(tr.spec.scripted):
                    self._end(tr, "script_end")
                else:
                    scripts.append(tr)
                continue
            room = cfg.max_context_tokens - len(tr.token_ids)
            if room < 1:
                self._end(tr, "context", truncated=True)
                continue
            seed = None if cfg.seed is None else _seed(cfg.seed, tr.spec.seed, tr._index, turn)
            params = SamplingParams(temperature=cfg.temperature, top_p=cfg.top_p,
                                    max_new_tokens=min(cfg.max_new_tokens, room),
                                    stop=cfg.stop, seed=seed, grammar=action_grammar_for(
                                        cfg, tr.spec.tag.get("setting", "games")))
            ready.append(tr)
            requests.append(GenerationRequest(prompt_ids=list(tr.token_ids), params=params))
        gen_of: dict[int, Any] = {}
        gen_s = 0.0
        if ready:
            t = time.perf_counter()
            try:
                gens = self.policy.generate(requests)
            except Exception as exc:  # the policy failing ends these episodes, typed
                for tr in ready:
                    self._fail(tr, exc, "policy_error")
                gens = []
            gen_s = time.perf_counter() - t
            self.stats["model_s"] += gen_s
            for tr, gen in zip(ready, gens):
                self._take_generation(tr, gen)
                gen_of[id(tr)] = gen
        # every episode that acts this turn, in the run's order: scripted ones sit among the
        # sampled ones in the same step call (one lockstep, one session)
        acting = [tr for tr in live if tr.live and (tr.scripted or id(tr) in gen_of)]
        if not acting:
            return
        actions, thought = [], []
        for tr in acting:
            if tr.scripted:
                actions.append(tr.spec.scripted[len(tr.turns)])
                tr.messages.append({"role": "assistant", "content": actions[-1]})
                thought.append(0)
                continue
            reply = tr.messages[-1]["content"]  # the response prefix + the sampled text
            thinking, visible = split_thinking(reply) if cfg.strip_thinking else ("", "")
            actions.append(visible if thinking else reply)
            thought.append(len(thinking))
        t = time.perf_counter()
        results, own_s, worker_s = self._step_all(acting, actions, session)
        mean_s = (time.perf_counter() - t) / len(acting)
        pending: list[tuple[Trajectory, str]] = []
        for tr, result, action, n_thought, sec, w_s in zip(acting, results, actions, thought,
                                                          own_s, worker_s):
            if isinstance(result, SandboxError):
                self._fail(tr, result, "env_error")
                continue
            gen = gen_of.get(id(tr))
            obs, reward, term, trunc, _info = result
            record = TurnRecord(action=action, observation=obs, reward=reward, terminated=term,
                                truncated=trunc,
                                new_tokens=len(gen.token_ids) if gen is not None else 0,
                                finish_reason=gen.finish_reason if gen is not None
                                else "scripted",
                                generate_s=gen_s / len(ready) if gen is not None else 0.0,
                                step_s=mean_s if sec is None else sec, thinking_chars=n_thought,
                                worker_turn_s=w_s)
            tr.turns.append(record)
            self.stats["turns"] += 1
            if self.on_turn is not None and not tr.scripted:
                self.on_turn(tr, record)
            if term or trunc:
                self._end(tr, "terminated" if term else "truncated", term, trunc)
            elif len(tr.turns) >= tr.max_turns:
                self._end(tr, "max_turns", truncated=True)
            elif tr.scripted:
                tr.messages.append({"role": "user", "content": obs})
                if len(tr.turns) >= len(tr.spec.scripted):
                    self._end(tr, "script_end")
            else:
                text, exact = self.renderer.observation_text(
                    tr.messages, tr._sampled_end, obs,
                    tr.tools if (tr.tools and cfg.native_tools) else None)
                record.exact_render = exact
                tr.messages.append({"role": "user", "content": obs})
                pending.append((tr, text + _prefix(cfg, tr)))
        for (tr, _text), ids in zip(pending, encode_texts(self.policy.tokenizer,
                                                          [p[1] for p in pending])):
            tr.token_ids += ids
            tr.loss_mask += [0] * len(ids)
            if tr.logprobs is not None:
                tr.logprobs += [0.0] * len(ids)
        self.stats["env_s"] += time.perf_counter() - t

    def _take_generation(self, tr: Trajectory, gen: Any) -> None:
        """Append one turn's sampled tokens, behaviour logprobs and reply text to ``tr``."""
        tr.token_ids += gen.token_ids
        tr.loss_mask += [1] * len(gen.token_ids)
        if gen.logprobs is None or len(gen.logprobs) != len(gen.token_ids):
            if tr.logprobs is not None:  # never filled in: the sample loses them all
                self.stats["trajectories_without_logprobs"] += 1
            tr.logprobs = None
        elif tr.logprobs is not None:
            tr.logprobs += list(gen.logprobs)
        tr.messages.append({"role": "assistant", "content": _prefix(self.config, tr) + gen.text})
        tr._sampled_end = bool(gen.token_ids) and gen.token_ids[-1] in self._stop_ids
        self.stats["sampled_tokens"] += len(gen.token_ids)

    def _step_all(self, acting: list[Trajectory], actions: list[str],
                  session: EnvSession | None) -> tuple[list[Any], list[float | None],
                                                       list[float | None]]:
        """Step every acting episode once: the sandboxed ones in one ``session.step`` call, the
        in-process ones here. Returns the results, each episode's own step time and the time
        its worker spent on the whole call (``TurnRecord.worker_turn_s``), None where
        unmeasured."""
        remote = [i for i, tr in enumerate(acting) if not isinstance(tr._env, LocalEnv)]
        results: list[Any] = [None] * len(acting)
        own_s: list[float | None] = [None] * len(acting)
        worker_s: list[float | None] = [None] * len(acting)
        if remote:
            session.step_seconds = None
            for i, result in zip(remote, session.step([(acting[i]._env, actions[i])
                                                       for i in remote])):
                results[i] = result
            measured = session.step_seconds
            if measured is not None and len(measured) == len(remote):
                for i, sec in zip(remote, measured):
                    own_s[i] = sec
            per_worker = getattr(session, "turn_seconds", None)
            if isinstance(per_worker, list) and len(per_worker) == len(remote):
                for i, sec in zip(remote, per_worker):
                    worker_s[i] = None if sec is None else float(sec)
            else:  # one sandbox serves every episode of a program: their step times add up
                total: dict[str, float] = {}
                for i in remote:
                    if own_s[i] is not None:
                        key = acting[i].spec.env_key
                        total[key] = total.get(key, 0.0) + own_s[i]
                for i in remote:
                    worker_s[i] = total.get(acting[i].spec.env_key)
        for i, tr in enumerate(acting):
            if isinstance(tr._env, LocalEnv):
                t_local = time.perf_counter()
                results[i] = tr._env.step(actions[i])
                own_s[i] = worker_s[i] = time.perf_counter() - t_local
        return results, own_s, worker_s

    def _cap(self, tr: Trajectory) -> int:
        """The cap an episode is constructed with: its spec's, else the config's."""
        return tr.spec.max_turns if tr.spec.max_turns is not None else self.config.max_turns

    # -- endings --------------------------------------------------------------------------

    def _end(self, tr: Trajectory, reason: str, terminated: bool = False,
             truncated: bool = False) -> None:
        tr.stop_reason = reason
        tr.terminated, tr.truncated = terminated, truncated
        last = tr.turns[-1].reward if tr.turns else None
        tr.episode_return = episode_return(last, terminated)
        if tr.messages and tr.messages[-1]["role"] == "assistant" and not tr.scripted:
            closing = self.renderer.closing_ids(tr._sampled_end)
            tr.token_ids += closing
            tr.loss_mask += [0] * len(closing)
            if tr.logprobs is not None:
                tr.logprobs += [0.0] * len(closing)
        self._drop(tr)

    def _fail(self, tr: Trajectory, exc: Exception, reason: str) -> None:
        tr.failure = exc.to_dict() if hasattr(exc, "to_dict") else {
            "type": type(exc).__name__, "message": str(exc)[:2000]}
        tr.stop_reason = reason
        tr.episode_return = 0.0
        self._drop(tr)

    @staticmethod
    def _drop(tr: Trajectory) -> None:
        # the instance dies with its sandbox at the end of the run; no round trip to drop it
        tr._env = None


def _prefix(cfg: RolloutConfig, tr: Trajectory) -> str:
    return prefix_for(cfg, tr.spec.tag.get("setting", "games"))


def _seed(base: int, episode_seed: int, key: int, turn: int) -> int:
    return zlib.crc32(f"{base}:{episode_seed}:{key}:{turn}".encode())
