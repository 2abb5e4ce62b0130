"""What exporting and re-reading a pool costs, against writing and reading the same bytes bare.

Usage: python3 benchmarks/pool_export.py [--programs 1000] [--repeat 3]

A pool directory of ``--programs`` distinct programs (the reference library's games, validated
in the sandbox once, each made distinct by a comment line, with hints) is exported three ways,
each timed in this process, best of ``--repeat``:

- baseline: the bare route, the same game files written and a one-line-a-game JSON manifest,
  each file hashed (what any export must at least do);
- ``spadekit pool export --format release`` (``export_pool(parquet=False)``);
- ``spadekit pool export`` (the release plus the parquet and the card);
- reading back: ``read_release`` (every checksum verified, every record checked) against
  reading the same files and hashing them bare; ``datasets.load_dataset`` of the export.

Prints each time and its ratio to the baseline; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def make_pool(root: Path, n: int) -> Path:
    from spadekit.envs.library import list_library, program
    from spadekit.runs.pool import write_pool

    from spadekit.sandbox import SandboxPool
    from spadekit.sandbox.validate import Validator

    base = [program(e) for e in list_library() if e.setting == "games"]
    with Validator(SandboxPool(warm=1)) as validator:  # each variant adds only a comment line
        reports = validator.validate_many(base, workers=2)
    entries = []
    for i in range(n):
        p, report = base[i % len(base)], reports[i % len(base)]
        variant = type(p)(code=p.code + f"\n# variant {i}\n", hint=p.hint, skill=p.skill,
                          domain=p.domain, class_name=p.class_name, source=f"bench:{i}")
        entries.append((variant, dataclasses.replace(report, program=variant)))
    write_pool(root / "pool", entries)
    return root / "pool"


def bare_export(pool: Path, out: Path) -> None:
    from spadekit.runs.pool import load_pool

    shutil.rmtree(out, ignore_errors=True)
    (out / "games").mkdir(parents=True)
    lines = []
    for i, p in enumerate(load_pool(pool)):
        data = p.code.encode()
        (out / "games" / f"game_{i:05d}.py").write_bytes(data)
        lines.append(json.dumps({"sha256": hashlib.sha256(data).hexdigest(), "hint": p.hint,
                                 "skill": p.skill}) + "\n")
    (out / "manifest.jsonl").write_text("".join(lines))


def bare_read(out: Path) -> int:
    n = 0
    for path in sorted((out / "games").iterdir()):
        hashlib.sha256(path.read_bytes()).hexdigest()
        n += 1
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--programs", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    from spadekit.runs.pool_export import export_pool
    from spadekit.runs.release import read_release

    with tempfile.TemporaryDirectory(prefix="pool-export-bench-") as tmp:
        root = Path(tmp)
        pool = make_pool(root, args.programs)
        t_bare = best(lambda: bare_export(pool, root / "bare"), args.repeat)
        t_release = best(lambda: export_pool(pool, root / "release", parquet=False, force=True),
                         args.repeat)
        t_all = best(lambda: export_pool(pool, root / "all", force=True), args.repeat)
        t_bare_read = best(lambda: bare_read(root / "bare"), args.repeat)
        t_read = best(lambda: read_release(root / "release"), args.repeat)
        n_read = len(read_release(root / "release")[0])
        t_load = None
        try:
            import datasets

            datasets.disable_progress_bars()
            cache = root / "hf-cache"
            t_load = best(lambda: datasets.load_dataset(str(root / "all"), split="train",
                                                        cache_dir=str(cache)), 1)
        except ImportError:
            pass
    result = {
        "programs": args.programs, "read_back": n_read,
        "bare_export_s": round(t_bare, 3), "release_export_s": round(t_release, 3),
        "full_export_s": round(t_all, 3), "release_vs_bare": round(t_release / t_bare, 2),
        "full_vs_bare": round(t_all / t_bare, 2), "bare_read_s": round(t_bare_read, 3),
        "read_release_s": round(t_read, 3), "read_vs_bare": round(t_read / t_bare_read, 2),
        "load_dataset_s": None if t_load is None else round(t_load, 3)}
    print(f"export of {args.programs} programs: bare {t_bare:.3f} s, release {t_release:.3f} s "
          f"({result['release_vs_bare']}x), release + dataset {t_all:.3f} s "
          f"({result['full_vs_bare']}x)")
    print(f"read back: bare {t_bare_read:.3f} s, read_release (verified) {t_read:.3f} s "
          f"({result['read_vs_bare']}x); datasets.load_dataset "
          f"{'-' if t_load is None else f'{t_load:.3f} s'}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
