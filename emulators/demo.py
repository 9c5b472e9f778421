"""`sebridge demo`: the whole bridge on 127.0.0.1, one scenario end to end, with a timeline.

What runs (all loopback, nothing from Azure):
- the IMDS simulator (a child process) replaying a packaged scenario, re-homed onto a small
  demo world: VMs web-1, web-2... in resource group rg-web, behind load balancer lb-web;
- the Service Bus emulator (a child process) with the project's entities;
- the local functions host running the real function_app.py (in this process), with Teams
  played by a loopback sink that renders each card as text, ARM by a loopback fake that holds
  the VMs, their NICs and the pool, and managed identity by a loopback token endpoint;
- `sebridge forwarder` (a child process) publishing to the emulator and taking approvals.

The loop it proves: Scheduled -> Teams card -> pool removal -> Prepared -> gate approval ->
IMDS POST -> Started -> Completed -> pool restored. It exits 0 when every event of the
scenario ended (Completed or Cancelled), every event first seen Scheduled was approved through
IMDS, and every pool change was undone (except after Terminate and Preempt, whose VM is gone);
otherwise non-zero with the reasons. Every process it started is stopped either way.

``--source eventgrid`` runs the same scenario with no forwarder: the events reach the topic
through Event Grid and the ingestion function, and the gate approves through ARM;
``--source both`` runs the two side by side and requires one message per transition on the
topic (emulators/demo_sources.py).

The VMs share one availability set (the scope check lets web-1 report events of the others),
and pool-a keeps one spare member (web-spare) so that the capacity guard (LB_MIN_HEALTHY=1)
never holds a packaged scenario's drain. The demo's own scenario ``capacity-hold`` has no
spare: two overlapping events on the pool of two show a ``Held`` (the second drain would
empty the pool), and the held event is drained and approved once the first completes.
``long-notice``: a Reboot with ten minutes' notice and a maintenance window that opens about a
minute in (the next whole minute at least 40 s away): the VM stays in its pool until the window's
start minus the lead (20 s), is drained, approved when the window opens, rebooted and restored,
long before NotBefore (lb-pools drains at the moment: DrainMomentsQueueName).
"""

from __future__ import annotations

import argparse
import json
import logging
import secrets
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from importlib import resources
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SCENARIO = "redeploy"
SUBSCRIPTION = "00000000-0000-4000-8000-0000000000de"
GROUP = "rg-web"
MIN_HEALTHY = 1  # LB_MIN_HEALTHY in the demo (the app's default)


@dataclass
class Timeline:
    """What happened, stamped with when it happened (wall clock), printed in that order."""

    start: float = field(default_factory=time.time)
    entries: list[tuple[float, str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    live: bool = False

    def add(self, source: str, text: str, at: float | None = None) -> None:
        offset = (time.time() if at is None else at) - self.start
        with self.lock:
            self.entries.append((offset, source, text))
        if self.live:
            print(f"{offset:7.2f}s  {source:<7} {text}", flush=True)

    def render(self) -> list[str]:
        with self.lock:
            ordered = sorted(self.entries, key=lambda entry: entry[0])
        return [f"{at:7.2f}s  {source:<7} {text}" for at, source, text in ordered]


# -- scenarios of the demo's own (not IMDS simulator fixtures) ----------------------------
CAPACITY_HOLD = "capacity-hold"
LONG_NOTICE = "long-notice"
LONG_NOTICE_LEAD = 20  # seconds before the window opens that lb-pools drains


@dataclass(frozen=True)
class DemoWorld:
    spares: int = 1  # pool members no event names (keep the guard from holding)
    expect_held: bool = False  # the run must show a Held transition
    # More app settings, made when the run starts (a window in wall-clock time), with a line
    # for the timeline; None: none.
    settings: Callable[[datetime], tuple[dict[str, str], str]] | None = None


def window_settings(now: datetime) -> tuple[dict[str, str], str]:
    """long-notice: a policy whose only window opens at the next whole minute at least 40 s
    after ``now`` (30 minutes long), Reboot's lead, and the drain-moments queue."""
    opens = (now + timedelta(seconds=100)).replace(second=0, microsecond=0)
    closes = opens + timedelta(minutes=30)
    window = f"{opens:%a} {opens:%H:%M}-{closes:%H:%M} UTC"
    policy = {
        "rules": [
            {
                "name": "maintenance-window",
                "match": {},
                "action": "approve-when-prepared",
                "windows": [window],
            }
        ],
        "leadSeconds": {"Reboot": LONG_NOTICE_LEAD},
    }
    settings = {"APPROVAL_POLICY": json.dumps(policy), "DrainMomentsQueueName": "drain-moments"}
    return settings, (
        f"policy: approve only in the window {window}; lb-pools drains {LONG_NOTICE_LEAD} s "
        f"before it opens ({opens - timedelta(seconds=LONG_NOTICE_LEAD):%H:%M:%S} UTC)"
    )


def _long_notice() -> dict[str, Any]:
    """One Reboot with ten minutes' notice (Azure gives 15 for a Reboot, up to 7 days for
    degraded hardware: the same story, shorter)."""
    event_id = "c3c3c3c3-0003-4000-8000-00000000c0de"
    return {
        "name": LONG_NOTICE,
        "description": "A Reboot with ten minutes' notice and a maintenance window a minute or "
        "so away: in the pool until the window's start minus the lead, then drained, approved "
        "in the window, rebooted and restored.",
        "provenance": "Composed for the demo of drain moments and maintenance windows.",
        "events": [
            {
                "EventId": event_id,
                "EventType": "Reboot",
                "ResourceType": "VirtualMachine",
                "Resources": ["vm-a"],
                "Description": "Virtual machine is going to be restarted (host maintenance).",
                "EventSource": "Platform",
                "DurationInSeconds": -1,
                "timeline": [
                    {"at": 0, "status": "Scheduled", "notBeforeIn": 600},
                    {"at": 600, "status": "Started"},
                    {"at": 616, "status": "gone"},
                ],
            }
        ],
        "expect": [
            {"transition": "Scheduled", "eventId": event_id},
            {"transition": "Started", "eventId": event_id},
            {"transition": "Completed", "eventId": event_id},
        ],
    }


def _capacity_hold() -> dict[str, Any]:
    """Two Reboots on the two members of one pool, the second while the first is drained."""

    def reboot(event_id: str, vm: str, at: int, not_before_in: int) -> dict[str, Any]:
        return {
            "EventId": event_id,
            "EventType": "Reboot",
            "ResourceType": "VirtualMachine",
            "Resources": [vm],
            "Description": "Virtual machine is going to be restarted (host maintenance).",
            "EventSource": "Platform",
            "DurationInSeconds": -1,
            "timeline": [
                {"at": at, "status": "Scheduled", "notBeforeIn": not_before_in},
                {"at": at + not_before_in, "status": "Started"},
                {"at": at + not_before_in + 16, "status": "gone"},
            ],
        }

    first, second = "a1a1a1a1-0001-4000-8000-00000000c0de", "b2b2b2b2-0002-4000-8000-00000000c0de"
    return {
        "name": CAPACITY_HOLD,
        "description": "Two overlapping Reboots on a pool of two: the second drain is held "
        "until the first completes (LB_MIN_HEALTHY=1).",
        "provenance": "Composed for the demo of the capacity guard: one Reboot per member of "
        "a two-member backend pool, the second scheduled while the first is drained.",
        "events": [reboot(first, "vm-a", 0, 60), reboot(second, "vm-b", 6, 84)],
        "expect": [
            {"transition": "Scheduled", "eventId": first},
            {"transition": "Scheduled", "eventId": second},
            {"transition": "Started", "eventId": first},
            {"transition": "Completed", "eventId": first},
            {"transition": "Started", "eventId": second},
            {"transition": "Completed", "eventId": second},
        ],
    }


DEMO_SCENARIOS: dict[str, tuple[dict[str, Any], DemoWorld]] = {
    CAPACITY_HOLD: (_capacity_hold(), DemoWorld(spares=0, expect_held=True)),
    LONG_NOTICE: (_long_notice(), DemoWorld(settings=window_settings)),
}


# -- the demo world ---------------------------------------------------------------------
def scenario_names() -> list[str]:
    from emulators.imds.testing import scenario_names as names

    return sorted([*names(), *DEMO_SCENARIOS])


def load_packaged(name: str) -> dict[str, Any]:
    if name in DEMO_SCENARIOS:
        copied: dict[str, Any] = json.loads(json.dumps(DEMO_SCENARIOS[name][0]))
        return copied
    text = resources.files("emulators.imds").joinpath("scenarios", f"{name}.json").read_text()
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def demo_world(name: str) -> DemoWorld:
    return DEMO_SCENARIOS[name][1] if name in DEMO_SCENARIOS else DemoWorld()


def rehome(scenario: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The scenario with its VM and Resources mapped onto web-1, web-2, ... in rg-web."""
    names: dict[str, str] = {}

    def step_resources(event: dict[str, Any]) -> list[str]:
        return [
            r
            for step in event.get("timeline", [])
            for r in (step.get("set") or {}).get("Resources") or []
        ]

    for event in scenario["events"]:
        for resource in [*event.get("Resources", []), *step_resources(event)]:
            names.setdefault(resource.lower(), f"web-{len(names) + 1}")
    if not names:
        names["vm"] = "web-1"
    world = dict(scenario)
    world["vm"] = {
        "name": "web-1",
        "subscriptionId": SUBSCRIPTION,
        "resourceGroupName": GROUP,
        "vmScaleSetName": "",
        "location": "westeurope",
        "zone": "1",
    }

    def renamed(resources: list[str]) -> list[str]:
        return [names[r.lower()] for r in resources]

    def step(s: dict[str, Any]) -> dict[str, Any]:
        fields = s.get("set")
        if isinstance(fields, dict) and isinstance(fields.get("Resources"), list):
            return {**s, "set": {**fields, "Resources": renamed(fields["Resources"])}}
        return s

    world["events"] = [
        {
            **e,
            "Resources": renamed(e.get("Resources", [])),
            "timeline": [step(s) for s in e.get("timeline", [])],
        }
        for e in scenario["events"]
    ]
    return world, sorted(set(names.values()))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def app_settings_for_stand_ins(
    connection_string: str,
    *,
    teams_url: str,
    arm_url: str,
    approval_base_url: str,
    identity: Mapping[str, str],
) -> dict[str, str]:
    """The app settings every local run of function_app.py starts from: the project's entities
    (infra/servicebus-emulator/Config.json) on ``connection_string``, a fresh signing key, the
    Teams and ARM stand-ins, where the Approve links point, and the identity fake's settings."""
    return {
        "ServiceBusConnection": connection_string,
        "TopicName": "scheduled-events",
        "TeamsSubscriptionName": "teams",
        "LbPoolsSubscriptionName": "lb-pools",
        "ApprovalGateSubscriptionName": "approval-gate",
        "ApprovalsQueueName": "approvals",
        "TEAMS_WEBHOOK_URL": teams_url,
        "APPROVAL_SIGNING_KEY": secrets.token_urlsafe(32),
        "ARM_ENDPOINT": arm_url,
        "APPROVAL_BASE_URL": approval_base_url,
        **identity,
    }


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

        host_logger = logging.getLogger("sebridge.demo.functions-host")
        host_logger.setLevel(logging.INFO if self.verbose else logging.ERROR)
        http_port = free_port()
        common = app_settings_for_stand_ins(
            self.connection_string,
            teams_url=self.teams.webhook_url,
            arm_url=self.arm.url,
            approval_base_url=f"http://127.0.0.1:{http_port}",  # the Approve links
            identity=self.identity.environ(),
        )
        host = FunctionsHost(
            ROOT / "function_app.py", {**common, **settings}, logger=host_logger, port=http_port
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


# -- the run ------------------------------------------------------------------------------
def run(
    scenario_name: str, speed: float, timeout: float, verbose: bool, source: str = "forwarder"
) -> int:
    from emulators import demo_sources
    from emulators.demo_verdict import Verdict, judge, plan_for
    from emulators.fakes.storage import FakeBlobStorage
    from emulators.processes import forwarder

    scenario = load_packaged(scenario_name)
    world, vms = rehome(scenario)
    options = demo_world(scenario_name)
    plan = plan_for(world, held=options.expect_held)
    spares = [f"web-spare{'' if n == 0 else n + 1}" for n in range(options.spares)]
    timeline = Timeline(live=verbose)
    print(f"sebridge demo: scenario {scenario_name} at speed {speed:g}: {scenario['description']}")
    print(
        f"world: {', '.join([*vms, *spares])} in {GROUP} (one availability set), behind "
        f"lb-web/pool-a (LB_MIN_HEALTHY={MIN_HEALTHY}); everything on 127.0.0.1\n"
    )
    with DemoStack(timeline, verbose) as stack:
        workdir = stack.workdir("sebridge-demo-")  # removed last: the forwarder's state is in it
        storage, state_storage = FakeBlobStorage(), demo_sources.state_storage()
        stack.start_fakes(storage, state_storage)
        arm = stack.arm
        lb = arm.add_load_balancer(
            SUBSCRIPTION, GROUP, "lb-web", ["pool-a"], rules={"http": "pool-a"}
        )
        pool = f"{lb}/backendAddressPools/pool-a"
        aset = arm.add_availability_set(SUBSCRIPTION, GROUP, "as-web")
        vm_ids = {
            vm: arm.add_vm(SUBSCRIPTION, GROUP, vm, [pool], availability_set=aset)
            for vm in [*vms, *spares]
        }
        initial = {vm: sorted(arm.vm_pools(vm_id)) for vm, vm_id in vm_ids.items()}

        stack.start_bus()
        settings = {
            "LB_MIN_HEALTHY": str(MIN_HEALTHY),
            "LB_POOL_STATE_URL": storage.container_url("sebridge-pools"),
            **demo_sources.app_settings(source, state_storage, GROUP),
        }
        if plan.policy is not None:
            settings["APPROVAL_POLICY"] = plan.policy
            timeline.add(
                "setup",
                "policy: a human decides (no early approval), so the scenario's Updated or "
                "Cancelled can happen before NotBefore",
            )
        if options.settings is not None:
            more, said = options.settings(datetime.now(UTC))
            settings.update(more)
            timeline.add("setup", said)
        host = stack.start_host(settings)

        scenario_file = workdir / "scenario.json"
        scenario_file.write_text(json.dumps(world))
        sim, sim_url = stack.start_simulator(scenario_file, speed)

        fw = forwarder(
            sim_url,
            workdir / "state",
            "--connection-string",
            stack.connection_string,
            dry_run=False,
            poll_interval=1.0,
        )
        if source != "eventgrid":
            fw.start()
            stack.defer(fw.close)
            timeline.add("setup", "forwarder polling IMDS once a second")
        if source != "forwarder":
            for stop_source in demo_sources.start_event_grid(
                host.url,
                sim,
                arm,
                subscription=SUBSCRIPTION,
                group=GROUP,
                vm_name=world["vm"]["name"],
                report=lambda text: timeline.add("evgrid", text),
                start_clock=source == "eventgrid",
            ):
                stack.defer(stop_source.stop)

        topic_seen = stack.topic_seen
        expected_events = {e["EventId"].lower(): e for e in world["events"]}
        deadline = time.monotonic() + timeout - (time.time() - timeline.start)
        if not verbose:
            print("running the scenario; the timeline follows when the loop is done...\n")
        judged = Verdict(missing=["not finished"])
        while time.monotonic() < deadline:
            judged = judge(
                plan,
                expected_events,
                topic_seen,
                approved_event_ids(stack.posts_seen),
                lambda vm: arm.vm_pools(vm_ids[vm]),
                initial,
            )
            judged.missing += demo_sources.verdict(source, topic_seen)
            if not judged.missing:
                break
            if source != "eventgrid" and not fw.alive:
                judged.missing = [f"the forwarder exited:\n{fw.stderr_text()[-2000:]}"]
                break
            time.sleep(0.2)
        time.sleep(0.3)  # let the watchers catch the last lines
        elapsed = time.time() - timeline.start
        if not verbose:
            print("\n".join(timeline.render()))
        if judged.missing:
            print(f"\nFAILED after {elapsed:.1f} s: the demo did not show what it exists to show")
            for reason in judged.missing:
                print(f"  - {reason}")
            if verbose:
                print(fw.stderr_text()[-4000:])
            return 1
        shown = ", ".join(sorted({t for t, _ in plan.shows} | ({"Held"} if plan.held else set())))
        print(f"\nOK in {elapsed:.1f} s: the scenario showed {shown}.")
        for line in judged.story:
            print(line)
        for line in demo_sources.summary(source, topic_seen):
            print(line)
        return 0


def render_post(post: dict[str, Any]) -> str:
    try:
        event_id = json.loads(post["body"])["StartRequests"][0]["EventId"][:8]
    except (ValueError, KeyError, IndexError, TypeError):
        event_id = "(malformed body)"
    return f"POST StartRequests {event_id} -> {post['status']}"


def approved_event_ids(posts: list[dict[str, Any]]) -> set[str]:
    """The EventIds IMDS took a StartRequests for (answered 200)."""
    approved: set[str] = set()
    for post in list(posts):
        if post.get("status") != 200:
            continue
        try:
            approved.add(json.loads(post["body"])["StartRequests"][0]["EventId"].lower())
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            continue
    return approved


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="sebridge demo",
        description="Run one maintenance event through the whole bridge on 127.0.0.1.",
    )
    parser.add_argument(
        "--scenario",
        default=DEFAULT_SCENARIO,
        help="a packaged scenario (see --list; default %(default)s)",
    )
    parser.add_argument(
        "--speed", type=float, default=2.0, help="scenario time scale (default %(default)s)"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="give up after this many seconds (default %(default)s)",
    )
    parser.add_argument(
        "--source",
        choices=("forwarder", "eventgrid", "both"),
        default="forwarder",
        help="where events come from: the forwarder polling IMDS, Event Grid with no forwarder "
        "at all (agentless), or both at once (default %(default)s)",
    )
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    parser.add_argument("--verbose", action="store_true", help="show the functions host's log")
    args = parser.parse_args(argv)
    from emulators import demo_hooks  # the VM-side scenario (issue 16) lives there

    if args.list:
        for name in scenario_names():
            print(f"{name:<24} {load_packaged(name)['description']}")
        print(f"{demo_hooks.NAME:<24} {demo_hooks.DESCRIPTION}")
        return 0
    if args.scenario not in [*scenario_names(), demo_hooks.NAME]:
        print(f"sebridge demo: unknown scenario {args.scenario!r} (see --list)", file=sys.stderr)
        return 2
    if not 0.1 <= args.speed <= 20 or args.timeout <= 0:
        print("sebridge demo: --speed must be 0.1..20 and --timeout positive", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.scenario == demo_hooks.NAME:
        if args.source != "forwarder":
            print("sebridge demo: the vm-side scenario is the forwarder's", file=sys.stderr)
            return 2
        return demo_hooks.run(args.speed, args.timeout, args.verbose)
    return run(args.scenario, args.speed, args.timeout, args.verbose, args.source)


if __name__ == "__main__":
    sys.exit(main())
