"""Host spadekit's SPADE round inside slime (THUDM/slime: SGLang rollout, Megatron training).

slime owns the weights, the optimizer and the GPUs; spadekit owns the round (design, validate,
hint, play in sandboxes, rewards, per-role advantages), run by ``SelfPlay`` with slime as its
trainer (:class:`RoundProducer`). The samples cross over as slime ``Sample`` objects through
slime's two extension points: ``--data-source-path spadekit.integrations.slime.SpadekitDataSource``
(holds the run) and ``--rollout-function-path spadekit.integrations.slime.generate_rollout`` (one
round per call). A sample's reward is its advantage times its weight, exact for slime's
clipped surrogate with normalisation off (:func:`check_slime_args` lists the flags).
``python -m spadekit.integrations.slime`` is slime's ``train.py`` with spadekit's arguments.
slime, Ray and SGLang are imported inside functions only. ``docs/slime.md`` has the launch
command, the loss mapping and what was verified (a real slime run was not).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterable

from spadekit.policy.base import TemplatePolicy
from spadekit.selfplay.advantages import Sample

__all__ = ["to_slime_sample", "from_slime_sample", "response_start", "pad_to_global_batch",
           "slime_step_losses", "RoundProducer", "produce_round", "SpadekitRollout",
           "generate_rollout", "SpadekitDataSource", "SGLangRouterPolicy",
           "add_spadekit_arguments", "check_slime_args", "main", "STATUS_COMPLETED",
           "STATUS_TRUNCATED"]

from spadekit.integrations.slime_samples import (  # noqa: E402  (re-exported)
    STATUS_COMPLETED, STATUS_TRUNCATED, from_slime_sample, pad_to_global_batch, response_start,
    slime_step_losses, to_slime_sample)


# ---------------------------------------------------------------------------------------------
# the round without the update


class _SlimeTrainer:
    """spadekit's trainer under slime: slime owns the weights and their checkpoints, so a
    round's update hands its samples out (designer first, then agent) and changes nothing."""

    class dist:  # one process: the environment side runs inside slime's RolloutManager
        world_size, rank, enabled, is_main = 1, 0, False, True

    def __init__(self) -> None:
        self.taken: list[Sample] = []

    def train_step(self, samples: list[Sample]) -> dict[str, Any]:
        self.taken = ([s for s in samples if s.role == "designer"]
                      + [s for s in samples if s.role != "designer"])
        return {}

    def load(self, path: str) -> None:
        return None

    def gathered_for_generation(self) -> Any:
        import contextlib

        return contextlib.nullcontext()


class RoundProducer:
    """spadekit's self-play round with slime as the trainer: the loop's own setup and round
    (``SelfPlay`` with an external trainer: same run directory, store, memory, delay buffer and
    schedule as ``spadekit selfplay``, no checkpoint of weights); each ``produce`` commits one
    round and returns its training samples. ``policy`` only needs ``token_ids`` and
    ``logprobs``."""

    def __init__(self, config: Any, run_dir: str | Path, *, policy: Any,
                 designer_policy: Any = None, resume: bool | None = None) -> None:
        from spadekit.common.errors import ConfigError
        from spadekit.selfplay.loop import SelfPlay

        missing = {"token_ids", "logprobs"} - set(getattr(policy, "capabilities", ()))
        if missing:
            raise ConfigError(
                f"{getattr(policy, 'name', type(policy).__name__)} cannot produce training "
                f"samples: it lacks {sorted(missing)} (the server must return sampled token ids "
                "and their logprobs)")
        if config.generation_model:
            raise ConfigError("generation_model is not used under slime: slime's SGLang engines "
                              "generate; leave generation_model unset")
        run_dir = Path(run_dir)
        if resume is None:
            resume = (run_dir / "run.sqlite").exists()
        self._trainer = _SlimeTrainer()
        self._sp = SelfPlay(config, run_dir, policy=policy, designer_policy=designer_policy,
                            resume=resume, trainer=self._trainer)

    @property
    def config(self) -> Any:
        return self._sp.config

    @property
    def run_dir(self) -> Path:
        return self._sp.run_dir

    @property
    def next_step(self) -> int:
        return self._sp.next_step

    @property
    def store(self) -> Any:
        return self._sp.store

    def produce(self, step: int | None = None) -> tuple[list[Sample], dict[str, Any]]:
        """Play round ``step`` (default: the next one) and commit it; returns the training
        samples (designer first, then agent) and the round's metrics."""
        step = self._sp.next_step if step is None else int(step)
        self._trainer.taken = []
        metrics = self._sp.round(step)
        self._sp.next_step = step + 1
        return self._trainer.taken, metrics

    def close(self) -> None:
        self._sp.close()

    def __enter__(self) -> "RoundProducer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def produce_round(producer: RoundProducer, *, global_batch_size: int,
                  per_token_loss: bool = True, overflow: str = "steps",
                  require_logprobs: bool = True,
                  mask_truncated: bool = False) -> tuple[list[dict], dict[str, Any]]:
    """One round as slime-ready sample dicts: produce, drop what slime cannot train (no loss
    tokens; no logprobs when ``require_logprobs``), convert (designer samples first, so
    ``overflow="trim"`` drops surplus agent samples), pad. ``mask_truncated`` zeroes the loss
    mask of truncated episodes (spadekit's ``mask_truncated_completions``; SPADE's
    ``--spade-compact-filter``). Plain Python: runs without slime."""
    samples, metrics = producer.produce()
    step = metrics["step"]
    # agent samples are played this round (spadekit leaves their generated_at_step at 0)
    samples = [dataclasses.replace(s, generated_at_step=step) if s.role == "agent" else s
               for s in samples]
    kept, dropped = [], {"no_loss_tokens": 0, "no_logprobs": 0}
    for s in samples:
        if not any(s.loss_mask):
            dropped["no_loss_tokens"] += 1
        elif require_logprobs and s.behaviour_logprobs is None:
            dropped["no_logprobs"] += 1
        else:
            kept.append(s)
    dicts = [to_slime_sample(s, i, step=step, require_logprobs=require_logprobs)
             for i, s in enumerate(kept)]
    if mask_truncated:
        for d in dicts:
            if d["status"] == STATUS_TRUNCATED:
                d["loss_mask"] = [0] * d["response_length"]
    if not dicts:
        raise RuntimeError(f"round {step} produced no trainable sample (dropped: {dropped}); "
                           "slime needs at least one")
    batch, info = pad_to_global_batch(dicts, global_batch_size, per_token_loss=per_token_loss,
                                      overflow=overflow)
    metrics.update({f"slime/{k}": v for k, v in info.items()})
    metrics.update({f"slime/dropped_{k}": v for k, v in dropped.items()})
    metrics["slime/designer_samples"] = sum(1 for d in dicts
                                            if d["train_metadata"]["role"] == "designer")
    return batch, metrics


# ---------------------------------------------------------------------------------------------
# generation through slime's SGLang router


class SGLangRouterPolicy(TemplatePolicy):
    """A spadekit ``Policy`` on SGLang's native ``POST /generate`` (what slime's own rollout
    calls, ``slime/rollout/sglang_rollout.py:152-235``): ``input_ids`` in, and
    ``meta_info.output_token_logprobs`` (``[logprob, token_id, ...]`` per sampled token) and
    ``meta_info.finish_reason.type`` (``stop``/``length``/``abort``) out. Token ids come back
    exactly, so no retokenisation. Standard library HTTP; ``max_concurrency`` requests in
    flight (the router balances them over the engines).

    The logprobs are SGLang's for the sampling temperature; slime scores training logprobs with
    ``--rollout-temperature``, which must equal spadekit's ``rollout.temperature``.
    """

    capabilities = frozenset({"token_ids", "logprobs"})

    def __init__(self, base_url: str, tokenizer: Any, *, max_concurrency: int = 64,
                 timeout: float = 600.0, name: str = "sglang") -> None:
        self.base_url = base_url.rstrip("/")
        if isinstance(tokenizer, (str, Path)):
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(tokenizer), trust_remote_code=True)
        self.tokenizer = tokenizer
        self.timeout = float(timeout)
        self.name = f"{name}@{self.base_url}"
        self._pool = ThreadPoolExecutor(max_workers=max(1, int(max_concurrency)),
                                        thread_name_prefix="spadekit-sglang")
        from spadekit.rollout.engine import END_OF_TURN_TEXTS

        vocab = tokenizer.get_vocab()
        self.stop_token_ids = sorted({vocab[t] for t in END_OF_TURN_TEXTS if t in vocab})

    def generate(self, requests: list[Any]) -> list[Any]:
        from spadekit.policy.grammar import refuse_grammar

        refuse_grammar(self, requests)  # SGLang's router is sent no grammar
        return list(self._pool.map(self._one, requests))

    def close(self) -> None:
        self._pool.shutdown(wait=False)

    def _one(self, req: Any) -> Any:
        from spadekit.policy.base import Generation, PolicyError, cut_at_stop

        prompt = (list(req.prompt_ids) if req.prompt_ids is not None
                  else self.render(req.messages, True, req.tools,
                                   getattr(req, "chat_template_kwargs", None)))
        p = req.params
        params: dict[str, Any] = {
            "temperature": p.temperature, "top_p": p.top_p, "max_new_tokens": p.max_new_tokens,
            "stop": list(p.stop), "stop_token_ids": self.stop_token_ids, "no_stop_trim": True,
            "skip_special_tokens": False, "spaces_between_special_tokens": False}
        if p.seed is not None:
            params["sampling_seed"] = int(p.seed)
        body = json.dumps({"input_ids": prompt, "sampling_params": params,
                           "return_logprob": True}).encode()
        request = urllib.request.Request(self.base_url + "/generate", data=body,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as resp:
                out = json.loads(resp.read().decode())
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise PolicyError(f"{self.name}: /generate failed: {exc}") from exc
        meta = out.get("meta_info") or {}
        entries = meta.get("output_token_logprobs")
        if not isinstance(entries, list):
            raise PolicyError(f"{self.name}: no meta_info.output_token_logprobs in the answer")
        ids = [int(e[1]) for e in entries]
        lps = [float(e[0]) for e in entries]
        text, _ = cut_at_stop(self.tokenizer.decode(ids, skip_special_tokens=True), p.stop)
        reason = (meta.get("finish_reason") or {}).get("type")
        if reason == "abort":
            raise PolicyError(f"{self.name}: generation aborted by the server")
        finish = "length" if reason == "length" else "stop"
        return Generation(prompt_ids=prompt, token_ids=ids, logprobs=lps, text=text,
                          finish_reason=finish)


def router_url(args: Any) -> str:
    """``http://{sglang_router_ip}:{sglang_router_port}``: slime's RolloutManager sets both on
    its ``args`` when it starts the router (``slime/ray/rollout.py:1052-1053``)."""
    ip, port = getattr(args, "sglang_router_ip", None), getattr(args, "sglang_router_port", None)
    if not ip or not port:
        raise RuntimeError("slime's args carry no sglang_router_ip/port: the router is not up")
    return f"http://{ip}:{port}"


def _policy_from_args(args: Any) -> Any:
    backend = getattr(args, "spadekit_policy_backend", "sglang")
    url = router_url(args)
    if backend == "openai":  # spadekit's OpenAI client, pointed at the router's /v1
        from spadekit.policy.openai_backend import load_openai

        model = getattr(args, "spadekit_served_model", "") or ""
        return load_openai(f"openai:{model}@{url}/v1", tokenizer=args.hf_checkpoint,
                           max_concurrency=args.spadekit_max_concurrency)
    return SGLangRouterPolicy(url, args.hf_checkpoint,
                              max_concurrency=args.spadekit_max_concurrency)


# ---------------------------------------------------------------------------------------------
# slime glue (thin; needs slime)


def add_spadekit_arguments(parser: Any) -> Any:
    """slime's ``add_custom_arguments`` hook: spadekit's flags."""
    g = parser.add_argument_group("spadekit")
    g.add_argument("--spadekit-run-dir", type=str, default=None,
                   help="spadekit run directory (store, env pool, memory); resumed when it "
                        "already holds rounds")
    g.add_argument("--spadekit-preset", type=str, default="cpu-tiny")
    g.add_argument("--spadekit-config", type=str, default=None, help="a spadekit YAML config")
    g.add_argument("--spadekit-set", action="append", default=[],
                   help="spadekit key=value override (repeatable)")
    g.add_argument("--spadekit-policy-backend", choices=["sglang", "openai"], default="sglang",
                   help="sglang: native /generate (exact token ids); openai: spadekit's "
                        "OpenAI client on the router's /v1")
    g.add_argument("--spadekit-served-model", type=str, default="")
    g.add_argument("--spadekit-max-concurrency", type=int, default=64)
    g.add_argument("--spadekit-overflow", choices=["steps", "trim"], default="steps")
    g.add_argument("--spadekit-mask-truncated", action="store_true", default=False)
    return parser


def check_slime_args(args: Any, config: Any = None) -> list[str]:
    """The slime settings under which this adapter's samples mean what spadekit meant;
    returns the problems (empty when fine)."""
    problems = []

    def need(cond: bool, text: str) -> None:
        if not cond:
            problems.append(text)

    need(getattr(args, "advantage_estimator", "grpo") == "grpo", "--advantage-estimator grpo")
    need(not getattr(args, "rewards_normalization", False), "--disable-rewards-normalization")
    need(not getattr(args, "grpo_std_normalization", False), "--disable-grpo-std-normalization")
    need(not getattr(args, "normalize_advantages", False), "no --normalize-advantages")
    need(getattr(args, "kl_coef", 0.0) == 0.0, "--kl-coef 0 (reward shaping)")
    need(getattr(args, "use_tis", False), "--use-tis (delayed designer samples)")
    need(getattr(args, "entropy_coef", 0.0) == 0.0 and getattr(args, "kl_loss_coef", 0.0) == 0.0,
         "--entropy-coef 0 --kl-loss-coef 0 (padding rescales the policy term only)")
    if config is not None:
        need(getattr(args, "rollout_temperature", None) == config.rollout.temperature,
             f"--rollout-temperature must equal spadekit rollout.temperature "
             f"({config.rollout.temperature}): training logprobs use it")
        loss_type = config.train.loss_type
        need((loss_type == "token") == bool(getattr(args, "calculate_per_token_loss", False)),
             f"spadekit train.loss_type={loss_type} needs "
             f"{'' if loss_type == 'token' else 'no '}--calculate-per-token-loss")
    return problems


def _config_from_args(args: Any) -> Any:
    from spadekit.selfplay.config import load_config

    return load_config(preset=args.spadekit_preset, path=args.spadekit_config,
                       overrides=list(args.spadekit_set or []))


class SpadekitDataSource:
    """slime's data source (``slime/rollout/data_source.py:17-46``: ``get_samples``,
    ``add_samples``, ``save``, ``load``, ``__len__``) holding the spadekit run.

    spadekit writes its own prompts, so ``get_samples`` hands out nothing and ``add_samples``
    (aborted partial rollouts) is refused. State: every round commits to the spadekit run
    directory as it is produced; ``save(rollout_id)`` writes a pointer
    ``{args.save}/rollout/spadekit_state_{rollout_id}.json`` (run dir, next step), ``load``
    reopens the run dir (resume) and checks the pointer. ``__len__`` is 0: pass
    ``--num-rollout``.
    """

    def __init__(self, args: Any, *, producer: RoundProducer | None = None) -> None:
        self.args = args
        self._producer = producer

    @property
    def producer(self) -> RoundProducer:
        if self._producer is None:  # the router is up only once the manager has started it
            run_dir = self.args.spadekit_run_dir
            if not run_dir:
                raise RuntimeError("--spadekit-run-dir is required")
            config = _config_from_args(self.args)
            problems = check_slime_args(self.args, config)
            if problems:
                raise RuntimeError("slime flags do not match spadekit's loss: "
                                   + "; ".join(problems))
            self._producer = RoundProducer(config, run_dir, policy=_policy_from_args(self.args))
        return self._producer

    def get_samples(self, num_samples: int) -> list:
        return []

    def add_samples(self, samples: list) -> None:
        raise RuntimeError("SpadekitDataSource takes no samples back (spadekit rounds are not "
                           "partial; do not use --partial-rollout)")

    def _pointer(self, root: str | None, rollout_id: Any) -> Path | None:
        return None if not root else Path(root) / "rollout" / f"spadekit_state_{rollout_id}.json"

    def save(self, rollout_id: Any) -> None:
        path = self._pointer(getattr(self.args, "save", None), rollout_id)
        if path is None or self._producer is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"run_dir": str(self._producer.run_dir),
                                    "next_step": self._producer.next_step,
                                    "rollout_id": rollout_id}))

    def load(self, rollout_id: Any = None) -> None:
        path = self._pointer(getattr(self.args, "load", None), rollout_id)
        if path is None or not path.is_file():
            return
        state = json.loads(path.read_text())
        if self.args.spadekit_run_dir is None:
            self.args.spadekit_run_dir = state["run_dir"]
        # the run dir itself is the state: it reopens (resume) at its last committed round,
        # which may be later than the slime checkpoint (rounds commit when produced)

    def __len__(self) -> int:
        return 0


class SpadekitRollout:
    """slime's rollout function as an object: ``__call__(args, rollout_id, data_source,
    evaluation=False)``. One call = one spadekit round (``produce_round``), returned as
    ``RolloutFnTrainOutput(samples=[[s] for s in samples], metrics)``."""

    def __call__(self, args: Any, rollout_id: int, data_source: Any,
                 evaluation: bool = False) -> Any:
        from slime.rollout.base_types import RolloutFnEvalOutput, RolloutFnTrainOutput

        if evaluation:  # spadekit's evaluation runs outside slime (spadekit eval)
            return RolloutFnEvalOutput(data={}, metrics={})
        if not isinstance(data_source, SpadekitDataSource):
            raise RuntimeError("use --data-source-path spadekit.integrations.slime."
                               "SpadekitDataSource with this rollout function")
        batch, metrics = produce_round(
            data_source.producer, global_batch_size=args.global_batch_size,
            per_token_loss=bool(getattr(args, "calculate_per_token_loss", False)),
            overflow=args.spadekit_overflow, mask_truncated=args.spadekit_mask_truncated)
        metrics["slime/rollout_id"] = rollout_id
        samples = [[_slime_sample(d)] for d in batch]
        flat = {f"spadekit/{k}": v for k, v in metrics.items()
                if isinstance(v, (int, float)) and not isinstance(v, bool)}
        return RolloutFnTrainOutput(samples=samples, metrics=flat)


def _slime_sample(d: dict) -> Any:
    from slime.utils.types import Sample as SlimeSample

    fields = dict(d)
    status = SlimeSample.Status(fields.pop("status"))
    return SlimeSample(status=status, **fields)


generate_rollout = SpadekitRollout()
"""The ``--rollout-function-path`` target."""


def main(argv: Iterable[str] | None = None) -> None:
    """slime's ``train.py`` with spadekit's arguments: ``--slime-dir`` (or ``SLIME_DIR``, or the
    current directory) is the slime checkout whose ``train.py`` runs."""
    argv = list(sys.argv[1:] if argv is None else argv)
    slime_dir = os.environ.get("SLIME_DIR", os.getcwd())
    if "--slime-dir" in argv:
        i = argv.index("--slime-dir")
        slime_dir = argv[i + 1]
        del argv[i:i + 2]
    sys.path.insert(0, slime_dir)
    sys.argv = [sys.argv[0]] + argv
    from slime.utils.arguments import parse_args
    from train import train  # slime's train.py

    train(parse_args(add_custom_arguments=add_spadekit_arguments))


if __name__ == "__main__":
    main()
