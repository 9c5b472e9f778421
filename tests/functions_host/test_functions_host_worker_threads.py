"""The Python worker's thread pool for sync functions (PYTHON_THREADPOOL_THREAD_COUNT).

The worker runs sync functions on a ThreadPoolExecutor shared by every function of the app, so an
instance runs at most that many at once, however many sessions the extension holds. The local
host models it with one semaphore per host; without it, a benchmark of one host ran as many
invocations at once as it had receivers, which no instance in Azure does.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

import azure.functions as func
import pytest

from emulators.functions_host.host import FunctionsHost
from emulators.functions_host.invoke import (
    FunctionInvoker,
    default_thread_count,
    sync_slots,
    sync_thread_count,
)

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    ("value", "count", "warns"),
    [
        (None, default_thread_count(), False),
        ("", default_thread_count(), False),
        ("32", 32, False),
        (" 3 ", 3, False),
        ("0", default_thread_count(), True),
        ("-4", default_thread_count(), True),
        ("many", default_thread_count(), True),
    ],
)
def test_the_setting_is_read_like_the_worker(value: str | None, count: int, warns: bool) -> None:
    environ = {} if value is None else {"PYTHON_THREADPOOL_THREAD_COUNT": value}
    got, warning = sync_thread_count(environ)
    assert got == count and (warning is not None) == warns


def test_the_default_is_pythons_thread_pool_default() -> None:
    assert default_thread_count() == min(32, (os.cpu_count() or 1) + 4)


def _invokers(slots: threading.BoundedSemaphore) -> tuple[list[FunctionInvoker], dict[str, int]]:
    """Two sync functions of one app sharing the pool; they record the most running at once."""
    app = func.FunctionApp()
    seen = {"running": 0, "most": 0}
    lock = threading.Lock()

    def work() -> None:
        with lock:
            seen["running"] += 1
            seen["most"] = max(seen["most"], seen["running"])
        time.sleep(0.05)
        with lock:
            seen["running"] -= 1

    @app.function_name("one")
    @app.queue_trigger(arg_name="msg", queue_name="q1", connection="C")
    def one(msg: func.QueueMessage) -> None:
        work()

    @app.function_name("two")
    @app.queue_trigger(arg_name="msg", queue_name="q2", connection="C")
    def two(msg: func.QueueMessage) -> None:
        work()

    functions = {f.get_function_name(): f for f in app.get_functions()}
    invokers = [
        FunctionInvoker(_Spec(name), functions[name].get_user_function(), Path("."), slots)  # type: ignore[arg-type]
        for name in ("one", "two")
    ]
    return invokers, seen


class _Trigger:
    param = "msg"
    kind = "queueTrigger"


class _Spec:
    def __init__(self, name: str) -> None:
        self.name = name
        self.trigger = _Trigger()
        self.binding_names = ("msg",)
        self.outputs = ()


def test_at_most_the_pool_runs_at_once_across_functions() -> None:
    invokers, seen = _invokers(sync_slots(2))
    threads = [threading.Thread(target=invokers[n % 2].invoke, args=(object(),)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert seen["most"] == 2  # eight at once, two functions, one pool of two


def test_the_host_sizes_the_pool_from_the_app_settings() -> None:
    from apps import http_app

    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger("test.worker-threads")
    logger.addHandler(Keep())
    logger.setLevel(logging.INFO)
    host = FunctionsHost(http_app, {"PYTHON_THREADPOOL_THREAD_COUNT": "3"}, logger=logger)
    host.start()
    host.stop()
    threads = [r for r in records if "worker thread(s)" in r.getMessage()]
    assert [r.getMessage() for r in threads] == [
        "sync functions run on 3 worker thread(s) (PYTHON_THREADPOOL_THREAD_COUNT)"
    ]
