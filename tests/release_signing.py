"""Re-sign a release directory the way an adversary who controls it would: ``checksums.sha256``
rewritten over every other file, so a test reaches the checks behind the checksums."""

from __future__ import annotations

from pathlib import Path

from spadekit.runs.release import CHECKSUMS, sha256_file


def resign(root: Path) -> None:
    """Rewrite ``root``'s ``checksums.sha256`` so that every other file in it matches."""
    listed = sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                    if p.is_file() and p.name != CHECKSUMS)
    (root / CHECKSUMS).write_text("".join(f"{sha256_file(root / rel)}  {rel}\n"
                                          for rel in listed))
