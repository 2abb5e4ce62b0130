"""What starting a run costs, and what the caches and the tests' preloaded processes save.

Usage: python3 benchmarks/startup.py [--repeats 3]

1. **Default corpus.** Built in a fresh interpreter (what every new run paid before the
   corpus was kept on disk) against read from the cache (``spadekit.selfplay.corpus_cache``),
   in this process, each ``--repeats`` times; the two must hold the same documents.
2. **A run's process.** ``benchmarks/chaos.py``'s child (the tiny model, one round: what the
   fault and resume tests start dozens of) started as a fresh ``python`` against forked from a
   preloaded interpreter (``tests/prefork.py``), alternately, ``--repeats`` times each; both
   must finish their round.

Medians; the ratios are baseline / new. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))


def corpus(repeats: int) -> dict:
    from spadekit.selfplay.corpus import _clean_default_documents, cached_default_documents

    built, cached = [], []
    docs = None
    for _ in range(repeats):
        t = time.perf_counter()
        docs, _versions = _clean_default_documents()
        built.append(time.perf_counter() - t)
    cached_default_documents()  # the cache holds this build from here on
    for _ in range(repeats):
        t = time.perf_counter()
        again, _versions = cached_default_documents()
        cached.append(time.perf_counter() - t)
    return {"corpus_build_s": round(statistics.median(built), 3),
            "corpus_cached_s": round(statistics.median(cached), 3),
            "corpus_ratio": round(statistics.median(built) / statistics.median(cached), 1),
            "corpus_same_documents": again == docs, "corpus_documents": len(docs)}


def child(repeats: int) -> dict:
    import chaos
    import prefork

    env = {**os.environ, "PYTHONPATH": chaos.SRC}
    fresh, forked, ok = [], [], True
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeats):
            for how, times in (("fresh", fresh), ("forked", forked)):
                run = Path(tmp) / f"{how}-{i}"
                cmd = [sys.executable, chaos.__file__, "--child", str(run), "--rounds", "1"]
                start = subprocess.Popen if how == "fresh" else prefork.popen
                if how == "forked" and i == 0:  # both zygotes start once, before the clock
                    for _ in range(2):
                        prefork.popen(cmd[:2] + ["--help"], env=env, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL).wait()
                t = time.perf_counter()
                proc = start(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
                out, err = proc.communicate(timeout=900)
                times.append(time.perf_counter() - t)
                ok = ok and proc.returncode == 0 and '{"done": 0}' in out
                if proc.returncode != 0:
                    print(f"{how} child failed: {err[-2000:]}", file=sys.stderr)
    prefork.close_all()
    return {"child_fresh_s": round(statistics.median(fresh), 2),
            "child_forked_s": round(statistics.median(forked), 2),
            "child_ratio": round(statistics.median(fresh) / statistics.median(forked), 2),
            "children_finished": ok}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    result = {"repeats": args.repeats, "cores": os.cpu_count()}
    result.update(corpus(args.repeats))
    print(f"default corpus: built {result['corpus_build_s']} s, from the cache "
          f"{result['corpus_cached_s']} s ({result['corpus_ratio']}x)", flush=True)
    result.update(child(args.repeats))
    print(f"a run's process, one round: fresh {result['child_fresh_s']} s, forked "
          f"{result['child_forked_s']} s ({result['child_ratio']}x)", flush=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
