"""HTTP triggers served on 127.0.0.1, in process and through the `sebridge functions-host` CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from apps import http_app
from conftest import APPS

from emulators.functions_host.host import FunctionsHost, HostStartError
from emulators.functions_host.hostconfig import HostConfig
from emulators.functions_host.http_server import listen

REPO = Path(__file__).resolve().parents[2]


def _lower(items: object) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in items}  # type: ignore[attr-defined]


def _request(
    url: str,
    *,
    method: str = "GET",
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, _lower(response.headers.items()), response.read()
    except urllib.error.HTTPError as error:
        return error.code, _lower(error.headers.items()), error.read()


@pytest.fixture
def http_host() -> Iterator[FunctionsHost]:
    host = FunctionsHost(http_app, {}, host_config=HostConfig(route_prefix="api"), port=0)
    host.start()
    try:
        yield host
    finally:
        host.stop()


@pytest.mark.timeout(30)
def test_http_trigger_answers_with_the_function_response(http_host: FunctionsHost) -> None:
    status, headers, body = _request(
        f"{http_host.url}/api/echo/alice/7?q=1",
        method="POST",
        body=b"payload",
        headers={"X-Test-Header": "hello", "Content-Type": "text/plain"},
    )
    assert status == 201
    assert headers["x-echo"] == "yes"
    assert headers["content-type"] == "application/json"
    document = json.loads(body)
    assert document["method"] == "POST"
    assert document["route_params"] == {"name": "alice", "id": "7"}
    assert document["params"] == {"q": "1"}
    assert document["header"] == "hello"
    assert document["body"] == "payload"
    assert document["url"] == f"{http_host.url}/api/echo/alice/7?q=1"


@pytest.mark.timeout(30)
def test_http_errors_and_plain_results(http_host: FunctionsHost) -> None:
    assert _request(f"{http_host.url}/api/boom")[0] == 500
    assert _request(f"{http_host.url}/api/nowhere")[0] == 404
    assert _request(f"{http_host.url}/api/plain", method="POST", body=b"")[0] == 404
    status, headers, body = _request(f"{http_host.url}/api/plain")
    assert (status, body) == (200, b"just text")
    assert headers["content-type"].startswith("text/plain")
    assert _request(f"{http_host.url}/api/files/a/b.txt")[2] == b"a/b.txt"
    # The server keeps answering after a failing function.
    assert _request(f"{http_host.url}/api/echo/bob")[0] == 201
    status, _, body = _request(f"{http_host.url}/admin/host/status")
    assert status == 200 and json.loads(body)["state"] == "Running"


@pytest.mark.timeout(30)
def test_route_prefix_from_host_config() -> None:
    with FunctionsHost(http_app, {}, host_config=HostConfig(route_prefix=""), port=0) as host:
        assert _request(f"{host.url}/plain")[0] == 200
        assert _request(f"{host.url}/api/plain")[0] == 404


@pytest.mark.timeout(30)
def test_a_host_serves_on_the_socket_bound_before_its_settings_were_made() -> None:
    """The demo's pattern: bind port 0, put the port into a setting, start the host on that
    socket (no port picked, released and bound again later)."""
    listener = listen()
    port = listener.getsockname()[1]
    settings = {"APPROVAL_BASE_URL": f"http://127.0.0.1:{port}"}
    with FunctionsHost(
        http_app, settings, host_config=HostConfig(route_prefix=""), listener=listener
    ) as host:
        assert host.port == port and host.url == settings["APPROVAL_BASE_URL"]
        assert _request(f"{host.url}/plain")[0] == 200
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/plain", timeout=5)  # closed on stop


def test_a_listener_of_a_host_that_never_started_is_closed() -> None:
    listener = listen()
    FunctionsHost(http_app, {}, listener=listener).stop()
    assert listener.fileno() == -1


def test_unsupported_app_fails_to_start_with_every_reason() -> None:
    from apps import bad_app

    host = FunctionsHost(
        bad_app,
        {"FhServiceBus": "Endpoint=sb://127.0.0.1:1;SharedAccessKeyName=a;SharedAccessKey=b"},
    )
    with pytest.raises(HostStartError) as info:
        host.start()
    text = str(info.value)
    assert "timerTrigger" in text and "'blob'" in text and "%NoSuch%" in text


def _start_cli(*args: str, cwd: Path = REPO) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("Fh")}
    env["PYTHONUNBUFFERED"] = "1"
    return subprocess.Popen(
        [sys.executable, "-m", "sebridge.cli", "functions-host", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.timeout(60)
def test_cli_prints_the_listening_line_serves_and_stops_on_sigterm(tmp_path: Path) -> None:
    (tmp_path / "host.json").write_text(
        json.dumps(
            {
                "version": "2.0",
                "extensions": {"http": {"routePrefix": "x"}, "serviceBus": {"bogusOption": 1}},
            }
        )
    )
    app = tmp_path / "function_app.py"
    app.write_text((APPS / "http_app.py").read_text())
    (tmp_path / "local.settings.json").write_text(
        json.dumps({"IsEncrypted": False, "Values": {"FUNCTIONS_WORKER_RUNTIME": "python"}})
    )
    process = _start_cli("--port", "0", "--log-format", "json", cwd=tmp_path)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("listening on http://127.0.0.1:"), line
        url = line.strip().removeprefix("listening on ")
        assert _request(f"{url}/x/plain")[2] == b"just text"
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=5)
    assert process.returncode == 0, err
    assert out == ""  # nothing but the listening line on stdout
    events = [json.loads(raw) for raw in err.splitlines() if raw.startswith("{")]
    names = {(e.get("event"), e.get("function")) for e in events}
    assert ("function", "echo") in names and ("invocation", "plain") in names
    ignored = [e["option"] for e in events if e.get("event") == "option_ignored"]
    assert ignored == ["extensions.serviceBus.bogusoption"]
    invocation = next(e for e in events if e.get("event") == "invocation")
    assert invocation["outcome"] == "succeeded" and invocation["status"] == 200
    assert "duration_ms" in invocation


@pytest.mark.timeout(60)
def test_cli_without_a_settings_file_says_how_to_make_one(tmp_path: Path) -> None:
    # The README sends people to local.settings.json, which a checkout does not hold.
    app = tmp_path / "function_app.py"
    app.write_text((APPS / "http_app.py").read_text())
    process = _start_cli("--port", "0", "--log-format", "json", cwd=tmp_path)
    try:
        assert process.stdout is not None
        assert process.stdout.readline().startswith("listening on http://127.0.0.1:")
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=5)
    (missing,) = [
        e
        for e in (json.loads(raw) for raw in err.splitlines() if raw.startswith("{"))
        if e.get("event") == "settings_file_missing"
    ]
    demo = REPO / "emulators" / "local.settings.demo.json"
    assert missing["path"] == str(tmp_path / "local.settings.json")
    assert f"cp {demo} {tmp_path / 'local.settings.json'}" in missing["message"]
    assert demo.is_file()


@pytest.mark.timeout(60)
def test_cli_refuses_an_app_it_cannot_run(tmp_path: Path) -> None:
    process = _start_cli("--app", str(APPS / "bad_app.py"), "--port", "0")
    out, err = process.communicate(timeout=30)
    assert process.returncode == 2
    assert out == ""
    assert "timerTrigger" in err and "connection 'FhServiceBus' is not configured" in err


@pytest.mark.timeout(60)
@pytest.mark.parametrize("address", ["0.0.0.0", "::", "192.0.2.10", "example.invalid"])
def test_cli_refuses_a_non_loopback_host(address: str) -> None:
    """The local host checks no function keys: `--host 0.0.0.0` used to serve every HTTP
    trigger to the network (attack 26a, noted). Refused before anything binds."""
    process = _start_cli("--host", address, "--port", "0")
    out, err = process.communicate(timeout=50)
    assert process.returncode == 2
    assert "listening on" not in out
    assert "not a loopback address" in err and "--allow-remote" in err


def test_loopback_names_are_loopback() -> None:
    from emulators.functions_host.host import is_loopback

    assert all(is_loopback(h) for h in ("127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "10.0.0.1", "local.host", ""))
