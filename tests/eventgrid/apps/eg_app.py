"""An Event Grid triggered test function that records what it was handed (for the host tests)."""

from __future__ import annotations

import threading
from typing import Any

import azure.functions as func

app = func.FunctionApp()
received: list[Any] = []
lock = threading.Lock()


@app.function_name("record")
@app.event_grid_trigger(arg_name="event")
def record(event: func.EventGridEvent) -> None:
    data = event.get_json()
    if isinstance(data, dict) and data.get("fail"):
        raise RuntimeError("failing on purpose")
    with lock:
        received.append(event)
