"""Worker side of the reference-contract compatibility layer (``SandboxConfig.compat``).

Programs written for the SPADE reference contract use standard-library names without importing
them (``random``, ``deque``, ``Tuple``...), numpy as ``np``, math_verify's ``parse``/``verify``
and a pre-loaded ``ToolUseBaseEnv`` (:mod:`spadekit.envs.refbase`). :func:`prepare` binds, before
a program's module code runs, only the names its code objects read as globals; third-party names
only when the package is on the worker's allowlist, imported at load time, never mid-step.
:class:`AllowlistFinder` is the import gate for third-party packages: site-packages is never on a
worker's ``sys.path``. Standard library only and cheap to import: the worker imports it at boot.
"""

import sys

__all__ = ["AllowlistFinder", "INJECTABLE", "accepts_keyword", "prepare", "reads_global",
           "referenced_names"]

_STDLIB_MODULES = ("itertools", "math", "random", "re", "json", "collections", "functools",
                   "string", "copy", "heapq", "operator", "statistics", "bisect", "fractions",
                   "decimal", "datetime", "time", "textwrap", "dataclasses", "enum", "typing",
                   "abc")
_FROM = {
    "collections": ("deque", "defaultdict", "Counter", "OrderedDict", "namedtuple"),
    "itertools": ("combinations", "permutations", "product", "chain", "accumulate"),
    "functools": ("reduce", "lru_cache", "partial", "cache"),
    "copy": ("deepcopy",),
    "heapq": ("heappush", "heappop", "heapify"),
    "dataclasses": ("dataclass", "field"),
    "fractions": ("Fraction",),
    "typing": ("Tuple", "Dict", "List", "Optional", "Union", "Any", "Set", "FrozenSet",
               "Callable", "Iterable", "Sequence", "Mapping"),
}
INJECTABLE = {name: (name, None) for name in _STDLIB_MODULES}
"""Name usable without an import -> (module, attribute or None for the module itself)."""
for _module, _names in _FROM.items():
    INJECTABLE.update({_name: (_module, _name) for _name in _names})
THIRD_PARTY = {"np": ("numpy", None), "numpy": ("numpy", None),
               "parse": ("math_verify", "parse"), "verify": ("math_verify", "verify")}
"""Names backed by an allowlisted third-party package (imported at load, when read)."""
BASE_NAMES = ("ToolUseBaseEnv",)
BASE_MODULE = "tool_use_base_env"


def referenced_names(code):
    """Every name the code object (and the code nested in it) mentions: globals, attributes and
    imported names. A superset of what it reads as globals, found without parsing again."""
    names, stack = set(), [code]
    while stack:
        item = stack.pop()
        names.update(item.co_names)
        names.update(item.co_varnames)
        stack.extend(c for c in item.co_consts if hasattr(c, "co_names"))
    return names


def _allowed(package):
    finder = next((f for f in sys.meta_path if isinstance(f, AllowlistFinder)), None)
    return finder is not None and package in finder.roots


def reads_global(code, name):
    """True when ``code`` (or code nested in it) reads ``name`` as a global, not merely as an
    attribute (``self.parse``). Only called for the few third-party names, so ``dis`` is
    imported only by programs that mention one."""
    import dis

    stack = [code]
    while stack:
        item = stack.pop()
        if name in item.co_names:
            for ins in dis.get_instructions(item):
                if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME") and ins.argval == name:
                    return True
        stack.extend(c for c in item.co_consts if hasattr(c, "co_names"))
    return False


def prepare(namespace, code):
    """Bind the compatibility names ``code`` mentions into ``namespace`` (before executing it);
    returns the names bound, sorted."""
    wanted = referenced_names(code)
    bound = []
    for name in wanted:
        if name in namespace:
            continue
        if name in INJECTABLE:
            module, attr = INJECTABLE[name]
            __import__(module)
            value = sys.modules[module]
            namespace[name] = value if attr is None else getattr(value, attr)
        elif name in THIRD_PARTY and _allowed(THIRD_PARTY[name][0]) \
                and reads_global(code, name):
            module, attr = THIRD_PARTY[name]
            value = __import__(module)
            namespace[name] = value if attr is None else getattr(value, attr)
        else:
            continue
        bound.append(name)
    if wanted.intersection(BASE_NAMES + (BASE_MODULE,)):
        from spadekit.envs import refbase

        sys.modules.setdefault(BASE_MODULE, refbase)
        if "ToolUseBaseEnv" not in namespace:
            namespace["ToolUseBaseEnv"] = refbase.ToolUseBaseEnv
            bound.append("ToolUseBaseEnv")
    return sorted(bound)


def accepts_keyword(fn, name):
    """True when calling ``fn`` with keyword ``name`` is allowed (or cannot be told)."""
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    if code is None:
        return True
    if code.co_flags & 0x08:  # CO_VARKEYWORDS
        return True
    return name in code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]


class AllowlistFinder:
    """A ``sys.meta_path`` finder for allowlisted top-level modules only.

    ``roots`` maps each importable top-level name to the directory holding it; submodules are
    found the usual way, through the package's ``__path__``. ``dists`` names the distributions
    whose metadata may be read."""

    def __init__(self, roots, dists=None):
        self.roots = dict(roots)
        self.dists = dict(dists or {})
        self.found = []

    def find_spec(self, fullname, path=None, target=None):
        if path is not None or fullname not in self.roots:
            return None
        from importlib.machinery import PathFinder

        spec = PathFinder.find_spec(fullname, [self.roots[fullname]])
        if spec is not None and fullname not in self.found:
            self.found.append(fullname)
        return spec

    def find_distributions(self, context=None):
        """The metadata (``importlib.metadata``) of the allowlisted distributions only, which
        some packages read while importing (latex2sympy2 checks its ANTLR runtime's version)."""
        from importlib.metadata import PathDistribution
        from pathlib import Path

        name = getattr(context, "name", None)
        key = None if name is None else name.replace("-", "_").replace(".", "_").lower()
        for dist_name, info_dir in self.dists.items():
            if key is None or key == dist_name:
                yield PathDistribution(Path(info_dir))


def install_finder(roots, dists=None):
    """Put an :class:`AllowlistFinder` for ``roots`` (top-level module -> directory) and
    ``dists`` (normalised distribution name -> its ``.dist-info`` directory) at the end of
    ``sys.meta_path``."""
    if roots:
        sys.meta_path.append(AllowlistFinder(roots, dists))
