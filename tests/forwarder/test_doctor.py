"""`sebridge doctor` against the real stand-ins: the IMDS simulator, the Service Bus emulator
(with a connection string, and over TLS with a token from the managed-identity fake and the
emulator's role assignments), the forwarder itself (its drain probe and status), the
installer's environment file, and a systemctl on PATH that says what a unit's state is.

Never IMDS or Entra for real: every run names the simulator's URL, and a run that signs in has
AZURE_POD_IDENTITY_AUTHORITY_HOST pointing at the fake (the forwarder's own managed-identity
credential asks there) and, for azure-identity's chain, IDENTITY_ENDPOINT too, so neither asks
anything else.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import certifi
import pytest
from azure.servicebus import ServiceBusClient

from emulators.fakes.identity import FakeIdentity
from emulators.imds.testing import RunningSimulator, running_simulator
from emulators.ports import refused_port, reserve_port
from emulators.processes import forwarder
from emulators.servicebus.testing import EmulatorProcess, running_emulator
from sebridge import __version__, servicebus
from sebridge.contract.commands import ApproveCommand
from sebridge.forwarder.observability.doctor import read_env_file, run
from tests.support import docs
from tests.support.http_peers import HttpPeer, Style
from tests.support.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
INSTALLER = REPO / "infra" / "scripts" / "install-forwarder.sh"
pytestmark = pytest.mark.timeout(180)

# The simulator's VM (its instance metadata's compute.name).
VM = "vmss_vm1"


def in_an_hour() -> datetime:
    return datetime.now(UTC) + timedelta(hours=1)


FORWARDERS = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"  # client id: Data Sender + Data Receiver
SEND_ONLY = "1f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"  # client id: Data Sender only
RECEIVE_ONLY = "2f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"  # client id: Data Receiver only

# Where the credentials find a managed identity: cleared, then set to loopback by each test.
IDENTITY_SETTINGS = {
    "AZURE_CLIENT_ID",
    "IDENTITY_ENDPOINT",
    "IDENTITY_HEADER",
    "AZURE_POD_IDENTITY_AUTHORITY_HOST",
}

UNIT_STATES = {
    "active": "LoadState=loaded\nActiveState=active\nSubState=running\nNRestarts=0\nResult=success",
    "failed": "LoadState=loaded\nActiveState=failed\nSubState=failed\nNRestarts=5\n"
    "Result=exit-code",
    "missing": "LoadState=not-found\nActiveState=inactive\nSubState=dead\nNRestarts=0\n"
    "Result=success",
}


def doctor(*args: str) -> tuple[int, dict[str, dict[str, str]], dict[str, Any]]:
    """Run the doctor in this process (--json); its checks by name and its whole document."""
    out, err = io.StringIO(), io.StringIO()
    code, stuck = run(["--json", "--timeout", "20", *args], out=out, err=err)
    assert not stuck, err.getvalue()
    document = json.loads(out.getvalue())
    return code, {c["name"]: c for c in document["checks"]}, document


@pytest.fixture(autouse=True)
def systemctl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A systemctl first on PATH that reports the unit as its ``state`` file says (active)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    state = tmp_path / "unit-state"
    state.write_text(UNIT_STATES["active"])
    script = bin_dir / "systemctl"
    script.write_text(f'#!/bin/sh\n[ "$1" = show ] || exit 1\ncat "{state}"\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}/usr/bin:/bin")
    for name in list(os.environ):
        if name.startswith("SEBRIDGE_") or name in IDENTITY_SETTINGS:
            monkeypatch.delenv(name)
    return state


@pytest.fixture(scope="module")
def sim() -> Iterator[RunningSimulator]:
    with running_simulator(str(REPO / "benchmarks" / "idle-scenario.json")) as simulator:
        yield simulator


@pytest.fixture(scope="module")
def bus() -> Iterator[EmulatorProcess]:
    with running_emulator() as emulator:
        yield emulator


def _receive(bus: EmulatorProcess, entity: str, session: str) -> list[Any]:
    """Every message of one session of a queue (``approvals``) or a topic subscription."""
    with ServiceBusClient.from_connection_string(bus.connection_string) as client:
        if "/" in entity:
            topic, subscription = entity.split("/")
            receiver = client.get_subscription_receiver(
                topic, subscription, session_id=session, max_wait_time=3
            )
        else:
            receiver = client.get_queue_receiver(entity, session_id=session, max_wait_time=3)
        with receiver:
            messages = receiver.receive_messages(max_message_count=20, max_wait_time=3)
            for message in messages:
                receiver.complete_message(message)
            return messages


# --- with a connection string (the emulator) ---------------------------------------------------


def test_everything_ok_sends_a_heartbeat_and_takes_no_command(
    sim: RunningSimulator, bus: EmulatorProcess, tmp_path: Path
) -> None:
    _receive(bus, "scheduled-events/audit", VM)  # whatever earlier tests left
    code, checks, document = doctor(
        "--no-env-files",
        "--imds-endpoint",
        sim.base_url,
        "--connection-string",
        bus.connection_string,
        "--state-dir",
        str(tmp_path / "state"),
    )
    assert code == 0, checks
    status = {name: c["status"] for name, c in checks.items()}
    assert status == {
        "config": "ok",
        "imds": "ok",
        "token": "skip",  # a connection string needs none
        "send": "ok",
        "receive": "ok",
        "unit": "ok",
        "forwarder": "warn",  # no state: this forwarder never ran
        "hooks": "skip",
        "probe": "skip",
    }
    assert "scheduled events enabled" in checks["imds"]["what"]
    assert f"VM {VM}" in checks["imds"]["what"]
    assert "0 command(s) waiting" in checks["receive"]["what"]
    # The Heartbeat is on the topic, where the Verify step looks for it.
    (heartbeat,) = _receive(bus, "scheduled-events/audit", VM)
    assert heartbeat.message_id == document["heartbeatMessageId"]
    assert heartbeat.message_id.startswith(f"heartbeat:{VM}:")
    body = json.loads(b"".join(heartbeat.body))
    assert body["type"] == "Azure.VM.ScheduledEvent.Heartbeat"
    assert body["data"]["heartbeat"]["forwarderVersion"] == f"{__version__}+doctor"
    # Nothing secret in what it prints.
    assert "SAS_KEY_VALUE" not in json.dumps(document)


def test_waiting_commands_are_peeked_never_taken(
    sim: RunningSimulator, bus: EmulatorProcess, tmp_path: Path
) -> None:
    session = f"vm-{uuid.uuid4().hex[:8]}"
    command = ApproveCommand(str(uuid.uuid4()), "test", "doctor must not take it", in_an_hour())
    with ServiceBusClient.from_connection_string(bus.connection_string) as client:
        with client.get_queue_sender("approvals") as sender:
            sender.send_messages(servicebus.command_message(command, session))
    code, checks, _ = doctor(
        "--no-env-files",
        "--imds-endpoint",
        sim.base_url,
        "--connection-string",
        bus.connection_string,
        "--vm-name",
        session,
        "--state-dir",
        str(tmp_path / "state"),
        "--no-send",
    )
    assert checks["receive"]["status"] == "warn"
    assert f"session {session}: 1 command(s) waiting" in checks["receive"]["what"]
    assert "systemctl enable --now" in checks["receive"]["fix"]
    assert code == 0  # a warning is not a failure
    (message,) = _receive(bus, "approvals", session)  # still there, never delivered before
    assert message.message_id == command.message_id
    assert message.delivery_count == 0


def test_a_session_held_by_the_running_forwarder_is_a_good_sign(
    sim: RunningSimulator, bus: EmulatorProcess, tmp_path: Path
) -> None:
    session = f"vm-{uuid.uuid4().hex[:8]}"
    with ServiceBusClient.from_connection_string(bus.connection_string) as client:
        with client.get_queue_receiver("approvals", session_id=session, max_wait_time=2):
            code, checks, _ = doctor(
                "--no-env-files",
                "--imds-endpoint",
                sim.base_url,
                "--connection-string",
                bus.connection_string,
                "--vm-name",
                session,
                "--state-dir",
                str(tmp_path / "state"),
                "--no-send",
            )
    assert code == 0
    assert checks["receive"]["status"] == "ok"
    assert "locked by another receiver, the running forwarder" in checks["receive"]["what"]


# Every check, in the order the command prints them.
CHECKS = ["config", "imds", "token", "send", "receive", "unit", "forwarder", "hooks", "probe"]


def doctor_command(
    sim: RunningSimulator, connection_string: str, tmp_path: Path, *, timeout: float
) -> subprocess.CompletedProcess[str]:
    """``sebridge doctor`` as an operator runs it, in a process of its own, no env files."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "sebridge.cli",
            "doctor",
            "--no-env-files",
            "--imds-endpoint",
            sim.base_url,
            "--connection-string",
            connection_string,
            "--state-dir",
            str(tmp_path / "state"),
            "--timeout",
            str(timeout),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def test_the_command_prints_one_line_per_check_and_exits_1_on_a_failure(
    sim: RunningSimulator, tmp_path: Path
) -> None:
    # The CLI as an operator runs it; Service Bus is a port nothing listens on.
    proc = doctor_command(
        sim,
        "Endpoint=sb://127.0.0.1:9;SharedAccessKeyName=k;SharedAccessKey=secret-key-value;"
        "UseDevelopmentEmulator=true;",
        tmp_path,
        timeout=10,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    names = [line.split()[1] for line in lines]
    assert names == CHECKS, proc.stdout
    (send,) = [line for line in lines if line.split()[1] == "send"]
    assert send.startswith("FAIL  send")
    assert "Fix: outbound TCP 5671 (AMQP) to the namespace must be open" in send
    assert "the first call after 24 h without one may take up to 2 minutes" in proc.stderr
    assert "secret-key-value" not in proc.stdout + proc.stderr


def test_a_short_timeout_prints_checks_not_the_sdks_tracebacks(
    sim: RunningSimulator, bus: EmulatorProcess, tmp_path: Path
) -> None:
    """Review a31: with --timeout 0.5 the send left behind by its deadline logged the SDK's
    'Unexpected error occurred ... Handler shutting down.' and a traceback on stderr (4 runs
    of 4): the doctor promises one line per check."""
    proc = doctor_command(sim, bus.connection_string, tmp_path, timeout=0.5)
    names = [line.split()[1] for line in proc.stdout.splitlines()]
    assert names == CHECKS, proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "Unexpected error" not in proc.stderr, proc.stderr


def test_a_usage_error_is_exit_2() -> None:
    code, _ = run(["--no-such-flag"], out=io.StringIO(), err=io.StringIO())
    assert code == 2


# --- the VM's own pieces -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "status", "words"),
    [
        ("active", "ok", "is active (running)"),
        ("failed", "FAIL", "is failed (failed), result exit-code"),
        ("missing", "FAIL", "is not installed"),
    ],
)
def test_the_units_state_with_its_fix(
    systemctl: Path, sim: RunningSimulator, tmp_path: Path, state: str, status: str, words: str
) -> None:
    systemctl.write_text(UNIT_STATES[state])
    code, checks, _ = doctor(
        "--no-env-files", "--dry-run", "--imds-endpoint", sim.base_url,
        "--state-dir", str(tmp_path / "state"),
    )  # fmt: skip
    assert checks["unit"]["status"] == status
    assert words in checks["unit"]["what"]
    assert code == (0 if status == "ok" else 1)
    if state == "failed":
        fix = checks["unit"]["fix"]
        assert "sudo systemctl enable --now sebridge-forwarder.service" in fix
        assert "journalctl -u sebridge-forwarder.service" in fix


def test_without_systemd_the_unit_is_said_to_be_skipped(
    sim: RunningSimulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    _, checks, _ = doctor(
        "--no-env-files", "--dry-run", "--imds-endpoint", sim.base_url,
        "--state-dir", str(tmp_path / "state"),
    )  # fmt: skip
    assert checks["unit"]["status"] == "skip"
    assert "no systemctl on this machine" in checks["unit"]["what"]


def test_a_hooks_file_the_forwarder_would_refuse(sim: RunningSimulator, tmp_path: Path) -> None:
    hooks = tmp_path / "hooks.json"
    hooks.write_text(json.dumps({"schemaVersion": 1, "hooks": []}))
    hooks.chmod(0o666)  # anyone may change what the forwarder runs
    code, checks, _ = doctor(
        "--no-env-files", "--dry-run", "--imds-endpoint", sim.base_url,
        "--state-dir", str(tmp_path / "state"), "--hooks-file", str(hooks),
    )  # fmt: skip
    assert code == 1
    assert checks["hooks"]["status"] == "FAIL"
    assert "refused" in checks["hooks"]["what"]
    assert f"chown root:root {hooks} and chmod go-w it" in checks["hooks"]["fix"]


def test_the_drain_probe_and_the_health_of_a_running_forwarder(
    sim: RunningSimulator, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    port = reserve_port()  # for the forwarder's probe: no one else is handed it meanwhile
    probe = ["--drain-probe-port", str(port), "--drain-probe-address", "127.0.0.1"]
    with forwarder(sim.base_url, state, *probe, env={"SEBRIDGE_METRICS_PORT": ""}) as fw:
        wait_until(lambda: (state / "status.json").exists(), 30, "the forwarder's status.json")
        code, checks, _ = doctor(
            "--no-env-files", "--dry-run", "--imds-endpoint", sim.base_url,
            "--state-dir", str(state), *probe,
        )  # fmt: skip
        assert fw.process is not None and fw.process.poll() is None
    assert code == 0, [c for c in checks.values() if c["status"] == "FAIL"]
    assert checks["probe"]["status"] == "ok"
    assert f"http://127.0.0.1:{port} answers 200 (in service)" in checks["probe"]["what"]
    assert checks["forwarder"]["status"] == "ok"
    assert checks["forwarder"]["what"].startswith("healthy (sebridge status)")
    # Stopped: nothing answers on the port, with the fix.
    _, checks, _ = doctor(
        "--no-env-files", "--dry-run", "--imds-endpoint", sim.base_url,
        "--state-dir", str(state), *probe,
    )  # fmt: skip
    assert checks["probe"]["status"] == "FAIL"
    assert "nothing answers" in checks["probe"]["what"]
    assert checks["forwarder"]["status"] == "FAIL"  # its pid is gone: degraded


def test_imds_that_does_not_answer_is_a_failure_with_the_fix(tmp_path: Path) -> None:
    with refused_port() as port:  # nothing answers here, and no one else is handed it
        code, checks, _ = doctor(
            "--no-env-files", "--dry-run", "--imds-endpoint", f"http://127.0.0.1:{port}",
            "--imds-timeout", "3", "--state-dir", str(tmp_path / "state"),
        )  # fmt: skip
    assert code == 1
    assert checks["imds"]["status"] == "FAIL"
    assert "must be reachable from this VM" in checks["imds"]["fix"]
    assert "never through a proxy" in checks["imds"]["fix"]


def test_a_configuration_the_forwarder_would_refuse(sim: RunningSimulator) -> None:
    code, checks, _ = doctor("--no-env-files", "--imds-endpoint", sim.base_url)
    assert code == 1
    assert checks["config"]["status"] == "FAIL"
    assert "nowhere to publish" in checks["config"]["what"]
    assert "SEBRIDGE_NAMESPACE and AZURE_CLIENT_ID" in checks["config"]["fix"]
    assert {c["status"] for n, c in checks.items() if n != "config" and n != "unit"} == {"skip"}


# --- with the VM's identity: a token from the fake, roles in the emulator ----------------------


@pytest.fixture(scope="module")
def identity() -> Iterator[FakeIdentity]:
    with FakeIdentity() as fake:
        yield fake


_oid = FakeIdentity.object_id
# What main.bicep grants the forwarders' identity (servicebus-roles.bicep), and two that lack one.
ROLES = [
    {"principalId": _oid(FORWARDERS), "role": "Azure Service Bus Data Sender",
     "scope": "scheduled-events"},
    {"principalId": _oid(FORWARDERS), "role": "Azure Service Bus Data Receiver",
     "scope": "approvals"},
    {"principalId": _oid(SEND_ONLY), "role": "Azure Service Bus Data Sender",
     "scope": "scheduled-events"},
    {"principalId": _oid(RECEIVE_ONLY), "role": "Azure Service Bus Data Receiver",
     "scope": "approvals"},
]  # fmt: skip


@pytest.fixture(scope="module")
def secure_bus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorProcess]:
    """The emulator over TLS, enforcing the roles main.bicep grants (servicebus-roles.bicep)."""
    rights = tmp_path_factory.mktemp("rights") / "rights.json"
    rights.write_text(json.dumps({"roleAssignments": ROLES}))
    with running_emulator(tls=True, extra_args=["--rights", str(rights)]) as emulator:
        yield emulator


@pytest.fixture
def signed_in(
    identity: FakeIdentity,
    secure_bus: EmulatorProcess,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """The forwarder's managed-identity credential finds the fake as a VM's IMDS (and nothing
    else); the SDK trusts the emulator's certificate, as it trusts Azure's: through certifi's
    bundle, which gains it."""
    for name, value in identity.vm_environ().items():
        monkeypatch.setenv(name, value)
    assert secure_bus.ca_cert is not None
    bundle = tmp_path / "bundle.pem"
    bundle.write_text(Path(certifi.where()).read_text() + Path(secure_bus.ca_cert).read_text())
    monkeypatch.setattr(certifi, "where", lambda: str(bundle))


def _installed_env_file(tmp_path: Path, client_id: str, **settings: str) -> Path:
    """forwarder.env as install-forwarder.sh writes it (into a scratch root)."""
    root = tmp_path / "root"
    root.mkdir()
    env = {
        "PATH": os.environ["PATH"],
        "SEBRIDGE_ROOT": str(root),
        "SEBRIDGE_NAMESPACE": "127.0.0.1",  # the certificate's name; the endpoint says where
        "AZURE_CLIENT_ID": client_id,
        **settings,
    }
    proc = subprocess.run(
        ["bash", str(INSTALLER), "--no-start", "--no-user", "--no-pip"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return root / "etc" / "sebridge" / "forwarder.env"


@pytest.fixture
def unassigned() -> Iterator[HttpPeer]:
    """An IMDS identity endpoint for a VM the identity is not assigned to: 400, as IMDS answers."""
    body = json.dumps({"error": "invalid_request", "error_description": "Identity not found"})
    with HttpPeer(lambda request: (400, body.encode())) as peer:
        yield peer


def _signed_in_doctor(
    tmp_path: Path, sim: RunningSimulator, bus: EmulatorProcess, client_id: str, *args: str
) -> tuple[int, dict[str, dict[str, str]], dict[str, Any]]:
    env_file = _installed_env_file(
        tmp_path,
        client_id,
        SEBRIDGE_IMDS_ENDPOINT=sim.base_url,
        SEBRIDGE_SERVICEBUS_ENDPOINT=f"sb://127.0.0.1:{bus.tls_port}",
    )
    settings = read_env_file(env_file)
    assert settings["AZURE_CLIENT_ID"] == client_id
    return doctor("--env-file", str(env_file), "--state-dir", str(tmp_path / "state"), *args)


@pytest.mark.usefixtures("signed_in")
def test_the_forwarders_identity_with_its_roles_passes(
    sim: RunningSimulator, secure_bus: EmulatorProcess, tmp_path: Path
) -> None:
    code, checks, document = _signed_in_doctor(tmp_path, sim, secure_bus, FORWARDERS)
    assert code == 0, checks
    assert "from the environment" not in checks["config"]["what"]
    assert (
        str(tmp_path / "root" / "etc" / "sebridge" / "forwarder.env")
        in document["environmentFiles"]
    )
    assert checks["config"]["what"].startswith(
        f"namespace 127.0.0.1, client id {FORWARDERS}; topic scheduled-events"
    )
    assert checks["token"]["status"] == "ok"
    assert f"object id {FakeIdentity.object_id(FORWARDERS)}" in checks["token"]["what"]
    assert "through the forwarder's managed-identity credential" in checks["token"]["what"]
    assert checks["send"]["status"] == "ok" and checks["receive"]["status"] == "ok"
    assert document["configuration"]["credential"] == "managed-identity"
    # No token in what it prints.
    assert "eyJ" not in json.dumps(document)


@pytest.mark.usefixtures("signed_in")
def test_send_and_receive_sign_in_with_the_forwarders_credential_too(
    sim: RunningSimulator,
    secure_bus: EmulatorProcess,
    tmp_path: Path,
    identity: FakeIdentity,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """azure-identity's chain would fail here (its App Service endpoint refuses the header);
    the forwarder never asks it, so neither may any of the doctor's checks."""
    monkeypatch.setenv("IDENTITY_ENDPOINT", identity.environ()["IDENTITY_ENDPOINT"])
    monkeypatch.setenv("IDENTITY_HEADER", "not-the-header")  # the endpoint refuses: 401
    code, checks, _ = _signed_in_doctor(tmp_path, sim, secure_bus, FORWARDERS)
    assert code == 0, checks
    assert "through the forwarder's managed-identity credential" in checks["token"]["what"]
    assert checks["send"]["status"] == "ok", checks["send"]
    assert checks["receive"]["status"] == "ok", checks["receive"]


@pytest.mark.usefixtures("signed_in")
def test_credential_default_signs_in_through_azure_identitys_chain(
    sim: RunningSimulator,
    secure_bus: EmulatorProcess,
    tmp_path: Path,
    identity: FakeIdentity,
    unassigned: HttpPeer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With --credential default the forwarder signs in through azure-identity (here its App
    Service flavour, the fake), never through its own credential (whose IMDS would refuse)."""
    for name, value in identity.environ().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AZURE_POD_IDENTITY_AUTHORITY_HOST", unassigned.url)
    code, checks, document = _signed_in_doctor(
        tmp_path, sim, secure_bus, FORWARDERS, "--credential", "default"
    )
    assert code == 0, checks
    assert document["configuration"]["credential"] == "default"
    token = checks["token"]
    assert token["status"] == "ok"
    assert "through azure-identity's default chain (--credential default)" in token["what"]
    assert f"object id {FakeIdentity.object_id(FORWARDERS)}" in token["what"]
    assert checks["send"]["status"] == "ok" and checks["receive"]["status"] == "ok"
    assert not unassigned.requests  # the forwarder's own credential was never asked


@pytest.mark.usefixtures("signed_in")
def test_without_data_sender_send_fails_naming_the_role_and_the_topic(
    sim: RunningSimulator, secure_bus: EmulatorProcess, tmp_path: Path
) -> None:
    code, checks, _ = _signed_in_doctor(tmp_path, sim, secure_bus, RECEIVE_ONLY)
    assert code == 1
    assert checks["token"]["status"] == "ok"
    send = checks["send"]
    assert send["status"] == "FAIL"
    assert send["what"] == "not allowed to send to topic scheduled-events"
    assert "Azure Service Bus Data Sender on topic scheduled-events" in send["fix"]
    assert f"--assignee-object-id {FakeIdentity.object_id(RECEIVE_ONLY)}" in send["fix"]
    assert checks["receive"]["status"] == "ok"


@pytest.mark.usefixtures("signed_in")
def test_without_data_receiver_receive_fails_naming_the_role_and_the_queue(
    sim: RunningSimulator, secure_bus: EmulatorProcess, tmp_path: Path
) -> None:
    code, checks, _ = _signed_in_doctor(tmp_path, sim, secure_bus, SEND_ONLY)
    assert code == 1
    assert checks["send"]["status"] == "ok"
    receive = checks["receive"]
    assert receive["status"] == "FAIL"
    assert receive["what"] == "not allowed to receive from queue approvals"
    assert "Azure Service Bus Data Receiver on queue approvals" in receive["fix"]


@pytest.mark.usefixtures("signed_in")
def test_no_token_fails_with_how_to_attach_the_identity(
    identity: FakeIdentity,
    unassigned: HttpPeer,
    sim: RunningSimulator,
    secure_bus: EmulatorProcess,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """IMDS refuses the forwarder's token: the doctor fails the token even though
    azure-identity's chain (which the forwarder does not use) would get one here."""
    for name, value in identity.environ().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AZURE_POD_IDENTITY_AUTHORITY_HOST", unassigned.url)
    code, checks, _ = _signed_in_doctor(tmp_path, sim, secure_bus, FORWARDERS)
    assert code == 1
    assert checks["token"]["status"] == "FAIL"
    what = checks["token"]["what"]
    assert what.startswith(
        f"no Service Bus token for client id {FORWARDERS} through the forwarder's "
        "managed-identity credential"
    )
    assert "IMDS answered 400: invalid_request: Identity not found" in what
    assert f"is the identity with client id {FORWARDERS} assigned to this VM?" in what
    assert "az vm identity assign" in checks["token"]["fix"]
    assert "forwarderIdentityClientId" in checks["token"]["fix"]
    assert checks["send"]["status"] == "skip" and checks["receive"]["status"] == "skip"


def test_a_token_request_that_never_ends_is_bounded_then_stopped(
    sim: RunningSimulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """IMDS takes the forwarder's token request and never answers: the check fails at its
    deadline with the identity fix, and the request left behind ends with the doctor (its
    credential's cancel), not after the credential's own 70 s of retries."""
    with HttpPeer(lambda request: (200, b"{}"), Style(answer=False)) as silent:
        monkeypatch.setenv("AZURE_POD_IDENTITY_AUTHORITY_HOST", silent.url)
        out, err = io.StringIO(), io.StringIO()
        code, stuck = run(
            [
                "--json", "--no-env-files", "--imds-endpoint", sim.base_url,
                "--namespace", "127.0.0.1", "--client-id", FORWARDERS,
                "--state-dir", str(tmp_path / "state"), "--timeout", "2",
            ],
            out=out,
            err=err,
        )  # fmt: skip
        assert stuck  # the check's thread was left behind at its deadline...
        checks = {c["name"]: c for c in json.loads(out.getvalue())["checks"]}
        token = checks["token"]
        assert code == 1 and token["status"] == "FAIL"
        assert token["what"] == (
            f"no Service Bus token for client id {FORWARDERS} through the forwarder's "
            "managed-identity credential (IMDS's token endpoint): no answer within 2 s"
        )
        assert "az vm identity assign" in token["fix"]
        assert checks["send"]["status"] == "skip" and checks["receive"]["status"] == "skip"
        assert silent.requests  # it did ask the forwarder's IMDS
        # ...and ends at once: one request takes 10 s, the retries 70 s.
        wait_until(
            lambda: not any(t.name == "doctor-check" for t in threading.enumerate()),
            3,
            "the token check's thread to end",
        )


def test_the_readme_lists_every_check_and_the_verify_step_runs_the_doctor(
    sim: RunningSimulator, tmp_path: Path
) -> None:
    table = docs.page("monitoring").split("**`sudo sebridge doctor [--json]`**", 1)[1]
    table = table.split("\n\n")[1]
    documented = [line.split("`")[1] for line in table.splitlines()[2:]]
    _, checks, _ = doctor(
        "--no-env-files", "--dry-run", "--imds-endpoint", sim.base_url,
        "--state-dir", str(tmp_path / "state"),
    )  # fmt: skip
    assert documented == list(checks)
    assert "`sudo sebridge doctor`" in docs.section(docs.page("README"), "## Deploy")
    verify = docs.section(docs.page("deploy"), "## Verify")
    assert "`sudo sebridge doctor`" in verify
    example = verify.split("```\n", 1)[1].split("```", 1)[0]
    lines = [line.strip() for line in example.splitlines() if line.strip()]
    shown = [line.split()[1] for line in lines if not line.startswith("imds:")]
    assert shown == list(checks)


def test_text_from_imds_is_shown_escaped_never_obeyed(tmp_path: Path) -> None:
    """Hostile review item 7: the doctor printed IMDS's VM name raw (``VM {vm_name}``): an
    escape sequence, a bidi override or a forged line reached the terminal. Every check's text
    now goes through sebridge.text's escaping."""
    from tests.support.imds_stub import ImdsStub

    hostile = "vm\x1b[2J\u202eok\nFAIL  forged  line"
    with ImdsStub() as imds:
        imds.instance_status = 200
        imds.instance_compute = {"name": hostile, "vmId": "id", "resourceId": "/r"}
        out, err = io.StringIO(), io.StringIO()
        args = ["--no-env-files", "--dry-run", "--imds-endpoint", imds.url, "--timeout", "20"]
        run([*args, "--state-dir", str(tmp_path / "state")], out=out, err=err)
    text = out.getvalue() + err.getvalue()
    assert "\x1b" not in text and "\u202e" not in text
    assert not any(line.startswith("FAIL  forged") for line in text.splitlines())
    (imds_line,) = [line for line in out.getvalue().splitlines() if line.split()[1] == "imds"]
    assert "\\x1b[2J\\u202eok\\nFAIL  forged  line" in imds_line
