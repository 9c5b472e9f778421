"""sebridge.servicebus.load_sdk: the forwarder imports the SDK without its administration client.

Each case runs in a fresh interpreter: what it checks is what a process imports.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(120)


def run(code: str) -> dict[str, object]:
    """``code`` in a new interpreter; what it printed last, as JSON."""
    done = subprocess.run(
        [sys.executable, "-c", "import json, sys\n" + code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=90,
        check=True,
    )
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


SENDS = """
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusReceiver
from azure.servicebus.exceptions import ServiceBusError
client = ServiceBusClient.from_connection_string(
    "Endpoint=sb://127.0.0.1:1/;SharedAccessKeyName=k;SharedAccessKey=c2VjcmV0;UseDevelopmentEmulator=true"
)
sender = client.get_topic_sender("scheduled-events")
message = ServiceBusMessage(b"{}", application_properties={"a": 1})
"""


def test_without_administration_the_sdk_loads_without_requests_and_still_builds_clients() -> None:
    seen = run(
        "from sebridge import servicebus\n"
        "servicebus.load_sdk(administration=False)\n"
        + SENDS
        + "lean = sorted(m for m in ('requests', 'urllib3', 'azure.servicebus.management')"
        " if m in sys.modules)\n"
        "import azure.servicebus\n"
        "assert not hasattr(azure.servicebus, 'management')\n"
        "from azure.servicebus.management import ServiceBusAdministrationClient\n"
        "assert azure.servicebus.management.ServiceBusAdministrationClient\n"
        "print(json.dumps({'lean': lean, 'admin': ServiceBusAdministrationClient.__name__,"
        " 'requests_later': 'requests' in sys.modules}))"
    )
    # Nothing of the administration package's own, nor the requests stack, until asked for;
    # asked for later, the whole package comes.
    assert seen == {
        "lean": [],
        "admin": "ServiceBusAdministrationClient",
        "requests_later": True,
    }


def test_by_default_the_sdk_loads_as_it_always_does() -> None:
    seen = run(
        "from sebridge import servicebus\n"
        "servicebus.load_sdk()\n"
        "print(json.dumps({'requests': 'requests' in sys.modules}))"
    )
    assert seen == {"requests": True}


def test_an_sdk_that_needs_more_of_a_skipped_package_is_imported_the_usual_way() -> None:
    """As if a later SDK imported a name of a package load_sdk skips: here azure.servicebus's
    own AMQP package, whose __init__ the SDK does need (``from ._pyamqp import ...``)."""
    seen = run(
        "from sebridge import servicebus\n"
        "servicebus._ADMINISTRATION += ('azure.servicebus._pyamqp',)\n"
        "servicebus.load_sdk(administration=False)\n"
        + SENDS
        + "print(json.dumps({'requests': 'requests' in sys.modules,"
        " 'amqp': hasattr(sys.modules['azure.servicebus._pyamqp'], '__file__')}))"
    )
    assert seen == {"requests": True, "amqp": True}
