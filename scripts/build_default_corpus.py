"""Build the default corpus spadekit ships, ``src/spadekit/selfplay/data/default_corpus.jsonl.gz``.

Run by maintainers at release (and whenever the module list below or the document format
changes), from the repository root, with the Python the release is built on:

    python scripts/build_default_corpus.py            # rewrite the shipped file
    python scripts/build_default_corpus.py --check    # exit 1 when a rebuild would change it
    python scripts/build_default_corpus.py --out F    # write elsewhere (tests)

The documents are the docstrings, with at least ``MIN_PROSE_WORDS`` prose words, of the standard
library modules in ``STDLIB_MODULES``: each module's own, its public functions and classes and
their public methods, ``"<qualname><signature>\\n\\n<docstring>"`` with id ``stdlib:<qualname>``,
modules and names in sorted order, a docstring seen before (aliases, re-exports) kept once.
They are harvested in a fresh interpreter started as ``python -S -s -P`` with an empty
environment but ``PYTHONHASHSEED=0`` (``-I``'s isolation with a fixed hash seed: no site, so no
third-party package is importable and none can patch the standard library); this process then
writes the file with ``spadekit.selfplay.corpus.write_corpus_file`` (sorted, compact JSON, gzip
with mtime 0 and no file name), so the same Python gives the same bytes. The text is CPython's,
under the PSF License Agreement, which permits redistribution with its notice: the file's header
line carries it, and ``data/README.md`` says which Python built the file and how.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "src" / "spadekit" / "selfplay" / "data" / "default_corpus.jsonl.gz"

#: Standard library modules whose documentation makes up the default corpus.
STDLIB_MODULES: tuple[str, ...] = (
    "argparse", "array", "ast", "asyncio", "base64", "bisect", "calendar", "cmath", "codecs",
    "collections", "colorsys", "concurrent.futures", "configparser", "copy", "csv",
    "dataclasses", "datetime", "decimal", "difflib", "email.message", "enum", "fractions",
    "ftplib", "functools", "graphlib", "hashlib", "heapq", "html", "http.client", "http.cookies",
    "imaplib", "inspect", "ipaddress", "itertools", "json", "logging", "math", "mimetypes",
    "numbers", "operator", "pickle", "pprint", "queue", "random", "re", "sched", "secrets",
    "shlex", "shutil", "smtplib", "sqlite3", "statistics", "string", "struct", "tarfile",
    "tempfile", "textwrap", "threading", "time", "timeit", "tokenize", "unicodedata",
    "urllib.parse", "urllib.request", "uuid", "wave", "xml.etree.ElementTree", "zipfile", "zlib",
)
#: A docstring enters the corpus only with at least this many prose words.
MIN_PROSE_WORDS = 60

NOTICE = ("Text: docstrings of the Python {python} standard library. {copyright} All Rights "
          "Reserved. Redistributed under the PSF License Agreement "
          "(https://docs.python.org/3/license.html). Built by scripts/build_default_corpus.py.")
DESCRIPTION = ("docstrings (>= {words} prose words) of {n} Python standard library modules, "
               "shipped with spadekit")


# -- harvest: runs in the isolated interpreter, standard library only -------------------------


def harvest(modules: list[str], min_words: int) -> list[list[str]]:
    """``[id, text, source]`` of every document, in order, duplicates dropped."""
    import importlib
    import inspect
    import re

    prose = re.compile(r"[A-Za-z][A-Za-z'-]+")
    address = re.compile(r" at 0x[0-9a-fA-F]+>")

    def signature(obj):
        # memory addresses in default values' reprs (<object object at 0x7f...>) change with
        # every process: taken out
        try:
            return address.sub(">", str(inspect.signature(obj)))
        except (TypeError, ValueError):
            return ""

    def native(obj, modname):
        # only what belongs to the module's own package: re-exports of other modules' members
        # would make one module's documents depend on another's
        owner = getattr(obj, "__module__", None)
        if not isinstance(owner, str):
            return True  # C functions of the module itself
        root = modname.split(".")[0]
        return (owner == root or owner.startswith(root + ".")
                or owner.lstrip("_").split(".")[0] == root.lstrip("_"))

    def members(module):
        names = getattr(module, "__all__", None)
        if not isinstance(names, (list, tuple)):
            names = [n for n in dir(module) if not n.startswith("_")]
        for name in sorted({str(n) for n in names}):
            try:
                obj = getattr(module, name)
            except Exception:  # noqa: BLE001 - a lazy attribute that does not import
                continue
            if not inspect.ismodule(obj) and native(obj, module.__name__) and callable(obj):
                yield name, obj

    docs: list[list[str]] = []
    for modname in sorted(set(modules)):
        module = importlib.import_module(modname)

        def add(qualname, obj, header):
            doc = inspect.getdoc(obj)
            if isinstance(doc, str) and len(prose.findall(doc)) >= min_words:
                docs.append([f"stdlib:{qualname}", f"{header}\n\n{doc.strip()}\n",
                             f"stdlib:{modname}"])

        add(modname, module, f"Module {modname}")
        for name, obj in members(module):
            qual = f"{modname}.{name}"
            if inspect.isclass(obj):
                add(qual, obj, f"class {qual}{signature(obj)}")
                for meth_name, meth in sorted(vars(obj).items()):
                    if not meth_name.startswith("_") and callable(meth) \
                            and native(meth, modname):
                        add(f"{qual}.{meth_name}", meth, f"{qual}.{meth_name}{signature(meth)}")
            else:
                add(qual, obj, f"{qual}{signature(obj)}")
    seen: set[str] = set()
    unique = []
    for row in docs:
        body = row[1].split("\n\n", 1)[-1]
        if body not in seen:
            seen.add(body)
            unique.append(row)
    return unique


def harvest_isolated() -> dict:
    """:func:`harvest` in a fresh ``python -S -s -P`` (empty environment, hash seed 0), with
    that interpreter's version, platform and zlib."""
    done = subprocess.run(
        [sys.executable, "-S", "-s", "-P", str(Path(__file__).resolve()), "--harvest",
         str(MIN_PROSE_WORDS), *STDLIB_MODULES],
        capture_output=True, text=True, check=True, timeout=600, cwd="/",
        env={"PYTHONHASHSEED": "0"})
    return json.loads(done.stdout)


# -- write: this process, with spadekit importable ----------------------------------------------


def build(out: Path) -> dict:
    sys.path.insert(0, str(ROOT / "src"))
    import spadekit
    from spadekit.selfplay.corpus import Document, write_corpus_file

    got = harvest_isolated()
    docs = [Document(*row) for row in got["docs"]]
    info = {"built_by": "scripts/build_default_corpus.py", "spadekit": spadekit.__version__,
            "python": got["python"], "platform": got["platform"], "zlib": got["zlib"],
            "stdlib_modules": list(STDLIB_MODULES), "min_prose_words": MIN_PROSE_WORDS}
    digest = write_corpus_file(
        out, docs, name="default",
        description=DESCRIPTION.format(words=MIN_PROSE_WORDS, n=len(STDLIB_MODULES)),
        info=info, notice=NOTICE.format(python=got["python"], copyright=got["copyright"]))
    return {"path": str(out), "documents": len(docs), "bytes": out.stat().st_size,
            "digest": digest, "python": got["python"]}


def main() -> None:
    if sys.argv[1:2] == ["--harvest"]:  # the isolated child
        import platform
        import zlib

        docs = harvest(sys.argv[3:], int(sys.argv[2]))
        json.dump({"docs": docs, "python": platform.python_version(), "platform": sys.platform,
                   "zlib": zlib.ZLIB_RUNTIME_VERSION,
                   "copyright": sys.copyright.split("\n")[0]}, sys.stdout)
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=TARGET, help="where to write (default: the "
                    "shipped file)")
    ap.add_argument("--check", action="store_true", help="build to a temporary file and exit 1 "
                    "when it differs from the shipped one")
    args = ap.parse_args()
    if args.check:
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            result = build(Path(tmp) / TARGET.name)
            same = Path(result["path"]).read_bytes() == TARGET.read_bytes()
        print(json.dumps({**result, "path": str(TARGET), "same": same}))
        sys.exit(0 if same else 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    print(json.dumps(build(args.out)))


if __name__ == "__main__":
    main()
