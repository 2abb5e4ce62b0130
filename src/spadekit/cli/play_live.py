"""``spadekit play --model``: a model plays a program, each turn shown as it happens.

Episodes run through the batched rollout engine; its ``on_turn`` hook prints every turn as the
environment answers it (to stderr under ``--json``, so stdout stays one JSON document). Ctrl-C
ends the run cleanly: sandboxes released, what was played reported, exit status 130 (a SIGINT
swallowed by a finalizer is remembered, ``InterruptFlag``, and raised at the next turn).
Defaults fit a small model on a CPU (``PLAY_DEFAULTS``: 6 turns of at most 48 new tokens, the
``cpu-tiny`` format aids); ``--preset``, ``--max-turns`` and ``--max-new-tokens`` override them.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any

from spadekit.common.safe_text import strict_json, terminal_text

PLAY_DEFAULTS = {"max_turns": 6, "max_new_tokens": 48}
"""The per-episode budget of ``play --model`` when the options are not given."""


@dataclass
class LiveEpisode:
    """What has been seen of one episode so far (kept by the ``on_turn`` hook)."""

    index: int
    seed: int
    turns: list[Any]
    trajectory: Any = None


class InterruptFlag:
    """Remembers that SIGINT came, so a ``KeyboardInterrupt`` the interpreter dropped (raised
    inside a ``__del__`` or a weakref callback) is raised again at the next ``check``."""

    def __init__(self) -> None:
        self.requested = False

    def handler(self, signum: int, frame: Any) -> None:
        self.requested = True
        raise KeyboardInterrupt

    def check(self) -> None:
        if self.requested:
            raise KeyboardInterrupt

    @contextlib.contextmanager
    def installed(self):
        """The handler for SIGINT while the block runs (main thread only; elsewhere a no-op,
        as Python allows signal handlers only there); the previous handler after."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = signal.signal(signal.SIGINT, self.handler)
        try:
            yield self
        finally:
            restored = False
            while not restored:  # a SIGINT in between raises before the restore: again
                try:
                    signal.signal(signal.SIGINT, previous)
                    restored = True
                except KeyboardInterrupt:
                    self.requested = True
            self.check()  # a SIGINT caught here still ends the play


def play_with_model(label: str, program: Any, model: str, episodes: int, seed: int,
                    hint: str | None, max_turns: int | None, temperature: float,
                    max_new_tokens: int | None, as_json: bool, pool: Any, console: Any,
                    err_console: Any, preset: str = "cpu-tiny") -> int:
    """Play ``episodes`` episodes with ``model``; returns the exit status (0 ran, 1 a program
    failed, 2 the model or preset could not be loaded, 130 interrupted). ``pool`` is closed."""
    import dataclasses

    from spadekit.selfplay.config import load_config
    from spadekit.common.errors import SpadekitError
    from spadekit.policy.registry import load_policy
    from spadekit.rollout.engine import EpisodeSpec, RolloutConfig, RolloutEngine

    try:
        aids = load_config(preset).rollout
        with err_console.status(f"loading {model}"):
            policy = load_policy(model)
    except SpadekitError as exc:
        pool.close()
        err_console.print(f"[red]cannot load {terminal_text(model)}:[/red] "
                          f"{terminal_text(exc.message)}")
        return 2
    turns_cap = max_turns if max_turns is not None else PLAY_DEFAULTS["max_turns"]
    budget = max_new_tokens if max_new_tokens is not None else PLAY_DEFAULTS["max_new_tokens"]
    config = dataclasses.replace(
        RolloutConfig(max_turns=turns_cap, max_new_tokens=budget, temperature=temperature,
                      seed=seed, max_context_tokens=32768),
        response_prefix=dict(aids.response_prefix), demonstrations=tuple(aids.demonstrations))
    live = [LiveEpisode(i, seed + i, []) for i in range(episodes)]
    out = err_console if as_json else console
    t0 = time.perf_counter()
    flag = InterruptFlag()

    def on_turn(tr: Any, record: Any) -> None:
        ep = live[tr._index]
        ep.turns.append(record)
        ep.trajectory = tr
        action = terminal_text(record.action.strip().replace("\n", " ")[:160], markup=False)
        obs = terminal_text(record.observation.strip().replace("\n", " ")[:200], markup=False)
        ended = " [end]" if record.terminated or record.truncated else ""
        out.print(f"[dim]{time.perf_counter() - t0:6.1f}s[/dim] episode {ep.index + 1} turn "
                  f"{len(ep.turns)}: [bold cyan]{action}[/bold cyan]", highlight=False)
        out.print(f"         reward {record.reward:.3f}{ended}  {obs}", markup=False,
                  highlight=False)
        flag.check()  # a Ctrl-C the interpreter dropped ends the play here

    engine = RolloutEngine(policy, pool, config)
    engine.on_turn = on_turn
    prefix = config.response_prefix.get("games", "")
    out.print(f"{terminal_text(model)} plays {episodes} episode(s) of {terminal_text(label)}: "
              f"at most {turns_cap} turns x {budget} tokens"
              + (f", response prefix {prefix}" if prefix else ""), markup=False,
              highlight=False)
    trajs, interrupted = None, False
    try:
        with flag.installed():
            trajs = engine.run([EpisodeSpec(program, seed=seed + i, hint=hint)
                                for i in range(episodes)])
            flag.check()  # a Ctrl-C dropped after the last turn's check
    except KeyboardInterrupt:
        interrupted = True
    finally:
        pool.close()
    seconds = time.perf_counter() - t0
    if interrupted:
        return _report_interrupted(live, label, model, seconds, as_json, console)
    assert trajs is not None
    mean = sum(t.episode_return for t in trajs) / len(trajs)
    if as_json:
        print(strict_json({"path": label, "model": model, "mean_return": mean,
                           "seconds": round(seconds, 2),
                           "episodes": [t.to_dict() for t in trajs]}, indent=2))
    else:
        from rich.panel import Panel

        for i, tr in enumerate(trajs):
            end = terminal_text(tr.failure["message"] if tr.failure else tr.stop_reason)
            console.print(f"[yellow]episode {i + 1} (seed {tr.spec.seed}): return "
                          f"{tr.episode_return:.3f}[/yellow] ({end}, {len(tr.turns)} turns, "
                          f"{tr.num_sampled} sampled tokens)")
        console.print(Panel(f"mean return {mean:.3f} over {len(trajs)} episode(s) in "
                            f"{seconds:.1f}s; model time {engine.stats['model_s']:.1f}s, "
                            f"environment time {engine.stats['env_s']:.2f}s",
                            title=terminal_text(model)))
    return 1 if any(t.failure for t in trajs) else 0


def _report_interrupted(live: list[LiveEpisode], label: str, model: str, seconds: float,
                        as_json: bool, console: Any) -> int:
    """What was played before Ctrl-C: every episode's turns so far (none ended with a return
    unless the environment terminated it)."""
    rows = []
    for ep in live:
        last = ep.turns[-1] if ep.turns else None
        done = bool(last and (last.terminated or last.truncated))
        rows.append({"episode": ep.index + 1, "seed": ep.seed, "turns": len(ep.turns),
                     "finished": done,
                     "return": float(last.reward) if done and last.terminated else 0.0,
                     "actions": [t.action for t in ep.turns],
                     "rewards": [t.reward for t in ep.turns]})
    if as_json:
        print(strict_json({"path": label, "model": model, "interrupted": True,
                           "seconds": round(seconds, 2), "episodes": rows}, indent=2))
    else:
        played = sum(r["turns"] for r in rows)
        console.print(f"[yellow]interrupted after {seconds:.1f}s:[/yellow] {played} turn(s) "
                      f"played in {len(rows)} episode(s)")
        for r in rows:
            state = f"return {r['return']:.3f}" if r["finished"] else "unfinished"
            console.print(f"  episode {r['episode']} (seed {r['seed']}): {r['turns']} turns, "
                          f"{state}", highlight=False)
    return 130
