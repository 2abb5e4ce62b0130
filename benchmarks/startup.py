"""What starting a run costs, and what the caches and the tests' preloaded processes save.

Usage: python3 benchmarks/startup.py [--repeats 3]

1. **Default corpus.** Harvested from the standard library's docstrings in a fresh interpreter
   (``scripts/build_default_corpus.py``: what the maintainers do once a release) against read
   from the file spadekit ships (what every new run does), each ``--repeats`` times; the two
   must hold the same documents.
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
sys.path.insert(0, str(ROOT / "scripts"))


def corpus(repeats: int) -> dict:
    import build_default_corpus as builder

    from spadekit.selfplay.corpus import DEFAULT_CORPUS_FILE, read_corpus_file

    built, shipped = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        rows = builder.harvest_isolated()["docs"]
        built.append(time.perf_counter() - t)
    for _ in range(repeats):
        t = time.perf_counter()
        docs, _header = read_corpus_file(DEFAULT_CORPUS_FILE)
        shipped.append(time.perf_counter() - t)
    return {"corpus_build_s": round(statistics.median(built), 3),
            "corpus_shipped_s": round(statistics.median(shipped), 3),
            "corpus_ratio": round(statistics.median(built) / statistics.median(shipped), 1),
            "corpus_same_documents": [[d.id, d.text, d.source] for d in docs] == rows,
            "corpus_documents": len(docs)}


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
    print(f"default corpus: harvested {result['corpus_build_s']} s, read from the shipped file "
          f"{result['corpus_shipped_s']} s ({result['corpus_ratio']}x)", flush=True)
    result.update(child(args.repeats))
    print(f"a run's process, one round: fresh {result['child_fresh_s']} s, forked "
          f"{result['child_forked_s']} s ({result['child_ratio']}x)", flush=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
