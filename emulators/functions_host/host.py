"""`sebridge functions-host`: run function_app.py locally against the Service Bus emulator.

    sebridge functions-host [--app PATH_OR_MODULE] [--settings FILE] [--host H] [--port P]
                            [--allow-remote] [--functions NAME,...] [--log-format text|json]

``--host`` is held to loopback (127.0.0.1, ::1, localhost): the local host checks no function
keys, so binding another address would serve every HTTP trigger to the network. A non-loopback
address is refused (exit 2) unless ``--allow-remote`` says so explicitly.

Start-up, in the order the Functions host and Python worker use:
1. Locate the app (default ./function_app.py; a directory means its function_app.py; a dotted
   name is a module) and read local.settings.json (default: next to the app).
2. Put the settings into os.environ. As with Core Tools, a variable already set in the
   environment wins over local.settings.json (logged as "skipping"), so CI can override.
3. Import the app, index it with azure.functions' metadata, read host.json next to it, resolve
   `%Setting%` expressions and connections, check every function's signature. Any problem is
   reported for all functions at once and the host exits with code 2.
4. Bind the HTTP server (--port 0 picks a free port; default Host.LocalHttpPort from
   local.settings.json, else 7071) and print exactly one stdout line
   `listening on http://127.0.0.1:<port>`, even when the app has no HTTP triggers.
5. Start the Service Bus receivers. Logs go to stderr, one line per event.
SIGTERM/SIGINT: stop receiving, let invocations in flight finish (10 s grace, then their
receivers are closed so the broker releases the messages), exit 0.

The in-process API, `FunctionsHost`, does the same in threads for tests and the demo; there the
settings passed in win over os.environ (and are restored on stop), because one process may
run many hosts against many emulators.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import os
import socket
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from azure.functions.decorators.function_app import FunctionRegister

from emulators.functions_host import loader
from emulators.functions_host.bindings import (
    BindingError,
    EventGridTrigger,
    FunctionSpec,
    HttpTrigger,
    ServiceBusTrigger,
    discover,
    select,
)
from emulators.functions_host.dispatcher import Dispatcher, ServiceBusFunction
from emulators.functions_host.eventgrid import WEBHOOK_PATH, EventGridFunction, EventGridWebhook
from emulators.functions_host.hostconfig import (
    OVERRIDE_PREFIX,
    HostConfig,
    HostConfigError,
    parse_host_json,
    with_overrides,
)
from emulators.functions_host.http_server import HttpFunction, HttpHost, RouteError, compile_route
from emulators.functions_host.invoke import (
    THREADPOOL_SETTING,
    FunctionInvoker,
    FunctionLoadError,
    sync_slots,
    sync_thread_count,
)
from emulators.functions_host.logs import configure, event, host_logger
from emulators.functions_host.sbclient import ClientFactory, OutputSender, make_client
from emulators.functions_host.settings import (
    EnvironOverlay,
    LocalSettings,
    SettingsError,
    load_local_settings,
    merge_settings,
)
from sebridge.signals import StopSignals

DEFAULT_HTTP_PORT = 7071
SHUTDOWN_GRACE_S = 10.0


class HostStartError(Exception):
    """The host cannot start: bad app, settings, host.json or bindings. The message says why."""


def read_host_json(directory: Path, environ: Mapping[str, str] | None = None) -> HostConfig:
    """host.json next to the app, with the ``AzureFunctionsJobHost__...`` app settings in
    ``environ`` applied over it (hostconfig.with_overrides)."""
    path = directory / "host.json"
    try:
        document = json.loads(path.read_text(encoding="utf-8-sig")) if path.is_file() else {}
        return parse_host_json(with_overrides(document, environ or {}))
    except json.JSONDecodeError as exc:
        raise HostStartError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from exc
    except HostConfigError as exc:
        raise HostStartError(str(exc)) from exc


class FunctionsHost:
    """Index an app, serve its HTTP triggers and run its Service Bus triggers, in threads.

    `app` is a path or module name (imported after the settings are applied), an imported
    module, or a FunctionApp. `settings` win over os.environ while the host runs. `listener`
    (from :func:`http_server.listen`) serves HTTP on a socket bound beforehand, for settings
    that must name the host's own URL (the Approve links): bind port 0, read the port, start.
    """

    def __init__(
        self,
        app: str | Path | ModuleType | FunctionRegister,
        settings: Mapping[str, str] | None = None,
        *,
        host_config: HostConfig | None = None,
        functions: Sequence[str] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        app_directory: Path | None = None,
        client_factory: ClientFactory = make_client,
        logger: logging.Logger | None = None,
        settings_win: bool = True,
        shutdown_grace: float = SHUTDOWN_GRACE_S,
        listener: socket.socket | None = None,
    ) -> None:
        self._app = app
        self._settings = dict(settings or {})
        self._host_config = host_config
        self._functions = list(functions) if functions is not None else None
        self._bind = (host, port)
        self._listener = listener  # bound by the caller (http_server.listen): its port is known
        self._app_directory = app_directory
        self._factory = client_factory
        self.logger = logger or host_logger()
        self._settings_win = settings_win
        self._grace = shutdown_grace
        self._overlay = EnvironOverlay(os.environ)
        self._outputs: OutputSender | None = None
        self._dispatcher: Dispatcher | None = None
        self._http: HttpHost | None = None
        self._eventgrid: EventGridWebhook | None = None
        self.specs: list[FunctionSpec] = []
        self.config = HostConfig()

    # -- start-up ------------------------------------------------------------------------
    def start(self) -> FunctionsHost:
        try:
            self._start()
        except Exception:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        location = self._locate()
        merged = merge_settings(self._settings, os.environ, file_wins=self._settings_win)
        for name in merged.shadowed:
            event(
                self.logger,
                logging.WARNING,
                "setting_skipped",
                f"Skipping '{name}' from local settings as it's already defined in current "
                "environment variables",
                setting=name,
            )
        self._overlay.apply(merged.values, [n for n in self._settings if n not in merged.shadowed])
        app, directory = self._import(location)
        self.config = self._host_config or read_host_json(directory, os.environ)
        for name in sorted(os.environ):
            if self._host_config is None and name.lower().startswith(OVERRIDE_PREFIX.lower()):
                event(
                    self.logger,
                    logging.INFO,
                    "host_json_override",
                    "host.json value overridden by an app setting",
                    setting=name,
                )
        for option in self.config.ignored:
            event(
                self.logger,
                logging.WARNING,
                "option_ignored",
                "host.json option not honoured by the local host",
                option=option,
            )
        indexed = {f.metadata.name: f for f in self._index(app, directory)}
        wanted = self._functions if self._functions is not None else self.config.functions
        try:
            chosen = select([f.metadata for f in indexed.values()], wanted)
            self.specs = discover(chosen, dict(os.environ))
        except BindingError as exc:
            raise HostStartError(
                "the app cannot run locally:\n  " + "\n  ".join(exc.problems)
            ) from exc
        threads, warning = sync_thread_count(os.environ)
        if warning is not None:
            event(self.logger, logging.WARNING, "setting_invalid", warning)
        slots = sync_slots(threads)
        event(
            self.logger,
            logging.INFO,
            "worker_threads",
            f"sync functions run on {threads} worker thread(s) ({THREADPOOL_SETTING})",
            threads=threads,
        )
        sb_functions: list[ServiceBusFunction] = []
        http_functions: list[HttpFunction] = []
        eventgrid_functions: list[EventGridFunction] = []
        problems: list[str] = []
        for spec in self.specs:
            entry = indexed[spec.name]
            try:
                invoker = FunctionInvoker(spec, entry.user_function, entry.directory, slots)
                if isinstance(spec.trigger, ServiceBusTrigger):
                    sb_functions.append(ServiceBusFunction(spec, spec.trigger, invoker))
                elif isinstance(spec.trigger, EventGridTrigger):
                    eventgrid_functions.append(EventGridFunction(spec, spec.trigger, invoker))
                else:
                    assert isinstance(spec.trigger, HttpTrigger)
                    route = compile_route(self.config.route_prefix, spec.trigger.route)
                    http_functions.append(HttpFunction(spec, spec.trigger, invoker, route))
            except (FunctionLoadError, RouteError) as exc:
                problems.append(str(exc))
        if problems:
            raise HostStartError("the app cannot run locally:\n  " + "\n  ".join(problems))

        self._outputs = OutputSender(self._factory)
        status = {"functions": [s.name for s in self.specs]}
        self._eventgrid = EventGridWebhook(eventgrid_functions, self._outputs, self.logger)
        self._http = HttpHost(
            http_functions,
            self._outputs,
            self.logger,
            host=self._bind[0],
            port=self._bind[1],
            status=status,
            webhooks={WEBHOOK_PATH: self._eventgrid.handle},
            listener=self._listener,
        )
        self._listener = None  # the HTTP host closes it from now on
        self._log_functions()
        self._http.start()
        self._dispatcher = Dispatcher(
            sb_functions, self.config.service_bus, self._outputs, self.logger, self._factory
        )
        self._dispatcher.start()
        event(
            self.logger,
            logging.INFO,
            "host_started",
            "functions host started",
            url=self.url,
            functions=len(self.specs),
        )

    def _locate(self) -> loader.AppLocation | None:
        if isinstance(self._app, str | Path):
            try:
                return loader.locate(str(self._app), Path.cwd())
            except loader.AppLoadError as exc:
                raise HostStartError(str(exc)) from exc
        return None

    def _import(self, location: loader.AppLocation | None) -> tuple[FunctionRegister, Path]:
        try:
            if location is not None:
                module = loader.import_app(location)
                return loader.find_app(module), self._app_directory or location.directory
            if isinstance(self._app, FunctionRegister):
                return self._app, self._app_directory or Path.cwd()
            assert isinstance(self._app, ModuleType)
            directory = self._app_directory or Path(self._app.__file__ or ".").resolve().parent
            return loader.find_app(self._app), directory
        except loader.AppLoadError as exc:
            raise HostStartError(str(exc)) from exc

    def _index(self, app: FunctionRegister, directory: Path) -> list[loader.IndexedFunction]:
        try:
            return loader.index(app, directory)
        except loader.AppLoadError as exc:
            raise HostStartError(str(exc)) from exc

    def _log_functions(self) -> None:
        for spec in self.specs:
            trigger = spec.trigger
            fields: dict[str, Any] = {"function": spec.name, "trigger": trigger.kind}
            if isinstance(trigger, ServiceBusTrigger):
                fields |= {
                    "entity": trigger.entity,
                    "sessions": trigger.sessions,
                    "cardinality": trigger.cardinality,
                    "connection": trigger.connection.describe(),
                }
            elif isinstance(trigger, EventGridTrigger):
                fields |= {"entity": trigger.entity}
            else:
                prefix = f"/{self.config.route_prefix}" if self.config.route_prefix else ""
                fields |= {
                    "entity": f"{prefix}/{trigger.route}",
                    "methods": ",".join(trigger.methods),
                }
            outputs = [f"{o.param}:{getattr(o, 'entity', 'http')}" for o in spec.outputs]
            event(
                self.logger,
                logging.INFO,
                "function",
                f"function {spec.name}",
                outputs=",".join(outputs) or None,
                **fields,
            )

    # -- running -------------------------------------------------------------------------
    @property
    def port(self) -> int:
        if self._http is None:
            raise RuntimeError("the host is not started")
        return self._http.port

    @property
    def url(self) -> str:
        return f"http://{self._bind[0]}:{self.port}"

    def stop(self) -> None:
        if self._dispatcher is not None:
            self._dispatcher.stop(grace=self._grace)
            self._dispatcher = None
        if self._http is not None:
            self._http.stop()
            self._http = None
        if self._eventgrid is not None:
            self._eventgrid.close()
            self._eventgrid = None
        if self._listener is not None:  # never started
            self._listener.close()
            self._listener = None
        if self._outputs is not None:
            self._outputs.close()
            self._outputs = None
        self._overlay.restore()

    def __enter__(self) -> FunctionsHost:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# -- command line ----------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sebridge functions-host",
        description="Run function_app.py (Azure Functions Python v2) locally against the "
        "Service Bus emulator and serve its HTTP triggers on loopback.",
    )
    parser.add_argument(
        "--app",
        default=None,
        help="function_app.py path, a directory holding it, or a module name "
        "(default: ./function_app.py)",
    )
    parser.add_argument(
        "--settings",
        type=Path,
        default=None,
        help="local.settings.json ({'IsEncrypted': false, 'Values': {...}}); default: next to "
        "the app. Environment variables win over it, as with Core Tools.",
    )
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="HTTP bind address, loopback only unless --allow-remote (default 127.0.0.1)",
    )
    parser.add_argument(
        "--allow-remote",
        action="store_true",
        help="allow a non-loopback --host: the local host checks no function keys, so every "
        "HTTP trigger is then open to whoever reaches that address",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=None,
        help="HTTP port (0 = pick a free one; default Host.LocalHttpPort or 7071)",
    )
    parser.add_argument(
        "--functions", default=None, help="comma-separated function names to run (default: all)"
    )
    parser.add_argument("--log-format", choices=("text", "json"), default="text")
    return parser


# The settings file every local run can start from: it names the stand-ins' ports (README,
# Local stand-ins: the pieces by hand).
DEMO_SETTINGS = Path(__file__).resolve().parents[1] / "local.settings.demo.json"


def _load_settings_file(
    args: argparse.Namespace, location: loader.AppLocation, logger: logging.Logger
) -> LocalSettings:
    path = args.settings or location.directory / "local.settings.json"
    if args.settings is None and not path.is_file():
        # Core Tools runs without the file too (the environment may hold every setting), but a
        # newcomer who was told about local.settings.json needs to hear how to make one.
        event(
            logger,
            logging.WARNING,
            "settings_file_missing",
            f"no {path.name} next to the app: it gets the environment's settings only. To run "
            f"it against the local stand-ins: cp {DEMO_SETTINGS} {path} (or --settings "
            f"{DEMO_SETTINGS}), then add your own settings to it",
            path=str(path),
        )
        return LocalSettings(values={})
    return load_local_settings(path)


def is_loopback(host: str) -> bool:
    """Whether ``host`` names only this machine (an IP literal, or ``localhost``)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    configure(args.log_format)
    if not args.allow_remote and not is_loopback(args.host):
        event(
            host_logger(),
            logging.ERROR,
            "start_failed",
            f"--host {args.host!r} is not a loopback address: the local host checks no "
            "function keys. Pass --allow-remote to serve it there anyway.",
        )
        return 2
    # stdout carries exactly the listening line; anything the app prints goes to the log
    # stream instead, as the worker sends function output to the host log.
    announce = sys.stdout
    sys.stdout = sys.stderr
    logger = host_logger()
    try:
        location = loader.locate(args.app, Path.cwd())
        local = _load_settings_file(args, location, logger)
    except (loader.AppLoadError, SettingsError) as exc:
        event(logger, logging.ERROR, "start_failed", str(exc))
        return 2
    for section in local.ignored_sections:
        event(
            logger,
            logging.WARNING,
            "option_ignored",
            "local.settings.json section ignored",
            option=section,
        )
    port = args.port if args.port is not None else (local.local_http_port or DEFAULT_HTTP_PORT)
    functions = (
        [n.strip() for n in args.functions.split(",") if n.strip()] if args.functions else None
    )
    host = FunctionsHost(
        str(location.path) if location.path else location.target,
        local.values,
        functions=functions,
        host=args.host,
        port=port,
        logger=logger,
        settings_win=False,
    )
    stop = threading.Event()

    StopSignals(stop).install()  # for the process's life: no lock taken in a signal handler
    try:
        host.start()
    except (HostStartError, OSError) as exc:
        event(logger, logging.ERROR, "start_failed", str(exc))
        return 2
    print(f"listening on http://{args.host}:{host.port}", file=announce, flush=True)
    while not stop.wait(0.5):
        pass
    event(logger, logging.INFO, "host_stopping", "stopping: finishing invocations in flight")
    host.stop()
    event(logger, logging.INFO, "host_stopped", "functions host stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
