"""Role assignments (`servicebus-emulator --rights`): what an Entra principal may do, per entity.

Azure Service Bus with local auth off lets a token's principal do what its data roles grant
at a scope covering the entity: Data Sender sends, Data Receiver receives (and peeks), Data
Owner does both. The emulator reads the principal from the token's ``oid`` claim. Tokens come
from the managed-identity fake through azure-identity, as on a VM; the refusals are the SDK's
own exceptions for Service Bus's ``amqp:unauthorized-access``. Local only: these tests start
their own emulator.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from azure.identity import ManagedIdentityCredential
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import (
    ServiceBusAuthenticationError,
    ServiceBusAuthorizationError,
)

from emulators.fakes.identity import FakeIdentity, unsigned_jwt
from emulators.servicebus.auth import Rights, RightsError
from emulators.servicebus.testing import EmulatorProcess, running_emulator

pytestmark = pytest.mark.timeout(60)

SENDER = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"  # client ids of user-assigned identities
RECEIVER = "1f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
OWNER = "2f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
NOBODY = "3f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"


def assignments() -> dict[str, object]:
    oid = FakeIdentity.object_id
    return {
        "roleAssignments": [
            {"principalId": oid(SENDER), "role": "Azure Service Bus Data Sender",
             "scope": "scheduled-events"},
            {"principalId": oid(RECEIVER), "role": "Azure Service Bus Data Receiver",
             "scope": "approvals"},
            {"principalId": oid(RECEIVER), "role": "Azure Service Bus Data Receiver",
             "scope": "scheduled-events/subscriptions/audit"},
            {"principalId": oid(OWNER), "role": "Azure Service Bus Data Owner", "scope": ""},
        ]
    }  # fmt: skip


@pytest.fixture(scope="module")
def identity() -> Iterator[FakeIdentity]:
    with FakeIdentity() as fake:
        yield fake


@pytest.fixture(scope="module")
def bus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorProcess]:
    rights = tmp_path_factory.mktemp("rights") / "rights.json"
    rights.write_text(json.dumps(assignments()))
    with running_emulator(extra_args=["--rights", str(rights)]) as emulator:
        yield emulator


@pytest.fixture
def client_for(
    identity: FakeIdentity, bus: EmulatorProcess, monkeypatch: pytest.MonkeyPatch
) -> Iterator[object]:
    for name, value in identity.environ().items():
        monkeypatch.setenv(name, value)
    clients: list[ServiceBusClient] = []

    def make(client_id: str) -> ServiceBusClient:
        credential = ManagedIdentityCredential(client_id=client_id)
        client = ServiceBusClient(bus.namespace, credential, use_tls=False, retry_total=0)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


def _send(client: ServiceBusClient, entity: str, session: str = "vm-1") -> None:
    send = client.get_queue_sender if entity == "approvals" else client.get_topic_sender
    with send(entity) as sender:
        sender.send_messages(ServiceBusMessage(b"{}", session_id=session))


def test_a_sender_sends_to_its_topic_and_nothing_else(client_for) -> None:  # type: ignore[no-untyped-def]
    client = client_for(SENDER)
    _send(client, "scheduled-events")
    with pytest.raises(ServiceBusAuthorizationError) as info:
        _send(client, "approvals")
    assert "'Send' claim(s) are required" in str(info.value)
    assert "approvals" in str(info.value)
    with pytest.raises(ServiceBusAuthorizationError, match="'Listen' claim"):
        with client.get_queue_receiver("approvals", session_id="vm-1", max_wait_time=2) as r:
            r.peek_messages()


def test_a_receiver_receives_where_granted_and_sends_nowhere(client_for) -> None:  # type: ignore[no-untyped-def]
    client = client_for(RECEIVER)
    with client.get_queue_receiver("approvals", session_id="vm-1", max_wait_time=2) as receiver:
        assert receiver.peek_messages() is not None
    with client.get_subscription_receiver(
        "scheduled-events", "audit", session_id="vm-1", max_wait_time=2
    ) as receiver:
        receiver.receive_messages(max_wait_time=1)
    with pytest.raises(ServiceBusAuthorizationError, match="'Listen' claim"):
        with client.get_subscription_receiver(
            "scheduled-events", "teams", session_id="vm-1", max_wait_time=2
        ) as receiver:
            receiver.receive_messages(max_wait_time=1)
    with pytest.raises(ServiceBusAuthorizationError, match="'Send' claim"):
        _send(client, "scheduled-events")


def test_an_owner_at_the_namespace_may_do_both_and_a_stranger_nothing(client_for) -> None:  # type: ignore[no-untyped-def]
    owner = client_for(OWNER)
    _send(owner, "approvals", session="vm-owner")
    with owner.get_queue_receiver("approvals", session_id="vm-owner", max_wait_time=2) as r:
        (message,) = r.receive_messages(max_wait_time=2)
        r.complete_message(message)
    with pytest.raises(ServiceBusAuthorizationError):
        _send(client_for(NOBODY), "scheduled-events")


def test_a_token_naming_no_principal_is_refused(bus: EmulatorProcess) -> None:
    class NoOid:
        def get_token(self, *scopes: str, **kwargs: object) -> object:
            from azure.core.credentials import AccessToken

            return AccessToken(unsigned_jwt({"aud": "https://servicebus.azure.net"}), 2**31)

    with ServiceBusClient(bus.namespace, NoOid(), use_tls=False, retry_total=0) as client:
        with pytest.raises(ServiceBusAuthenticationError):
            _send(client, "scheduled-events")


def test_the_sas_key_may_still_do_everything(bus: EmulatorProcess) -> None:
    with ServiceBusClient.from_connection_string(bus.connection_string) as client:
        _send(client, "approvals", session="vm-sas")
        with client.get_queue_receiver("approvals", session_id="vm-sas", max_wait_time=2) as r:
            (message,) = r.receive_messages(max_wait_time=2)
            r.complete_message(message)


@pytest.mark.parametrize(
    ("document", "problem"),
    [
        ([], "roleAssignments"),
        ({"roleAssignments": [{"principalId": "x", "role": "Owner", "scope": ""}]}, "not one of"),
        ({"roleAssignments": [{"principalId": "", "role": "x", "scope": ""}]}, "not empty"),
        ({"roleAssignments": [{"principalId": "x", "scope": ""}]}, "principalId, role and scope"),
    ],
)
def test_role_assignments_that_cannot_be_used_are_refused(document: object, problem: str) -> None:
    with pytest.raises(RightsError, match=problem):
        Rights.from_json(document)


def test_a_scope_covers_the_entity_and_what_is_under_it() -> None:
    rights = Rights.from_json(assignments())
    sender, receiver = FakeIdentity.object_id(SENDER), FakeIdentity.object_id(RECEIVER)
    assert rights.claims(sender, "scheduled-events") == {"Send"}
    assert rights.claims(sender.upper(), "Scheduled-Events/$management") == {"Send"}
    assert rights.claims(receiver, "scheduled-events/Subscriptions/audit") == {"Listen"}
    assert rights.claims(receiver, "scheduled-events/Subscriptions/auditors") == set()
    assert rights.claims(receiver, "scheduled-events") == set()
    assert rights.claims(FakeIdentity.object_id(OWNER), "approvals") == {
        "Send",
        "Listen",
        "Manage",
    }


def test_the_emulator_refuses_a_rights_file_it_cannot_use(tmp_path: Path) -> None:
    bad = tmp_path / "rights.json"
    bad.write_text('{"roleAssignments": [{"principalId": "x", "role": "Reader", "scope": ""}]}')
    emulator = EmulatorProcess(extra_args=["--rights", str(bad)])
    with pytest.raises(Exception, match=r"exited|Reader|not one of"):
        emulator.start()
    emulator.close()
