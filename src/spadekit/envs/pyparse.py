"""``ast.parse`` safe to call from several threads.

CPython 3.11 keeps part of the AST builder's recursion bookkeeping in interpreter-wide state, so
two threads parsing at once can fail with ``SystemError: AST constructor recursion depth
mismatch`` (CPython gh-106905; seen here when a garbage-collection finaliser released the GIL
in the middle of one thread's parse and another thread parsed). spadekit parses model-written
programs from worker threads (``Validator.validate_many``, the rollout engine's loaders, the
Ray actors), so every parse goes through one lock, and that one error is retried once (a parse
by code outside spadekit can still race with ours). Parsing runs at ~1 MB/s: serialising it
costs nothing measurable.
"""

from __future__ import annotations

import ast
import threading

_LOCK = threading.Lock()


def parse(source: str, filename: str = "<unknown>", mode: str = "exec") -> ast.AST:
    """``ast.parse(source, filename, mode)``, one thread at a time."""
    with _LOCK:
        try:
            return ast.parse(source, filename=filename, mode=mode)
        except SystemError as exc:
            if "recursion depth mismatch" not in str(exc):
                raise
            return ast.parse(source, filename=filename, mode=mode)
