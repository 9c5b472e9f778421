"""`sebridge forwarder`: the composition root that wires the production adapters."""

from __future__ import annotations

import json
import logging
import signal
import sys
from collections.abc import Callable
from types import FrameType

from sebridge import __version__
from sebridge.forwarder.config import ConfigError, ForwarderConfig, parse_config
from sebridge.forwarder.imds_client import ImdsClient
from sebridge.forwarder.outbox import Outbox
from sebridge.forwarder.publisher import DryRunPublisher, Publisher, ServiceBusPublisher
from sebridge.forwarder.service import Forwarder
from sebridge.forwarder.state import StateStore, ensure_dir
from sebridge.logs import setup_logging

log = logging.getLogger("forwarder")


def build_publisher(config: ForwarderConfig) -> Publisher:
    if config.dry_run:
        return DryRunPublisher(sys.stdout)
    return ServiceBusPublisher(
        config.topic,
        namespace=config.namespace,
        connection_string=config.connection_string,
        client_id=config.client_id,
    )


def build_forwarder(config: ForwarderConfig) -> Forwarder:
    ensure_dir(config.state_dir)
    return Forwarder(
        imds=ImdsClient(config.imds_endpoint, api_version=config.api_version),
        store=StateStore(config.state_dir),
        outbox=Outbox(config.state_dir, max_rows=config.outbox_max),
        publisher=build_publisher(config),
        poll_interval=config.poll_interval,
        heartbeat_interval=config.heartbeat_interval,
        vm_name=config.vm_name,
    )


def main(argv: list[str] | None = None) -> int:
    try:
        config = parse_config(argv)
    except ConfigError as exc:
        print(f"sebridge forwarder: {exc}", file=sys.stderr)
        return 2
    setup_logging(config.log_format, config.log_level)
    log.info(
        "sebridge forwarder %s starting: %s",
        __version__,
        json.dumps(config.describe(), sort_keys=True),
    )
    try:
        forwarder = build_forwarder(config)
    except OSError as exc:
        log.error("cannot use state directory %s: %s", config.state_dir, exc)
        return 1

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s: stopping", signal.Signals(signum).name)
        forwarder.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        if config.once:
            return 0 if forwarder.run_once() else 1
        workers: tuple[Callable[[], None], ...] = ()
        if not config.dry_run:
            from sebridge.forwarder.approvals import approvals_worker

            workers = (approvals_worker(forwarder, config),)
        forwarder.run(workers)
        log.info(
            "stopped: %d poll(s), %d message(s) pending", forwarder.polls, forwarder.outbox.depth()
        )
        return 0
    finally:
        forwarder.publisher.close()
        forwarder.imds.close()
        forwarder.outbox.close()


if __name__ == "__main__":
    sys.exit(main())
