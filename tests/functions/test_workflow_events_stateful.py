"""Events that overlap on one VM and move between VMs, against generated histories (Hypothesis
stateful testing; hostile review of issue 23, breaks 3 and 5).

IMDS can show one VM several events at once, and an Updated can move an event to other VMs.
Events are scheduled on one or two VMs of two pools (overlapping freely), updated to other VMs,
started, completed and cancelled in any order. lb-pools (the real core, with the real ARM and
blob adapters against the loopback fakes over HTTP) must keep these promises:

- a VM drained for an event stays out while that event is on and still names it, whatever other
  events on the VM end meanwhile (one event's end never undoes another's drain);
- a VM is out of its pool only while some event that is on names it (nothing drained for a stale
  held entry, nothing left out when the last event ends);
- a pool's held list names only events that are on, each with the VMs it names now.
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
from functions.lb_pools.core import LbOutcome, LbPools
from functions.shared.impact import DEFAULT_RULES
from functions.shared.scope import TrustRules
from sebridge.contract.events import Transition, event_message, parse_message
from tests.fixtures import golden
from tests.functions.support import (
    NOW,
    POOL_CONTAINER,
    RG,
    SUB,
    RecordingPublisher,
    event,
    web_vm,
)
from tests.support.budget import examples

pytestmark = pytest.mark.timeout(300)

POOL_A = ("web-1", "web-2", "web-3")
POOL_B = ("web-4", "web-5")
VMS = POOL_A + POOL_B
MAX_PER_VM = 2  # events on one VM at once


@dataclass
class Event:
    event_id: str
    vms: list[str]
    event_type: str
    started: bool = False
    ordinal: int = 11  # documentIncarnation of its next message


@dataclass
class Model:
    on: dict[str, Event] = field(default_factory=dict)
    drained_for: dict[str, set[str]] = field(default_factory=dict)  # event -> VMs it drained


@pytest.mark.slow  # about 8 s or more: make check leaves it to make test
def test_overlapping_and_moving_events_keep_their_promises(
    arm_fake: FakeArm, storage_fake: FakeBlobStorage, identity_fake: FakeIdentity
) -> None:
    credential = ManagedIdentityCredential()
    counter = itertools.count(1)

    class Events(RuleBasedStateMachine):
        events = Bundle("events")

        def __init__(self) -> None:
            super().__init__()
            arm_fake.resources.clear()
            arm_fake.pool_events.clear()
            arm_fake.probe_down.clear()
            arm_fake.requests.clear()
            storage_fake.blobs.clear()
            storage_fake.leases.clear()
            lb_a = arm_fake.add_load_balancer(SUB, RG, "lb-a", ["pool-a"], rules={"a": "pool-a"})
            lb_b = arm_fake.add_load_balancer(SUB, RG, "lb-b", ["pool-b"], rules={"b": "pool-b"})
            self.pool = {
                **{vm: f"{lb_a}/backendAddressPools/pool-a" for vm in POOL_A},
                **{vm: f"{lb_b}/backendAddressPools/pool-b" for vm in POOL_B},
            }
            self.vm_ids = {vm: web_vm(arm_fake, vm, [self.pool[vm]]) for vm in VMS}
            self.lb_pools = LbPools(
                CachedVmReads(ArmRestClient(arm_fake.url, credential)),
                RecordingPublisher(),
                DEFAULT_RULES,
                rules=TrustRules(),
                pools=BlobPoolStore(storage_fake.container_url(POOL_CONTAINER), credential),
                min_healthy=1,
                settle_seconds=0.0,
            )
            self.model = Model()

        # ---- helpers -------------------------------------------------------------------
        def deliver(self, transition: Transition, e: Event, **changes: object) -> LbOutcome:
            fields: dict[str, object] = {
                "EventId": e.event_id,
                "Resources": list(e.vms),
                "EventType": e.event_type,
                "DurationInSeconds": -1,
            }
            if e.started or transition in (Transition.STARTED, Transition.COMPLETED):
                fields |= {"EventStatus": "Started", "NotBefore": ""}
            e.ordinal += 1
            message = event_message(
                transition,
                event(**fields),
                golden.OBSERVER,
                e.ordinal,
                golden.OBSERVED_AT,
                changes=changes or None,
            )
            return self.lb_pools.handle(parse_message(message.body_bytes()), NOW)

        def note(self, e: Event, outcome: LbOutcome) -> None:
            """What lb-pools drained: the event's VMs (all of them, or none)."""
            if outcome.action == "drain" and outcome.held is None and not outcome.not_ready:
                self.model.drained_for[e.event_id] = set(e.vms)
            for resumed in outcome.resumed:
                if resumed in self.model.on:
                    self.model.drained_for[resumed] = set(self.model.on[resumed].vms)

        def busy(self, vms: list[str], besides: str = "") -> bool:
            return any(
                sum(vm in e.vms for e in self.model.on.values() if e.event_id != besides)
                >= MAX_PER_VM
                for vm in vms
            )

        def out(self, vm: str) -> bool:
            return arm_fake.vm_pools(self.vm_ids[vm]) == []

        # ---- rules ---------------------------------------------------------------------
        @rule(
            target=events,
            vms=st.lists(st.sampled_from(VMS), min_size=1, max_size=2, unique=True),
            event_type=st.sampled_from(["Reboot", "Freeze", "Redeploy"]),
        )
        def schedule(self, vms: list[str], event_type: str) -> object:
            if self.busy(vms):
                return multiple()
            e = Event(f"{next(counter):08x}-0000-4000-8000-000000000000", sorted(vms), event_type)
            self.model.on[e.event_id] = e
            self.note(e, self.deliver(Transition.SCHEDULED, e))
            return e

        @rule(e=events, vms=st.lists(st.sampled_from(VMS), min_size=1, max_size=2, unique=True))
        def move(self, e: Event, vms: list[str]) -> None:
            if e.event_id not in self.model.on or e.started or sorted(vms) == e.vms:
                return
            if self.busy(vms, besides=e.event_id):
                return
            before, e.vms = e.vms, sorted(vms)
            outcome = self.deliver(
                Transition.UPDATED, e, Resources={"from": before, "to": list(e.vms)}
            )
            kept = self.model.drained_for.get(e.event_id)
            if kept is not None:
                kept &= set(e.vms)  # a VM the event no longer names is let go
            self.note(e, outcome)

        @rule(e=events)
        def start(self, e: Event) -> None:
            if e.event_id not in self.model.on or e.started:
                return
            outcome = self.deliver(Transition.STARTED, e)
            e.started = True
            self.note(e, outcome)

        @rule(e=consumes(events))
        def end(self, e: Event) -> None:
            if e.event_id not in self.model.on:
                return
            del self.model.on[e.event_id]
            self.model.drained_for.pop(e.event_id, None)
            ending = Transition.COMPLETED if e.started else Transition.CANCELLED
            self.note(e, self.deliver(ending, e))

        @rule(vm=st.sampled_from(VMS), up=st.booleans())
        def probe(self, vm: str, up: bool) -> None:
            arm_fake.set_probe(self.vm_ids[vm], up=up)

        # ---- the promises --------------------------------------------------------------
        @invariant()
        def drained_vms_stay_out_while_their_event_is_on(self) -> None:
            for event_id, vms in self.model.drained_for.items():
                for vm in vms & set(self.model.on[event_id].vms):
                    assert self.out(vm), f"{vm} back in its pool while {event_id} has it out"

        @invariant()
        def a_vm_is_out_only_for_an_event_that_names_it(self) -> None:
            named = {vm for e in self.model.on.values() for vm in e.vms}
            for vm in VMS:
                if self.out(vm):
                    assert vm in named, f"{vm} out of its pool, no event on names it"

        @invariant()
        def held_lists_name_events_that_are_on_with_their_vms_now(self) -> None:
            for pool in set(self.pool.values()):
                raw = storage_fake.blobs.get(POOL_CONTAINER, {}).get(blob_name(pool))
                for entry in (held.read(json.loads(raw)) if raw else {}).values():
                    event_id = entry.event
                    assert event_id in self.model.on, f"{event_id} ended, still held"
                    resources = entry.body["data"]["Resources"]
                    assert sorted(resources) == self.model.on[event_id].vms, (
                        f"{event_id} held with {resources}, names {self.model.on[event_id].vms}"
                    )

    run_state_machine_as_test(
        Events,
        settings=settings(
            max_examples=examples(30),
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
            derandomize=True,
        ),
    )
