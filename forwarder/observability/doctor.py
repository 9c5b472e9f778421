"""`sebridge doctor`: is the forwarder on this VM set up so that it can work?

It reads the forwarder's configuration the way the forwarder gets it (the unit's environment
files ``/etc/sebridge/forwarder.env`` and ``forwarder.local.env``, then the environment, then
flags: every ``sebridge forwarder`` flag is accepted) and checks, each within a deadline:

- ``config``: the configuration is valid;
- ``imds``: IMDS answers and scheduled events are enabled (the first call after 24 h without
  one may take up to 2 minutes: said before waiting, and waited for at most ``--imds-timeout``),
  and the VM's name (its session on ``approvals``);
- ``token``: the forwarder's credential (``--credential``: its own managed-identity one, or
  azure-identity's default chain) gets an Entra token for Service Bus; the same credential
  signs the ``send`` and ``receive`` checks in (skipped with a connection string);
- ``send``: it may send to the topic: it sends one Heartbeat (harmless, and what the README's
  Verify step then looks for on the topic);
- ``receive``: it may receive from its own session on ``approvals``: it peeks (never settles or
  takes a command); a session locked by another receiver is the running forwarder's: good;
- ``unit``: the systemd unit's state (skipped without systemd);
- ``forwarder``: the health ``sebridge status`` reports from the state directory;
- ``hooks``: the hooks file loads and passes the forwarder's ownership check;
- ``probe``: the drain probe answers on its port.

One line per check: ``ok``, ``warn``, ``FAIL`` or ``skip``, what was found, and for a failure
the fix in a sentence. ``--json`` prints one document instead. Exit 0: no check failed; 1: a
check failed; 2: usage error. Nothing secret is printed: no token, no connection string.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO, TypeVar

from sebridge import __version__, servicebus
from sebridge.contract.events import Envelope, Observer, heartbeat_message
from sebridge.forwarder import signin
from sebridge.forwarder.config import ConfigError, ForwarderConfig, build_parser, config_from_args
from sebridge.forwarder.delivery.publisher import PublishError, ServiceBusPublisher
from sebridge.forwarder.imds.client import FIRST_CALL_READ_TIMEOUT, ImdsClient, hostname_observer
from sebridge.forwarder.local.hooks_file import HooksFileError, load_hooks
from sebridge.forwarder.net.client import DeadlineHttp
from sebridge.forwarder.observability.status_cli import collect
from sebridge.forwarder.ports import ImdsError
from sebridge.imds import Document
from sebridge.signals import StopEvent
from sebridge.text import printable, printable_lines

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
# Where install-forwarder.sh writes the configuration; the unit reads them in this order.
ENV_FILES = (Path("/etc/sebridge/forwarder.env"), Path("/etc/sebridge/forwarder.local.env"))
UNIT = "sebridge-forwarder.service"
DEFAULT_TIMEOUT = 30.0  # seconds for each Service Bus, identity and local check
PROBE_TIMEOUT = 5.0
RECEIVE_WAIT = 5.0
PEEK_COUNT = 10
# The settings the forwarder reads from its environment.
_SETTING_PREFIXES = ("SEBRIDGE_",)
_SETTING_NAMES = ("AZURE_CLIENT_ID",)

OK, WARN, FAIL, SKIP = "ok", "warn", "FAIL", "skip"
T = TypeVar("T")


@dataclass
class Check:
    name: str
    status: str
    what: str
    fix: str = ""

    def line(self) -> str:
        """One line for a terminal: whatever a check quotes (IMDS's VM name or error bodies,
        a peer's message) goes through :func:`sebridge.text.printable`, so an escape sequence,
        a bidi override or a line break from outside is shown, never obeyed."""
        text = f"{self.status:<4}  {self.name:<9}  {printable(self.what)}"
        return f"{text}. Fix: {printable(self.fix)}" if self.fix else text

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "status": self.status, "what": self.what, "fix": self.fix}


class CheckTimeout(Exception):
    """A check did not finish by its deadline (its thread is left behind)."""


def bounded(call: Callable[[], T], seconds: float) -> T:
    """``call()`` on a daemon thread, waited for at most ``seconds`` (raises CheckTimeout)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=run, name="doctor-check", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise CheckTimeout(f"no answer within {seconds:g} s")
    if "error" in box:
        raise box["error"]
    value: T = box["value"]
    return value


# --- the configuration, as the unit passes it ---------------------------------------------


def read_env_file(path: Path) -> dict[str, str]:
    """A systemd EnvironmentFile: ``KEY=VALUE`` lines, ``#``/``;`` comments, optional quotes."""
    values: dict[str, str] = {}
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")) or "=" not in line:
            continue
        key, _, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        values[key] = value
    return values


@dataclass
class Sources:
    """Where the settings came from: the files read, those that could not be, and the names
    the caller's environment set on top of them."""

    read: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)
    from_environment: list[str] = field(default_factory=list)


def effective_environment(
    files: Sequence[Path], environ: Mapping[str, str]
) -> tuple[dict[str, str], Sources]:
    """The unit's environment files in order (later ones win), then the forwarder's settings
    from ``environ`` on top (what an operator sets by hand wins, and is named)."""
    merged: dict[str, str] = {}
    sources = Sources()
    for path in files:
        try:
            merged.update(read_env_file(path))
        except FileNotFoundError:
            continue
        except (OSError, UnicodeDecodeError) as exc:
            sources.unreadable.append(f"{path} ({type(exc).__name__}: {exc.args[-1]})")
            continue
        sources.read.append(str(path))
    for name, value in environ.items():
        if name.startswith(_SETTING_PREFIXES) or name in _SETTING_NAMES:
            if merged.get(name) != value:
                sources.from_environment.append(name)
            merged[name] = value
    # Everything else the process needs (PATH, IDENTITY_ENDPOINT, proxies...) is the caller's.
    return {**environ, **merged}, sources


def _pre_parser() -> argparse.ArgumentParser:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--env-file", action="append", type=Path, default=None)
    pre.add_argument("--no-env-files", action="store_true")
    return pre


def _add_doctor_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("doctor")
    group.add_argument("--json", action="store_true", help="one JSON document on stdout")
    group.add_argument(
        "--env-file",
        action="append",
        type=Path,
        default=None,
        metavar="PATH",
        help="read the forwarder's settings from this file (repeatable; default: "
        + ", ".join(str(p) for p in ENV_FILES)
        + ", as the unit does)",
    )
    group.add_argument(
        "--no-env-files", action="store_true", help="read no environment file at all"
    )
    group.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        help="seconds each Service Bus, identity and local check may take (default %(default)s)",
    )
    group.add_argument(
        "--imds-timeout",
        type=float,
        default=FIRST_CALL_READ_TIMEOUT,
        help="seconds to wait for IMDS: its first call after 24 h without one may take up to 2 "
        "minutes (default %(default)s)",
    )
    group.add_argument(
        "--no-send", action="store_true", help="do not send the test Heartbeat to the topic"
    )
    group.add_argument("--unit", default=UNIT, help="the systemd unit (default %(default)s)")


def parser_for(env: Mapping[str, str]) -> argparse.ArgumentParser:
    """The forwarder's own flags (defaults from ``env``) and the doctor's."""
    parser = build_parser(env)
    parser.prog = "sebridge doctor"
    parser.description = (
        "Check that the forwarder on this VM can work: IMDS, the identity's Service Bus token, "
        "sending to the topic and receiving from its approvals session, the systemd unit, the "
        "hooks file and the drain probe. One line per check with the fix. Takes every "
        "`sebridge forwarder` flag; reads the unit's environment files first. Exit 0 all ok, "
        "1 a check failed, 2 usage error."
    )
    for action in parser._actions:  # the forwarder's run-mode flags mean nothing here
        if action.dest in {"once", "log_format", "log_level"}:
            action.help = argparse.SUPPRESS
    _add_doctor_arguments(parser)
    return parser


# --- the checks ---------------------------------------------------------------------------


def _first_line(exc: BaseException, limit: int = 300) -> str:
    text = str(exc).strip().splitlines()
    detail = text[0] if text else ""
    message = f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__
    return message if len(message) <= limit else message[: limit - 3] + "..."


def token_object_id(token: str) -> str | None:
    """The ``oid`` claim of an Entra access token (read, not verified: for display only)."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (ValueError, binascii.Error, UnicodeError, RecursionError):
        return None
    oid = claims.get("oid") if isinstance(claims, dict) else None
    return oid if isinstance(oid, str) else None


def _sdk_errors() -> dict[str, type[BaseException]]:
    from azure.servicebus import exceptions as sb

    return {
        "authorization": sb.ServiceBusAuthorizationError,
        "authentication": sb.ServiceBusAuthenticationError,
        "not-found": sb.MessagingEntityNotFoundError,
        "locked": sb.SessionCannotBeLockedError,
        "connection": sb.ServiceBusConnectionError,
        "timeout": sb.OperationTimeoutError,
    }


def _kind(exc: BaseException) -> str:
    """What an SDK error (or the one a PublishError wraps) is, as the fixes tell them apart."""
    cause = exc.__cause__ if isinstance(exc, PublishError) and exc.__cause__ else exc
    for kind, error in _sdk_errors().items():
        if isinstance(cause, error):
            return kind
    return "other"


class Doctor:
    def __init__(self, args: argparse.Namespace, environ: Mapping[str, str], sources: Sources):
        self.args = args
        self.environ = environ
        self.sources = sources
        self.config: ForwarderConfig | None = None
        self.config_error: str | None = None
        self.observer: Observer | None = None
        self.document: Document | None = None
        self.polled_at: datetime | None = None
        self.principal: str | None = None  # the identity's object id, from its token
        self.token_failed = False
        self.heartbeat_id: str | None = None
        self.stuck = False  # a check's thread was left behind
        # The forwarder's credential, made once as it makes it (namespace configurations only);
        # ``cancel`` ends its requests when the doctor is done.
        self.cancel = StopEvent()
        self.credential: Any = None

    # -- config -----------------------------------------------------------------------------
    def check_config(self) -> Check:
        fix_files = (
            "run it as root (sudo sebridge doctor): the unit's environment files are readable "
            "by root and the sebridge group only"
        )
        try:
            self.config = config_from_args(self.args)
        except ConfigError as exc:
            self.config_error = str(exc)
            fix = (
                fix_files
                if self.sources.unreadable
                else "rerun install-forwarder.sh with SEBRIDGE_NAMESPACE and AZURE_CLIENT_ID (the "
                "outputs of main.bicep), or set it in /etc/sebridge/forwarder.local.env"
            )
            return Check("config", FAIL, f"the forwarder would not start: {exc}", fix)
        config = self.config
        where = ", ".join(self.sources.read) or "no environment file"
        if self.sources.from_environment:
            where += f"; from the environment: {', '.join(sorted(self.sources.from_environment))}"
        if config.dry_run or not (config.namespace or config.connection_string):
            target = "dry run (sends nothing)"
        elif config.namespace:
            client = f", client id {config.client_id}" if config.client_id else ""
            target = f"namespace {config.namespace}{client}"
        else:
            target = "Service Bus by connection string (an emulator)"

        what = (
            f"{target}; topic {config.topic}, queue {config.reply_queue}, IMDS "
            f"{config.imds_endpoint} ({where})"
        )
        if self.sources.unreadable:
            return Check(
                "config",
                WARN,
                f"{what}; could not read {', '.join(self.sources.unreadable)}",
                fix_files,
            )
        if config.namespace and not config.client_id:
            return Check(
                "config",
                WARN,
                f"{what}; no AZURE_CLIENT_ID: the VM's system-assigned identity is used",
                "set AZURE_CLIENT_ID to the forwarders' identity (output forwarderIdentityClientId "
                "of main.bicep), which holds the Service Bus roles",
            )
        return Check("config", OK, what)

    # -- IMDS ---------------------------------------------------------------------------------
    def check_imds(self, notice: Callable[[str], None]) -> Check:
        assert self.config is not None
        config = self.config
        fix = (
            f"IMDS ({config.imds_endpoint}) must be reachable from this VM (the forwarder connects "
            "directly, never through a proxy): no firewall rule or route dropping it; this must "
            "be an Azure VM"
        )
        notice(
            "imds: asking IMDS for scheduled events; the first call after 24 h without one may "
            f"take up to 2 minutes (waiting at most {self.args.imds_timeout:g} s)"
        )
        client = ImdsClient(config.imds_endpoint, api_version=config.api_version)
        started = time.monotonic()
        try:
            document = bounded(
                lambda: client.get_document(read_timeout=self.args.imds_timeout),
                self.args.imds_timeout + 5,
            )
        except (ImdsError, CheckTimeout) as exc:
            client.close()
            if isinstance(exc, CheckTimeout):
                self.stuck = True
            if isinstance(exc, ImdsError) and not exc.transient:
                fix = (
                    f"check SEBRIDGE_IMDS_ENDPOINT and SEBRIDGE_API_VERSION ({config.api_version})"
                )
            return Check("imds", FAIL, f"no scheduled events from IMDS: {exc}", fix)
        self.document, self.polled_at = document, datetime.now(UTC)
        took = time.monotonic() - started
        what = (
            f"scheduled events enabled at {config.imds_endpoint} (answered in {took:.1f} s; "
            f"DocumentIncarnation {document.incarnation}, {len(document.events)} event(s))"
        )
        try:
            observer = bounded(client.instance_metadata, 15.0)
        except (ImdsError, CheckTimeout) as exc:
            observer = hostname_observer()
            self.observer = self._with_name(observer)
            return Check(
                "imds",
                WARN,
                f"{what}; no instance metadata ({exc}): the VM name is taken from the host name, "
                f"{self.observer.vm_name!r}, and so is the approvals session",
                "make /metadata/instance reachable too, or set SEBRIDGE_VM_NAME to the VM's name "
                "in Azure",
            )
        finally:
            client.close()
        self.observer = self._with_name(observer)
        return Check("imds", OK, f"{what}; VM {self.observer.vm_name}")

    def _with_name(self, observer: Observer) -> Observer:
        assert self.config is not None
        if self.config.vm_name:
            return replace(observer, vm_name=self.config.vm_name)
        return observer

    def _vm_name(self) -> str:
        if self.observer is None:
            self.observer = self._with_name(hostname_observer())
        return self.observer.vm_name

    # -- Service Bus ---------------------------------------------------------------------------
    def _service_bus_skip(self, name: str) -> Check | None:
        config = self.config
        if config is None:
            return Check(name, SKIP, "no valid configuration")
        if config.dry_run or not (config.namespace or config.connection_string):
            return Check(name, SKIP, "the forwarder runs --dry-run: it sends and receives nothing")
        if self.token_failed:
            return Check(name, SKIP, "no Service Bus token (above)")
        return None

    def _credential(self) -> Any:
        """The forwarder's token credential, made as ``sebridge forwarder`` makes it (its
        ``--credential`` and client id), once: the token, send and receive checks share it, as
        the forwarder's publisher and approvals receiver do. None with a connection string."""
        config = self.config
        if config is None or config.connection_string or not config.namespace:
            return None
        if self.credential is None:
            self.credential = signin.credential(
                config.credential, config.client_id, cancel=self.cancel
            )
        return self.credential

    def _credential_name(self) -> str:
        assert self.config is not None
        if self.config.credential == signin.DEFAULT_CHAIN:
            return "azure-identity's default chain (--credential default)"
        return "the forwarder's managed-identity credential (IMDS's token endpoint)"

    def check_token(self) -> Check:
        skip = self._service_bus_skip("token")
        if skip is not None:
            return skip
        assert self.config is not None
        config = self.config
        if not config.namespace:
            return Check("token", SKIP, "a connection string (an emulator) needs no token")
        who = (
            f"client id {config.client_id}" if config.client_id else "the system-assigned identity"
        )
        via = f"through {self._credential_name()}"
        try:
            credential = self._credential()
            token = bounded(lambda: credential.get_token(servicebus.TOKEN_SCOPE), self.args.timeout)
        except CheckTimeout as exc:
            self.stuck = self.token_failed = True
            return Check(
                "token", FAIL, f"no Service Bus token for {who} {via}: {exc}", self._identity_fix()
            )
        except Exception as exc:  # noqa: BLE001 - TokenError, azure-identity's several kinds
            self.token_failed = True
            return Check(
                "token",
                FAIL,
                f"no Service Bus token for {who} {via}: {_first_line(exc)}",
                self._identity_fix(),
            )
        self.principal = token_object_id(token.token)
        left = max(0, int(token.expires_on - time.time()))
        whose = f" (object id {self.principal})" if self.principal else ""
        return Check(
            "token",
            OK,
            f"a Service Bus token for {who}{whose} {via}, valid for {left // 60} min",
        )

    def _identity_fix(self) -> str:
        return (
            "attach the forwarders' user-assigned identity to this VM (az vm identity assign "
            "--identities <forwarderIdentityResourceId>, or forwarder.bicep) and set "
            "AZURE_CLIENT_ID to its client id (output forwarderIdentityClientId of main.bicep)"
        )

    def _grant_fix(self, role: str, entity: str) -> str:
        assert self.config is not None
        if self.config.connection_string:
            return f"the connection string's policy needs the {role.split()[-1]} right on {entity}"
        who = (
            f"--assignee-object-id {self.principal}"
            if self.principal
            else "--assignee <the identity>"
        )
        return (
            f"grant the forwarders' identity {role} on {entity}: deploy main.bicep again (its "
            f"servicebus-roles module grants it), or az role assignment create {who} "
            f'--assignee-principal-type ServicePrincipal --role "{role}" --scope <its resource id>'
        )

    def _reach_fix(self) -> str:
        assert self.config is not None
        if self.config.servicebus_transport == "websocket":
            return "outbound TCP 443 to the namespace must be open (AMQP over WebSockets)"
        return (
            "outbound TCP 5671 (AMQP) to the namespace must be open, or set "
            "SEBRIDGE_SERVICEBUS_TRANSPORT=websocket to use 443"
        )

    def heartbeat(self) -> Envelope:
        observer = self.observer or self._with_name(hostname_observer())
        depth = 0
        if self.config is not None:
            depth = collect(self.config.state_dir).outbox_depth or 0
        return heartbeat_message(
            observer,
            datetime.now(UTC),
            # Says who sent it: the doctor, not the forwarder's loop.
            forwarder_version=f"{__version__}+doctor",
            last_incarnation=self.document.incarnation if self.document else None,
            outbox_depth=depth,
            last_successful_poll=self.polled_at,
        )

    def check_send(self) -> Check:
        skip = self._service_bus_skip("send")
        if skip is not None:
            return skip
        assert self.config is not None
        config = self.config
        if self.args.no_send:
            return Check("send", SKIP, "--no-send: no test Heartbeat was sent")
        envelope = self.heartbeat()
        publisher = ServiceBusPublisher(
            config.topic,
            namespace=config.namespace,
            connection_string=config.connection_string,
            client_id=config.client_id,
            credential=self._credential(),
            max_message_size=config.max_message_size,
            transport=config.servicebus_transport,
            endpoint=config.servicebus_endpoint,
        )
        try:
            bounded(lambda: publisher.publish([envelope]), self.args.timeout)
        except CheckTimeout as exc:
            self.stuck = True
            return Check("send", FAIL, f"sending to topic {config.topic}: {exc}", self._reach_fix())
        except Exception as exc:  # noqa: BLE001 - PublishError, MessageRefused, anything
            return self._send_failed(exc)
        finally:
            self._close(publisher.close)
        self.heartbeat_id = envelope.message_id
        return Check(
            "send",
            OK,
            f"sent a Heartbeat to topic {config.topic} (message id {envelope.message_id}, "
            f"session {envelope.session_id})",
        )

    def _close_credential(self) -> None:
        """Done with Service Bus: end the credential's requests (a call left behind by a
        deadline stops asking IMDS) and close it."""
        self.cancel.set()
        if self.credential is not None:
            self._close(self.credential.close)

    def _close(self, close: Callable[[], object]) -> None:
        """Close an SDK client within a few seconds, or leave it behind (never raises)."""
        try:
            bounded(close, 5.0)
        except CheckTimeout:
            self.stuck = True
        except Exception:  # noqa: BLE001, S110 - closing a broken link may fail too
            pass

    def _send_failed(self, exc: BaseException) -> Check:
        assert self.config is not None
        topic = f"topic {self.config.topic}"
        kind = _kind(exc)
        what = f"cannot send to {topic}: {_first_line(exc)}"
        if kind == "authorization":
            return Check(
                "send",
                FAIL,
                f"not allowed to send to {topic}",
                self._grant_fix("Azure Service Bus Data Sender", topic),
            )
        if kind == "not-found":
            return Check(
                "send",
                FAIL,
                what,
                "SEBRIDGE_TOPIC must name the topic main.bicep made "
                "(scheduled-events), in the namespace SEBRIDGE_NAMESPACE names",
            )
        if kind == "authentication":
            return Check(
                "send",
                FAIL,
                what,
                "the namespace refused the token: SEBRIDGE_NAMESPACE "
                "must be main.bicep's output serviceBusNamespace",
            )
        return Check("send", FAIL, what, self._reach_fix())

    def check_receive(self) -> Check:
        skip = self._service_bus_skip("receive")
        if skip is not None:
            return skip
        assert self.config is not None
        config = self.config
        session = self._vm_name()
        queue = f"queue {config.reply_queue}"
        credential = self._credential()

        def peek() -> int:
            client = servicebus.client(
                namespace=config.namespace,
                connection_string=config.connection_string,
                client_id=config.client_id,
                credential=credential,
                transport=config.servicebus_transport,
                endpoint=config.servicebus_endpoint,
                retry_total=0,
            )
            with client:
                receiver = client.get_queue_receiver(
                    config.reply_queue, session_id=session, max_wait_time=RECEIVE_WAIT
                )
                with receiver:
                    # A peek takes nothing: no lock on a message, no settlement.
                    return len(receiver.peek_messages(max_message_count=PEEK_COUNT))

        try:
            waiting = bounded(peek, self.args.timeout)
        except CheckTimeout as exc:
            self.stuck = True
            return Check("receive", FAIL, f"receiving from {queue}: {exc}", self._reach_fix())
        except Exception as exc:  # noqa: BLE001 - the SDK's errors, told apart below
            kind = _kind(exc)
            if kind == "locked":
                return Check(
                    "receive",
                    OK,
                    f"may receive from {queue}: session {session} is locked by another receiver, "
                    "the running forwarder (it is listening for approve commands)",
                )
            if kind == "authorization":
                return Check(
                    "receive",
                    FAIL,
                    f"not allowed to receive from {queue}",
                    self._grant_fix("Azure Service Bus Data Receiver", queue),
                )
            if kind == "not-found":
                return Check(
                    "receive",
                    FAIL,
                    f"cannot receive from {queue}: {_first_line(exc)}",
                    "SEBRIDGE_REPLY_QUEUE must name the queue main.bicep made (approvals)",
                )
            return Check(
                "receive",
                FAIL,
                f"cannot receive from {queue}: {_first_line(exc)}",
                self._reach_fix(),
            )
        what = (
            f"may receive from {queue}, session {session}: {waiting} command(s) waiting "
            "(peeked, none taken); no other receiver held the session"
        )
        if waiting:
            return Check(
                "receive",
                WARN,
                what,
                "commands are waiting and no forwarder is receiving them: start the unit "
                f"(sudo systemctl enable --now {self.args.unit})",
            )
        return Check("receive", OK, what)

    # -- the VM itself --------------------------------------------------------------------------
    def check_unit(self) -> Check:
        unit = self.args.unit
        systemctl = shutil.which("systemctl")
        if systemctl is None:
            return Check("unit", SKIP, f"no systemctl on this machine: {unit} not checked")
        try:
            proc = subprocess.run(  # noqa: S603 - systemctl from PATH, fixed arguments
                [
                    systemctl,
                    "show",
                    unit,
                    "--property=LoadState,ActiveState,SubState,NRestarts,Result",
                ],
                capture_output=True,
                text=True,
                timeout=self.args.timeout,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return Check("unit", SKIP, f"systemctl did not answer: {_first_line(exc)}")
        if proc.returncode != 0:
            reason = (proc.stderr.strip().splitlines() or ["no reason given"])[0]
            return Check("unit", SKIP, f"systemd cannot be asked here: {reason[:200]}")
        state = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
        logs = f"journalctl -u {unit} -n 50 says why"
        if state.get("LoadState") == "not-found":
            return Check(
                "unit",
                FAIL,
                f"{unit} is not installed",
                "install it: install-forwarder.sh (forwarder.bicep runs it), docs/deploy.md",
            )
        active, sub = state.get("ActiveState", "?"), state.get("SubState", "?")
        restarts = state.get("NRestarts", "0")
        what = f"{unit} is {active} ({sub})"
        if active != "active":
            return Check(
                "unit",
                FAIL,
                f"{what}, result {state.get('Result', '?')}",
                f"sudo systemctl enable --now {unit}; {logs}",
            )
        if restarts.isdigit() and int(restarts) > 0:
            return Check(
                "unit",
                WARN,
                f"{what}, restarted {restarts} time(s) since it was started",
                f"a forwarder that keeps restarting is failing: {logs}",
            )
        return Check("unit", OK, what)

    def check_forwarder(self) -> Check:
        if self.config is None:
            return Check("forwarder", SKIP, "no valid configuration")
        report = collect(self.config.state_dir)
        reasons = report.reasons + report.problems
        if report.no_state:
            cannot = any("cannot look into" in r for r in reasons)
            return Check(
                "forwarder",
                WARN,
                "; ".join(reasons) or f"no state in {self.config.state_dir}",
                "run it as root (sudo sebridge doctor): the state directory is the service's"
                if cannot
                else f"the forwarder has not run yet: start it (sudo systemctl enable --now "
                f"{self.args.unit})",
            )
        depth = report.outbox_depth
        if report.verdict == "healthy":
            status = report.status or {}
            poll = (status.get("lastPoll") or {}).get("at")
            return Check(
                "forwarder",
                OK,
                f"healthy (sebridge status): last poll {poll}, {depth} message(s) waiting to be "
                "sent",
            )
        return Check(
            "forwarder",
            FAIL,
            "degraded (sebridge status): " + "; ".join(reasons)[:400],
            f"sudo sebridge status shows the details; journalctl -u {self.args.unit}",
        )

    def check_hooks(self) -> Check:
        if self.config is None:
            return Check("hooks", SKIP, "no valid configuration")
        path = self.config.local.hooks_file
        if path is None:
            return Check("hooks", SKIP, "no hooks file (SEBRIDGE_HOOKS_FILE is not set)")
        try:
            hooks = bounded(lambda: load_hooks(path), self.args.timeout)
        except CheckTimeout as exc:
            return Check("hooks", FAIL, f"reading {path}: {exc}", "is it on a stalled mount?")
        except HooksFileError as exc:
            if "refused" in str(exc):
                fix = (
                    f"chown root:root {path} and chmod go-w it and every directory above it: "
                    "whoever can change it decides what the forwarder runs"
                )
            else:
                fix = (
                    f"correct the file; python -m sebridge.forwarder.local.hooks_file {path} "
                    "checks it as the forwarder does (docs/vm-actions.md)"
                )
            return Check("hooks", FAIL, f"the forwarder would refuse it: {exc}", fix)
        names = ", ".join(h.name for h in hooks.hooks) or "none"
        return Check(
            "hooks", OK, f"{path}: {len(hooks.hooks)} hook(s) ({names}); only root can change it"
        )

    def check_probe(self) -> Check:
        if self.config is None:
            return Check("probe", SKIP, "no valid configuration")
        port = self.config.local.probe_port
        if port is None:
            return Check("probe", SKIP, "no drain probe (SEBRIDGE_DRAIN_PROBE_PORT is not set)")
        address = self.config.local.probe_address
        # The probe binds every address by default; ask it on loopback then.
        wildcard = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}  # noqa: S104
        host = wildcard.get(address, address)
        url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
        http = DeadlineHttp(url, max_body=4096, connect_timeout=PROBE_TIMEOUT)
        try:
            answer = http.request("GET", "/", timeout=PROBE_TIMEOUT)
        except Exception as exc:  # noqa: BLE001 - refused, reset, timed out: nothing answers
            return Check(
                "probe",
                FAIL,
                f"nothing answers on {url}: {_first_line(exc)}",
                "the forwarder serves it once it runs (check the unit above); if it does, "
                "SEBRIDGE_DRAIN_PROBE_PORT is taken by another program (journalctl says so)",
            )
        finally:
            http.close()
        meaning = {200: "in service", 503: "draining: an impactful event of this VM is on"}
        return Check(
            "probe",
            OK,
            f"{url} answers {answer.status} ({meaning.get(answer.status, 'not the probe?')}); "
            "let only the AzureLoadBalancer service tag reach it",
        )

    # -- all of them ------------------------------------------------------------------------------
    def run(self, emit: Callable[[Check], None], notice: Callable[[str], None]) -> list[Check]:
        checks: list[Check] = []

        def record(check: Check) -> None:
            checks.append(check)
            emit(check)

        record(self.check_config())
        if self.config is not None:
            record(self.check_imds(notice))
        else:
            record(Check("imds", SKIP, "no valid configuration"))
        try:
            record(self.check_token())
            record(self.check_send())
            record(self.check_receive())
        finally:
            self._close_credential()
        record(self.check_unit())
        record(self.check_forwarder())
        record(self.check_hooks())
        record(self.check_probe())
        return checks


def run(
    argv: Sequence[str] | None,
    *,
    environ: Mapping[str, str] | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> tuple[int, bool]:
    """The doctor's work: (exit code, whether a check's thread was left behind)."""
    environ = os.environ if environ is None else environ
    out = out or sys.stdout
    err = err or sys.stderr
    argv = list(sys.argv[1:] if argv is None else argv)
    pre, _ = _pre_parser().parse_known_args(argv)
    files = [] if pre.no_env_files else (pre.env_file or list(ENV_FILES))
    merged, sources = effective_environment(files, environ)
    try:
        args = parser_for(merged).parse_args(argv)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        return (exc.code if isinstance(exc.code, int) else EXIT_USAGE), False
    doctor = Doctor(args, merged, sources)

    def emit(check: Check) -> None:
        if not args.json:
            print(check.line(), file=out, flush=True)

    def notice(text: str) -> None:
        print(printable_lines(text), file=err, flush=True)

    checks = doctor.run(emit, notice)
    failed = any(c.status == FAIL for c in checks)
    if args.json:
        document = {
            "ok": not failed,
            "checks": [c.to_json() for c in checks],
            "configuration": doctor.config.describe() if doctor.config else None,
            "environmentFiles": sources.read,
            "heartbeatMessageId": doctor.heartbeat_id,
        }
        print(json.dumps(document, indent=2), file=out, flush=True)
    return (EXIT_FAILED if failed else EXIT_OK), doctor.stuck


def main(argv: list[str] | None = None) -> int:
    # The doctor prints one line per check; nothing else configures logging here, so the SDK's
    # records (a send thread left behind by --timeout reports its torn-down link, with a
    # traceback) would reach stderr through logging's last resort. They go nowhere instead.
    azure = logging.getLogger("azure")
    if not azure.handlers:
        azure.addHandler(logging.NullHandler())
        azure.propagate = False
    code, stuck = run(argv)
    if stuck:
        # A check's call never returned (a Service Bus or identity call): leave without
        # waiting for its thread.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
