"""Issue 21: the forwarder as on a VM signs in with its own managed-identity credential.

The real ``sebridge forwarder --namespace`` publishes a Reboot's transitions to the Service Bus
emulator's TLS listener with tokens from the identity fake, which stands in for IMDS's token
endpoint through AZURE_POD_IDENTITY_AUTHORITY_HOST (as in benchmarks/forwarder_poll.py). The
process runs with ``python -X importtime``: the interpreter itself names every module the
process imports, from start-up to the last publish, on stderr; azure.identity, cryptography and
msal must not be among them (10.7 MiB of RSS: docs/performance.md), nor the SDK's
administration client and the requests stack it brings (6.4 MiB more). Its memory map is read
too (/proc/<pid>/maps): no extension module of cryptography is loaded.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from emulators.fakes.identity import FakeIdentity
from emulators.imds.testing import expected_transitions, running_simulator
from emulators.processes import ChildProcess, forwarder
from emulators.servicebus.testing import EmulatorProcess, running_emulator
from sebridge.contract.events import parse_message
from tests.support.bus import receive_all

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "infra" / "servicebus-emulator" / "Config.json"
CLIENT_ID = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
FORBIDDEN = ("azure.identity", "cryptography", "msal")
# What azure.servicebus imports through its administration package, which sending and
# receiving never use (sebridge.servicebus.load_sdk).
ADMINISTRATION = ("requests", "urllib3", "azure.servicebus.management._management_client")
# Settings through which azure-identity (or anything else) could find another identity.
IDENTITY_SETTINGS = (
    "AZURE_CLIENT_ID",
    "AZURE_TENANT_ID",
    "AZURE_CLIENT_SECRET",
    "AZURE_FEDERATED_TOKEN_FILE",
    "IDENTITY_ENDPOINT",
    "IDENTITY_HEADER",
    "MSI_ENDPOINT",
    "MSI_SECRET",
)
_IMPORTED = re.compile(r"^import time:\s+\d+ \|\s+\d+ \| (\s*)(\S+)$")


@pytest.fixture
def identity() -> Iterator[FakeIdentity]:
    with FakeIdentity() as fake:
        yield fake


@pytest.fixture
def bus() -> Iterator[EmulatorProcess]:
    with running_emulator(CONFIG, tls=True) as emulator:
        yield emulator


def imported(stderr: str) -> set[str]:
    """Every module ``-X importtime`` reported (and each one's parent packages)."""
    names = set()
    for line in stderr.splitlines():
        match = _IMPORTED.match(line)
        if match:
            parts = match.group(2).split(".")
            names.update(".".join(parts[: i + 1]) for i in range(len(parts)))
    return names


def as_on_a_vm(sim_url: str, state: Path, bus: EmulatorProcess, fake: FakeIdentity) -> ChildProcess:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in IDENTITY_SETTINGS and not k.startswith("SEBRIDGE_")
    }
    env.update(fake.vm_environ())  # "IMDS" for tokens is the fake: never 169.254.169.254
    assert bus.tls_port and bus.ca_cert
    child = forwarder(
        sim_url,
        state,
        "--namespace",
        "127.0.0.1",  # the name in the emulator's certificate
        "--servicebus-endpoint",
        f"sb://127.0.0.1:{bus.tls_port}",
        "--client-id",
        CLIENT_ID,
        dry_run=False,
        env=env,
    )
    # The SDK trusts the emulator's CA as it trusts Azure's (benchmarks/trusting.py), and the
    # interpreter reports each import.
    child.argv = [
        sys.executable,
        "-X",
        "importtime",
        str(REPO / "benchmarks" / "trusting.py"),
        bus.ca_cert,
        *child.argv[3:],  # after "python -m sebridge.cli"
    ]
    return child


@pytest.mark.timeout(180)
def test_the_forwarder_publishes_with_its_own_credential_and_no_azure_identity(
    identity: FakeIdentity, bus: EmulatorProcess, tmp_path: Path
) -> None:
    lifecycle = [e["transition"] for e in expected_transitions("user-reboot")]
    with running_simulator("user-reboot", speed=8, extra_args=["--start-on-first-poll"]) as sim:
        fw = as_on_a_vm(sim.base_url, tmp_path, bus, identity)
        with fw:
            lb = receive_all(bus.connection_string, "lb-pools", want=len(lifecycle), timeout=90)
            assert fw.wait_for(lambda _: "receiving commands" in fw.stderr_text(), 30)
            assert fw.process is not None
            maps = Path(f"/proc/{fw.process.pid}/maps").read_text()
            log = fw.stderr_text()
            assert fw.alive, log[-3000:]
    assert [m["subject"] for m in lb] == lifecycle, log[-3000:]
    for message in lb:
        assert parse_message(message["body"]).observer.vm_name == "vmss_vm1"
    # Signed in through the fake, for Service Bus, as the user-assigned identity.
    assert "https://servicebus.azure.net/" in identity.issued.values()
    modules = imported(log)
    assert {"azure.servicebus", "sebridge.forwarder.imds.token"} <= modules  # it did report
    assert not {m for m in modules if m.split(".")[0] in FORBIDDEN or m in FORBIDDEN}
    assert not modules & set(ADMINISTRATION), sorted(modules & set(ADMINISTRATION))
    assert "_ssl" in maps or "libssl" in maps  # the map shows extension modules ...
    assert "cryptography" not in maps  # ... and cryptography's is not one of them
    assert "eyJ" not in log  # no token in the logs
