"""The workflows' view of the outside world: small protocols the adapters implement.

The cores in this package talk only to these; the composition root wires the real adapters
(requests, azure-identity, azure-servicebus) and tests wire recording fakes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from sebridge.contract.commands import ApproveCommand
from sebridge.contract.events import Envelope

if TYPE_CHECKING:  # verified.py imports this module (ArmClient)
    from functions.shared.verified import VerifiedMessage


class Clock(Protocol):
    def __call__(self) -> datetime: ...


class TeamsPoster(Protocol):
    def post(self, card: dict[str, Any]) -> None:
        """Post one Adaptive Card; raise when Teams did not take it after bounded retries."""


@dataclass(frozen=True)
class ArmDocument:
    body: dict[str, Any]
    etag: str | None


class PreconditionFailed(Exception):
    """ARM answered 412: the resource changed since it was read (re-read and try again)."""


class PermissionDenied(Exception):
    """ARM answered 403: the app's identity lacks ``action`` (an RBAC action) on ``scope``.

    No retry can repair that, so the workflows do not raise it on: they log it at ERROR, leave
    that VM as it is (never removing what they might not be allowed to put back), publish no
    Prepared for the event, and let the message complete.
    """

    def __init__(self, action: str, scope: str, detail: str = "") -> None:
        self.action = action
        self.scope = scope
        self.detail = detail
        super().__init__(
            f"missing permission {action} on {scope}" + (f" (ARM said: {detail})" if detail else "")
        )


@dataclass(frozen=True)
class VmRecord:
    """What the workflows need to know of one VM from ARM (read, never from a message)."""

    id: str  # the ARM id as ARM spells it
    name: str
    vm_id: str  # properties.vmId: the identity IMDS reports as compute.vmId
    nic_ids: tuple[str, ...]
    availability_set: str = ""  # lower-case ARM id, "" when the VM is in none
    scale_set: str = ""  # lower-case ARM id of its scale set (Flexible or Uniform), else ""
    uniform: bool = False  # a Uniform scale-set instance (NICs belong to the scale-set model)
    # The observer of a sealed message that no longer exists (a Completed after a Terminate):
    # Azure reported it, so it verifies, but there is nothing to act on (functions.shared.scope).
    gone: bool = False


class ReferenceMissing(Exception):
    """ARM refused a write because it refers to a resource that does not exist (400
    ``InvalidResourceReference``: a NIC PUT naming a backend pool whose load balancer, or the
    pool itself, was deleted). No retry of the same write repairs it."""


class WriteRefused(Exception):
    """ARM refused a write for good: a 4xx other than 401, 403 (PermissionDenied), 404, 408,
    409, 412 (PreconditionFailed) and 429, with ARM's error ``code``. No retry of the same write
    repairs it; an operator must (lb-pools reports a restore it refuses: functions.lb_pools)."""

    def __init__(self, status: int, code: str, detail: str, *, what: str = "write") -> None:
        super().__init__(f"{what}: HTTP {status} {code}: {detail}".strip())
        self.status = status
        self.code = code or f"HTTP {status}"


class AcknowledgeRefused(Exception):
    """ARM refused an acknowledgement for good (a 4xx other than 401, 403, 408 and 429)."""


class ArmClient(Protocol):
    """The few ARM calls the workflows make. ``None`` means 404 (the resource is gone);
    :class:`PermissionDenied` means 403. Names are checked (functions.shared.names) before they
    are passed here; ids come from ARM's own documents."""

    def get_vm(self, subscription: str, group: str, vm_name: str) -> VmRecord | None: ...

    def get_scale_set_vm(
        self, subscription: str, group: str, scale_set: str, instance_id: str
    ) -> VmRecord | None: ...

    def get_nic(self, nic_id: str) -> ArmDocument | None: ...

    def put_nic(self, nic_id: str, body: dict[str, Any], etag: str | None) -> None:
        """PUT the NIC (If-Match ``etag``) and wait for the operation to finish.
        PreconditionFailed on 412; ReferenceMissing when it names a pool that is gone."""

    def get_load_balancer(self, lb_id: str) -> ArmDocument | None: ...

    def rule_health(self, rule_id: str) -> dict[str, str]:
        """The load balancer's own probe verdict per backend ip configuration of one
        load-balancing rule: lower-case ip configuration id -> ``Up`` or ``Down``."""

    def acknowledge_event(self, vm_resource_id: str, event_id: str) -> None:
        """POST the acknowledge. PermissionDenied on 403; AcknowledgeRefused when ARM answers
        that no retry will change (another 4xx: the event is gone, already acknowledged or
        started, or the id is not one ARM takes)."""


class EventRecords(Protocol):
    """Where what the bridge knows of each event is kept (functions.shared.event_record)."""

    def read_event(self, event_id: str) -> Mapping[str, Any]:
        """The event's record (``{}`` when there is none)."""


class CommandSender(Protocol):
    def send(self, command: ApproveCommand, session_id: str) -> None: ...


class TopicPublisher(Protocol):
    def publish(self, envelope: Envelope) -> None: ...


class MomentScheduler(Protocol):
    """Messages lb-pools schedules to itself for an event's drain moment (Service Bus scheduled
    messages on the drain-moments queue: functions.lb_pools.moments)."""

    def schedule(self, body: bytes, at: datetime, message_id: str) -> int:
        """Schedule ``body`` to arrive at ``at``; the broker's sequence number for it."""

    def cancel(self, sequence: int) -> None:
        """Cancel a scheduled message; one already delivered or cancelled is no error."""


class HeartbeatStore(Protocol):
    def record(self, vm_name: str, at: datetime) -> None: ...

    def last(self, vm_name: str) -> datetime | None: ...


class PoolBusy(Exception):
    """Another instance held a pool's lock for longer than we may wait (the message is
    redelivered and tried again)."""


class PoolLease(Protocol):
    """The locks on some backend pools, held: read and write their state while holding them."""

    def state(self, pool_id: str) -> Mapping[str, Any]: ...

    def save(self, pool_id: str, state: Mapping[str, Any]) -> None: ...

    def check(self) -> None:
        """Raise if a lock was lost (it expired and someone else took it)."""

    def allowance(self) -> float:
        """:meth:`check`, then the seconds every lock is still provably held (the write window
        of functions.shared.write_window)."""


class PoolStore(Protocol):
    """Per-pool serialisation and durable per-pool state (held events)."""

    def hold(self, pool_ids: Sequence[str]) -> AbstractContextManager[PoolLease]:
        """Take the locks of ``pool_ids`` (in a fixed order), or raise :class:`PoolBusy`."""

    def peek(self, pool_id: str) -> Mapping[str, Any]:
        """The pool's state without taking its lock (may be stale the moment it returns)."""

    def index_held(self, event_id: str, pool_ids: Sequence[str]) -> None:
        """Remember which pools hold ``event_id`` (empty: none), for :meth:`held_pools`."""

    def held_pools(self, event_id: str) -> Sequence[str]:
        """The pools that last held ``event_id`` (a hint: their own state says for sure)."""

    def read_event(self, event_id: str) -> Mapping[str, Any]:
        """The event's record (functions.shared.event_record; ``{}`` when there is none)."""

    def update_event(self, event_id: str, change: Callable[[dict[str, Any]], bool]) -> None:
        """Change the event's record: ``change`` edits a copy in place and says whether it
        changed anything; written under the record's ETag (a concurrent write makes it read
        and change again), so no writer loses another's change."""


class ActionRecorder(Protocol):
    """What a workflow did that reaches no topic (lb-pools putting VMs back), for the event's
    history (functions/history), in the verified scope of the message that caused it.
    Recording never fails the caller: an adapter retries a storage fault for a while, then
    keeps the action to write later and logs it."""

    def record(
        self, verified: VerifiedMessage, action: str, at: datetime, details: Mapping[str, Any]
    ) -> None: ...


class NoActions:
    """The default :class:`ActionRecorder`: the history is off, nothing is recorded."""

    def record(
        self, verified: VerifiedMessage, action: str, at: datetime, details: Mapping[str, Any]
    ) -> None:
        return None
