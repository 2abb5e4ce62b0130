"""Time to first token of ``spadekit serve`` with ``stream=True``, against the same request unstreamed.

Usage: python3 benchmarks/serve_stream.py [--model smollm2-135m] [--tokens 128] [--repeats 3]

Serves ``--model`` (default: the bundled SmolLM2-135M when its cache is built, else ``tiny``) in
this process and asks it through the official ``openai`` client for a greedy completion of
``--tokens`` tokens (a prompt whose greedy continuation runs to the length limit, so both
requests produce the same tokens): once unstreamed (the baseline: ``plain_s``, the time to the
whole answer) and once streamed (``ttft_s``: the time to the first chunk with text; ``total_s``:
to the end of the stream), ``--repeats`` times each, medians. ``ttft_share = ttft_s / plain_s``
is the share of the whole answer's time a client waits before it sees text (target: at most
0.10 at 128 tokens); ``stream_overhead = total_s / plain_s``. The streamed text is checked to
equal the unstreamed one.

The last line printed is one JSON object with ``ttft_s``, ``total_s``, ``plain_s``,
``ttft_share``, ``stream_overhead``, ``tokens``, ``model``, ``events``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

PROMPTS = ("Once upon a time", "The", "Here is a list of", "In the beginning", "Hello",
           "Write a story about a cat.", "1, 2, 3,", "x")


def _model(name: str | None) -> str:
    if name:
        return name
    from spadekit.policy import bundled

    return "smollm2-135m" if bundled.status().get("cached") else "tiny"


def main() -> None:
    import openai

    from spadekit.policy import load_policy
    from spadekit.policy.serve import serve

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    model = _model(args.model)
    policy = load_policy(model)
    with serve(policy, model_name=model) as srv, openai.OpenAI(
            base_url=srv.url, api_key="none", max_retries=0, timeout=600) as client:
        ask = dict(model=model, max_tokens=args.tokens, temperature=0)
        prompt = None
        for p in PROMPTS:  # the same length both ways: a continuation that does not end early
            if client.completions.create(prompt=p, **ask).choices[0].finish_reason == "length":
                prompt = p
                break
        if prompt is None:
            sys.exit(f"no prompt of {PROMPTS} runs to {args.tokens} tokens greedily")
        plain, ttft, total, events = [], [], [], 0
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            text = client.completions.create(prompt=prompt, **ask).choices[0].text
            plain.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            first, parts, events = None, [], 0
            for chunk in client.completions.create(prompt=prompt, stream=True, **ask):
                if chunk.choices and chunk.choices[0].text:
                    if first is None:
                        first = time.perf_counter() - t0
                    parts.append(chunk.choices[0].text)
                    events += 1
            total.append(time.perf_counter() - t0)
            ttft.append(first if first is not None else total[-1])
            if "".join(parts) != text:
                sys.exit("the streamed text differs from the unstreamed one")
    result = {"model": model, "tokens": args.tokens, "prompt": prompt,
              "ttft_s": round(statistics.median(ttft), 4),
              "total_s": round(statistics.median(total), 4),
              "plain_s": round(statistics.median(plain), 4), "events": events}
    result["ttft_share"] = round(result["ttft_s"] / result["plain_s"], 4)
    result["stream_overhead"] = round(result["total_s"] / result["plain_s"], 3)
    print(f"time to first token {result['ttft_s']:.3f} s of {result['plain_s']:.3f} s for the "
          f"whole answer ({result['ttft_share']:.1%}); streamed total {result['total_s']:.3f} s "
          f"in {events} events")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
