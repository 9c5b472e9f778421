"""The loopback fakes behave like the services: azure-identity works against the token endpoint,
ARM refuses requests without a token or api-version, Teams rejects what is not a card."""

from __future__ import annotations

import base64
import json

import pytest
import requests
from azure.identity import DefaultAzureCredential, ManagedIdentityCredential

from emulators.fakes.arm import FakeArm
from emulators.fakes.identity import FakeIdentity
from emulators.fakes.storage import FakeBlobStorage
from emulators.fakes.teams import FakeTeams, card_lines
from emulators.servicebus.auth import jwt_claims

pytestmark = pytest.mark.timeout(20)


@pytest.mark.parametrize("credential_type", [ManagedIdentityCredential, DefaultAzureCredential])
def test_azure_identity_gets_a_token_unchanged(
    identity_fake: FakeIdentity, credential_type
) -> None:  # type: ignore[no-untyped-def]
    token = credential_type().get_token("https://management.azure.com/.default")
    assert token.token in identity_fake.issued
    assert identity_fake.issued[token.token] == "https://management.azure.com"
    (request,) = identity_fake.requests
    assert request.headers["x-identity-header"] == identity_fake.header


def test_a_token_names_the_identity_it_was_issued_to(identity_fake: FakeIdentity) -> None:
    client_id = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
    token = ManagedIdentityCredential(client_id=client_id).get_token(
        "https://servicebus.azure.net/.default"
    )
    claims = jwt_claims(token.token)
    assert claims is not None
    assert claims["aud"] == "https://servicebus.azure.net"
    assert claims["appid"] == client_id
    assert claims["oid"] == FakeIdentity.object_id(client_id) != FakeIdentity.object_id()
    assert FakeIdentity.object_id(client_id) == FakeIdentity.object_id(client_id.upper())


@pytest.mark.parametrize("credential_type", [ManagedIdentityCredential, DefaultAzureCredential])
def test_a_vm_gets_its_token_from_imds_unchanged(
    identity_fake: FakeIdentity, monkeypatch: pytest.MonkeyPatch, credential_type: type
) -> None:
    """As on a VM (no App Service settings): azure-identity asks IMDS's token endpoint, here
    the fake's, and gets a token shaped like Entra ID's: three base64url parts, JSON claims."""
    for name in identity_fake.environ():
        monkeypatch.delenv(name)
    for name, value in identity_fake.vm_environ().items():
        monkeypatch.setenv(name, value)
    token = credential_type().get_token("https://servicebus.azure.net/.default")
    assert identity_fake.issued[token.token] == "https://servicebus.azure.net"
    (request,) = identity_fake.requests
    assert request.path == "/metadata/identity/oauth2/token"
    assert request.headers["metadata"] == "true"
    header, claims, signature = token.token.split(".")
    padded = claims + "=" * (-len(claims) % 4)
    decoded = json.loads(base64.urlsafe_b64decode(padded))
    assert decoded["aud"] == "https://servicebus.azure.net"
    assert decoded["exp"] == token.expires_on and header and signature


@pytest.mark.parametrize(
    ("path", "params", "headers", "status"),
    [
        ("/metadata/identity/oauth2/token", {"api-version": "2018-02-01"}, {}, 400),
        (
            "/metadata/identity/oauth2/token",
            {"api-version": "2019-08-01", "resource": "https://servicebus.azure.net"},
            {"Metadata": "true"},
            400,
        ),
        (
            "/metadata/identity/oauth2/token",
            {"api-version": "2018-02-01"},
            {"Metadata": "true"},
            400,
        ),
        ("/metadata/instance", {"api-version": "2018-02-01"}, {"Metadata": "true"}, 404),
    ],
    ids=["no-metadata-header", "wrong-api-version", "no-resource", "another-path"],
)
def test_the_vm_token_endpoint_refuses_what_imds_refuses(
    identity_fake: FakeIdentity,
    path: str,
    params: dict[str, str],
    headers: dict[str, str],
    status: int,
) -> None:
    response = requests.get(identity_fake.url + path, params=params, headers=headers, timeout=5)
    assert response.status_code == status
    assert not identity_fake.issued


def test_the_identity_endpoint_checks_its_header(identity_fake: FakeIdentity) -> None:
    response = requests.get(
        identity_fake.environ()["IDENTITY_ENDPOINT"],
        params={"api-version": "2019-08-01", "resource": "https://management.azure.com"},
        headers={"X-IDENTITY-HEADER": "wrong"},
        timeout=5,
    )
    assert response.status_code == 401


def test_arm_needs_a_bearer_token_and_an_api_version(arm_fake: FakeArm) -> None:
    vm = arm_fake.add_vm("s", "g", "vm", [])
    assert (
        requests.get(arm_fake.url + vm, params={"api-version": "2024-07-01"}, timeout=5).status_code
        == 401
    )
    auth = {"Authorization": "Bearer x"}
    assert requests.get(arm_fake.url + vm, headers=auth, timeout=5).status_code == 400
    ok = requests.get(
        arm_fake.url + vm.upper().replace("/SUBSCRIPTIONS", "/subscriptions"),
        params={"api-version": "2024-07-01"},
        headers=auth,
        timeout=5,
    )
    assert ok.status_code == 200  # ARM ids are case-insensitive
    missing = requests.get(
        arm_fake.url + vm + "x", params={"api-version": "1"}, headers=auth, timeout=5
    )
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "ResourceNotFound"


def test_arm_reads_paths_percent_decoded(arm_fake: FakeArm) -> None:
    """ARM decodes the path: ``rg%28web%29`` is the resource group ``rg(web)``, and the id in the
    answer is spelled without escapes."""
    vm = arm_fake.add_vm("s", "rg(web)", "vm", [])
    auth, version = {"Authorization": "Bearer x"}, {"api-version": "2024-07-01"}
    quoted = vm.replace("rg(web)", "rg%28web%29")
    answer = requests.get(arm_fake.url + quoted, params=version, headers=auth, timeout=5)
    assert answer.status_code == 200 and answer.json()["id"] == vm


def test_arm_refuses_a_pool_that_does_not_exist(arm_fake: FakeArm) -> None:
    arm_fake.add_vm("s", "g", "vm", [])
    nic_id = (
        "/subscriptions/s/resourceGroups/g/providers/Microsoft.Network/networkInterfaces/vm-nic"
    )
    body = arm_fake.nic(nic_id)
    body["properties"]["ipConfigurations"][0]["properties"]["loadBalancerBackendAddressPools"] = [
        {
            "id": "/subscriptions/s/resourceGroups/g/providers/Microsoft.Network/"
            "loadBalancers/x/backendAddressPools/y"
        }
    ]
    response = requests.put(
        arm_fake.url + nic_id,
        json=body,
        params={"api-version": "2024-05-01"},
        headers={"Authorization": "Bearer x"},
        timeout=5,
    )
    assert response.status_code == 400


def test_arm_answers_a_missing_role_like_arm(arm_fake: FakeArm) -> None:
    vm = arm_fake.add_vm("s", "g", "vm", [])
    arm_fake.fail(403, times=1, method="GET", path_contains="/virtualMachines/")
    url = f"{arm_fake.url}{vm}?api-version=2024-07-01"
    headers = {"Authorization": "Bearer x"}
    denied = requests.get(url, headers=headers, timeout=5)
    assert denied.status_code == 403
    error = denied.json()["error"]
    assert error["code"] == "AuthorizationFailed"
    assert (
        "does not have authorization to perform action 'Microsoft.Compute/virtualMachines/read'"
        f" over scope '{vm}'" in error["message"]
    )
    assert requests.get(url, headers=headers, timeout=5).status_code == 200  # times=1


def test_teams_rejects_a_payload_that_is_not_a_card(teams_fake: FakeTeams) -> None:
    response = requests.post(teams_fake.webhook_url, json={"text": "hello"}, timeout=5)
    assert response.status_code == 400 and not teams_fake.cards


def test_card_lines_render_title_and_facts() -> None:
    card = {
        "body": [
            {"type": "Container", "items": [{"type": "TextBlock", "text": "Title"}]},
            {"type": "FactSet", "facts": [{"title": "Event", "value": "Reboot"}]},
        ],
        "actions": [{"type": "Action.OpenUrl", "title": "Approve", "url": "https://x/?token=s"}],
    }
    assert card_lines(card) == ["Title", "  Event: Reboot", "  [Approve] (Action.OpenUrl)"]


def test_the_fakes_cli_prints_the_settings_and_stops(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from emulators.fakes.__main__ import main

    assert main(["--demo-world", "--seconds", "0.2"]) == 0
    settings = json.loads(capsys.readouterr().out)
    assert set(settings) == {
        "TEAMS_WEBHOOK_URL",
        "ARM_ENDPOINT",
        "HEARTBEAT_STORE_URL",
        "LB_POOL_STATE_URL",
        "EVENTGRID_STATE_URL",
        "IDENTITY_ENDPOINT",
        "IDENTITY_HEADER",
    }
    assert all(
        v.startswith("http://127.0.0.1:") for k, v in settings.items() if k != "IDENTITY_HEADER"
    )


def test_teams_prints_cards_when_asked(capsys: pytest.CaptureFixture[str]) -> None:
    with FakeTeams(print_cards=True) as teams:
        card = {
            "type": "AdaptiveCard",
            "version": "1.5",
            "body": [{"type": "TextBlock", "text": "Reboot scheduled"}],
        }
        payload = {
            "type": "message",
            "attachments": [
                {
                    "contentType": "application/vnd.microsoft.card.adaptive",
                    "contentUrl": None,
                    "content": card,
                }
            ],
        }
        assert requests.post(teams.webhook_url, json=payload, timeout=5).status_code == 202
    assert "[teams] Reboot scheduled" in capsys.readouterr().out


# ---- load balancers as ARM shows them, and the rule health API ---------------------------------

LB_SUB = "00000000-0000-4000-8000-0000000000aa"


def _auth() -> dict[str, str]:
    return {"Authorization": "Bearer x"}


def test_a_load_balancer_lists_its_members_and_rules(arm_fake: FakeArm) -> None:
    lb = arm_fake.add_load_balancer(LB_SUB, "g", "lb", ["p1", "p2"], rules={"http": "p1"})
    vm = arm_fake.add_vm(LB_SUB, "g", "vm", [f"{lb}/backendAddressPools/p1"])
    body = requests.get(
        arm_fake.url + lb, params={"api-version": "2024-05-01"}, headers=_auth(), timeout=5
    ).json()
    p1, p2 = body["properties"]["backendAddressPools"]
    nic_ipc = vm.replace("Microsoft.Compute/virtualMachines", "Microsoft.Network/networkInterfaces")
    assert p1["properties"]["backendIPConfigurations"] == [
        {"id": f"{nic_ipc}-nic/ipConfigurations/ipconfig1"}
    ]
    assert p1["properties"]["loadBalancingRules"] == [{"id": f"{lb}/loadBalancingRules/http"}]
    assert p2["properties"] == {"backendIPConfigurations": [], "loadBalancingRules": []}
    (rule,) = body["properties"]["loadBalancingRules"]
    assert rule["properties"]["backendAddressPool"] == {"id": f"{lb}/backendAddressPools/p1"}


def test_rule_health_answers_like_the_rest_reference(arm_fake: FakeArm) -> None:
    """LoadBalancerLoadBalancingRules_Health (api-version 2024-05-01): POST, 200 with
    LoadBalancerHealthPerRule (up, down, loadBalancerBackendAddresses[]: ipAddress,
    networkInterfaceIPConfigurationId, state, reason), or 202 with a Location."""
    lb = arm_fake.add_load_balancer(LB_SUB, "g", "lb", ["p"], rules={"http": "p"})
    up = arm_fake.add_vm(LB_SUB, "g", "up", [f"{lb}/backendAddressPools/p"])
    down = arm_fake.add_vm(LB_SUB, "g", "down", [f"{lb}/backendAddressPools/p"])
    arm_fake.set_probe(down, up=False)
    url = f"{arm_fake.url}{lb}/loadBalancingRules/http/health"
    answer = requests.post(url, params={"api-version": "2024-05-01"}, headers=_auth(), timeout=5)
    assert answer.status_code == 200
    body = answer.json()
    assert (body["up"], body["down"]) == (1, 1)
    states = {
        a["networkInterfaceIPConfigurationId"].split("/")[-3]: (a["state"], a["reason"])
        for a in body["loadBalancerBackendAddresses"]
    }
    assert states == {
        "up-nic": ("Up", "Up_Probe_Success"),
        "down-nic": ("Down", "Down_Probe_HealthProbeFailure"),
    }
    assert arm_fake.writes() == []  # the health query is a POST that changes nothing
    missing = requests.post(
        f"{arm_fake.url}{lb}/loadBalancingRules/nope/health",
        params={"api-version": "2024-05-01"},
        headers=_auth(),
        timeout=5,
    )
    assert missing.status_code == 404
    assert up


def test_the_arm_client_follows_an_asynchronous_health_query(
    arm_fake: FakeArm, identity_fake: FakeIdentity
) -> None:
    from functions.adapters.arm import ArmRestClient

    lb = arm_fake.add_load_balancer(LB_SUB, "g", "lb", ["p"], rules={"http": "p"})
    vm = arm_fake.add_vm(LB_SUB, "g", "vm", [f"{lb}/backendAddressPools/p"])
    arm_fake.health_async, arm_fake.async_polls = True, 2
    client = ArmRestClient(arm_fake.url, ManagedIdentityCredential(), sleep=lambda _: None)
    states = client.rule_health(f"{lb}/loadBalancingRules/http")
    nic = vm.replace("Microsoft.Compute/virtualMachines", "Microsoft.Network/networkInterfaces")
    assert states == {f"{nic}-nic/ipConfigurations/ipconfig1".lower(): "Up"}
    polls = [r for r in arm_fake.requests if r.path.startswith("/fake/locations/")]
    assert len(polls) == 3  # "in progress" twice, then the body


def test_a_probe_needs_time_to_see_a_member_that_rejoined(arm_fake: FakeArm) -> None:
    lb = arm_fake.add_load_balancer(LB_SUB, "g", "lb", ["p"], rules={"http": "p"})
    pool = f"{lb}/backendAddressPools/p"
    vm = arm_fake.add_vm(LB_SUB, "g", "vm", [pool])
    nic_id = vm.replace("Microsoft.Compute/virtualMachines", "Microsoft.Network/networkInterfaces")
    ipc = f"{nic_id}-nic/ipConfigurations/ipconfig1".lower()
    assert arm_fake.probe_up(ipc)  # a member from the start is Up
    arm_fake.probe_lag = 30.0
    nic = arm_fake.nic(f"{nic_id}-nic")
    config = nic["properties"]["ipConfigurations"][0]["properties"]
    for pools in ([], [{"id": pool}]):  # out, then back in
        config["loadBalancerBackendAddressPools"] = pools
        put = requests.put(
            f"{arm_fake.url}{nic_id}-nic",
            json=nic,
            params={"api-version": "2024-05-01"},
            headers=_auth(),
            timeout=5,
        )
        assert put.status_code == 200
        nic = put.json()
        config = nic["properties"]["ipConfigurations"][0]["properties"]
    assert not arm_fake.probe_up(ipc)
    assert [(e.joined, e.pool) for e in arm_fake.pool_events] == [(False, pool), (True, pool)]


def test_vms_carry_the_vm_id_the_imds_simulator_reports(arm_fake: FakeArm) -> None:
    from emulators.imds.instance import instance_document, vm_settings

    aset = arm_fake.add_availability_set(LB_SUB, "g", "as")
    flex = arm_fake.add_scale_set(LB_SUB, "g", "flex")
    vm = arm_fake.add_vm(LB_SUB, "g", "web-7", [], availability_set=aset)
    member = arm_fake.add_vm(LB_SUB, "g", "flex_1", [], scale_set=flex)
    document = arm_fake.resources[vm.lower()]["properties"]
    imds = instance_document(vm_settings({}, "web-7"))["compute"]
    assert document["vmId"] == imds["vmId"]
    assert document["availabilitySet"] == {"id": aset}
    assert arm_fake.resources[member.lower()]["properties"]["virtualMachineScaleSet"] == {
        "id": flex
    }
    instance = arm_fake.add_vmss_instance(LB_SUB, "g", "uni", "4", [])
    assert arm_fake.resources[instance.lower()]["name"] == "uni_4"


# ---- blob leases, as the Blob service does them ------------------------------------------------


def _blob(storage: FakeBlobStorage, container: str = "c", blob: str = "b") -> str:
    storage.blobs.setdefault(container, {})[blob] = b"{}"
    return f"{storage.container_url(container)}/{blob}"


def _lease(url: str, action: str, **headers: str) -> requests.Response:
    return requests.put(
        url,
        params={"comp": "lease"},
        headers={**_auth(), "x-ms-version": "2023-11-03", "x-ms-lease-action": action, **headers},
        timeout=5,
    )


def test_lease_acquire_conflict_release(storage_fake: FakeBlobStorage) -> None:
    url = _blob(storage_fake)
    first = _lease(url, "acquire", **{"x-ms-lease-duration": "15"})
    assert first.status_code == 201
    lease_id = first.headers["x-ms-lease-id"]
    second = _lease(url, "acquire", **{"x-ms-lease-duration": "15"})
    assert (second.status_code, second.headers["x-ms-error-code"]) == (409, "LeaseAlreadyPresent")
    again = _lease(
        url, "acquire", **{"x-ms-lease-duration": "15", "x-ms-proposed-lease-id": lease_id}
    )
    assert again.status_code == 201  # the holder acquiring again: a renewal
    wrong = _lease(url, "release", **{"x-ms-lease-id": "00000000-0000-4000-8000-000000000000"})
    assert (wrong.status_code, wrong.headers["x-ms-error-code"]) == (
        409,
        "LeaseIdMismatchWithLeaseOperation",
    )
    assert _lease(url, "release", **{"x-ms-lease-id": lease_id}).status_code == 200
    renew = _lease(url, "renew", **{"x-ms-lease-id": lease_id})
    assert (renew.status_code, renew.headers["x-ms-error-code"]) == (
        409,
        "LeaseNotPresentWithLeaseOperation",
    )
    assert _lease(url, "acquire", **{"x-ms-lease-duration": "60"}).status_code == 201


@pytest.mark.parametrize("duration", ["14", "61", "0", "forever", ""])
def test_a_lease_lasts_15_to_60_seconds_or_forever(
    storage_fake: FakeBlobStorage, duration: str
) -> None:
    answer = _lease(_blob(storage_fake), "acquire", **{"x-ms-lease-duration": duration})
    assert (answer.status_code, answer.headers["x-ms-error-code"]) == (400, "InvalidHeaderValue")
    assert (
        _lease(_blob(storage_fake), "acquire", **{"x-ms-lease-duration": "-1"}).status_code == 201
    )


def test_an_expired_lease_may_be_renewed_until_someone_else_takes_the_blob(
    storage_fake: FakeBlobStorage,
) -> None:
    now = [1000.0]
    storage_fake.clock = lambda: now[0]
    url = _blob(storage_fake)
    lease_id = _lease(url, "acquire", **{"x-ms-lease-duration": "15"}).headers["x-ms-lease-id"]
    now[0] += 20  # expired
    assert _lease(url, "renew", **{"x-ms-lease-id": lease_id}).status_code == 200
    now[0] += 20  # expired again, and taken by another
    assert _lease(url, "acquire", **{"x-ms-lease-duration": "15"}).status_code == 201
    lost = _lease(url, "renew", **{"x-ms-lease-id": lease_id})
    assert (lost.status_code, lost.headers["x-ms-error-code"]) == (
        409,
        "LeaseIdMismatchWithLeaseOperation",
    )


def test_a_leased_blob_is_written_with_its_lease_only(storage_fake: FakeBlobStorage) -> None:
    url = _blob(storage_fake)
    put = {**_auth(), "x-ms-version": "2023-11-03", "x-ms-blob-type": "BlockBlob"}
    stranger = "00000000-0000-4000-8000-000000000000"
    unleased = requests.put(url, data=b"1", headers={**put, "x-ms-lease-id": stranger}, timeout=5)
    assert unleased.headers["x-ms-error-code"] == "LeaseNotPresentWithBlobOperation"
    lease_id = _lease(url, "acquire", **{"x-ms-lease-duration": "15"}).headers["x-ms-lease-id"]
    for headers, code in (
        (put, "LeaseIdMissing"),
        ({**put, "x-ms-lease-id": stranger}, "LeaseIdMismatchWithBlobOperation"),
    ):
        answer = requests.put(url, data=b"2", headers=headers, timeout=5)
        assert (answer.status_code, answer.headers["x-ms-error-code"]) == (412, code)
    ok = requests.put(url, data=b"3", headers={**put, "x-ms-lease-id": lease_id}, timeout=5)
    assert ok.status_code == 201 and storage_fake.blobs["c"]["b"] == b"3"
    assert requests.get(url, headers=put, timeout=5).content == b"3"  # reads need no lease
    missing = _lease(
        f"{storage_fake.container_url('c')}/nope", "acquire", **{"x-ms-lease-duration": "15"}
    )
    assert (missing.status_code, missing.headers["x-ms-error-code"]) == (404, "BlobNotFound")
    exists = requests.put(url, data=b"4", headers={**put, "If-None-Match": "*"}, timeout=5)
    assert (exists.status_code, exists.headers["x-ms-error-code"]) == (409, "BlobAlreadyExists")
