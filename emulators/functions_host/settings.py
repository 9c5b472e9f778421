"""App settings: local.settings.json, the environment, and `%Setting%` expressions.

Precedence follows Azure Functions Core Tools: a value already present in the environment wins
over local.settings.json (Core Tools logs "Skipping '<name>' from local settings as it's already
defined in current environment variables"). The in-process API can ask for the opposite
(explicit settings win), which tests need because they run many hosts in one process.
Everything here is pure except `load_local_settings` (reads one file) and `EnvironOverlay`
(the single place that writes os.environ, and undoes it).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_EXPRESSION = re.compile(r"%([^%]+)%")


class SettingsError(ValueError):
    """A settings file or a `%Setting%` expression that cannot be used."""


@dataclass(frozen=True)
class LocalSettings:
    """The parts of local.settings.json the host uses."""

    values: dict[str, str]
    local_http_port: int | None = None
    ignored_sections: tuple[str, ...] = ()


def parse_local_settings(document: Any, *, source: str = "local.settings.json") -> LocalSettings:
    """Validate a parsed local.settings.json ({"IsEncrypted": false, "Values": {...}})."""
    if not isinstance(document, dict):
        raise SettingsError(f"{source}: expected a JSON object at the top level")
    if document.get("IsEncrypted", False) not in (False, "false", "False"):
        raise SettingsError(
            f"{source}: IsEncrypted is true; encrypted settings are not supported locally "
            "(run `func settings decrypt` or write plain values)"
        )
    raw_values = document.get("Values", {})
    if not isinstance(raw_values, dict):
        raise SettingsError(f"{source}: 'Values' must be an object of name -> string")
    values: dict[str, str] = {}
    for name, value in raw_values.items():
        values[name] = _setting_text(name, value, source)
    port: int | None = None
    host_section = document.get("Host", {})
    if isinstance(host_section, dict) and "LocalHttpPort" in host_section:
        try:
            port = int(host_section["LocalHttpPort"])
        except (TypeError, ValueError) as exc:
            raise SettingsError(f"{source}: Host.LocalHttpPort must be an integer") from exc
    ignored = tuple(k for k in document if k not in {"IsEncrypted", "Values", "Host"})
    return LocalSettings(values=values, local_http_port=port, ignored_sections=ignored)


def _setting_text(name: str, value: Any, source: str) -> str:
    # Core Tools reads Values as strings; JSON scalars are accepted and turned into text the way
    # an app setting would hold them, anything nested is a mistake worth a clear error.
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if value is None:
        return ""
    raise SettingsError(f"{source}: setting {name!r} must be a string, not {type(value).__name__}")


def load_local_settings(path: Path) -> LocalSettings:
    try:
        text = path.read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise SettingsError(f"cannot read settings file {path}: {exc.strerror or exc}") from exc
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SettingsError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from exc
    return parse_local_settings(document, source=str(path))


@dataclass(frozen=True)
class MergedSettings:
    """The effective settings, and which file values the environment shadowed."""

    values: dict[str, str]
    shadowed: tuple[str, ...] = field(default=())


CA_BUNDLE = "REQUESTS_CA_BUNDLE"
_PEM = re.compile(r"-----BEGIN CERTIFICATE-----[A-Za-z0-9+/=\s]+?-----END CERTIFICATE-----")


def _certificates(path: str) -> set[str] | None:
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    return {"".join(block.split()) for block in _PEM.findall(text)}


def extends_bundle(candidate: str, current: str) -> bool:
    """Whether the CA bundle file ``candidate`` holds every certificate of ``current`` (and so
    can stand in for it without dropping any trust), as Azurite's combined bundle does."""
    mine, theirs = _certificates(candidate), _certificates(current)
    return bool(mine) and theirs is not None and theirs <= (mine or set())


def merge_settings(
    file_values: Mapping[str, str], environ: Mapping[str, str], *, file_wins: bool = False
) -> MergedSettings:
    """Effective settings = environment plus file values, the environment winning by default.

    Core Tools skips a file value when the environment holds a non-empty value of that name;
    an empty environment value does not shadow it. One exception, ours: a file's
    ``REQUESTS_CA_BUNDLE`` that holds every certificate of the environment's bundle (the
    combined bundle ``sebridge fakes --azurite`` prints) wins, since it drops no trust and the
    Azurite settings would not work otherwise.
    """
    merged = dict(environ)
    shadowed: list[str] = []
    for name, value in file_values.items():
        if name == CA_BUNDLE and environ.get(name) and extends_bundle(value, environ[name]):
            merged[name] = value  # trusts all the environment's bundle does, and more
            continue
        if not file_wins and environ.get(name):
            if environ[name] != value:
                shadowed.append(name)
            continue
        merged[name] = value
    return MergedSettings(values=merged, shadowed=tuple(shadowed))


def resolve_expression(text: str, settings: Mapping[str, str], *, what: str = "value") -> str:
    """Replace every `%Name%` in text with the setting's value, as the Functions host does.

    An unknown or empty setting is an error naming the expression, like the host's
    "'%X%' does not resolve to a value."
    """

    def substitute(match: re.Match[str]) -> str:
        name = match.group(1)
        value = settings.get(name)
        if not value:
            raise SettingsError(f"{what}: '%{name}%' does not resolve to a value")
        return value

    return _EXPRESSION.sub(substitute, text)


class EnvironOverlay:
    """Writes settings into an environment mapping and can put back what was there before.

    The Python worker exposes app settings to function code as environment variables, so the
    host does the same before it imports the app.
    """

    def __init__(self, environ: MutableMapping[str, str]) -> None:
        self._environ = environ
        self._previous: dict[str, str | None] = {}

    def apply(self, values: Mapping[str, str], names: Iterable[str] | None = None) -> None:
        for name in values if names is None else names:
            if name not in self._previous:
                self._previous[name] = self._environ.get(name)
            self._environ[name] = values[name]

    def restore(self) -> None:
        for name, old in self._previous.items():
            if old is None:
                self._environ.pop(name, None)
            else:
                self._environ[name] = old
        self._previous.clear()
