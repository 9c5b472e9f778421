"""`sebridge servicebus-emulator`: a loopback Service Bus emulator speaking AMQP 1.0 (Qpid Proton).

This module is the program: flags, config loading, listening socket, signals. The Proton
adapter is adapter.py; the broker core is broker.py (pure). State lives in memory only: a
restart starts empty, as Microsoft's emulator does.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import shutil
import signal
import socket
import ssl
import sys
from pathlib import Path
from typing import Any

from proton.reactor import Container

from emulators.servicebus import polling
from emulators.servicebus.adapter import EmulatorHandler
from emulators.servicebus.auth import Rights, SasPolicy
from emulators.servicebus.bridge import Listener
from emulators.servicebus.broker import Namespace
from emulators.servicebus.config import ConfigError, load_config, with_max_message_size

LOG = logging.getLogger("sebridge.servicebus_emulator")
REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CONFIG = REPO_ROOT / "infra" / "servicebus-emulator" / "Config.json"


EPILOG = """\
connecting:
  plain AMQP (--port):
    Endpoint=sb://127.0.0.1:<port>;SharedAccessKeyName=RootManageSharedAccessKey;
    SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true;
  AMQP over TLS (--tls-port): a connection string WITHOUT UseDevelopmentEmulator (it turns
    TLS off), e.g. Endpoint=sb://localhost/;SharedAccessKeyName=...;SharedAccessKey=...;
    plus connection_verify=<ca_cert> and custom_endpoint_address='sb://127.0.0.1:<tls port>'
  AMQP over WebSockets (--websocket-port): the plain connection string plus
    transport_type=TransportType.AmqpOverWebsocket and
    custom_endpoint_address='sb://127.0.0.1:<websocket port>' (without it the SDK dials 80/443);
    the forwarder: --servicebus-transport websocket
    --servicebus-endpoint sb://127.0.0.1:<websocket port>
  AMQP over secure WebSockets (--websocket-tls-port): as TLS, with the WebSocket keywords and
    the wss port as custom_endpoint_address
  The certificate (ca_cert) is made at start and written with the ports to --listen-info.
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sebridge servicebus-emulator",
        description=(
            "Loopback Azure Service Bus emulator speaking AMQP 1.0 to the real azure-servicebus "
            "SDK. Entities come from a Config.json in Microsoft's emulator format. State is kept "
            "in memory only: every start is empty. Binds loopback only. Listens for plain AMQP; "
            "TLS, WebSockets and secure WebSockets are off unless their port is given."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="loopback address to bind, 127.0.0.1 or ::1 (default %(default)s)",
    )
    parser.add_argument(
        "--port", type=int, default=5672, help="AMQP port; 0 picks a free one (default %(default)s)"
    )
    parser.add_argument(
        "--config",
        default=str(DEFAULT_CONFIG),
        help="Config.json path (default: the project's infra/servicebus-emulator/Config.json)",
    )
    parser.add_argument(
        "--sas-key-name",
        default="RootManageSharedAccessKey",
        help="SAS key name checked on put-token (default %(default)s)",
    )
    parser.add_argument(
        "--sas-key",
        default="SAS_KEY_VALUE",
        help="SAS key checked on put-token; '' accepts any (default %(default)s, Microsoft's "
        "emulator default)",
    )
    parser.add_argument(
        "--rights",
        type=Path,
        default=None,
        metavar="FILE",
        help="role assignments for JWT principals, as Azure RBAC with local auth off: "
        '{"roleAssignments": [{"principalId": OID, "role": "Azure Service Bus Data Sender", '
        '"scope": "scheduled-events"}]}; a token\'s oid claim gets the Send/Listen/Manage of the '
        'roles assigned to it at a scope covering the entity ("" is the namespace). '
        "(default: none, and any JWT may do anything; SAS keys always may)",
    )
    parser.add_argument(
        "--tls-port",
        type=int,
        default=None,
        help="also listen for AMQP over TLS (amqps) on this port, 0 picks one, with a "
        "self-signed certificate made at start (default: off). Clients pass "
        "connection_verify=<certificate> and, for a port other than 5671, "
        "custom_endpoint_address='sb://127.0.0.1:<tls port>'",
    )
    parser.add_argument(
        "--websocket-port",
        type=int,
        default=None,
        help="also serve AMQP over WebSockets (ws://, subprotocol AMQPWSB10, path "
        "/$servicebus/websocket) on this port, 0 picks one (default: off). Clients add "
        "transport_type=TransportType.AmqpOverWebsocket and "
        "custom_endpoint_address='sb://127.0.0.1:<websocket port>'",
    )
    parser.add_argument(
        "--websocket-tls-port",
        type=int,
        default=None,
        help="also serve AMQP over secure WebSockets (wss://) on this port, 0 picks one, with "
        "the same self-signed certificate as --tls-port (default: off)",
    )
    parser.add_argument(
        "--tls-hostname",
        action="append",
        default=[],
        metavar="NAME",
        help="a DNS name the self-signed certificate is also valid for (repeatable), for "
        "clients that reach the emulator under a namespace's name mapped to loopback "
        "(default: localhost, 127.0.0.1 and ::1 only)",
    )
    parser.add_argument(
        "--tls-info",
        type=Path,
        default=None,
        help="write {port, ca_cert} JSON here once listening (default: none)",
    )
    parser.add_argument(
        "--listen-info",
        type=Path,
        default=None,
        help="write {amqp, amqps, ws, wss: port, ca_cert} JSON here once listening (default: none)",
    )
    parser.add_argument(
        "--max-message-size",
        type=int,
        default=None,
        metavar="BYTES",
        help="lower every entity's maximum message and batch size to BYTES (default: the "
        "tier's limit: Standard 262144; set the Tier in Config.json). Advertised on sender "
        "links (create_message_batch obeys it) and enforced: a larger transfer is rejected "
        "with amqp:link:message-size-exceeded (MessageSizeExceededError)",
    )
    parser.add_argument(
        "--log-level",
        default="INFO",
        help="DEBUG, INFO, WARNING or ERROR (default %(default)s)",
    )
    return parser


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def run(
    namespace: Namespace,
    host: str,
    port: int,
    policy: SasPolicy | None,
    *,
    tls_port: int | None = None,
    tls_info: Path | None = None,
    websocket_port: int | None = None,
    websocket_tls_port: int | None = None,
    listen_info: Path | None = None,
    tls_hostnames: tuple[str, ...] = (),
    rights: Rights | None = None,
) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    wanted = [("amqp", port), ("amqps", tls_port)]
    wanted += [("ws", websocket_port), ("wss", websocket_tls_port)]
    listeners: list[Listener] = []
    tls_files = None
    try:
        for scheme, number in wanted:
            if number is not None:
                sock = socket.create_server((host, number), family=family, backlog=128)
                listeners.append(Listener(sock, scheme))
        context: ssl.SSLContext | None = None
        if tls_port is not None or websocket_tls_port is not None:
            # cryptography (an azure-identity dependency) is only needed for the TLS listeners
            from emulators.servicebus.tls import self_signed_certificate

            tls_files = self_signed_certificate(hostnames=tls_hostnames)
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(str(tls_files[0]), str(tls_files[1]))
        handler = EmulatorHandler(
            namespace,
            listeners,
            policy,
            tls=context,
            ca_cert=None if tls_files is None else tls_files[0],
            tls_info=tls_info,
            listen_info=listen_info,
            rights=rights,
        )

        def request_stop(signum: int, frame: Any) -> None:
            handler.stop_requested = True

        signal.signal(signal.SIGTERM, request_stop)
        signal.signal(signal.SIGINT, request_stop)
        polling.install_into_proton()  # no FD_SETSIZE limit (emulators/servicebus/polling.py)
        try:
            Container(handler).run()
        finally:
            handler.stop_requested = True
    finally:
        for listener in listeners:
            listener.sock.close()
        if tls_files is not None:
            shutil.rmtree(tls_files[0].parent, ignore_errors=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not _loopback(args.host):
        print(
            f"servicebus-emulator: --host {args.host!r} is not a loopback address; the emulator "
            "only listens on 127.0.0.1 or ::1 (it has no real authorization)",
            file=sys.stderr,
        )
        return 2
    try:
        config = load_config(args.config)
        if args.max_message_size is not None:
            config = with_max_message_size(config, args.max_message_size)
    except ConfigError as exc:
        print(f"servicebus-emulator: invalid config {args.config}: {exc}", file=sys.stderr)
        return 2
    rights = None
    if args.rights is not None:
        try:
            rights = Rights.from_json(json.loads(args.rights.read_text()))
        except (OSError, ValueError) as exc:
            print(f"servicebus-emulator: --rights {args.rights}: {exc}", file=sys.stderr)
            return 2
        LOG.info("role assignments for JWT principals: %d", len(rights.assignments))
    namespace = Namespace(config)
    policy = SasPolicy(args.sas_key_name, args.sas_key) if args.sas_key else None
    LOG.info(
        "config %s: queues %s, topics %s; SAS key name %s",
        args.config,
        [q.name for q in config.queues],
        {t.name: [s.name for s in t.subscriptions] for t in config.topics},
        args.sas_key_name if policy else "(any token accepted)",
    )
    senders = [q.sending for q in config.queues] + [t.sending for t in config.topics]
    limits = {(e.max_message_size, e.max_batch_size) for e in senders}
    LOG.info(
        "%s tier; maximum message / batch size in bytes: %s",
        config.tier,
        ", ".join(f"{m} / {b}" for m, b in sorted(limits)) or "(no entities)",
    )
    try:
        return run(
            namespace,
            args.host,
            args.port,
            policy,
            tls_port=args.tls_port,
            tls_info=args.tls_info,
            websocket_port=args.websocket_port,
            websocket_tls_port=args.websocket_tls_port,
            listen_info=args.listen_info,
            tls_hostnames=tuple(args.tls_hostname),
            rights=rights,
        )
    except OSError as exc:
        print(
            f"servicebus-emulator: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
