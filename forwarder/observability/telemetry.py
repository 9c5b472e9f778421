"""Wires what reports on the loop into it: status.json, the metrics endpoint, systemd.

Called by the composition root (``main``) once the :class:`Forwarder` is built, the same way
the local actions are: listeners appended to ``forwarder.listeners``, workers returned to run
beside the poller. prometheus-client is imported only when ``--metrics-port`` is given, so a
forwarder without metrics does not carry it in memory.
"""

from __future__ import annotations

import faulthandler
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sebridge.forwarder.observability.errors import MetricsError
from sebridge.forwarder.observability.observations import Observations
from sebridge.forwarder.observability.observed import ObservedPublisher, ObservedSource, Watcher
from sebridge.forwarder.observability.status_file import StatusWriter
from sebridge.forwarder.observability.systemd_notify import Notifier, SystemdListener
from sebridge.forwarder.ports import LoopListener

if TYPE_CHECKING:
    from sebridge.forwarder.config import ForwarderConfig
    from sebridge.forwarder.local.actions import LocalActions
    from sebridge.forwarder.observability.metrics import MetricsServer
    from sebridge.forwarder.service import Forwarder

log = logging.getLogger("forwarder")

__all__ = ["MetricsError", "Telemetry", "install_telemetry"]  # MetricsError: its callers' name


@dataclass
class Telemetry:
    observations: Observations
    status: StatusWriter
    server: MetricsServer | None = None
    systemd: SystemdListener | None = None
    workers: tuple[Callable[[], None], ...] = field(default=())

    def stopping(self) -> None:
        """Tell systemd, and write the last status (the poller has ended, or is ending)."""
        if self.systemd is not None:
            self.systemd.stopping()
        self.status.write()

    def close(self) -> None:
        if self.systemd is not None:
            self.systemd.notifier.close()


def install_telemetry(
    forwarder: Forwarder,
    config: ForwarderConfig,
    stop: threading.Event,
    notifier: Notifier | None = None,
    local: LocalActions | None = None,
) -> Telemetry:
    """Plug the reporters into ``forwarder`` (and the metrics of ``local``'s hooks and drain
    probe, when there are any). Raises ``MetricsError`` when the metrics port cannot be bound
    (the caller exits 2)."""
    observations = Observations(config.poll_interval)
    watchers: list[Watcher] = [observations]
    telemetry = Telemetry(observations, StatusWriter(observations, config.state_dir))
    listeners: list[LoopListener] = [observations]
    if config.metrics_port is not None:
        from sebridge.forwarder.observability.metrics import Metrics, MetricsServer

        metrics = Metrics(observations)
        if local is not None:
            metrics.watch_local(local.hooks, local.probe)
        telemetry.server = MetricsServer(metrics, config.metrics_address, config.metrics_port)
        host, port = telemetry.server.address
        log.info("metrics on http://%s:%d/metrics and /healthz", host, port)
        server = telemetry.server

        def metrics_http() -> None:
            server.serve(stop)

        telemetry.workers = (metrics_http,)
        watchers.append(metrics)
        listeners.append(metrics)
    forwarder.imds = ObservedSource(forwarder.imds, watchers)
    forwarder.publisher = ObservedPublisher(forwarder.publisher, watchers)
    listeners.append(telemetry.status)
    if notifier is not None:
        if notifier.watchdog:
            # Killed by the watchdog (SIGABRT), the forwarder first writes every thread's
            # stack to stderr (the journal): where the poll loop was stuck.
            faulthandler.enable()
        telemetry.systemd = SystemdListener(notifier)
        listeners.append(telemetry.systemd)
        log.info(
            "notifying systemd%s",
            f", watchdog fed every {notifier.watchdog / 2:g} s" if notifier.watchdog else "",
        )
    forwarder.listeners.extend(listeners)
    return telemetry
