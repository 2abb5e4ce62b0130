"""The dashboard page: one HTML document used by ``spadekit report`` and ``spadekit serve``.

Vanilla JS + CSS from ``static/``, inlined so a report file needs no network. Data arrives as JSON
in ``<script type="application/json" id="data">``: the whole :func:`spadekit.report.data.bundle`
for a report file, ``{"live": true, "poll_ms": N}`` for a live page (which polls ``/api/...``).
Run data is hostile text: :func:`script_json` escapes ``<``, ``>``, ``&``, U+2028 and U+2029, the
script writes data only through ``textContent``, and a Content-Security-Policy allows only this
page's script (by hash), inline styles and ``data:`` images.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from spadekit.report.data import clean

__all__ = ["build_report", "content_security_policy", "render_page", "script_hash", "script_json",
           "write_report"]

_ASSETS = ("charts.js", "dashboard.js")
_JSON_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028",
                 "\u2029": "\\u2029"}


def _asset(name: str) -> str:
    return resources.files("spadekit.report").joinpath("static", name).read_text("utf-8")


@lru_cache(maxsize=1)
def _assets() -> tuple[str, str]:
    """(script, css) exactly as inlined (the CSP hash covers the script's text), checked so
    that neither can end its own element early."""
    script = "\n" + "\n".join(_asset(name) for name in _ASSETS) + "\n"
    css = _asset("dashboard.css")
    if any(tag in script.lower() for tag in ("<script", "</script", "<!--")) \
            or "</style" in css.lower():
        raise RuntimeError("dashboard assets must not contain script/style tags or <!--")
    return script, css


def script_hash() -> str:
    """The CSP source expression (``'sha256-…'``) of the page's one inline script."""
    digest = hashlib.sha256(_assets()[0].encode("utf-8")).digest()
    return "'sha256-" + base64.b64encode(digest).decode("ascii") + "'"


def content_security_policy(header: bool = False) -> str:
    """The page's policy; ``header=True`` adds what only an HTTP header can carry."""
    parts = ["default-src 'none'", f"script-src {script_hash()}", "style-src 'unsafe-inline'",
             "img-src data:", "connect-src 'self'", "base-uri 'none'", "form-action 'none'"]
    if header:
        parts.append("frame-ancestors 'none'")
    return "; ".join(parts)


def script_json(value: Any) -> str:
    """``value`` as JSON that is inert inside ``<script type="application/json">``: no ``<``,
    ``>`` or ``&`` (so no ``</script>`` or ``<!--``) and no U+2028/U+2029 line separators."""
    text = json.dumps(clean(value, loose=True), ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return text.translate(str.maketrans(_JSON_ESCAPES))


def render_page(boot: Any, title: str = "spadekit dashboard") -> str:
    """The complete HTML document with ``boot`` (a bundle, or the live-mode settings) embedded."""
    script, css = _assets()
    safe_title = (str(title).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;"))
    return (
        "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<meta http-equiv=\"Content-Security-Policy\" content=\"{content_security_policy()}\">\n"
        "<meta name=\"referrer\" content=\"no-referrer\">\n"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
        f"<title>{safe_title}</title>\n<link rel=\"icon\" href=\"data:,\">\n"
        f"<style>\n{css}</style>\n</head>\n<body>\n"
        "<header><span id=\"status\"></span><h1 id=\"title\">spadekit</h1><div id=\"meta\"></div>"
        "<div id=\"warnings\"></div></header>\n<nav id=\"tabs\"></nav>\n"
        "<main id=\"main\"><noscript>This dashboard needs JavaScript.</noscript></main>\n"
        f"<script type=\"application/json\" id=\"data\">{script_json(boot)}</script>\n"
        f"<script>{script}</script>\n</body>\n</html>\n"
    )


def live_page(poll_ms: int = 3000) -> str:
    """The page ``spadekit serve`` returns: no data inside, it polls the server's API."""
    return render_page({"live": True, "poll_ms": int(poll_ms)})


def build_report(run_dir: str | Path, max_episodes: int = 2, max_envs: int = 500) -> str:
    """The self-contained report of ``run_dir`` as an HTML string."""
    from spadekit.report import data

    bundle = data.bundle(run_dir, max_episodes_per_env=max_episodes, max_envs=max_envs)
    name = (bundle.get("run") or {}).get("name") or Path(run_dir).name
    return render_page(bundle, title=f"spadekit · {name}")


def write_report(run_dir: str | Path, out: str | Path | None = None, max_episodes: int = 2,
                 max_envs: int = 500) -> Path:
    """Write the report (default ``run_dir/report.html``) atomically; returns its path."""
    html = build_report(run_dir, max_episodes=max_episodes, max_envs=max_envs)
    path = Path(out) if out is not None else Path(run_dir) / "report.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(html, encoding="utf-8")
    os.replace(tmp, path)
    return path
