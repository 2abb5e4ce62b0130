"""The scheduler of ``spadekit serve``: batches, fair between requests, in token slices.

A ``Policy`` generates whole batches (``generate`` returns when every sequence of the batch has
finished), and the server has one model, so one long request would hold it for every other
client. The scheduler therefore generates in **slices**: a sequence asks for at most
``slice_tokens`` new tokens at a time (default 256); when a slice ends by length with budget
left, the sequence goes back in line with its tokens so far appended to its prompt (the token
ids themselves, never re-encoded text) and continues in a later batch. A sequence that fits in
one slice is generated exactly as before (one ``generate`` call, its own seed). A sliced one
is a continuation of the same model: greedy decoding gives the same tokens as unsliced, and each
token's logprob is still that of the full prefix; a seeded sampled sequence draws slice ``j``
with seed ``seed + 1000003 * j`` (deterministic, but not the unsliced draw). A stop string
that spans two slices is found here (the policy sees only its own slice) and the tokens are
cut after the one that completed it, as the policy itself does. ``slice_tokens=0`` turns
slicing off (for policies that do not continue a prompt, such as scripted ones).

**Fairness**: each request (all its choices) is one group; a batch is filled round-robin over
the groups that have sequences waiting, one sequence per group per turn, in the order the
groups joined the line, and a group whose slice ended joins at the back. A new request is
therefore in the next batch (up to ``max_batch`` groups; beyond that, within a few batches),
waiting at most for the batch that is running, itself at most one slice long.

Batching: after the first waiting sequence the collector waits ``window`` seconds for more
(unless a batch is already full), then generates once; if a batch fails, its sequences are
retried one by one so that one bad request does not fail its neighbours.

**Streaming** (``submit(..., watch=...)``): ``watch(index, tokens, logprobs)`` gets each
sequence's new tokens as they come (``index``: the sequence's place in the request). A policy
that streams (``"stream"`` in its ``capabilities``: the ``hf`` sampler and the in-process
``vllm`` engine) calls back per token from its decoding loop (``GenerationRequest.on_token``),
so a streamed sequence is generated exactly as an unstreamed one (same slices, same seeds, same
tokens). Any other policy (a remote ``openai:`` server) is sliced for a stream even when the
sequence would fit in one slice, in slices that double from ``STREAM_FIRST`` tokens (4, 8, 16,
... up to ``slice_tokens``), and ``watch`` gets each slice's tokens but the last's (those come
with the finished generation): the first tokens reach the client after one short slice, and the
doubling keeps the number of slices (each prefills the prompt again) at about log2 of the
length; such a seeded sampled stream draws its slices as any sliced sequence does (greedy
decoding gives the unsliced tokens). With ``slice_tokens=0`` nothing is sliced and a
non-streaming policy's tokens come at the end.

Weight updates (``gate``, the lock ``WeightReceiver`` takes) land between batches and never in
the middle of a sequence: once an update waits, no new sequence starts, the sequences already
under way finish their slices, then the update runs.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable

from spadekit.policy.base import (Generation, GenerationRequest, Policy, PolicyError,
                                  SamplingParams, cut_at_stop)

__all__ = ["DEFAULT_SLICE", "FairBatcher", "STREAM_FIRST", "Ticket", "UpdateGate", "wrap64"]

DEFAULT_SLICE = 256
STREAM_FIRST = 4
"""The first slice of a sequence streamed from a policy that cannot call back per token, in
tokens; each later one is twice the one before."""
_SLICE_SEED = 1_000_003
_STOP_TAIL = 64  # tokens decoded to look for a stop string, as the hf backend does


def wrap64(x: int) -> int:
    """``x`` as a signed 64-bit integer (seeds derived by adding stay in torch's range)."""
    return ((x + (1 << 63)) % (1 << 64)) - (1 << 63)


class UpdateGate:
    """A lock for weight updates that waits until no sequence is part-way generated."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.waiting = 0
        self._updating = False
        self._generating = False
        self.partial = 0  # sequences with a slice done and more to come (the batcher's count)

    def __enter__(self) -> "UpdateGate":
        with self._cond:
            self.waiting += 1
            self._cond.notify_all()
            try:
                self._cond.wait_for(lambda: not (self._updating or self._generating
                                                 or self.partial))
            finally:
                self.waiting -= 1
            self._updating = True
        return self

    def __exit__(self, *exc: Any) -> None:
        with self._cond:
            self._updating = False
            self._cond.notify_all()

    def begin_batch(self) -> None:
        with self._cond:
            self._cond.wait_for(lambda: not self._updating)
            self._generating = True

    def end_batch(self, partial: int) -> None:
        with self._cond:
            self._generating = False
            self.partial = partial
            self._cond.notify_all()

    def hold(self) -> None:
        """With nothing part-way generated: let the waiting updates run, then return."""
        with self._cond:
            self.partial = 0
            self._cond.notify_all()
            self._cond.wait_for(lambda: not (self.waiting or self._updating))


@dataclass
class _Group:
    """One request's sequences."""

    pending: deque = field(default_factory=deque)
    failed: bool = False


@dataclass
class _Seq:
    request: GenerationRequest
    future: Future
    group: _Group
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] | None = field(default_factory=list)
    slices: int = 0
    index: int = 0
    watch: Callable[[int, list[int], list[float] | None], None] | None = None
    streamed: int = 0  # tokens handed to ``watch`` so far


class Ticket:
    """The futures of one request's sequences; ``cancel()`` drops what is not finished."""

    def __init__(self, futures: list[Future], group: _Group) -> None:
        self.futures, self._group = futures, group

    def cancel(self) -> None:
        """Drop the request: what is queued never generates again (a client that went away
        frees its slot). A streamed sequence (submitted with ``watch``) inside the running
        batch ends at its next token with a policy that streams per token (``hf``, ``vllm``:
        its hook answers False); any other ends with that slice. Either way its future
        fails with "the request was cancelled" and it counts in ``cancelled``."""
        self._group.failed = True
        for f in self.futures:
            f.cancel()


class FairBatcher:
    """One collector thread generating batches for ``policy`` (module docstring)."""

    def __init__(self, policy: Policy, window: float, max_batch: int, gate: UpdateGate,
                 slice_tokens: int = DEFAULT_SLICE) -> None:
        if window < 0 or max_batch < 1 or slice_tokens < 0:
            raise PolicyError("batch_window must be >= 0, max_batch >= 1, slice_tokens >= 0")
        self.policy, self.window, self.max_batch = policy, window, max_batch
        self.gate, self.slice_tokens = gate, slice_tokens
        self.per_token = "stream" in getattr(policy, "capabilities", ())
        self._cond = threading.Condition()
        self._line: deque[_Group] = deque()  # groups with sequences waiting, in turn order
        self._waiting = 0
        self._stop = False
        self.batches = self.requests = self.largest = self.failed_batches = self.slices = 0
        self.cancelled = 0  # sequences dropped, queued or mid-batch: their request went away
        self._thread = threading.Thread(target=self._run, name="spadekit-serve-batcher",
                                        daemon=True)
        self._thread.start()

    def submit(self, requests: list[GenerationRequest],
               watch: Callable[[int, list[int], list[float] | None], None] | None = None
               ) -> Ticket:
        """Queue one request's sequences; ``watch`` streams them (module docstring)."""
        group = _Group()
        futures = []
        with self._cond:
            if self._stop:
                raise PolicyError("the server is shutting down")
            for i, r in enumerate(requests):
                fut: Future = Future()
                futures.append(fut)
                group.pending.append(_Seq(r, fut, group, index=i, watch=watch))
            if group.pending:
                self._line.append(group)
                self._waiting += len(group.pending)
                self._cond.notify_all()
        return Ticket(futures, group)

    def stats(self) -> dict[str, Any]:
        with self._cond:
            return {"requests": self.requests, "batches": self.batches,
                    "largest_batch": self.largest, "failed_batches": self.failed_batches,
                    "slices": self.slices, "queued": self._waiting,
                    "cancelled": self.cancelled}

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(timeout=30)
        with self._cond:  # anything still queued gets an error, not a hang
            for group in self._line:
                for seq in group.pending:
                    _fail(seq, PolicyError("the server is shutting down"))
            self._line.clear()
            self._waiting = 0

    # -- the collector --------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._stop or self._waiting)
                if self._stop:
                    return
                deadline = time.monotonic() + self.window
                while self._waiting < self.max_batch and not self._stop:
                    left = deadline - time.monotonic()
                    if left <= 0 or not self._cond.wait(left):
                        break
                if self._stop:
                    return
            if self.gate.waiting and not self._count_partial():
                self.gate.hold()  # a weight update goes first
                continue
            batch = self._take(admit=not self.gate.waiting)
            self.gate.begin_batch()
            try:
                if batch:
                    self._generate(batch)
            finally:
                self.gate.end_batch(self._count_partial())

    def _count_partial(self) -> int:
        with self._cond:
            return sum(1 for g in self._line for s in g.pending if s.slices)

    def _take(self, admit: bool) -> list[_Seq]:
        """Up to ``max_batch`` sequences, round-robin over the groups in line (only those
        already under way when ``admit`` is false)."""
        batch: list[_Seq] = []
        with self._cond:
            passed: deque[_Group] = deque()
            while self._line and len(batch) < self.max_batch:
                group = self._line.popleft()
                if group.failed:
                    for seq in group.pending:
                        self._drop(seq)
                    self._waiting -= len(group.pending)
                    group.pending.clear()
                    continue
                pick = 0 if admit else next(
                    (k for k, s in enumerate(group.pending) if s.slices), None)
                if pick is None:  # nothing of this group is under way: it waits
                    passed.append(group)
                    continue
                batch.append(group.pending[pick])
                del group.pending[pick]
                self._waiting -= 1
                if group.pending:
                    self._line.append(group)
            self._line.extendleft(reversed(passed))
        return batch

    def _requeue(self, seqs: list[_Seq]) -> None:
        with self._cond:
            for seq in seqs:
                if self._stop:
                    _fail(seq, PolicyError("the server is shutting down"))
                    continue
                if not seq.group.pending:
                    self._line.append(seq.group)
                seq.group.pending.append(seq)
                self._waiting += 1
            self._cond.notify_all()

    def _slice_request(self, seq: _Seq) -> tuple[GenerationRequest, bool]:
        """The request for ``seq``'s next generation, and whether it is the whole sequence."""
        r = seq.request
        size = self.slice_tokens
        sliced_stream = seq.watch is not None and size and not self.per_token
        if sliced_stream:  # short slices first, then doubling
            size = min(size, STREAM_FIRST << min(seq.slices, 30))
        elif self.slice_tokens == 0 or (seq.slices == 0
                                        and r.params.max_new_tokens <= self.slice_tokens):
            return self._watched(seq, r), True
        p = r.params
        budget = min(size, p.max_new_tokens - len(seq.tokens))
        seed = None if p.seed is None else wrap64(p.seed + _SLICE_SEED * seq.slices)
        params = SamplingParams(temperature=p.temperature, top_p=p.top_p, max_new_tokens=budget,
                                stop=p.stop, seed=seed)
        return self._watched(seq, GenerationRequest(
            prompt_ids=list(r.prompt_ids or []) + seq.tokens, params=params)), False

    def _watched(self, seq: _Seq, r: GenerationRequest) -> GenerationRequest:
        """``r`` with the per-token hook of a streamed sequence (a policy that streams)."""
        if seq.watch is None or not self.per_token:
            return r
        return dataclasses.replace(r, on_token=lambda tok, lp: self._emit(seq, [tok], [lp]))

    def _emit(self, seq: _Seq, tokens: list[int], logprobs: list[float] | None) -> bool:
        """Hands ``tokens`` to the sequence's watcher; False once its request is dropped
        (cancelled, its client gone, or a broken watcher): a policy that streams per token
        may then stop generating it (``GenerationRequest.on_token``)."""
        if seq.group.failed:
            return False
        seq.streamed += len(tokens)
        try:
            seq.watch(seq.index, tokens, logprobs)
        except Exception:  # a broken watcher drops its request, never the batcher
            seq.group.failed = True
            return False
        return True

    def _drop(self, seq: _Seq) -> None:
        """Fail a sequence whose request went away (queued, about to run or mid-batch) and
        count it in ``cancelled``."""
        _fail(seq, PolicyError("the request was cancelled"))
        with self._cond:  # reentrant: _take calls this with it held
            self.cancelled += 1

    def _generate(self, batch: list[_Seq]) -> None:
        live = []
        for seq in batch:
            if seq.group.failed or seq.future.cancelled():
                self._drop(seq)
            elif seq.slices or seq.future.set_running_or_notify_cancel():
                live.append(seq)
        if not live:
            return
        planned = [self._slice_request(s) for s in live]
        reqs = [r for r, _whole in planned]
        with self._cond:
            self.batches += 1
            self.requests += sum(1 for s in live if s.slices == 0)
            self.largest = max(self.largest, len(live))
        streamed = [s.streamed for s in live]
        try:
            out = self.policy.generate(reqs)
            if len(out) != len(reqs):
                raise PolicyError(f"the policy returned {len(out)} generations for "
                                  f"{len(reqs)} requests")
            results: list[Any] = list(out)
        except Exception as exc:  # isolate the failing request(s)
            with self._cond:
                self.failed_batches += 1
            if len(reqs) == 1:
                results = [exc]
            else:
                results = []
                for seq, r, before in zip(live, reqs, streamed):
                    if seq.streamed != before:  # tokens already went out: no second draw
                        results.append(PolicyError(f"generation failed mid-stream: {exc}"))
                        continue
                    try:
                        results.append(self.policy.generate([r])[0])
                    except Exception as one_exc:
                        results.append(one_exc)
        again = []
        for seq, (_r, whole), g in zip(live, planned, results):
            if isinstance(g, BaseException):
                seq.group.failed = True
                _fail(seq, g)
            elif seq.group.failed:  # dropped while it ran (maybe cut short: its hook said so)
                self._drop(seq)
            elif whole:  # one whole, unsliced generation
                seq.future.set_result(g)
            elif self._advance(seq, g):
                again.append(seq)
        with self._cond:
            self.slices += sum(1 for _r, whole in planned if not whole)
        self._requeue(again)

    def _advance(self, seq: _Seq, g: Generation) -> bool:
        """Add a slice's tokens to ``seq``; True when it goes on, else its future is set."""
        start = len(seq.tokens)
        seq.tokens.extend(g.token_ids)
        if seq.logprobs is not None and g.logprobs is not None:
            seq.logprobs.extend(g.logprobs)
        else:
            seq.logprobs = None
        seq.slices += 1
        p = seq.request.params
        finish = "stop" if g.finish_reason == "stop" else ""
        if p.stop and start:  # a stop string across the slice boundary
            tok = self.policy.tokenizer
            for k in range(start, min(len(seq.tokens), start + _STOP_TAIL)):
                tail = tok.decode(seq.tokens[max(0, k + 1 - _STOP_TAIL):k + 1],
                                  skip_special_tokens=True)
                if cut_at_stop(tail, p.stop)[1]:
                    del seq.tokens[k + 1:]
                    if seq.logprobs is not None:
                        del seq.logprobs[k + 1:]
                    finish = "stop"
                    break
        if not finish and g.token_ids and len(seq.tokens) < p.max_new_tokens:
            if seq.watch is not None and not self.per_token:
                self._emit(seq, seq.tokens[seq.streamed:], None if seq.logprobs is None
                           else seq.logprobs[seq.streamed:])
            return True
        text = self.policy.tokenizer.decode(seq.tokens, skip_special_tokens=True)
        text, _ = cut_at_stop(text, p.stop)
        seq.future.set_result(Generation(
            prompt_ids=list(seq.request.prompt_ids or []), token_ids=seq.tokens,
            logprobs=seq.logprobs, text=text, finish_reason=finish or "length"))
        return False


def _fail(seq: _Seq, exc: BaseException) -> None:
    if seq.future.done():
        return
    if not seq.future.running() and not seq.future.set_running_or_notify_cancel():
        return  # cancelled
    seq.future.set_exception(exc)
