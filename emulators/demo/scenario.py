"""A packaged scenario (or one of the demo's own) run end to end on the demo stack, judged by
its verdict: ``sebridge demo [--scenario NAME] [--source forwarder|eventgrid|both]``."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime

from emulators.demo import history as demo_history
from emulators.demo import sources as demo_sources
from emulators.demo.stack import DemoStack
from emulators.demo.timeline import Timeline
from emulators.demo.verdict import Verdict, approved_event_ids, judge, plan_for
from emulators.demo.world import GROUP, MIN_HEALTHY, SUBSCRIPTION, demo_world, load_packaged, rehome

READY = "receiving commands"  # the forwarder's log line once its Service Bus link is up
FORWARDER_START_TIMEOUT = 60.0  # then the scenario runs anyway (the verdict says what failed)


def run(
    scenario_name: str, speed: float, timeout: float, verbose: bool, source: str = "forwarder"
) -> int:
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
        stack.start_fakes()
        storage = stack.start_storage()
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
            **demo_sources.app_settings(source, storage.blob_endpoint, GROUP),
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
        demo_history.warm_up(host.url)

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
            # The scenario's clock waits for the forwarder's Service Bus link: on a loaded
            # machine the first connection takes seconds, and events timed seconds apart
            # (capacity-hold's two Reboots) would otherwise reach the topic together.
            sim.hold_clock()
            fw.start()
            stack.defer(fw.close)
            fw.wait_for(lambda _: READY in fw.stderr_text(), FORWARDER_START_TIMEOUT)
            sim.run_clock()
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
        calendar = demo_history.CalendarWatch(host.url, topic_seen, timeline.add, stack.stop)
        stack.watch(calendar.run)
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
            if not judged.missing:  # the loop is done: the history must tell it too
                judged.missing += demo_history.verdict(calendar, expected_events)
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
        print("\nThe history (GET /api/events/{eventId}):")
        for line in demo_history.story(host.url, sorted(expected_events)):
            print(line)
        return 0
