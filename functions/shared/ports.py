"""The workflows' view of the outside world: small protocols the adapters implement.

The cores in this package talk only to these; the composition root wires the real adapters
(requests, azure-identity, azure-servicebus) and tests wire recording fakes.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from sebridge.contract.commands import ApproveCommand
from sebridge.contract.events import Envelope


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


class ArmClient(Protocol):
    """The few ARM calls the workflows make. ``None`` means 404 (the resource is gone);
    :class:`PermissionDenied` means 403 (reads and the NIC write)."""

    def vm_nic_ids(self, subscription: str, group: str, vm_name: str) -> list[str] | None: ...

    def vmss_vm_nic_ids(
        self, subscription: str, group: str, scale_set: str, instance_id: str
    ) -> list[str] | None: ...

    def get_nic(self, nic_id: str) -> ArmDocument | None: ...

    def put_nic(self, nic_id: str, body: dict[str, Any], etag: str | None) -> None:
        """PUT the NIC (If-Match ``etag``) and wait for the operation to finish."""

    def acknowledge_event(self, vm_resource_id: str, event_id: str) -> None: ...


class CommandSender(Protocol):
    def send(self, command: ApproveCommand, session_id: str) -> None: ...


class TopicPublisher(Protocol):
    def publish(self, envelope: Envelope) -> None: ...


class HeartbeatStore(Protocol):
    def record(self, vm_name: str, at: datetime) -> None: ...

    def last(self, vm_name: str) -> datetime | None: ...
