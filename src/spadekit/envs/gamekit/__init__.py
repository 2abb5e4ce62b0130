"""The game kit: importable parts that a designed game composes into one ``...Env`` class.

A kit program subclasses ``KitEnv`` and names a theme and four parts (hidden state, information
action, scoring rule, turn structure) with typed, range-checked parameters, overriding any piece
with its own Python; it is validated exactly as a whole program is. Each released version is a
frozen folder (``v1/``) imported by name; tests/envs/test_gamekit_versions.py pins each one's
SHA-256, so a change of behaviour is a new version. Importing a kit name from this package raises
an ``ImportError`` naming the versions. :func:`kit_version` reads the version a program imports,
:func:`kit_meta` what ``EnvProgram.meta["gamekit"]`` records. Standard library only, nothing
imported at load time (workers import it).
"""

__all__ = ["LATEST", "VERSIONS", "kit_meta", "kit_version"]

VERSIONS = ("v1",)
"""The released kit versions, oldest first (each a frozen folder of this package)."""
LATEST = VERSIONS[-1]
"""The version new programs should import."""
PACKAGE = "spadekit.envs.gamekit"

_KIT_NAMES = frozenset((
    "KitEnv", "KitError", "Param", "Part", "Hidden", "Info", "Scoring", "Turns",
    "HiddenNumber", "HiddenCode", "HiddenCell", "HiddenCause", "HiddenOrder", "Probe", "Reveal",
    "Clue", "ScoreExact", "ScoreSteep", "ScoreBanded", "ScoreThrifty", "OpenTurns",
    "BudgetTurns", "GatedTurns"))


def __getattr__(name):
    if name in _KIT_NAMES:  # ``from spadekit.envs.gamekit import KitEnv``: no version named
        raise ImportError("the game kit is imported by version: write `from %s.%s import %s` "
                          "(released: %s)" % (PACKAGE, LATEST, name, ", ".join(VERSIONS)),
                          name=PACKAGE)
    raise AttributeError("module %r has no attribute %r" % (PACKAGE, name))


def _imported_modules(code):
    """The absolute module names that ``code``'s import statements name (empty when it does
    not parse)."""
    import ast

    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
            names += [node.module + "." + alias.name for alias in node.names]
    return names


def kit_version(code):
    """The kit version that program source ``code`` imports (``"v1"``), None when it imports
    no released version; versions joined by ``+`` (``"v1+v2"``) if it imports several."""
    found = []
    prefix = PACKAGE + "."
    for module in _imported_modules(code):
        if module.startswith(prefix):
            version = module[len(prefix):].split(".")[0]
            if version in VERSIONS and version not in found:
                found.append(version)
    return "+".join(sorted(found, key=VERSIONS.index)) or None


def kit_meta(code):
    """``{"gamekit": version}`` for a kit program (to merge into ``EnvProgram.meta`` where
    programs are stored), ``{}`` for any other."""
    version = kit_version(code)
    return {"gamekit": version} if version else {}
