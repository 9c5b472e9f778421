"""`sebridge approve`: send one approval command to a VM's forwarder by hand."""

from __future__ import annotations

import argparse
import getpass
import os
import socket
import sys
from datetime import UTC, datetime, timedelta

from sebridge import servicebus
from sebridge.contract.commands import CommandError, approve_command
from sebridge.servicebus import check_endpoint, check_transport

SEND_TIMEOUT = 30.0


def _parser() -> argparse.ArgumentParser:
    env = os.environ
    p = argparse.ArgumentParser(
        prog="sebridge approve",
        description="Send an approve command to the forwarder on one VM, through the approvals "
        "queue (session = the VM name). The forwarder checks the event against IMDS first.",
    )
    p.add_argument("--vm", required=True, help="target VM name (IMDS compute.name)")
    p.add_argument("--event-id", required=True, help="the EventId (a GUID)")
    p.add_argument("--reason", default="", help="why, for the audit trail")
    p.add_argument("--by", default=None, help="who approves (default: user@host)")
    p.add_argument(
        "--expires-in",
        type=float,
        default=900.0,
        help="seconds until the command expires (default %(default)s)",
    )
    servicebus.add_connection_arguments(p, env)
    p.add_argument(
        "--queue",
        default=env.get("SEBRIDGE_REPLY_QUEUE", "approvals"),
        help="approvals queue [SEBRIDGE_REPLY_QUEUE] (default %(default)s)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not (args.namespace or args.connection_string):
        print("sebridge approve: give --namespace or --connection-string", file=sys.stderr)
        return 2
    if not 1 <= args.expires_in <= 7 * 86_400:
        print("sebridge approve: --expires-in must be between 1 s and 7 days", file=sys.stderr)
        return 2
    try:
        # (argparse checks a flag's choices; a value from the environment is checked here)
        transport = check_transport(args.servicebus_transport)
        endpoint = check_endpoint(args.servicebus_endpoint) if args.servicebus_endpoint else None
    except ValueError as exc:
        print(f"sebridge approve: {exc}", file=sys.stderr)
        return 2
    requested_by = args.by or f"{getpass.getuser()}@{socket.gethostname()}"
    try:
        command = approve_command(
            args.event_id,
            requested_by,
            args.reason,
            datetime.now(UTC) + timedelta(seconds=args.expires_in),
        )
    except CommandError as exc:
        print(f"sebridge approve: {exc.description}", file=sys.stderr)
        return 2
    from azure.core.exceptions import AzureError
    from azure.servicebus.exceptions import ServiceBusError

    try:
        client = servicebus.client(
            namespace=args.namespace,
            connection_string=args.connection_string,
            client_id=args.client_id,
            transport=transport,
            endpoint=endpoint,
            retry_total=1,
        )
        with client, client.get_queue_sender(args.queue) as sender:
            sender.send_messages(servicebus.command_message(command, args.vm), timeout=SEND_TIMEOUT)
    except (ServiceBusError, AzureError, OSError, ValueError) as exc:
        # One line, no traceback; a connection string is never echoed (the SDK's messages name
        # the host and the entity, not the key).
        print(
            f"sebridge approve: not sent ({type(exc).__name__}): {_first_line(exc)}",
            file=sys.stderr,
        )
        return 1
    print(f"sent {command.message_id} to session {args.vm} on {args.queue}")
    # Cheap to say, costly to find out (reading the queue's settings needs Manage rights).
    print(
        "note: the queue drops a message id it has already seen within its duplicate-detection "
        f"window (1 hour as deployed): if an earlier {command.message_id} was dead-lettered, "
        "this one was dropped as well. Then wait the window out, or approve through ARM: "
        "az maintenance scheduledevents acknowledge --resource-group <group> "
        f"--resource-type virtualMachines --resource-name {args.vm} "
        f"--scheduled-events-id {command.event_id}"
    )
    return 0


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0][:300] if lines else "(no message)"


if __name__ == "__main__":
    sys.exit(main())
