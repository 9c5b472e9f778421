"""The shipped settings file for ``sebridge functions-host`` works with the fakes' demo world.

``emulators/local.settings.demo.json`` names the ports the README's commands use
(``servicebus-emulator`` on 5672, ``fakes --demo-world --port-base 17071``, the host's 7071).
Here each process binds port 0 and reports the port it got, and the file is used with only
those port numbers rewritten; then a Scheduled for web-1 goes through the real function_app.py
and reaches the Teams fake and the ARM fake.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from emulators.processes import ChildProcess
from emulators.servicebus.testing import running_emulator
from functions.shared.settings import load_settings
from sebridge import servicebus
from tests.fixtures import golden
from tests.support import docs
from tests.support.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "emulators" / "local.settings.demo.json"


def _printed_settings(fakes: ChildProcess) -> dict[str, str]:
    """The app settings ``sebridge fakes`` printed (one JSON object): the URLs of the ports it
    bound."""
    fakes.wait_for_line("}", timeout=30)  # printed once every fake is serving
    lines = [line.text for line in fakes.lines]
    printed: dict[str, str] = json.loads("\n".join(lines[: lines.index("}") + 1]))
    return printed


def _port(url: str) -> int:
    port = urlsplit(url).port
    assert port is not None, url
    return port


def test_the_shipped_file_is_a_complete_valid_configuration() -> None:
    values = json.loads(SHIPPED.read_text())["Values"]
    settings = load_settings(values)  # raises, naming each missing or invalid setting
    assert settings.teams_webhook_url.startswith("http://127.0.0.1:17071/")
    assert settings.arm_endpoint == "http://127.0.0.1:17072"
    assert values["IDENTITY_ENDPOINT"] == "http://127.0.0.1:17073/msi/token"
    assert "sb://127.0.0.1:5672;" in values["ServiceBusConnection"]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_functions_host_runs_the_app_against_the_demo_world_with_it(tmp_path: Path) -> None:
    # Every process binds port 0 and says which port it got; the file is rewritten to match.
    fakes = ChildProcess(
        "fakes",
        ["--demo-world", "--port-base", "0", "--identity-header", "local-demo-identity-header"],
    )
    with running_emulator() as bus, fakes:
        printed = _printed_settings(fakes)
        text = SHIPPED.read_text()
        for old, new in [
            ("127.0.0.1:5672", f"127.0.0.1:{bus.port}"),
            ("127.0.0.1:17071", f"127.0.0.1:{_port(printed['TEAMS_WEBHOOK_URL'])}"),
            ("127.0.0.1:17072", f"127.0.0.1:{_port(printed['ARM_ENDPOINT'])}"),
            ("127.0.0.1:17073", f"127.0.0.1:{_port(printed['IDENTITY_ENDPOINT'])}"),
            ("127.0.0.1:17074", f"127.0.0.1:{_port(printed['LB_POOL_STATE_URL'])}"),
        ]:
            assert old in text, old
            text = text.replace(old, new)
        settings_file = tmp_path / "local.settings.json"
        settings_file.write_text(text)
        host = ChildProcess(
            "functions-host", ["--settings", str(settings_file), "--port", "0"], cwd=REPO
        )
        with host:
            host.wait_for_line("listening on http://127.0.0.1:", timeout=60)
            client = servicebus.client(connection_string=bus.connection_string)
            with client, client.get_topic_sender("scheduled-events") as sender:
                sender.send_messages(servicebus.envelope_message(golden.build()["scheduled"]))

            def seen(marker: str) -> bool:
                return any(marker in line.text for line in fakes.lines)

            wait_until(
                lambda: seen("[teams]") and seen("web-1-nic/ipconfig1 left"),
                60,
                "a card and web-1's drain in the fakes' output:\n"
                + "\n".join(line.text for line in fakes.lines[-20:])
                + host.stderr_text()[-2000:],
            )


def test_the_readme_says_how_to_make_the_local_settings_file_it_refers_to() -> None:
    # local.settings.json is named in the README but not in a checkout (it may hold secrets):
    # every paragraph that names it says how to make it, and git keeps the made one out.
    readme = docs.all_docs()
    making = "cp emulators/local.settings.demo.json local.settings.json"
    paragraphs = [p for p in readme.split("\n\n") if "`local.settings.json`" in p]
    assert paragraphs
    for paragraph in paragraphs:
        assert making in paragraph or "--settings" in paragraph, paragraph[:200]
    ignored = (REPO / ".gitignore").read_text().splitlines()
    assert "local.settings.json" in ignored


def _readme_fakes_output() -> dict[str, str]:
    readme = docs.all_docs()
    section = readme.split("`sebridge fakes` prints the app settings", 1)[1]
    block = section.split("```json\n", 1)[1].split("```", 1)[0]
    shown: dict[str, str] = json.loads(block)
    return shown


@pytest.mark.timeout(60)
def test_the_readme_shows_what_sebridge_fakes_prints() -> None:
    shown = _readme_fakes_output()
    # The README's ports are --port-base 17071's; here the fakes take free ones.
    fakes = ChildProcess(
        "fakes", ["--demo-world", "--identity-header", "local-demo-identity-header"]
    )
    with fakes:
        fakes.wait_for_line("}", timeout=30)
        printed = json.loads("\n".join(line.text for line in fakes.lines))

    def without_ports(values: dict[str, str]) -> dict[str, str]:
        return {k: re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:PORT", v) for k, v in values.items()}

    assert list(printed) == list(shown)
    assert without_ports(printed) == without_ports(shown)
    # ... and they are the ports the shipped settings file names, for every setting both have.
    values = json.loads(SHIPPED.read_text())["Values"]
    assert {k: values[k] for k in shown if k in values} == {
        k: v for k, v in shown.items() if k in values
    }
    assert set(shown) - set(values) == {"EVENTGRID_STATE_URL"}  # agentless mode only
