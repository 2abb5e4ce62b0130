"""The canonical token stream of a program: what the near-duplicate gates compare.

``canonical_tokens(code)`` parses the program with :mod:`ast`, drops docstrings (and, through
``ast.unparse``, comments and formatting), replaces every identifier *the program binds* (its
classes, functions, arguments, variables, attributes it assigns, import aliases) by one
placeholder and every string literal by another, keeping keywords, operators, numbers and the
names it only uses (builtins, ``random.Random``, ``str.split``...). Renaming, reformatting,
editing comments, docstrings or the texts shown to the player therefore leave the stream as it
was. Code that does not parse falls back to raw word/symbol tokens; never raises on text. Used
by the memory's shingle fingerprints (``spadekit.selfplay.memory``) and by the kit identity's
own-code comparison (``spadekit.selfplay.kit_identity``).
"""

from __future__ import annotations

import ast
import io
import re
import tokenize

from spadekit.envs import pyparse

__all__ = ["canonical_tokens"]

_BOUND, _STRING = "_v", "_s"
_SCOPES = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _bound_names(tree: ast.AST) -> set[str]:
    """Every name the program itself binds (so renaming it does not change behaviour)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, _DEFS):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and not isinstance(node.ctx, ast.Load):
            names.add(node.attr)
        elif isinstance(node, ast.alias) and node.asname:
            names.add(node.asname)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
    return names


def _canonicalize(tree: ast.AST) -> None:
    """In place: drop docstrings, rename bound identifiers and blank out string literals."""
    bound = _bound_names(tree)
    for node in ast.walk(tree):
        if isinstance(node, _SCOPES):
            body = node.body
            if (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                    and isinstance(body[0].value.value, str)):
                node.body = body[1:] or [ast.Pass()]
            if isinstance(node, _DEFS) and node.name in bound:
                node.name = _BOUND
        elif isinstance(node, ast.Name):
            if node.id in bound:
                node.id = _BOUND
        elif isinstance(node, ast.Attribute):
            if node.attr in bound:
                node.attr = _BOUND
        elif isinstance(node, ast.arg):
            if node.arg in bound:
                node.arg = _BOUND
        elif isinstance(node, ast.Constant):
            if isinstance(node.value, str):
                node.value = _STRING
        elif isinstance(node, ast.keyword):
            if node.arg in bound:
                node.arg = _BOUND
        elif isinstance(node, ast.alias):
            if node.asname:
                node.asname = _BOUND
        elif isinstance(node, ast.ExceptHandler):
            if node.name:
                node.name = _BOUND


_TOKEN_NAMES = {tokenize.NEWLINE: "<nl>", tokenize.INDENT: "<in>", tokenize.DEDENT: "<de>"}
_SKIP = {tokenize.NL, tokenize.COMMENT, tokenize.ENDMARKER, tokenize.ENCODING}


def canonical_tokens(code: str) -> list[str]:
    """The canonical token stream of ``code`` (see the module docstring)."""
    try:
        tree = pyparse.parse(code)
        _canonicalize(tree)
        text = ast.unparse(tree)
        return [_TOKEN_NAMES.get(t.type, t.string)
                for t in tokenize.generate_tokens(io.StringIO(text).readline)
                if t.type not in _SKIP]
    except (SyntaxError, ValueError, RecursionError, MemoryError, tokenize.TokenError):
        return re.findall(r"\w+|[^\w\s]", re.sub(r"#[^\n]*", "", code))
