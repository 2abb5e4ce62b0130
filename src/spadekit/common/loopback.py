"""Whether an address names this machine only: the one check every server of the project uses
before it listens (``spadekit serve`` for a model or a run's dashboard) and the dashboard's
Host-header check. Standard library only."""

from __future__ import annotations

import ipaddress

__all__ = ["is_loopback"]

_LOOPBACK_NAMES = {"localhost", "localhost.", "ip6-localhost"}


def is_loopback(host: str | None) -> bool:
    """Whether ``host`` (a name or an address, maybe in brackets) is this machine only."""
    host = (host or "").strip().strip("[]").lower()
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
