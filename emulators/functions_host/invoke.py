"""Calling a user function the way the Python worker does.

At load the worker checks that the function's parameters match its bindings (each binding
but `$return` is a parameter; `context` is the only extra name allowed; an output parameter,
if annotated, is `func.Out[...]`; an annotated trigger parameter has a type the binding's
converter accepts) and refuses the function otherwise. At invocation it passes the trigger
value, a fresh `Out` per output parameter and a Context; sync functions run in the
worker's thread pool, coroutines on one shared event loop (the worker's own loop model).

The thread pool: the worker runs sync functions on a ThreadPoolExecutor of
``PYTHON_THREADPOOL_THREAD_COUNT`` threads (the app setting; unset, Python's default
``min(32, cpu_count + 4)``), shared by every function of the app. An invocation beyond that
waits for a thread, however many sessions or calls the Service Bus extension has open; the
host models this with one semaphore per host (:func:`sync_slots`), held while a sync
function runs on its receiver's thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import os
import threading
import typing
import uuid
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import azure.functions as func
from azure.functions import _abc as azf_abc
from azure.functions import meta

from emulators.functions_host.bindings import RETURN, FunctionSpec, HttpOutput, ServiceBusOutput


class FunctionLoadError(ValueError):
    """The function's signature does not match its bindings."""


class Out(func.Out[Any]):
    def __init__(self) -> None:
        self._value: Any = None

    def set(self, val: Any) -> None:
        self._value = val

    def get(self) -> Any:
        return self._value


class _TraceContext(azf_abc.TraceContext):
    def __init__(self) -> None:
        self._parent = f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01"

    @property
    def trace_state(self) -> str:
        return ""

    @property
    def trace_parent(self) -> str:
        return self._parent

    @property
    def attributes(self) -> dict[str, str]:
        return {}


class _RetryContext(azf_abc.RetryContext):
    def __init__(self, retry_count: int) -> None:
        self._retry_count = retry_count

    @property
    def retry_count(self) -> int:
        return self._retry_count

    @property
    def max_retry_count(self) -> int:
        return 0

    @property
    def exception(self) -> azf_abc.RpcException:
        raise NotImplementedError("no retry policy runs locally")


class Context(func.Context):
    _local = threading.local()

    def __init__(self, function_name: str, directory: Path, retry_count: int = 0) -> None:
        self._invocation_id = str(uuid.uuid4())
        self._function_name = function_name
        self._directory = str(directory)
        self._trace = _TraceContext()
        self._retry = _RetryContext(retry_count)

    @property
    def invocation_id(self) -> str:
        return self._invocation_id

    @property
    def thread_local_storage(self) -> Any:
        return self._local

    @property
    def function_name(self) -> str:
        return self._function_name

    @property
    def function_directory(self) -> str:
        return self._directory

    @property
    def trace_context(self) -> azf_abc.TraceContext:
        return self._trace

    @property
    def retry_context(self) -> azf_abc.RetryContext:
        return self._retry


class AsyncRunner:
    """One event loop on its own thread for every coroutine function of the host."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        loop = self._ensure_loop()
        future: concurrent.futures.Future[Any] = asyncio.run_coroutine_threadsafe(coro, loop)
        return future.result()

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name="functions-host-asyncio", daemon=True
                )
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    def close(self) -> None:
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=5)
            if not thread.is_alive():
                loop.close()


@dataclass
class Result:
    """What an invocation produced: the return value and each output parameter's value."""

    return_value: Any
    outputs: dict[str, Any]


def _is_out_annotation(annotation: Any) -> bool:
    origin = typing.get_origin(annotation) or annotation
    return isinstance(origin, type) and issubclass(origin, func.Out)


THREADPOOL_SETTING = "PYTHON_THREADPOOL_THREAD_COUNT"


def default_thread_count() -> int:
    """ThreadPoolExecutor's default, which the worker uses when the setting is not set."""
    return min(32, (os.cpu_count() or 1) + 4)


def sync_thread_count(environ: Mapping[str, str]) -> tuple[int, str | None]:
    """(the worker's sync thread count for these app settings, a warning or None)."""
    raw = environ.get(THREADPOOL_SETTING)
    if raw is None or not raw.strip():
        return default_thread_count(), None
    try:
        count = int(raw.strip())
    except ValueError:
        count = 0
    if count < 1:
        return default_thread_count(), (
            f"{THREADPOOL_SETTING}={raw!r} is not a positive integer; the worker uses its "
            f"default ({default_thread_count()})"
        )
    return count, None


def sync_slots(count: int) -> threading.BoundedSemaphore:
    return threading.BoundedSemaphore(count)


class FunctionInvoker:
    def __init__(
        self,
        spec: FunctionSpec,
        user_function: Callable[..., Any],
        directory: Path,
        slots: threading.BoundedSemaphore | None = None,
    ) -> None:
        self.spec = spec
        self.directory = directory
        self._slots = slots  # the worker's sync thread pool (None: unbounded, for unit tests)
        self._function = user_function
        self._is_async = inspect.iscoroutinefunction(user_function)
        self._out_params = self._validate()
        self._wants_context = "context" in inspect.signature(user_function).parameters

    def _validate(self) -> tuple[str, ...]:
        name = self.spec.name
        try:
            signature = inspect.signature(self._function)
        except (TypeError, ValueError) as exc:
            raise FunctionLoadError(f"function {name!r}: cannot read its signature") from exc
        params = signature.parameters
        try:
            # Resolve string annotations (from __future__ import annotations) like the worker.
            hints = typing.get_type_hints(self._function)
        except Exception:  # noqa: BLE001 - an unresolvable hint only skips the type check
            hints = {}
        bound = [n for n in self.spec.binding_names if n != RETURN]
        missing = [n for n in bound if n not in params]
        if missing:
            raise FunctionLoadError(
                f"function {name!r}: bindings {missing} have no matching Python parameter"
            )
        extra = [n for n in params if n not in bound and n != "context"]
        if extra:
            raise FunctionLoadError(
                f"function {name!r}: parameters {extra} match no binding (only 'context' may)"
            )
        trigger = self.spec.trigger
        annotation = hints.get(trigger.param, inspect.Parameter.empty)
        if annotation is not inspect.Parameter.empty:
            converter = meta.get_binding_registry().get(trigger.kind)  # type: ignore[no-untyped-call]
            if converter is not None and not converter.check_input_type_annotation(annotation):
                hint = (
                    " (for a batch write typing.List[...]: the converter does not recognise "
                    "list[...])"
                    if typing.get_origin(annotation) is list
                    else ""
                )
                raise FunctionLoadError(
                    f"function {name!r}: the {trigger.kind} parameter {trigger.param!r} is "
                    f"annotated {annotation!r}, which its converter does not accept{hint}"
                )
        outs: list[str] = []
        for output in self.spec.outputs:
            if output.param == RETURN:
                continue
            annotation = hints.get(output.param, inspect.Parameter.empty)
            if annotation is not inspect.Parameter.empty and not _is_out_annotation(annotation):
                raise FunctionLoadError(
                    f"function {name!r}: output parameter {output.param!r} must be annotated "
                    f"func.Out[...], not {annotation!r}"
                )
            outs.append(output.param)
        return tuple(outs)

    def invoke(
        self, trigger_value: Any, *, context: Context | None = None, retry_count: int = 0
    ) -> Result:
        """Run the function once; exceptions propagate (the caller decides what failure means)."""
        kwargs: dict[str, Any] = {self.spec.trigger.param: trigger_value}
        outs = {param: Out() for param in self._out_params}
        kwargs.update(outs)
        if self._wants_context:
            kwargs["context"] = context or Context(self.spec.name, self.directory, retry_count)
        if self._is_async:
            value = _RUNNER.run(self._function(**kwargs))
        elif self._slots is None:
            value = self._function(**kwargs)
        else:
            with self._slots:  # waits for one of the worker's threads
                value = self._function(**kwargs)
        return Result(return_value=value, outputs={p: o.get() for p, o in outs.items()})

    @property
    def service_bus_outputs(self) -> tuple[ServiceBusOutput, ...]:
        return tuple(o for o in self.spec.outputs if isinstance(o, ServiceBusOutput))

    @property
    def http_output(self) -> HttpOutput | None:
        return next((o for o in self.spec.outputs if isinstance(o, HttpOutput)), None)

    def output_value(self, result: Result, param: str) -> Any:
        return result.return_value if param == RETURN else result.outputs.get(param)


_RUNNER = AsyncRunner()


def shutdown_async_runner() -> None:
    _RUNNER.close()
