"""The loopback fakes behave like the services: azure-identity works against the token endpoint,
ARM refuses requests without a token or api-version, Teams rejects what is not a card."""

from __future__ import annotations

import pytest
import requests
from azure.identity import DefaultAzureCredential, ManagedIdentityCredential

from emulators.fakes.arm import FakeArm
from emulators.fakes.identity import FakeIdentity
from emulators.fakes.teams import FakeTeams, card_lines

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
