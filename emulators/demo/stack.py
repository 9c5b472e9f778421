"""The stand-ins every demo runs, and the watchers that put what they do on the timeline."""

from __future__ import annotations

import json
import logging
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from emulators.demo.timeline import Timeline
from emulators.demo.world import HISTORY_TABLE, ROOT, app_settings_for_stand_ins


# -- watchers -----------------------------------------------------------------------------
def watch_topic(
    connection_string: str, timeline: Timeline, seen: list[dict[str, Any]], stop: threading.Event
) -> None:
    """Everything on the `audit` subscription (it has a copy of every message), in order."""
    from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusClient
    from azure.servicebus.exceptions import OperationTimeoutError, ServiceBusError

    from sebridge.contract.events import ContractError, parse_message
    from sebridge.servicebus import message_body

    with ServiceBusClient.from_connection_string(connection_string, retry_total=0) as client:
        while not stop.is_set():
            try:
                with client.get_subscription_receiver(
                    "scheduled-events",
                    "audit",
                    session_id=NEXT_AVAILABLE_SESSION,
                    max_wait_time=0.5,
                ) as receiver:
                    for message in receiver.receive_messages(
                        max_message_count=50, max_wait_time=0.5
                    ):
                        receiver.complete_message(message)
                        try:
                            parsed = parse_message(message_body(message))
                        except ContractError as exc:
                            timeline.add("topic", f"unreadable message: {exc}")
                            continue
                        if parsed.event is None:
                            continue  # Heartbeat
                        event = parsed.event
                        seen.append(
                            {
                                "transition": parsed.transition.value,
                                "event": event,
                                "message_id": message.message_id,
                                "at": time.time(),
                            }
                        )
                        extra = ""
                        if parsed.transition.value == "Approved":
                            approval = parsed.data.get("approval", {})
                            extra = f" by {approval.get('requestedBy')}: {approval.get('reason')}"
                        timeline.add(
                            "topic",
                            f"{parsed.transition.value:<9} {event.event_type} {event.key[:8]} "
                            f"on {','.join(event.resources) or '-'}{extra}",
                            at=(
                                message.enqueued_time_utc.timestamp()
                                if message.enqueued_time_utc
                                else None
                            ),
                        )
            except OperationTimeoutError:
                continue
            except ServiceBusError as exc:
                if not stop.is_set():
                    timeline.add("topic", f"receiver error, retrying: {exc}")
                    stop.wait(0.5)


def watch_list(
    items: Callable[[], list[Any]],
    render: Callable[[Any], str],
    source: str,
    timeline: Timeline,
    stop: threading.Event,
    stamp: Callable[[Any], float | None] = lambda _: None,
) -> None:
    """New items of a growing list (cards, pool changes, IMDS POSTs) onto the timeline."""
    count = 0
    while not stop.wait(0.05):
        try:
            current = items()
        except OSError:
            continue  # the simulator is going away at the end
        for item in current[count:]:
            timeline.add(source, render(item), at=stamp(item))
        count = len(current)


# -- the stand-ins every demo runs --------------------------------------------------------
class DemoStack:
    """The stand-ins every demo runs, and the threads that put what they do on the timeline:
    the Teams, ARM and identity fakes (and any others given), the Service Bus emulator with
    the project's entities, the functions host running the real function_app.py, the IMDS
    simulator. ``with DemoStack(timeline, verbose) as stack:``; whatever happens, the watchers
    stop and everything started is stopped in reverse order (a failure to stop one is
    reported, and the rest are still stopped)."""

    def __init__(
        self,
        timeline: Timeline,
        verbose: bool,
        report: Callable[[str], None] = lambda text: print(text, file=sys.stderr),
    ) -> None:
        from emulators.fakes.arm import FakeArm
        from emulators.fakes.identity import FakeIdentity
        from emulators.fakes.teams import FakeTeams

        self.timeline = timeline
        self.verbose = verbose
        self.report = report
        self.stop = threading.Event()
        self.teams, self.arm, self.identity = FakeTeams(), FakeArm(), FakeIdentity()
        self.storage: Any = None  # Azurite, once start_storage() ran
        self.topic_seen: list[dict[str, Any]] = []  # every message on the topic, in order
        self.posts_seen: list[dict[str, Any]] = []  # the simulator's record of IMDS POSTs
        self.connection_string = ""
        self._undo: list[Callable[[], object]] = []
        self._watchers: list[threading.Thread] = []

    def __enter__(self) -> DemoStack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def defer(self, undo: Callable[[], object]) -> None:
        """Call ``undo`` when the stack closes (the last deferred first)."""
        self._undo.append(undo)

    def workdir(self, prefix: str) -> Path:
        """A temporary directory, removed when the stack closes (make it first: it goes last)."""
        path = Path(tempfile.mkdtemp(prefix=prefix))
        self.defer(lambda: shutil.rmtree(path, ignore_errors=True))
        return path

    def start_fakes(self, *more: Any) -> None:
        """Start Teams, ARM and identity, and ``more`` (fakes with start() and stop())."""
        for fake in (self.teams, self.arm, self.identity, *more):
            fake.start()
            self.defer(fake.stop)

    def start_storage(self) -> Any:
        """Azurite (blobs and tables over HTTPS, Entra tokens): the functions host started
        after it trusts its certificate and keeps the history in it."""
        from emulators.azurite import Azurite

        self.storage = Azurite().start()
        self.defer(self.storage.stop)
        self.timeline.add("setup", f"Azurite: blobs {self.storage.blob_endpoint}")
        return self.storage

    def start_bus(self) -> None:
        """The Service Bus emulator, and a watcher of the topic's audit subscription."""
        from emulators.servicebus.testing import running_emulator

        emulator = running_emulator(ROOT / "infra" / "servicebus-emulator" / "Config.json")
        bus = emulator.__enter__()
        self.defer(lambda: emulator.__exit__(None, None, None))
        self.connection_string = bus.connection_string
        self.timeline.add("setup", f"Service Bus emulator on {bus.namespace}")
        self.watch(watch_topic, bus.connection_string, self.timeline, self.topic_seen, self.stop)

    def start_host(self, settings: Mapping[str, str]) -> Any:
        """The functions host running function_app.py against the emulator and the fakes, with
        ``settings`` over the common ones; watchers of the Teams cards and the ARM changes."""
        from emulators.fakes.teams import card_lines
        from emulators.functions_host.host import FunctionsHost
        from emulators.functions_host.http_server import listen

        host_logger = logging.getLogger("sebridge.demo.functions-host")
        host_logger.setLevel(logging.INFO if self.verbose else logging.ERROR)
        listener = listen()  # bound now: the Approve links name its port
        common = app_settings_for_stand_ins(
            self.connection_string,
            teams_url=self.teams.webhook_url,
            arm_url=self.arm.url,
            approval_base_url=f"http://127.0.0.1:{listener.getsockname()[1]}",
            identity=self.identity.environ(),
        )
        if self.storage is not None:
            common.update(self.storage.environ())
            common["HistorySubscriptionName"] = "history"
            common["HISTORY_TABLE_URL"] = self.storage.table_url(HISTORY_TABLE)
        host = FunctionsHost(
            ROOT / "function_app.py",
            {**common, **settings},
            logger=host_logger,
            listener=listener,
        )
        host.start()
        self.defer(host.stop)
        self.timeline.add("setup", "functions host running function_app.py")
        self.watch(
            watch_list,
            lambda: list(self.teams.cards),
            lambda c: "card: " + " | ".join(card_lines(c)[:2]),
            "teams",
            self.timeline,
            self.stop,
        )
        self.watch(watch_list, lambda: list(self.arm.changes), str, "arm", self.timeline, self.stop)
        return host

    def start_simulator(self, scenario_file: Path, speed: float) -> tuple[Any, str]:
        """The IMDS simulator replaying ``scenario_file`` (its clock starts on the first poll),
        and a watcher of the POSTs it takes: its client and its URL."""
        from emulators.imds.testing import SimClient
        from emulators.processes import server

        process, url = server(
            "imds-sim",
            "--scenario",
            str(scenario_file),
            "--speed",
            str(speed),
            "--start-on-first-poll",
        )
        self.defer(process.close)
        sim = SimClient(url)
        posts = self.posts_seen

        def recorded() -> list[dict[str, Any]]:
            posts[:] = sim.posts()
            return list(posts)

        self.watch(
            watch_list,
            recorded,
            render_post,
            "imds",
            self.timeline,
            self.stop,
            lambda p: datetime.fromisoformat(p["time"]).timestamp(),
        )
        self.timeline.add("setup", f"IMDS simulator on {url}")
        return sim, url

    def watch(self, target: Callable[..., object], *args: Any) -> None:
        """Run ``target(*args)`` on a thread of its own until the stack closes (it must return
        once ``self.stop`` is set)."""
        thread = threading.Thread(target=target, args=args, daemon=True)
        thread.start()
        self._watchers.append(thread)

    def close(self) -> None:
        self.stop.set()
        for thread in self._watchers:
            thread.join(timeout=5)
        while self._undo:
            undo = self._undo.pop()
            try:
                undo()
            except Exception as exc:  # noqa: BLE001 - keep stopping the rest
                self.report(f"demo: stopping failed: {exc}")


def render_post(post: dict[str, Any]) -> str:
    try:
        event_id = json.loads(post["body"])["StartRequests"][0]["EventId"][:8]
    except (ValueError, KeyError, IndexError, TypeError):
        event_id = "(malformed body)"
    return f"POST StartRequests {event_id} -> {post['status']}"
