"""`sebridge forwarder`: the composition root that wires the production adapters.

Exit codes: 0 stopped (SIGTERM/SIGINT) or ``--once`` succeeded; 1 ``--once`` failed or a loop
died; 2 bad configuration; :data:`EXIT_STATE_DIR` (73) the state directory cannot be used
(read-only, no permission, not a directory), said in one log line.

Stopping is bounded: SIGTERM ends the process within :data:`STOP_WITHIN` seconds in every state
(an IMDS read in progress is abandoned at once, the threads get 2 s together, closing the
clients a second); whatever is still stuck after that (a Service Bus call that does not
return) is left behind and the process exits anyway. Everything durable was already written
atomically, so there is nothing to lose by not waiting.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sebridge import __version__, servicebus
from sebridge.forwarder import signin
from sebridge.forwarder.config import ConfigError, ForwarderConfig, parse_config
from sebridge.forwarder.delivery.outbox import Outbox, OutboxError
from sebridge.forwarder.delivery.publisher import DryRunPublisher, ServiceBusPublisher
from sebridge.forwarder.imds.client import ImdsClient
from sebridge.forwarder.imds.ratelimit import RequestLimit
from sebridge.forwarder.local.settings import LocalActionsError
from sebridge.forwarder.observability.systemd_notify import Notifier, NotifyError
from sebridge.forwarder.observability.telemetry import MetricsError, Telemetry, install_telemetry
from sebridge.forwarder.ports import Publisher
from sebridge.forwarder.service import Forwarder
from sebridge.forwarder.state import StateDirUnusable, StateStore, ensure_dir
from sebridge.logs import setup_logging
from sebridge.signals import StopEvent, StopSignals

if TYPE_CHECKING:
    from sebridge.forwarder.local.actions import LocalActions

log = logging.getLogger("forwarder")

EXIT_STATE_DIR = 73  # sysexits EX_CANTCREAT: the state directory cannot be used
STOP_WITHIN = 5.0
CLOSE_TIMEOUT = 1.0


def build_credential(config: ForwarderConfig, stop: threading.Event) -> Any:
    """The one token credential of the process (the sender and the approvals receiver share
    its cache), or None: dry-run, or a connection string."""
    if config.dry_run or config.connection_string or not config.namespace:
        return None
    return signin.credential(config.credential, config.client_id, cancel=stop)


def build_publisher(config: ForwarderConfig, credential: Any = None) -> Publisher:
    if config.dry_run:
        return DryRunPublisher(sys.stdout)
    # Before the sender and the approvals worker start on their threads; without the
    # administration client, which the forwarder never uses (6.4 MiB on every VM).
    servicebus.load_sdk(administration=False)
    return ServiceBusPublisher(
        config.topic,
        namespace=config.namespace,
        connection_string=config.connection_string,
        client_id=config.client_id,
        credential=credential,
        max_message_size=config.max_message_size,
        transport=config.servicebus_transport,
        endpoint=config.servicebus_endpoint,
    )


@dataclass(frozen=True)
class Wiring:
    forwarder: Forwarder
    imds: ImdsClient
    outbox: Outbox
    publisher: Publisher
    credential: Any = None


def build_forwarder(
    config: ForwarderConfig, limit: RequestLimit, stop: threading.Event, credential: Any = None
) -> Wiring:
    """Raises StateDirUnusable when the state directory cannot be used. ``credential``: from
    :func:`build_credential`."""
    ensure_dir(config.state_dir)
    try:
        outbox = Outbox(config.state_dir, max_rows=config.outbox_max)
    except OutboxError as exc:
        raise StateDirUnusable(str(exc)) from exc
    imds = ImdsClient(
        config.imds_endpoint,
        api_version=config.api_version,
        limit=limit,
        priority=True,
        cancel=stop,
    )
    publisher = build_publisher(config, credential)
    try:
        forwarder = Forwarder(
            imds=imds,
            store=StateStore(config.state_dir),
            outbox=outbox,
            publisher=publisher,
            poll_interval=config.poll_interval,
            heartbeat_interval=config.heartbeat_interval,
            vm_name=config.vm_name,
            stop_event=stop,
        )
    except (OutboxError, StateDirUnusable) as exc:
        outbox.close()
        imds.close()
        raise StateDirUnusable(str(exc)) from exc
    return Wiring(forwarder, imds, outbox, publisher, credential)


def _bounded(what: str, call: Callable[[], object], seconds: float) -> bool:
    """Run ``call`` on a daemon thread; False (logged) when it has not returned in time."""
    thread = threading.Thread(target=call, name=f"close-{what}", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        log.warning("closing %s did not finish within %.1f s: left behind", what, seconds)
        return False
    return True


def _exit_now(code: int) -> None:
    """Leave without waiting for threads stuck in a call that does not return."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    try:
        config = parse_config(argv)
    except ConfigError as exc:
        print(f"sebridge forwarder: {exc}", file=sys.stderr)
        return 2
    setup_logging(config.log_format, config.log_level)
    notifier = _systemd_notifier()  # before any child process can inherit its socket
    log.info(
        "sebridge forwarder %s starting: %s",
        __version__,
        json.dumps(config.describe(), sort_keys=True),
    )
    stop = StopEvent()  # tells the HTTP deadline watchdog at once when set

    def on_signal(name: str) -> None:  # on the signals thread, never in a signal handler
        if not stop.is_set():
            log.info("received %s: stopping", name)

    with StopSignals(stop, on_signal=on_signal):
        return _run(config, notifier, stop)


def _run(config: ForwarderConfig, notifier: Notifier | None, stop: threading.Event) -> int:
    limit = RequestLimit()  # one IMDS budget for the poller and the approvals handler
    try:
        credential = build_credential(config, stop)
    except ValueError as exc:  # e.g. AZURE_POD_IDENTITY_AUTHORITY_HOST is no http(s) URL
        log.error("cannot sign in: %s", exc)
        print(f"sebridge forwarder: {exc}", file=sys.stderr)
        return 2
    try:
        wiring = build_forwarder(config, limit, stop, credential)
    except StateDirUnusable as exc:
        log.error("state directory %s cannot be used: %s", config.state_dir, exc)
        return EXIT_STATE_DIR
    forwarder = wiring.forwarder
    clean = True
    local: LocalActions | None = None
    telemetry: Telemetry | None = None
    try:
        if config.once:
            if config.local.enabled:
                log.warning("--once runs no hooks and serves no drain probe")
            return 0 if forwarder.run_once() else 1
        try:
            if config.local.enabled:  # hooks, journal and probe are imported only then
                from sebridge.forwarder.local.actions import build_local_actions

                local = build_local_actions(config.local, config.state_dir, forwarder.deliver)
        except LocalActionsError as exc:
            log.error("cannot start: %s", exc)
            print(f"sebridge forwarder: {exc}", file=sys.stderr)
            return 2
        workers: tuple[Callable[[], None], ...] = ()
        try:
            telemetry = install_telemetry(forwarder, config, stop, notifier, local)
        except MetricsError as exc:
            log.error("cannot start: %s", exc)
            print(f"sebridge forwarder: {exc}", file=sys.stderr)
            return 2
        workers += telemetry.workers
        if local is not None:
            # Told of every document by the poller; works on threads of its own.
            forwarder.listeners.append(local)
            local.start(fallback=forwarder.state)
            # An identity an earlier run resolved, should the state file hold none.
            forwarder.remember_identity(local.store.view.observer)
            workers += local.workers(stop)
        if not config.dry_run:
            from sebridge.forwarder.approvals.receiver import approvals_worker

            workers += (approvals_worker(forwarder, config, limit, wiring.credential),)
        clean = forwarder.run(workers)
        log.info("stopped: %d poll(s), %d message(s) pending", forwarder.polls, _depth(forwarder))
        return 1 if forwarder.crashed else 0
    finally:
        forwarder.stop()
        if telemetry is not None:
            telemetry.stopping()
        clean = _bounded("Service Bus", wiring.publisher.close, CLOSE_TIMEOUT) and clean
        clean = _bounded("IMDS", wiring.imds.close, CLOSE_TIMEOUT / 4) and clean
        if wiring.credential is not None:
            clean = _bounded("credential", wiring.credential.close, CLOSE_TIMEOUT / 4) and clean
        # Unless a thread that may still use them was left behind (a parked one does not:
        # Forwarder.parked), close the outbox and the local actions. Either way the local
        # actions keep when the last poll was: a restart measures its gap from it.
        if not forwarder.left_in_use:
            wiring.outbox.close()
            if local is not None:
                local.close()
            if telemetry is not None:
                telemetry.close()
        elif local is not None:
            local.save()
        if not clean:
            _exit_now(1 if forwarder.crashed else 0)


def _systemd_notifier() -> Notifier | None:
    """The notify socket systemd gave (Type=notify), or None; a bad one is logged, not fatal."""
    try:
        return Notifier.from_env()
    except (NotifyError, OSError) as exc:
        log.warning("not notifying systemd: %s", exc)
        return None


def _depth(forwarder: Forwarder) -> int:
    try:
        return forwarder.outbox.depth()
    except OutboxError:
        return -1


if __name__ == "__main__":
    sys.exit(main())
