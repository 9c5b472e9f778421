"""The capacity guard against generated histories (Hypothesis stateful testing).

Events start, end and are cancelled on the VMs of one backend pool in any order, and the load
balancer's probe marks members Up or Down between them. lb-pools (the real core, with the real
ARM and blob adapters against the loopback fakes over HTTP) must keep these promises:

- safety: every time it takes a healthy member out (for Scheduled, Updated or Started alike), the
  pool keeps at least LB_MIN_HEALTHY healthy members (checked by replaying ARM's own record of
  pool changes against the probe states of the moment);
- no VM stays out of its pool once all its events ended (Completed or Cancelled);
- a held event is held for a reason: right after an event ends and its VM is restored, no held
  event could be drained without breaking the minimum;
- the pool's held list names only events that have not ended.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field

import pytest
from azure.identity import ManagedIdentityCredential
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    multiple,
    rule,
    run_state_machine_as_test,
)

from emulators.fakes.arm import FakeArm
from emulators.fakes.identity import FakeIdentity
from emulators.fakes.storage import FakeBlobStorage
from functions.adapters.arm import ArmRestClient
from functions.adapters.arm_cache import CachedVmReads
from functions.adapters.pool_state import BlobPoolStore, blob_name
from functions.lb_pools import held
from functions.lb_pools.core import PARALLEL_WRITES, LbPools
from functions.shared.batching import Batcher, side_by_side
from functions.shared.impact import DEFAULT_RULES
from functions.shared.scope import TrustRules
from sebridge.contract.events import parse_message
from tests.functions.support import (
    NOW,
    POOL_CONTAINER,
    RG,
    SUB,
    RecordingPublisher,
    at_once,
    envelope,
    web_vm,
)
from tests.support.budget import examples

pytestmark = pytest.mark.timeout(240)

VMS = ("web-1", "web-2", "web-3", "web-4")


@dataclass
class Event:
    event_id: str
    vm: str
    event_type: str
    started: bool = False


@dataclass
class Model:
    active: dict[str, Event] = field(default_factory=dict)  # event id -> event


@pytest.mark.slow
def test_the_guard_holds_under_generated_histories(
    arm_fake: FakeArm, storage_fake: FakeBlobStorage, identity_fake: FakeIdentity
) -> None:
    credential = ManagedIdentityCredential()
    counter = itertools.count(1)
    largest_batches: list[int] = []  # per example: did concurrent decisions share a batch?

    class Pools(RuleBasedStateMachine):
        events = Bundle("events")

        def __init__(self) -> None:
            super().__init__()
            arm_fake.resources.clear()
            arm_fake.pool_events.clear()
            arm_fake.probe_down.clear()
            arm_fake.requests.clear()
            storage_fake.blobs.clear()
            storage_fake.leases.clear()
            lb = arm_fake.add_load_balancer(SUB, RG, "lb-web", ["pool-a"], rules={"http": "pool-a"})
            self.pool = f"{lb}/backendAddressPools/pool-a"
            self.vm_ids = {vm: web_vm(arm_fake, vm, [self.pool]) for vm in VMS}
            self.minimum = 2
            self.publisher = RecordingPublisher()
            self.lb_pools = LbPools(
                CachedVmReads(ArmRestClient(arm_fake.url, credential)),
                self.publisher,
                DEFAULT_RULES,
                rules=TrustRules(),
                pools=BlobPoolStore(storage_fake.container_url(POOL_CONTAINER), credential),
                min_healthy=self.minimum,
                settle_seconds=0.0,
                decisions=Batcher(),  # as the app wires it (functions.shared.composition)
                side_by_side=side_by_side(PARALLEL_WRITES),
            )
            self.model = Model()
            self.checked_events = 0
            self.down_at: list[tuple[float, frozenset[str]]] = [(0.0, frozenset())]
            self.started_vms: set[str] = set()

        # ---- helpers -------------------------------------------------------------------
        def ipc(self, vm: str) -> str:
            nic = self.vm_ids[vm].replace(
                "Microsoft.Compute/virtualMachines", "Microsoft.Network/networkInterfaces"
            )
            return f"{nic}-nic/ipConfigurations/ipconfig1".lower()

        def deliver(self, transition: str, event: Event) -> None:
            fields: dict[str, object] = {
                "EventId": event.event_id,
                "Resources": [event.vm],
                "EventType": event.event_type,
            }
            if transition in ("Started", "Completed"):
                fields |= {"EventStatus": "Started", "NotBefore": ""}
            self.lb_pools.handle(parse_message(envelope(transition, **fields).body_bytes()), NOW)

        # ---- rules ---------------------------------------------------------------------
        @rule(
            target=events,
            vm=st.sampled_from(VMS),
            event_type=st.sampled_from(["Reboot", "Redeploy", "Reboot", "Preempt"]),
        )
        def schedule(self, vm: str, event_type: str) -> object:
            busy = {e.vm for e in self.model.active.values()}
            gone = any(e.vm == vm and e.event_type == "Preempt" for e in self.model.active.values())
            if vm in busy or gone or vm in self.started_vms:
                return multiple()  # one event per VM at a time (as IMDS does for a VM)
            event = Event(f"{next(counter):08x}-0000-4000-8000-000000000000", vm, event_type)
            self.model.active[event.event_id] = event
            self.deliver("Scheduled", event)
            return event

        @rule(
            target=events,
            vms=st.sets(st.sampled_from(VMS), min_size=2),
            event_type=st.sampled_from(["Reboot", "Redeploy"]),
        )
        def schedule_at_once(self, vms: set[str], event_type: str) -> object:
            """Several events on several VMs handled at the same moment by concurrent
            invocations (threads): their decisions are batched under one lease."""
            busy = {e.vm for e in self.model.active.values()} | self.started_vms
            gone = {e.vm for e in self.model.active.values() if e.event_type == "Preempt"}
            free = sorted(vms - busy - gone)
            if len(free) < 2:
                return multiple()
            events = [
                Event(f"{next(counter):08x}-0000-4000-8000-000000000000", vm, event_type)
                for vm in free
            ]
            for event in events:
                self.model.active[event.event_id] = event
            errors = at_once(*((lambda e=e: self.deliver("Scheduled", e)) for e in events))
            assert not errors, errors
            return multiple(*events)

        @rule(event=events)
        def start(self, event: Event) -> None:
            if event.event_id not in self.model.active or event.started:
                return
            event.started = True
            self.deliver("Started", event)

        @rule(event=consumes(events))
        def end(self, event: Event) -> None:
            if event.event_id not in self.model.active:
                return
            del self.model.active[event.event_id]
            before = len(arm_fake.pool_events)
            self.deliver("Completed" if event.started else "Cancelled", event)
            if event.event_type == "Preempt" and event.started:
                self.started_vms.add(event.vm)  # gone for good: it never comes back
            if any(change.joined for change in arm_fake.pool_events[before:]):
                self.check_holds_have_reasons()  # a restore tried the held events again

        @rule(vm=st.sampled_from(VMS), up=st.booleans())
        def probe(self, vm: str, up: bool) -> None:
            arm_fake.set_probe(self.vm_ids[vm], up=up)
            import time

            self.down_at.append((time.time(), frozenset(arm_fake.probe_down)))
            self.checked_events += 1

        # ---- properties ----------------------------------------------------------------
        def down_when(self, at: float) -> frozenset[str]:
            current = frozenset[str]()
            for moment, down in self.down_at:
                if moment <= at:
                    current = down
            return current

        @invariant()
        def never_below_the_minimum_by_a_drain(self) -> None:
            members = {self.ipc(vm) for vm in VMS}
            for change in arm_fake.pool_events:
                if change.joined:
                    members.add(change.ip_configuration)
                    continue
                down = self.down_when(change.at)
                was_healthy = change.ip_configuration not in down
                members.discard(change.ip_configuration)
                if not was_healthy:
                    continue
                healthy = len(members - down)
                assert healthy >= self.minimum, (
                    f"{change.nic} left with {healthy} healthy members behind"
                )

        @invariant()
        def ended_vms_are_back(self) -> None:
            engaged = {e.vm for e in self.model.active.values()} | self.started_vms
            for vm in VMS:
                if vm not in engaged:
                    assert arm_fake.vm_pools(self.vm_ids[vm]) == [self.pool], f"{vm} still out"

        @invariant()
        def held_lists_name_events_that_have_not_ended(self) -> None:
            raw = storage_fake.blobs.get(POOL_CONTAINER, {}).get(blob_name(self.pool))
            entries = {e.event: e for e in held.read(json.loads(raw)).values()} if raw else {}
            active = set(self.model.active)
            assert set(entries) <= active, f"stale held entries {set(entries) - active}"

        def teardown(self) -> None:
            assert isinstance(self.lb_pools.decisions, Batcher)
            largest_batches.append(self.lb_pools.decisions.largest)

        def check_holds_have_reasons(self) -> None:
            raw = storage_fake.blobs.get(POOL_CONTAINER, {}).get(blob_name(self.pool))
            entries = {e.event: e for e in held.read(json.loads(raw)).values()} if raw else {}
            in_pool = {vm for vm in VMS if arm_fake.vm_pools(self.vm_ids[vm]) == [self.pool]}
            healthy = {vm for vm in in_pool if self.ipc(vm) not in arm_fake.probe_down}
            for event_id in entries:
                vm = self.model.active[event_id].vm
                if vm in healthy:
                    assert len(healthy) - 1 < self.minimum, (
                        f"{event_id} on {vm} still held with {len(healthy)} healthy members"
                    )

    run_state_machine_as_test(
        Pools,
        settings=settings(
            max_examples=examples(40),
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
            derandomize=True,
        ),
    )
    assert max(largest_batches) >= 2, "no example had two decisions in one batch"
