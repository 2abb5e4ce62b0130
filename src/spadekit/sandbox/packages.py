"""Which third-party packages sandbox workers may import (``SandboxConfig.packages``).

Workers run with site-packages off (``python -I -S``). :func:`resolve` turns the allowlist
(import or distribution names) into exactly what importing them needs: the closure over required
distributions, their top-level modules and ``.dist-info`` directories; a name not installed is
left out (``Resolved.missing``). :func:`for_workers` puts those paths into one world-readable,
owner-only-writable directory ``/var/tmp/spadekit-pkgs-<uid>-<key>`` (hard links or copies),
built once per host and set of versions; the worker's ``AllowlistFinder``, its Landlock rules
and bwrap's binds all point there.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Resolved", "for_workers", "resolve"]

_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


@dataclass(frozen=True)
class Resolved:
    """The resolved allowlist: importable top-level names, metadata directories, paths."""

    roots: dict[str, str] = field(default_factory=dict)
    """Top-level module name -> the directory holding it."""
    dists: dict[str, str] = field(default_factory=dict)
    """Normalised distribution name -> its ``.dist-info`` directory."""
    paths: tuple[str, ...] = ()
    """Every file and directory a worker must be able to read (sorted)."""
    missing: tuple[str, ...] = ()
    """Allowlisted names that are not installed here."""

    def worker_config(self) -> dict:
        """The ``packages`` entry of a worker's boot config."""
        return {"roots": dict(self.roots), "dists": dict(self.dists)}


@functools.lru_cache(maxsize=1)
def _owners() -> dict[str, list[str]]:
    """Import name -> the distributions that provide it (a scan of every installed
    distribution's file record: seconds with a few hundred installed, so once a process)."""
    from importlib import metadata

    return metadata.packages_distributions()


def _distribution(name: str, import_name: bool = True):
    """The installed distribution named ``name``, or, when ``import_name``, the one that
    provides the top-level module ``name`` (``yaml`` -> PyYAML); None when there is none. A
    requirement is a distribution name, so it is looked up with ``import_name=False``: one that
    is not installed (its marker excluded it here) costs no scan."""
    from importlib import metadata

    for candidate in (name, name.replace("_", "-")):
        try:
            return metadata.distribution(candidate)
        except metadata.PackageNotFoundError:
            pass
    if not import_name:
        return None
    owners = _owners().get(name) or []
    for owner in owners:
        try:
            return metadata.distribution(owner)
        except metadata.PackageNotFoundError:
            pass
    return None


def _requirements(dist) -> list[str]:
    out = []
    for req in dist.requires or []:
        spec, _sep, marker = req.partition(";")
        if "extra" in marker:
            continue
        match = _NAME.match(spec)
        if match:
            out.append(match.group(1))
    return out


@functools.lru_cache(maxsize=8)
def resolve(names: tuple[str, ...]) -> Resolved:
    """Resolve the allowlist ``names`` (see the module docstring); cached per allowlist."""
    todo, seen, dists, missing = list(names), set(), [], []
    allowlisted = set(names)
    while todo:
        name = todo.pop(0)
        if _norm(name) in seen:
            continue
        seen.add(_norm(name))
        dist = _distribution(name, import_name=name in allowlisted)
        if dist is None:
            if name in names:
                missing.append(name)
            continue
        seen.add(_norm(dist.metadata["Name"] or name))
        dists.append(dist)
        todo.extend(_requirements(dist))
    roots: dict[str, str] = {}
    infos: dict[str, str] = {}
    paths: set[str] = set()
    for dist in dists:
        base = Path(dist.locate_file("")).resolve()
        tops: set[tuple[str, bool]] = set()  # (first path part, whether it is the whole path)
        for item in dist.files or []:
            # a record's paths are relative, "/"-separated (strings, not Paths: numpy and sympy
            # record thousands of files, and pathlib's parsing took seconds a process)
            text = str(item).replace("\\", "/")
            if not text or text.startswith("/"):
                continue
            top, sep, _rest = text.partition("/")
            if top and top not in ("..", ".", "__pycache__"):
                tops.add((top, not sep))
        name = dist.metadata["Name"]
        for top, whole in sorted(tops):
            path = str(base / top)
            if top.endswith(".dist-info"):
                infos[_norm(name or top.split("-")[0])] = path
                paths.add(path)
                continue
            if whole and top.endswith(".pth"):
                continue
            module = top.split(".")[0] if whole else top
            if module.isidentifier():
                roots.setdefault(module, str(base))
            paths.add(path)
    return Resolved(roots, infos, tuple(sorted(paths)), tuple(missing))


def _key(resolved: Resolved) -> str:
    digest = hashlib.sha256()
    for path in resolved.paths:
        try:
            mtime = os.stat(path).st_mtime_ns
        except OSError:
            mtime = 0
        digest.update(f"{path}\0{mtime}\n".encode())
    return digest.hexdigest()[:16]


def _link_tree(src: str, dst: str) -> None:
    def link(a: str, b: str) -> None:
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)

    if os.path.isdir(src):
        shutil.copytree(src, dst, copy_function=link, symlinks=False)
    else:
        link(src, dst)


def _trusted(path: str) -> bool:
    st = os.lstat(path)
    return os.path.isdir(path) and not os.path.islink(path) and st.st_uid == os.getuid() \
        and not st.st_mode & 0o022


def _publish(tree: str) -> None:
    for dirpath, dirnames, filenames in os.walk(tree):
        os.chmod(dirpath, 0o755)
        for name in filenames:
            path = os.path.join(dirpath, name)
            if os.stat(path).st_nlink == 1:  # our copy; a hard link keeps its own (readable) mode
                os.chmod(path, 0o644 | (0o111 if os.access(path, os.X_OK) else 0))


@functools.lru_cache(maxsize=8)
def for_workers(names: tuple[str, ...]) -> Resolved:
    """:func:`resolve` ``names``, placed where workers can read them (module docstring)."""
    resolved = resolve(names)
    if not resolved.paths:
        return resolved
    base = "/var/tmp" if os.access("/var/tmp", os.W_OK) else tempfile.gettempdir()
    target = os.path.join(base, f"spadekit-pkgs-{os.getuid()}-{_key(resolved)}")
    if not (os.path.isdir(target) and _trusted(target)):
        build = tempfile.mkdtemp(prefix=os.path.basename(target) + ".", dir=base)
        for path in resolved.paths:
            _link_tree(path, os.path.join(build, os.path.basename(path)))
        _publish(build)
        try:
            os.rename(build, target)
        except OSError:  # built by another process meanwhile, or someone else's directory
            if os.path.isdir(target) and _trusted(target):
                shutil.rmtree(build, ignore_errors=True)
            else:
                target = build
    moved = {}
    for path in resolved.paths:
        moved[path] = os.path.join(target, os.path.basename(path))
    return Resolved({m: target for m in resolved.roots},
                    {d: moved.get(p, p) for d, p in resolved.dists.items()},
                    (target,), resolved.missing)
