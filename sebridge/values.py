"""Reading setting values the same way everywhere (pure)."""

from __future__ import annotations

import ipaddress

TRUE = frozenset({"1", "true", "yes", "on"})
FALSE = frozenset({"0", "false", "no", "off", ""})


def parse_bool(value: str) -> bool:
    """``1/true/yes/on`` or ``0/false/no/off/""`` in any case; ValueError otherwise."""
    text = value.strip().lower()
    if text in TRUE:
        return True
    if text in FALSE:
        return False
    raise ValueError(f"not a boolean: {value[:40]!r} (use true or false)")


def is_loopback(host: str) -> bool:
    """``localhost`` or a loopback address (127.0.0.0/8, ::1)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
