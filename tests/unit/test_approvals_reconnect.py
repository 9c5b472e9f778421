"""The approvals receiver's reconnect backoff starts afresh once a receive has worked.

Hostile review (stop 33): the backoff was reset only by a settled command, so after a few broker
drops with no command between them, every later reconnect waited up to 30 s, however long the
link had worked meanwhile, and the next command waited with it (3.2 s after six emulator
restarts 12 s apart). Here the Service Bus client is a scripted stand-in: what is under test is
the receiver loop's own waiting, read from the stop event it waits on."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from sebridge import servicebus
from sebridge.forwarder.approvals.receiver import approvals_worker
from sebridge.forwarder.config import parse_config
from tests.support.forwarder_fakes import World


class RecordingStop(threading.Event):
    """The forwarder's stop event; each timed wait is recorded and returns at once."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        if timeout is not None:
            self.waits.append(timeout)
        return self.is_set()


class ScriptedReceiver:
    def __init__(self, script: list[str], stop: threading.Event) -> None:
        self.script = script
        self.stop = stop

    def __enter__(self) -> ScriptedReceiver:
        if self.script.pop(0) == "refuse":
            raise ConnectionError("connection refused")
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def receive_messages(self, **_: Any) -> list[Any]:
        step = self.script.pop(0)
        if step == "drop":
            raise ConnectionError("the broker dropped the link")
        if step == "stop":
            self.stop.set()
        return []


class ScriptedClient:
    def __init__(self, script: list[str], stop: threading.Event) -> None:
        self.script = script
        self.stop = stop

    def get_queue_receiver(self, *_: Any, **__: Any) -> ScriptedReceiver:
        return ScriptedReceiver(self.script, self.stop)

    def close(self) -> None:
        return None


def test_a_receive_that_worked_resets_the_reconnect_backoff(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = World()
    stop = RecordingStop()
    world.forwarder.stop_event = stop
    # Five refused connections (the backoff grows to its cap), then three times: a link that
    # works for one receive, then drops.
    script = ["refuse"] * 5 + ["open", "empty", "drop"] * 3 + ["open", "stop"]
    monkeypatch.setattr(servicebus, "client", lambda **_: ScriptedClient(script, stop))
    config = parse_config(
        [
            "--imds-endpoint",
            "http://127.0.0.1:9",
            "--connection-string",
            "Endpoint=sb://127.0.0.1/;SharedAccessKeyName=k;SharedAccessKey=a2V5",
        ]
    )
    worker = approvals_worker(world.forwarder, config)
    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    thread.join(30)
    assert not thread.is_alive() and script == []
    refused, after_drops = stop.waits[:5], stop.waits[5:]
    assert max(refused) > 2.0 or sum(refused) > 8.0  # it did back off while refused
    assert len(after_drops) == 3
    # Each drop follows a receive that worked: the first delay again, within [1, 2] s.
    assert all(delay <= 2.0 for delay in after_drops), after_drops
