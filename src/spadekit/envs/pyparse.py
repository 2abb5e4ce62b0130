"""``ast.parse`` safe to call from several threads.

CPython 3.11 keeps part of the AST builder's recursion bookkeeping in interpreter-wide state, so
two threads parsing at once can fail with ``SystemError: AST constructor recursion depth
mismatch`` (CPython gh-106905). spadekit parses model-written programs from worker threads, so
every parse goes through one lock, and that one error is retried once (code outside spadekit can
still race with ours).
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
