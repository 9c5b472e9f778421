"""The live-test harness of azure-servicebus's own test suite, backed by the local emulator.

Microsoft's tests get their namespace and entities from preparers (servicebus_preparer.py,
built on devtools_testutils) that create Azure resources through ARM, and a credential from
``devtools_testutils.get_credential``. run.py copies the SDK's tests/ unchanged and replaces
exactly those pieces with shims that import this module:

* the preparers hand every test its own fresh emulator (sebridge servicebus-emulator, started
  for the test with a generated Config.json declaring the entities the test's preparers asked
  for, with Azure's defaults for what they did not set) and the same keyword arguments the real
  ones pass: ``servicebus_namespace`` (its ``.name``), the namespace connection string, key name
  and key, ``servicebus_queue`` / ``_topic`` / ``_subscription`` (their ``.name``);
* name resolution: the tests build ``<namespace>.servicebus.windows.net`` and let the SDK use its
  defaults (TLS on 5671, WebSockets on 443). ``socket.getaddrinfo`` maps that one name, and
  only it, to the emulator's TLS, wss and plain ports on 127.0.0.1; every other name fails to
  resolve (nothing leaves loopback). The emulator's self-signed certificate names the host, and
  ``certifi.where()`` (the SDK's CA bundle) is certifi's bundle plus that certificate, so the
  SDK's own TLS hostname and chain checks run as they would against Azure;
* ``get_credential()`` is a TokenCredential handing out unsigned JWTs (the emulator accepts JWTs
  unchecked: it has no Entra ID).

Nothing else of the SDK or its tests is changed. Exclusions (tests.peer/exclusions.toml) and the
CI subset are applied at collection; outcomes are written as JSON for run.py's report.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import fnmatch
import functools
import json
import os
import re
import shutil
import socket
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import certifi
import pytest
from azure.core.credentials import AccessToken

REPO = Path(os.environ.get("PEER_REPO", Path(__file__).resolve().parents[2]))
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from emulators.ports import hold_port  # noqa: E402
from emulators.servicebus.testing import SAS_KEY, SAS_KEY_NAME, EmulatorProcess  # noqa: E402

NAMESPACE_PREFIX = "sbemulator"  # each test's namespace: sbemulator<n>.servicebus.windows.net
ENDPOINT_SUFFIX = ".servicebus.windows.net"
# What ARM gives a queue/topic/subscription for properties the SDK's preparers do not set.
AZURE_DEFAULTS = {
    "MaxDeliveryCount": 10,
    "DefaultMessageTimeToLive": "P10675199DT2H48M5.4775807S",  # TimeSpan.MaxValue
    "DuplicateDetectionHistoryTimeWindow": "PT10M",
}
LOCAL_NAMES = {"localhost", "127.0.0.1", "::1"}

FakeResource = collections.namedtuple("FakeResource", ["name", "id"])


# -- name resolution and trust (the emulator stands in for <namespace>.servicebus.windows.net) --
@dataclass
class _Routes:
    host: str = ""  # the running test's namespace host; other tests' hosts no longer resolve
    name: str = ""
    count: int = 0
    ports: dict[int, int] = field(default_factory=dict)  # the port a client dials -> emulator's
    bundle: str | None = None  # certifi's bundle plus the running emulator's certificate
    closed_port: int = 0


_ROUTES = _Routes()
_REAL_GETADDRINFO = socket.getaddrinfo
_REAL_CERTIFI_WHERE = certifi.where


def _closed_port() -> int:
    """A loopback port nothing listens on (connections to it are refused at once): bound and
    never listening for the rest of the run, so no other process can take it meanwhile."""
    holder = hold_port(0)
    _HELD.append(holder)
    return int(holder.getsockname()[1])


_HELD: list[socket.socket] = []


def _getaddrinfo(
    host: Any, port: Any, family: int = 0, type: int = 0, proto: int = 0, flags: int = 0
) -> list[Any]:
    name = host.decode() if isinstance(host, bytes) else host
    if name is None or str(name).lower() in LOCAL_NAMES:
        return _REAL_GETADDRINFO(host, port, family, type, proto, flags)
    if _ROUTES.host and str(name).lower() == _ROUTES.host:
        wanted = int(port) if port not in (None, "") else 0
        target = _ROUTES.ports.get(wanted, _ROUTES.closed_port)
        return _REAL_GETADDRINFO("127.0.0.1", target, family, type, proto, flags)
    if str(name).lower().endswith(ENDPOINT_SUFFIX):
        # another namespace (or an earlier test's, whose clients may still retry): nothing there
        return _REAL_GETADDRINFO("127.0.0.1", _ROUTES.closed_port, family, type, proto, flags)
    raise socket.gaierror(
        socket.EAI_NONAME,
        f"{name}: the peer-suite harness resolves only *{ENDPOINT_SUFFIX} (to loopback)",
    )


def _certifi_where() -> str:
    return _ROUTES.bundle or _REAL_CERTIFI_WHERE()


def install_routing() -> None:
    _ROUTES.closed_port = _closed_port()
    socket.getaddrinfo = _getaddrinfo
    certifi.where = _certifi_where
    for proxy in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy"):
        os.environ.pop(proxy, None)


# -- entities and the emulator of one test -----------------------------------------------------
@dataclass
class Entity:
    kind: str  # queue | topic | subscription
    name: str
    parameter: str  # the keyword the test receives it as
    properties: dict[str, Any]
    topic_parameter: str | None = None  # subscriptions: the keyword of their topic


def _config(entities: list[Entity], name: str) -> dict[str, Any]:
    queues = [
        {"Name": e.name, "Properties": {**AZURE_DEFAULTS, **e.properties}}
        for e in entities
        if e.kind == "queue"
    ]
    topics: dict[str, dict[str, Any]] = {}
    for entity in entities:
        if entity.kind == "topic":
            properties = {
                "DefaultMessageTimeToLive": AZURE_DEFAULTS["DefaultMessageTimeToLive"],
                "DuplicateDetectionHistoryTimeWindow": "PT10M",
                **entity.properties,
            }
            topics[entity.parameter] = {
                "Name": entity.name,
                "Properties": properties,
                "Subscriptions": [],
            }
    for entity in entities:
        if entity.kind == "subscription":
            topic = topics.get(entity.topic_parameter or "")
            if topic is None:
                raise RuntimeError(f"subscription {entity.name}: no topic preparer above it")
            properties = {
                "MaxDeliveryCount": 10,
                "DefaultMessageTimeToLive": AZURE_DEFAULTS["DefaultMessageTimeToLive"],
                **entity.properties,
            }
            topic["Subscriptions"].append({"Name": entity.name, "Properties": properties})
    namespace = {"Name": name, "Queues": queues, "Topics": list(topics.values())}
    return {"UserConfig": {"Namespaces": [namespace], "Logging": {"Type": "Console"}}}


def _log_path(name: str) -> Path | None:
    folder = os.environ.get("PEER_LOG_DIR")
    if not folder:
        return None
    test = os.environ.get("PYTEST_CURRENT_TEST", name).split(" ")[0]
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", test)[-150:]
    return Path(folder) / f"{safe}.log"


@contextlib.contextmanager
def running_namespace(entities: list[Entity]) -> Iterator[EmulatorProcess]:
    """A fresh emulator holding ``entities`` for one test, reachable as a namespace name of
    its own (clients an earlier test left behind cannot reach it)."""
    _ROUTES.count += 1
    name = f"{NAMESPACE_PREFIX}{_ROUTES.count}"
    host = name + ENDPOINT_SUFFIX
    folder = Path(tempfile.mkdtemp(prefix="sebridge-peer-"))
    try:
        config = folder / "Config.json"
        config.write_text(json.dumps(_config(entities, name), indent=1))
        emulator = EmulatorProcess(
            config,
            tls=True,
            websocket=True,
            extra_args=["--tls-hostname", host],
            log_path=_log_path(name),
        )
        emulator.start()
        try:
            assert emulator.tls_port and emulator.websocket_tls_port and emulator.ca_cert
            bundle = folder / "ca-bundle.pem"
            bundle.write_text(
                Path(_REAL_CERTIFI_WHERE()).read_text() + "\n" + Path(emulator.ca_cert).read_text()
            )
            _ROUTES.ports = {
                5671: emulator.tls_port,
                443: emulator.websocket_tls_port,
                5672: emulator.port,
            }
            _ROUTES.bundle = str(bundle)
            _ROUTES.host, _ROUTES.name = host, name
            yield emulator
        finally:
            _ROUTES.ports = {}
            _ROUTES.bundle = None
            _ROUTES.host = _ROUTES.name = ""
            emulator.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# -- credentials -------------------------------------------------------------------------------
class FakeJwtCredential:
    """A TokenCredential whose unsigned JWTs the emulator accepts (it has no Entra ID)."""

    def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        def part(document: bytes) -> str:
            return base64.urlsafe_b64encode(document).decode().rstrip("=")

        header = part(b'{"alg":"none","typ":"JWT"}')
        body = part(b'{"aud":"https://servicebus.azure.net","oid":"peer-suite"}')
        return AccessToken(f"{header}.{body}.sig", int(time.time()) + 3600)

    def close(self) -> None:
        pass


def get_credential(**kwargs: Any) -> FakeJwtCredential:
    return FakeJwtCredential()


# -- preparers (the names and keyword arguments of servicebus_preparer.py) ----------------------
def _entity_name(prefix: str, parameter: str) -> str:
    raw = f"{prefix or 'sb'}-{parameter.removeprefix('servicebus_')}"
    return re.sub(r"[^a-z0-9-]+", "-", raw.lower()).strip("-")[:50]


class Preparer:
    """A decorator that adds keyword arguments to the test it wraps (like AzureMgmtPreparer).

    Each preparer records the entities below it on the wrapper, so the namespace preparer (the
    outermost that matters) knows what Config.json to start the test's emulator with.
    """

    def __init__(self, name_prefix: str = "", **options: Any) -> None:
        self.name_prefix = name_prefix
        self.options = options

    def entities(self) -> list[Entity]:
        return []

    def resources(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        return {}

    def around(self, entities: list[Entity]) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        below: list[Entity] = list(getattr(fn, "_peer_entities", []))
        entities = self.entities() + below

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self.around(entities):
                kwargs.update(self.resources(kwargs))
                return fn(*args, **kwargs)

        wrapper._peer_entities = entities  # type: ignore[attr-defined]
        return wrapper


class ResourceGroupPreparer(Preparer):
    def resources(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        name = self.options.get("parameter_name", "resource_group")
        return {name: FakeResource("rg-peer", "rg-peer"), "location": "westus"}


class NamespacePreparer(Preparer):
    def __init__(self, name_prefix: str = "", **options: Any) -> None:
        super().__init__(name_prefix, **options)
        sku = options.get("sku", "Standard")
        if sku != "Standard":
            raise RuntimeError(f"the peer suite runs a Standard namespace, not {sku}")

    def around(self, entities: list[Entity]) -> contextlib.AbstractContextManager[Any]:
        return running_namespace(entities)

    def resources(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        parameter = self.options.get("parameter_name", "servicebus_namespace")
        connection_string = (
            f"Endpoint=sb://{_ROUTES.host}/;SharedAccessKeyName={SAS_KEY_NAME};"
            f"SharedAccessKey={SAS_KEY}"
        )
        return {
            parameter: FakeResource(_ROUTES.name, _ROUTES.name),
            f"{parameter}_connection_string": connection_string,
            f"{parameter}_key_name": SAS_KEY_NAME,
            f"{parameter}_primary_key": SAS_KEY,
        }


class QueuePreparer(Preparer):
    @property
    def parameter(self) -> str:
        return str(self.options.get("parameter_name", "servicebus_queue"))

    def entities(self) -> list[Entity]:
        o = self.options
        properties = {
            "LockDuration": o.get("lock_duration", "PT30S"),
            "RequiresSession": bool(o.get("requires_session", False)),
            "RequiresDuplicateDetection": bool(o.get("requires_duplicate_detection", False)),
            "DeadLetteringOnMessageExpiration": bool(
                o.get("dead_lettering_on_message_expiration", False)
            ),
        }
        name = _entity_name(self.name_prefix, self.parameter)
        return [Entity("queue", name, self.parameter, properties)]

    def resources(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        name = _entity_name(self.name_prefix, self.parameter)
        return {self.parameter: FakeResource(name, name)}


class TopicPreparer(Preparer):
    @property
    def parameter(self) -> str:
        return str(self.options.get("parameter_name", "servicebus_topic"))

    def entities(self) -> list[Entity]:
        name = _entity_name(self.name_prefix, self.parameter)
        return [Entity("topic", name, self.parameter, {})]

    def resources(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        name = _entity_name(self.name_prefix, self.parameter)
        return {self.parameter: FakeResource(name, name)}


class SubscriptionPreparer(Preparer):
    @property
    def parameter(self) -> str:
        return str(self.options.get("parameter_name", "servicebus_subscription"))

    def entities(self) -> list[Entity]:
        o = self.options
        properties = {
            "LockDuration": o.get("lock_duration", "PT60S"),
            "RequiresSession": bool(o.get("requires_session", False)),
        }
        topic = str(o.get("servicebus_topic_parameter_name", "servicebus_topic"))
        name = _entity_name(self.name_prefix, self.parameter)
        return [Entity("subscription", name, self.parameter, properties, topic)]

    def resources(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        name = _entity_name(self.name_prefix, self.parameter)
        return {self.parameter: FakeResource(name, name)}


class AuthorizationRulePreparer(Preparer):
    """Per-rule SAS keys with limited rights: the emulator's config has one key for everything."""

    def resources(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        raise RuntimeError(
            "authorization rules with their own keys and rights are not supported by the "
            "emulator's config; such tests are listed in tests/peer/exclusions.toml"
        )


# -- pytest plugin: exclusions, the CI subset, outcomes --------------------------------------
@dataclass(frozen=True)
class Exclusion:
    pattern: str
    reason: str


def load_exclusions(path: Path) -> list[Exclusion]:
    document = tomllib.loads(path.read_text())
    return [Exclusion(str(e["pattern"]), str(e["reason"])) for e in document.get("exclude", [])]


def matching(nodeid: str, patterns: list[str]) -> str | None:
    for pattern in patterns:
        if fnmatch.fnmatchcase(nodeid, pattern):
            return pattern
    return None


class PeerPlugin:
    def __init__(self) -> None:
        self.exclusions = load_exclusions(Path(os.environ["PEER_EXCLUSIONS"]))
        subset = os.environ.get("PEER_SUBSET")
        self.subset: list[str] | None = None
        if subset:
            lines = Path(subset).read_text().splitlines()
            self.subset = [x.strip() for x in lines if x.strip() and not x.startswith("#")]
        self.results: dict[str, dict[str, Any]] = {}
        target = os.environ.get("PEER_RESULTS")
        self.sink = Path(target) if target else None

    def record(self, nodeid: str, entry: dict[str, Any]) -> None:
        """Keep ``entry`` and append it to the results file at once (a run cut short by its
        deadline still reports what finished)."""
        self.results[nodeid] = entry
        if self.sink is not None:
            with self.sink.open("a") as out:
                out.write(json.dumps({"nodeid": nodeid, **entry}) + "\n")

    @pytest.hookimpl(trylast=True)  # after -k / -m have deselected theirs
    def pytest_collection_modifyitems(
        self, session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        kept: list[pytest.Item] = []
        dropped: list[pytest.Item] = []
        for item in items:
            if self.subset is not None and matching(item.nodeid, self.subset) is None:
                dropped.append(item)
                continue
            kept.append(item)
            for exclusion in self.exclusions:
                if fnmatch.fnmatchcase(item.nodeid, exclusion.pattern):
                    item.add_marker(pytest.mark.skip(reason=f"EXCLUDED: {exclusion.reason}"))
                    entry = {"outcome": "excluded", "reason": exclusion.reason}
                    self.record(item.nodeid, {**entry, "pattern": exclusion.pattern})
                    break
            else:
                self.record(item.nodeid, {"outcome": "not run"})
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        items[:] = kept

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Iterator[None]:
        """Undo what a test leaves monkeypatched on the SDK's classes and modules.

        Some of the SDK's tests replace SDK methods without putting them back (for instance
        test_queue_receive_handler_peek_check_uniq_corr_id swaps
        PyamqpTransport.parse_received_message for a version that drops deferred messages'
        lock tokens); every later test in the process would run against that. In Microsoft's
        pipeline the order differs; here each test starts from the SDK as installed, and what
        was undone is reported with the test that did it.
        """
        before = _sdk_state()
        yield
        changed = _restore(before)
        if changed:
            entry = self.results.get(item.nodeid, {"outcome": "not run"})
            self.record(item.nodeid, {**entry, "left_patched": changed})

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        entry = self.results.get(report.nodeid)
        if entry is not None and entry["outcome"] == "excluded":
            return
        if report.when == "call" or report.outcome != "passed":
            outcome: str = report.outcome
            if report.skipped:
                outcome = "xfailed" if hasattr(report, "wasxfail") else "skipped"
            elif report.passed and hasattr(report, "wasxfail"):
                outcome = "xpassed"
            previous = self.results.get(report.nodeid)
            if previous is not None and previous["outcome"] == "failed":
                return  # a teardown after a failed call: keep the call's error
            detail = ""
            if report.failed:
                detail = _first_error_line(report)
            elif report.skipped and isinstance(report.longrepr, tuple):
                detail = str(report.longrepr[2])
            self.record(
                report.nodeid,
                {
                    "outcome": outcome,
                    "when": report.when,
                    "duration": round(report.duration, 2),
                    "detail": detail,
                },
            )


_Snapshot = dict[tuple[str, str], tuple[Any, dict[str, Any]]]


def _sdk_state() -> _Snapshot:
    """Every azure.servicebus module's and class's attributes, by identity."""
    state: _Snapshot = {}
    for module_name, module in list(sys.modules.items()):
        if module is None or not module_name.startswith("azure.servicebus"):
            continue
        state[(module_name, "")] = (module, dict(vars(module)))
        for attribute, value in list(vars(module).items()):
            if isinstance(value, type) and value.__module__ == module_name:
                state[(module_name, attribute)] = (value, dict(vars(value)))
    return state


def _restore(before: _Snapshot) -> list[str]:
    """Put back what changed since ``before``; the names of what was put back."""
    changed: list[str] = []
    for (module_name, class_name), (owner, attributes) in before.items():
        now = vars(owner)
        for name, value in attributes.items():
            if now.get(name, _MISSING) is not value:
                setattr(owner, name, value)
                changed.append(f"{module_name}.{class_name + '.' if class_name else ''}{name}")
        if class_name:  # attributes a test added to a class (a module may import lazily)
            # (__slotnames__ is copyreg's cache, filled by copy/pickle: not a patch)
            for name in [n for n in now if n not in attributes and n != "__slotnames__"]:
                delattr(owner, name)
                changed.append(f"{module_name}.{class_name}.{name} (added)")
    return changed


_MISSING = object()


def _first_error_line(report: pytest.TestReport) -> str:
    text = str(report.longrepr)
    errors = [line for line in text.splitlines() if line.startswith("E ")]
    chosen = errors[0] if errors else (text.splitlines() or [""])[-1]
    return chosen[:400]


def configure(config: pytest.Config) -> None:
    """The harness conftest's pytest_configure: markers, routing, the plugin."""
    for marker in ("liveTest", "live_test_only", "playback_test_only"):
        config.addinivalue_line("markers", f"{marker}: azure-servicebus live test marker")
    install_routing()
    config.pluginmanager.register(PeerPlugin(), "peer-plugin")
