"""`sebridge forwarder` settings: flags, each with an environment-variable equivalent."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sebridge.forwarder.delivery.outbox import DEFAULT_MAX_ROWS
from sebridge.forwarder.delivery.publisher import STANDARD_MAX_MESSAGE_BYTES
from sebridge.forwarder.imds.client import DEFAULT_ENDPOINT, SCHEDULED_EVENTS_API
from sebridge.forwarder.local import settings as local_actions
from sebridge.forwarder.net.client import check_url
from sebridge.forwarder.signin import (
    CREDENTIALS,
    MANAGED_IDENTITY,
    check_client_id,
    check_credential,
)
from sebridge.servicebus import add_connection_arguments, check_endpoint, check_transport
from sebridge.values import parse_bool

DEFAULT_STATE_DIR = "/var/lib/sebridge"
DEFAULT_TOPIC = "scheduled-events"
DEFAULT_REPLY_QUEUE = "approvals"
DEFAULT_HEARTBEAT_SECONDS = 300.0
DEFAULT_METRICS_ADDRESS = "127.0.0.1"


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class ForwarderConfig:
    imds_endpoint: str = DEFAULT_ENDPOINT
    api_version: str = SCHEDULED_EVENTS_API
    poll_interval: float = 1.0
    state_dir: Path = Path(DEFAULT_STATE_DIR)
    namespace: str | None = None
    connection_string: str | None = None
    client_id: str | None = None
    # With a namespace: the VM's managed identity (the forwarder's own, through IMDS), or
    # azure-identity's default chain (sebridge.forwarder.signin).
    credential: str = MANAGED_IDENTITY
    servicebus_transport: str = "amqp"  # or "websocket": AMQP over WebSockets on 443
    servicebus_endpoint: str | None = None  # sb://host[:port]: a gateway, a route, an emulator
    topic: str = DEFAULT_TOPIC
    reply_queue: str = DEFAULT_REPLY_QUEUE
    vm_name: str | None = None
    require_listed: bool = False
    heartbeat_interval: float = DEFAULT_HEARTBEAT_SECONDS
    outbox_max: int = DEFAULT_MAX_ROWS
    max_message_size: int = STANDARD_MAX_MESSAGE_BYTES
    log_format: str = "text"
    log_level: str = "INFO"
    once: bool = False
    dry_run: bool = False
    # Hooks and the drain probe (sebridge.forwarder.local.actions): off unless configured.
    local: local_actions.LocalSettings = local_actions.NO_LOCAL_ACTIONS
    # /metrics and /healthz (sebridge.forwarder.observability.metrics): off unless a port is given.
    metrics_port: int | None = None
    metrics_address: str = DEFAULT_METRICS_ADDRESS

    def describe(self) -> dict[str, Any]:
        """The effective configuration for the start-up log line: never a secret."""
        return {
            "imdsEndpoint": self.imds_endpoint,
            "apiVersion": self.api_version,
            "pollInterval": self.poll_interval,
            "stateDir": str(self.state_dir),
            "namespace": self.namespace,
            "connectionString": "<set>" if self.connection_string else None,
            "clientId": self.client_id,
            "credential": self.credential,
            "serviceBusTransport": self.servicebus_transport,
            "serviceBusEndpoint": self.servicebus_endpoint,
            "topic": self.topic,
            "replyQueue": self.reply_queue,
            "vmName": self.vm_name,
            "requireListed": self.require_listed,
            "heartbeatInterval": self.heartbeat_interval,
            "outboxMax": self.outbox_max,
            "maxMessageSize": self.max_message_size,
            "once": self.once,
            "dryRun": self.dry_run,
            **self.local.describe(),
            "metricsPort": self.metrics_port,
            "metricsAddress": self.metrics_address,
        }


def _env_bool(value: str) -> bool:
    try:
        return parse_bool(value)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def build_parser(env: Mapping[str, str]) -> argparse.ArgumentParser:
    def default(name: str, fallback: Any = None) -> Any:
        return env.get(name, fallback)

    p = argparse.ArgumentParser(
        prog="sebridge forwarder",
        description="Poll IMDS scheduled events, publish lifecycle transitions to Service Bus, "
        "and apply approval commands. Every flag has the environment variable shown.",
    )
    p.add_argument(
        "--imds-endpoint",
        default=default("SEBRIDGE_IMDS_ENDPOINT", DEFAULT_ENDPOINT),
        help="IMDS base URL [SEBRIDGE_IMDS_ENDPOINT] (default %(default)s)",
    )
    p.add_argument(
        "--api-version",
        default=default("SEBRIDGE_API_VERSION", SCHEDULED_EVENTS_API),
        help="scheduled events api-version [SEBRIDGE_API_VERSION] (default %(default)s)",
    )
    p.add_argument(
        "--poll-interval",
        default=default("SEBRIDGE_POLL_INTERVAL", "1"),
        help="seconds between polls [SEBRIDGE_POLL_INTERVAL] (default 1)",
    )
    p.add_argument(
        "--state-dir",
        default=default("SEBRIDGE_STATE_DIR", DEFAULT_STATE_DIR),
        help="state and outbox directory [SEBRIDGE_STATE_DIR] (default %(default)s)",
    )
    add_connection_arguments(p, env)
    p.add_argument(
        "--credential",
        choices=CREDENTIALS,
        default=default("SEBRIDGE_CREDENTIAL", MANAGED_IDENTITY),
        help="how --namespace signs in: managed-identity (the VM's, through IMDS's token "
        "endpoint) or default (azure-identity's DefaultAzureCredential: environment, az login, "
        "...; off Azure) [SEBRIDGE_CREDENTIAL] (default %(default)s)",
    )
    p.add_argument(
        "--topic",
        default=default("SEBRIDGE_TOPIC", DEFAULT_TOPIC),
        help="topic to publish to [SEBRIDGE_TOPIC] (default %(default)s)",
    )
    p.add_argument(
        "--reply-queue",
        default=default("SEBRIDGE_REPLY_QUEUE", DEFAULT_REPLY_QUEUE),
        help="approvals queue [SEBRIDGE_REPLY_QUEUE] (default %(default)s)",
    )
    p.add_argument(
        "--vm-name",
        default=default("SEBRIDGE_VM_NAME"),
        help="override the VM name from instance metadata [SEBRIDGE_VM_NAME]",
    )
    p.add_argument(
        "--require-listed",
        action="store_true",
        default=_env_bool(default("SEBRIDGE_REQUIRE_LISTED", "false")),
        help="approve only events whose Resources list this VM [SEBRIDGE_REQUIRE_LISTED]",
    )
    p.add_argument(
        "--heartbeat-interval",
        default=default("SEBRIDGE_HEARTBEAT_INTERVAL", str(DEFAULT_HEARTBEAT_SECONDS)),
        help="seconds between Heartbeats, 0 = off [SEBRIDGE_HEARTBEAT_INTERVAL] (default 300)",
    )
    p.add_argument(
        "--outbox-max",
        default=default("SEBRIDGE_OUTBOX_MAX", str(DEFAULT_MAX_ROWS)),
        help="most messages kept while Service Bus is unreachable "
        "[SEBRIDGE_OUTBOX_MAX] (default %(default)s)",
    )
    p.add_argument(
        "--max-message-size",
        default=default("SEBRIDGE_MAX_MESSAGE_SIZE", str(STANDARD_MAX_MESSAGE_BYTES)),
        help="largest message and batch in bytes: Standard 262144, Premium up to the entity's "
        "limit [SEBRIDGE_MAX_MESSAGE_SIZE] (default %(default)s)",
    )
    p.add_argument(
        "--log-format",
        choices=("text", "json"),
        default=default("SEBRIDGE_LOG_FORMAT", "text"),
        help="log format on stderr [SEBRIDGE_LOG_FORMAT] (default %(default)s)",
    )
    p.add_argument(
        "--log-level",
        default=default("SEBRIDGE_LOG_LEVEL", "INFO"),
        help="DEBUG, INFO, WARNING or ERROR [SEBRIDGE_LOG_LEVEL]",
    )
    p.add_argument("--once", action="store_true", help="poll once, send what is pending, and exit")
    p.add_argument(
        "--dry-run",
        action="store_true",
        default=_env_bool(default("SEBRIDGE_DRY_RUN", "false")),
        help="send nothing: print each message as one JSON line on stdout",
    )
    local_actions.add_arguments(p, env)
    p.add_argument(
        "--metrics-port",
        default=default("SEBRIDGE_METRICS_PORT"),
        help="serve /metrics (Prometheus) and /healthz on this port; off when not given "
        "[SEBRIDGE_METRICS_PORT]",
    )
    p.add_argument(
        "--metrics-address",
        default=default("SEBRIDGE_METRICS_ADDRESS", DEFAULT_METRICS_ADDRESS),
        help="address the metrics endpoint binds; not loopback is logged at WARNING "
        "[SEBRIDGE_METRICS_ADDRESS] (default %(default)s)",
    )
    return p


def _number(name: str, value: str, *, minimum: float, maximum: float) -> float:
    try:
        number = float(value)
    except ValueError as exc:
        raise ConfigError(f"{name} must be a number, not {value!r}") from exc
    if not minimum <= number <= maximum:
        raise ConfigError(f"{name} must be between {minimum:g} and {maximum:g}, not {number:g}")
    return number


def parse_config(
    argv: Sequence[str] | None, env: Mapping[str, str] | None = None
) -> ForwarderConfig:
    """Flags over environment over defaults; :class:`ConfigError` names what is wrong."""
    env = os.environ if env is None else env
    return config_from_args(build_parser(env).parse_args(argv))


def config_from_args(args: argparse.Namespace) -> ForwarderConfig:
    """The configuration from what :func:`build_parser`'s parser read (``sebridge doctor``
    adds its own flags to that parser); :class:`ConfigError` names what is wrong."""
    # Sub-second intervals are for simulator-driven tests: real IMDS throttles above 5/s.
    poll = _number("--poll-interval", args.poll_interval, minimum=0.05, maximum=60)
    heartbeat = _number("--heartbeat-interval", args.heartbeat_interval, minimum=0, maximum=86_400)
    outbox_max = int(_number("--outbox-max", args.outbox_max, minimum=1, maximum=10_000_000))
    max_message_size = int(
        _number("--max-message-size", args.max_message_size, minimum=1024, maximum=100 * 2**20)
    )
    try:
        check_url(args.imds_endpoint, base=True)
    except ValueError as exc:
        raise ConfigError(f"--imds-endpoint cannot be asked: {exc}") from None
    if not (args.dry_run or args.namespace or args.connection_string):
        raise ConfigError(
            "nowhere to publish: give --namespace (managed identity), --connection-string "
            "(emulator) or --dry-run"
        )
    if args.log_level.upper() not in {"DEBUG", "INFO", "WARNING", "ERROR"}:
        raise ConfigError(f"--log-level {args.log_level!r} is not DEBUG/INFO/WARNING/ERROR")
    metrics_port = None
    if args.metrics_port not in (None, ""):
        metrics_port = int(_number("--metrics-port", args.metrics_port, minimum=1, maximum=65535))
        if str(metrics_port) != str(args.metrics_port).strip():
            raise ConfigError(f"--metrics-port must be a port number, not {args.metrics_port!r}")
    if not args.metrics_address.strip():
        raise ConfigError("--metrics-address must not be empty")
    try:
        # (argparse checks a flag's choices; a value from the environment is checked here)
        transport = check_transport(args.servicebus_transport)
    except ValueError as exc:
        raise ConfigError(f"--servicebus-transport: {exc}") from exc
    try:
        endpoint = check_endpoint(args.servicebus_endpoint) if args.servicebus_endpoint else None
    except ValueError as exc:
        raise ConfigError(f"--servicebus-endpoint: {exc}") from exc
    try:
        credential = check_credential(args.credential)
    except ValueError as exc:
        raise ConfigError(f"--credential: {exc}") from exc
    if args.namespace and args.client_id:
        try:
            check_client_id(args.client_id)
        except ValueError as exc:
            raise ConfigError(f"--client-id: {exc}") from exc
    try:
        local = local_actions.settings_from_args(args)
    except local_actions.LocalActionsError as exc:
        raise ConfigError(str(exc)) from exc
    return ForwarderConfig(
        imds_endpoint=args.imds_endpoint,
        api_version=args.api_version,
        poll_interval=poll,
        state_dir=Path(args.state_dir),
        namespace=args.namespace or None,
        connection_string=args.connection_string or None,
        client_id=args.client_id or None,
        credential=credential,
        servicebus_transport=transport,
        servicebus_endpoint=endpoint,
        topic=args.topic,
        reply_queue=args.reply_queue,
        vm_name=args.vm_name or None,
        require_listed=bool(args.require_listed),
        heartbeat_interval=heartbeat,
        outbox_max=outbox_max,
        max_message_size=max_message_size,
        log_format=args.log_format,
        log_level=args.log_level.upper(),
        once=bool(args.once),
        dry_run=bool(args.dry_run),
        local=local,
        metrics_port=metrics_port,
        metrics_address=args.metrics_address.strip(),
    )
