"""The local actions' settings: their flags, read before anything of them is imported.

Flags (each with its environment variable, like every forwarder flag; all off by default):
``--hooks-file``, ``--drain-probe-port``, ``--drain-probe-address``, ``--drain-probe-upstream``,
``--drain-seconds``, ``--drain-impactful-event-types``, ``--drain-freeze-threshold-seconds``,
``--drain-lead``, ``--drain-probe-max-unhealthy-seconds`` (when to act: :mod:`sebridge.timing`).
A forwarder configured with none of them never imports the hooks, the journal or the probe
(:mod:`sebridge.forwarder.local.actions`): what a configuration does not use stays out of memory.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sebridge.impact import (
    DEFAULT_FREEZE_THRESHOLD,
    DEFAULT_IMPACTFUL,
    DEFAULT_RULES,
    KNOWN_EVENT_TYPES,
    ImpactRules,
)
from sebridge.timing import (
    DEFAULT_LEADS,
    DEFAULT_PROBE_MAX_UNHEALTHY_SECONDS,
    DEFAULT_PROBE_MIN_HEALTHY_SECONDS,
    MAX_PROBE_MIN_HEALTHY_SECONDS,
    Leads,
    TimingError,
    check_min_healthy,
    check_probe_bound,
    parse_leads,
)

DEFAULT_PROBE_ADDRESS = "0.0.0.0"  # noqa: S104 - the load balancer probes the VM's own address
DEFAULT_DRAIN_SECONDS = 30.0


class LocalActionsError(ValueError):
    """A local-action setting is wrong (the message names the flag)."""


@dataclass(frozen=True)
class LocalSettings:
    hooks_file: Path | None = None
    probe_port: int | None = None
    probe_address: str = DEFAULT_PROBE_ADDRESS
    probe_upstream: str | None = None
    drain_seconds: float = DEFAULT_DRAIN_SECONDS
    impact: ImpactRules = DEFAULT_RULES
    leads: Leads = DEFAULT_LEADS
    probe_max_unhealthy: float = DEFAULT_PROBE_MAX_UNHEALTHY_SECONDS
    probe_min_healthy: float = DEFAULT_PROBE_MIN_HEALTHY_SECONDS

    @property
    def enabled(self) -> bool:
        return self.hooks_file is not None or self.probe_port is not None

    def describe(self) -> dict[str, Any]:
        return {
            "hooksFile": str(self.hooks_file) if self.hooks_file else None,
            "drainProbePort": self.probe_port,
            "drainProbeAddress": self.probe_address if self.probe_port else None,
            "drainProbeUpstream": self.probe_upstream,
            "drainSeconds": self.drain_seconds,
            "drainImpactfulEventTypes": sorted(self.impact.impactful_event_types),
            "drainFreezeThresholdSeconds": self.impact.freeze_threshold_seconds,
            "drainLeadSeconds": self.leads.describe(),
            "drainProbeMaxUnhealthySeconds": self.probe_max_unhealthy if self.probe_port else None,
            "drainProbeMinHealthySeconds": self.probe_min_healthy if self.probe_port else None,
        }


NO_LOCAL_ACTIONS = LocalSettings()


def add_arguments(parser: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    parser.add_argument(
        "--hooks-file",
        default=env.get("SEBRIDGE_HOOKS_FILE"),
        help="run local commands on this VM's events, as this file says (root-owned, "
        "e.g. /etc/sebridge/hooks.json) [SEBRIDGE_HOOKS_FILE] (default: no hooks)",
    )
    parser.add_argument(
        "--drain-probe-port",
        default=env.get("SEBRIDGE_DRAIN_PROBE_PORT"),
        help="serve a load balancer health probe on this port that answers 503 while an "
        "impactful event of this VM is on [SEBRIDGE_DRAIN_PROBE_PORT] (default: off)",
    )
    parser.add_argument(
        "--drain-probe-address",
        default=env.get("SEBRIDGE_DRAIN_PROBE_ADDRESS", DEFAULT_PROBE_ADDRESS),
        help="address the drain probe binds [SEBRIDGE_DRAIN_PROBE_ADDRESS] (default %(default)s)",
    )
    parser.add_argument(
        "--drain-probe-upstream",
        default=env.get("SEBRIDGE_DRAIN_PROBE_UPSTREAM"),
        help="the application's own health check URL: answered when not draining "
        "[SEBRIDGE_DRAIN_PROBE_UPSTREAM]",
    )
    parser.add_argument(
        "--drain-seconds",
        default=env.get("SEBRIDGE_DRAIN_SECONDS", f"{DEFAULT_DRAIN_SECONDS:g}"),
        help="seconds from the first 503 until the VM counts as drained (probe interval x "
        "unhealthy threshold + connection drain time) [SEBRIDGE_DRAIN_SECONDS] (default "
        "%(default)s)",
    )
    parser.add_argument(
        "--drain-impactful-event-types",
        default=env.get("SEBRIDGE_DRAIN_IMPACTFUL_EVENT_TYPES", DEFAULT_IMPACTFUL),
        help="event types the probe drains for, like LB_IMPACTFUL_EVENT_TYPES "
        "[SEBRIDGE_DRAIN_IMPACTFUL_EVENT_TYPES] (default %(default)s)",
    )
    parser.add_argument(
        "--drain-freeze-threshold-seconds",
        default=env.get("SEBRIDGE_DRAIN_FREEZE_THRESHOLD_SECONDS", str(DEFAULT_FREEZE_THRESHOLD)),
        help="a Freeze this long or longer (or of unknown length) is drained, like "
        "LB_FREEZE_THRESHOLD_SECONDS [SEBRIDGE_DRAIN_FREEZE_THRESHOLD_SECONDS] "
        "(default %(default)s)",
    )
    parser.add_argument(
        "--drain-lead",
        default=env.get("SEBRIDGE_DRAIN_LEAD", ""),
        help="when the probe drains and the prepare hooks run: seconds before NotBefore per "
        "event type, or first-sight, e.g. Reboot=600,Freeze=first-sight; types left out keep "
        f"their default ({DEFAULT_LEADS.spelled()}); a notice shorter than the lead acts at "
        "first sight [SEBRIDGE_DRAIN_LEAD]",
    )
    parser.add_argument(
        "--drain-probe-max-unhealthy-seconds",
        default=env.get(
            "SEBRIDGE_DRAIN_PROBE_MAX_UNHEALTHY_SECONDS", f"{DEFAULT_PROBE_MAX_UNHEALTHY_SECONDS}"
        ),
        help="the probe answers 503 at most this long at a stretch before the event starts "
        "(then 200 until it starts), below the 600 s of the shortest grace period of a scale "
        "set's automatic repairs [SEBRIDGE_DRAIN_PROBE_MAX_UNHEALTHY_SECONDS] "
        "(default %(default)s)",
    )
    parser.add_argument(
        "--drain-probe-min-healthy-seconds",
        default=env.get(
            "SEBRIDGE_DRAIN_PROBE_MIN_HEALTHY_SECONDS", f"{DEFAULT_PROBE_MIN_HEALTHY_SECONDS}"
        ),
        help="between two runs of 503 before events start, the probe answers 200 at least this "
        "long, so that the load balancer and automatic repairs see the VM healthy: at least the "
        "probe interval x threshold they use, 0 to "
        f"{MAX_PROBE_MIN_HEALTHY_SECONDS} [SEBRIDGE_DRAIN_PROBE_MIN_HEALTHY_SECONDS] "
        "(default %(default)s)",
    )


def _number(flag: str, value: str, minimum: float, maximum: float) -> float:
    try:
        number = float(value)
    except ValueError as exc:
        raise LocalActionsError(f"{flag} must be a number, not {value!r}") from exc
    if not minimum <= number <= maximum:
        raise LocalActionsError(f"{flag} must be between {minimum:g} and {maximum:g}")
    return number


def settings_from_args(args: argparse.Namespace) -> LocalSettings:
    """Raises :class:`LocalActionsError` naming the flag."""
    port: int | None = None
    if args.drain_probe_port not in (None, ""):
        number = _number("--drain-probe-port", str(args.drain_probe_port), 1, 65535)
        if not number.is_integer():
            raise LocalActionsError("--drain-probe-port must be a whole number")
        port = int(number)
    upstream = args.drain_probe_upstream or None
    if upstream:
        if port is None:
            raise LocalActionsError("--drain-probe-upstream needs --drain-probe-port")
        from sebridge.forwarder.local.drain_probe import ProbeError, check_upstream

        try:
            check_upstream(upstream)
        except ProbeError as exc:
            raise LocalActionsError(str(exc)) from exc
    types = [t.strip() for t in str(args.drain_impactful_event_types).split(",") if t.strip()]
    known = {t.lower(): t for t in KNOWN_EVENT_TYPES}
    unknown = [t for t in types if t.lower() not in known]
    if unknown:
        raise LocalActionsError(
            f"--drain-impactful-event-types: unknown event types {unknown} "
            f"(known: {', '.join(KNOWN_EVENT_TYPES)})"
        )
    threshold = _number(
        "--drain-freeze-threshold-seconds", str(args.drain_freeze_threshold_seconds), 0, 86_400
    )
    address = str(args.drain_probe_address).strip()
    if not address:
        raise LocalActionsError("--drain-probe-address must not be empty")
    try:
        leads = parse_leads(str(args.drain_lead or ""))
    except TimingError as exc:
        raise LocalActionsError(str(exc)) from exc
    drain_seconds = _number("--drain-seconds", str(args.drain_seconds), 0, 86_400)
    bound = _number(
        "--drain-probe-max-unhealthy-seconds",
        str(args.drain_probe_max_unhealthy_seconds),
        0,
        86_400,
    )
    gap = _number(
        "--drain-probe-min-healthy-seconds",
        str(args.drain_probe_min_healthy_seconds),
        0,
        MAX_PROBE_MIN_HEALTHY_SECONDS,
    )
    try:
        check_probe_bound(bound)
        check_min_healthy(gap)
    except TimingError as exc:
        raise LocalActionsError(str(exc)) from exc
    if port is not None and drain_seconds >= bound:
        raise LocalActionsError(
            f"--drain-seconds ({drain_seconds:g}) must be shorter than "
            f"--drain-probe-max-unhealthy-seconds ({bound:g}): the probe's drain could never be "
            "done before the probe turns healthy again"
        )
    return LocalSettings(
        hooks_file=Path(args.hooks_file) if args.hooks_file else None,
        probe_port=port,
        probe_address=address,
        probe_upstream=upstream,
        drain_seconds=drain_seconds,
        impact=ImpactRules(frozenset(known[t.lower()] for t in types), int(threshold)),
        leads=leads,
        probe_max_unhealthy=bound,
        probe_min_healthy=gap,
    )
