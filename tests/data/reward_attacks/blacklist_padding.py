"""ATTACK (review of issue 22): a program retired in play (blacklisted) comes back as a near
duplicate with a few lines of dead code appended; the blacklist's near-duplicate gate
(EnvironmentMemory.blacklist_reason, Jaccard of 5-token shingles >= 0.9) lets it through, so it
is validated, pooled and played again. The retired program is tests/data/hacks/batch_detector.py
(honest alone, pays anything in a lockstep batch: what the watch retires). The padding is one
unused function: the behaviour is byte-for-byte the same.

    PYTHONPATH=src timeout 120 python3 tests/data/reward_attacks/blacklist_padding.py
"""
import tempfile
from pathlib import Path

from spadekit.envs.program import EnvProgram
from spadekit.runs.store import RunStore
from spadekit.selfplay.memory import EnvironmentMemory, fingerprint, jaccard

RETIRED = (Path(__file__).resolve().parents[1] / "hacks" / "batch_detector.py").read_text()
PADDING = '''

def _unused_helper(items, limit=3, label="note"):
    """Kept for later."""
    seen = {}
    for position, item in enumerate(items):
        if position > limit:
            break
        seen[item] = seen.get(item, 0) + position
    return label, sorted(seen.items()), max(seen.values(), default=None)
'''


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        store = RunStore(Path(tmp) / "run", create=True)
        memory = EnvironmentMemory(store)
        retired = EnvProgram(code=RETIRED)
        store.add_environment(retired, step=0)
        store.blacklist(retired.sha256, "garbage_wins", 1)
        one_token = EnvProgram(code=RETIRED.replace("len(RECENT) == 6", "len(RECENT) == 6 "
                                                    "and True"))
        padded = EnvProgram(code=RETIRED + PADDING)
        for name, program in (("exact", retired), ("one-token edit", one_token),
                              ("padded", padded)):
            sim = jaccard(fingerprint(program.code), fingerprint(RETIRED))
            print(f"{name:15s} similarity {sim:.3f} blacklist_reason="
                  f"{memory.blacklist_reason(program)!r}")
        ok = memory.blacklist_reason(padded) is None
        store.close()
    print("padded near duplicate passes the blacklist" if ok else "stopped")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
