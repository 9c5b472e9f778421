"""The webhooks workflow's settings: endpoints from ``WEBHOOKS``, secrets from the settings
they name (pure; ``functions.shared.settings`` calls :func:`load_endpoints`).

``WEBHOOKS`` is a JSON list; each endpoint::

    {"name": "ops-slack", "preset": "slack", "urlSetting": "WEBHOOK_OPS_SLACK_URL",
     "transitions": ["Scheduled", "Started"], "eventTypes": ["Reboot"], "impactfulOnly": false,
     "template": {...}}
    {"name": "oncall", "preset": "pagerduty", "routingKeySetting": "WEBHOOK_ONCALL_ROUTING_KEY"}
    {"name": "security", "preset": "slack", "urlSetting": "WEBHOOK_SECURITY_URL",
     "unverified": true}

An endpoint gets verified messages only, unless it sets ``unverified: true`` (an audit or
security channel): then it also gets messages that failed the scope check, marked so. PagerDuty
endpoints may not: an unverified message must never trigger or resolve an alert.

Secrets (webhook URLs, PagerDuty routing keys) never appear in ``WEBHOOKS``: ``urlSetting`` and
``routingKeySetting`` name other app settings that hold them (Key Vault references in Azure).
Everything is checked at start and every problem reported at once, naming the endpoint and the
setting but never a secret's value.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from functions.webhooks.presets import PAGERDUTY, PRESETS
from functions.webhooks.templates import CompiledTemplate, TemplateError, compile_template
from sebridge.contract.events import Transition
from sebridge.values import is_loopback

SETTING = "WEBHOOKS"
SUBSCRIPTION_SETTING = "WebhooksSubscriptionName"
MAX_ENDPOINTS = 20
MAX_WEBHOOKS_CHARS = 64 * 1024
NAME = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,38}[a-z0-9])?")
SETTING_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
ROUTING_KEY = re.compile(r"[A-Za-z0-9]{32}")
KEY_VAULT_REFERENCE = "@Microsoft.KeyVault("
KEYS = (
    "name",
    "preset",
    "urlSetting",
    "routingKeySetting",
    "transitions",
    "eventTypes",
    "impactfulOnly",
    "template",
    "unverified",
)


@dataclass(frozen=True)
class Endpoint:
    """One configured endpoint; ``url`` and ``routing_key`` are secrets (never in repr)."""

    name: str
    preset: str
    transitions: frozenset[Transition]
    event_types: frozenset[str] | None  # lower case; None: every event type
    impactful_only: bool
    template: CompiledTemplate = field(repr=False)
    url_setting: str = ""
    routing_key_setting: str = ""
    url: str = field(repr=False, default="")
    routing_key: str = field(repr=False, default="")
    unverified: bool = False  # also gets messages that failed the scope check (marked)

    def accepts(self, transition: Transition, event_type: str, impactful: bool) -> bool:
        """The endpoint's filter (a preset may still skip, e.g. PagerDuty on a minor event)."""
        if transition not in self.transitions:
            return False
        if self.event_types is not None and event_type.lower() not in self.event_types:
            return False
        return impactful or not self.impactful_only


def _check_url(where: str, setting: str, value: str) -> str | None:
    """A problem with a secret URL, described without the URL."""
    parts = urlsplit(value)
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        hint = (
            " (an unresolved Key Vault reference?)" if value.startswith(KEY_VAULT_REFERENCE) else ""
        )
        return f"{where}: {setting} does not hold an http(s) URL{hint}"
    if parts.scheme == "http" and not is_loopback(parts.hostname):
        return f"{where}: {setting} must use https (plain http is allowed for loopback only)"
    if parts.username or parts.password:
        return f"{where}: {setting} must not carry credentials in the URL"
    return None


def _secret(
    env: Mapping[str, str], where: str, key: str, setting: Any, problems: list[str]
) -> tuple[str, str]:
    """(setting name, its value) for ``urlSetting``/``routingKeySetting``."""
    if not isinstance(setting, str) or not SETTING_NAME.fullmatch(setting):
        problems.append(f"{where}: {key} must name an app setting (letters, digits, _)")
        return "", ""
    value = env.get(setting, "").strip()
    if not value:
        problems.append(f"{where}: {key} names {setting}, which is not set")
    return setting, value


def _strings(where: str, key: str, value: Any, problems: list[str]) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        problems.append(f"{where}: {key} must be a non-empty list of strings")
        return None
    return value


def _endpoint(
    item: Any, index: int, env: Mapping[str, str], known_event_types: Collection[str]
) -> tuple[Endpoint | None, list[str]]:
    problems: list[str] = []
    where = f"{SETTING}[{index}]"
    if not isinstance(item, dict):
        return None, [f"{where}: not a JSON object"]
    name = item.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        problems.append(f"{where}: name must be 1-40 lower-case letters, digits and hyphens")
    else:
        where = f"{SETTING}: endpoint {name!r}"
    unknown = sorted(set(item) - set(KEYS))
    if unknown:
        problems.append(f"{where}: unknown keys {unknown} (known: {', '.join(KEYS)})")
    preset = PRESETS.get(str(item.get("preset")))
    if preset is None:
        problems.append(f"{where}: preset must be one of {', '.join(PRESETS)}")
        return None, problems

    transitions = preset.transitions
    listed = _strings(where, "transitions", item.get("transitions"), problems)
    if listed is not None:
        wrong = [t for t in listed if t not in {x.value for x in preset.transitions}]
        if wrong:
            problems.append(
                f"{where}: transitions {wrong} are not for the {preset.name} preset (allowed: "
                f"{', '.join(sorted(t.value for t in preset.transitions))})"
            )
        transitions = frozenset(Transition(t) for t in listed if t not in wrong)

    event_types = None
    types = _strings(where, "eventTypes", item.get("eventTypes"), problems)
    if types is not None:
        known = {t.lower(): t for t in known_event_types}
        wrong = [t for t in types if t.lower() not in known]
        if wrong:
            problems.append(
                f"{where}: unknown eventTypes {wrong} (known: {', '.join(known_event_types)})"
            )
        event_types = frozenset(t.lower() for t in types)

    impactful_only = item.get("impactfulOnly", False)
    if not isinstance(impactful_only, bool):
        problems.append(f"{where}: impactfulOnly must be true or false")
        impactful_only = False

    unverified = item.get("unverified", False)
    if not isinstance(unverified, bool):
        problems.append(f"{where}: unverified must be true or false")
        unverified = False
    elif unverified and preset.name == PAGERDUTY:
        problems.append(
            f"{where}: unverified is not for the {PAGERDUTY} preset (a message that failed the "
            "scope check must never trigger or resolve an alert)"
        )

    template = preset.default_template
    if "template" in item:
        raw = item["template"]
        if not isinstance(raw, preset.template_kinds):
            problems.append(
                f"{where}: template must be {preset.template_shape} for the {preset.name} preset"
            )
        else:
            try:
                template = compile_template(raw)
            except TemplateError as exc:
                problems.append(f"{where}: template {exc}")

    url_setting, url = "", preset.default_url
    if "urlSetting" in item or preset.needs_url:
        if "urlSetting" not in item:
            problems.append(f"{where}: urlSetting is required (the app setting with the URL)")
        else:
            url_setting, url = _secret(env, where, "urlSetting", item["urlSetting"], problems)
            if url:
                problem = _check_url(where, url_setting, url)
                if problem:
                    problems.append(problem)

    key_setting, routing_key = "", ""
    if preset.needs_routing_key:
        if "routingKeySetting" not in item:
            problems.append(
                f"{where}: routingKeySetting is required (the app setting with the key)"
            )
        else:
            key_setting, routing_key = _secret(
                env, where, "routingKeySetting", item["routingKeySetting"], problems
            )
            if routing_key and not ROUTING_KEY.fullmatch(routing_key):
                problems.append(
                    f"{where}: {key_setting} does not hold a PagerDuty routing key "
                    "(32 letters and digits: the Events API v2 integration key)"
                )
    elif "routingKeySetting" in item:
        problems.append(f"{where}: routingKeySetting is only for the {PAGERDUTY} preset")

    if problems:
        return None, problems
    assert isinstance(name, str)
    return (
        Endpoint(
            name=name,
            preset=preset.name,
            transitions=transitions,
            event_types=event_types,
            impactful_only=impactful_only,
            template=template,
            url_setting=url_setting,
            routing_key_setting=key_setting,
            url=url,
            routing_key=routing_key,
            unverified=unverified,
        ),
        [],
    )


def load_endpoints(
    env: Mapping[str, str],
    problems: list[str],
    *,
    subscription: str,
    known_event_types: Collection[str],
) -> tuple[Endpoint, ...]:
    """The endpoints of ``WEBHOOKS`` (none when unset); problems are appended, not raised."""
    text = env.get(SETTING, "").strip()
    if not text:
        return ()
    if len(text) > MAX_WEBHOOKS_CHARS:
        problems.append(f"{SETTING}: longer than {MAX_WEBHOOKS_CHARS} characters")
        return ()
    try:
        items = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        problems.append(f"{SETTING}: not JSON: {exc}")
        return ()
    if not isinstance(items, list):
        problems.append(f"{SETTING}: must be a JSON list of endpoints")
        return ()
    if len(items) > MAX_ENDPOINTS:
        problems.append(f"{SETTING}: at most {MAX_ENDPOINTS} endpoints")
        return ()
    endpoints: list[Endpoint] = []
    for index, item in enumerate(items):
        endpoint, found = _endpoint(item, index, env, known_event_types)
        problems.extend(found)
        if endpoint is not None:
            endpoints.append(endpoint)
    names = [e.name for e in endpoints]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        problems.append(f"{SETTING}: endpoint names used twice: {twice}")
    if items and not subscription:
        problems.append(f"{SUBSCRIPTION_SETTING}: required when {SETTING} lists endpoints")
    return tuple(endpoints)
