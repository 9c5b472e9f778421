"""The `sebridge` console script: one subcommand per program the project ships.

Each subcommand lives in its own module and exposes ``main(argv: list[str] | None) -> int``.
Modules are imported only when their subcommand runs, so the forwarder on a VM never loads
the emulators (or Qpid Proton) and a missing optional extra fails with a clear message.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence
from typing import NamedTuple


class Subcommand(NamedTuple):
    module: str
    summary: str
    extra: str | None = None  # pip extra that provides its dependencies


SUBCOMMANDS: dict[str, Subcommand] = {
    "forwarder": Subcommand(
        "forwarder.main", "poll IMDS, publish lifecycle transitions, apply approvals"
    ),
    "approve": Subcommand("forwarder.approve_cli", "send an approval command to a VM's forwarder"),
    "imds-sim": Subcommand(
        "emulators.imds.server", "loopback IMDS simulator that replays scenarios"
    ),
    "servicebus-emulator": Subcommand(
        "emulators.servicebus.server", "loopback Service Bus emulator (AMQP 1.0)", "local"
    ),
    "functions-host": Subcommand(
        "emulators.functions_host.host", "run function_app.py locally against the emulator", "local"
    ),
    "demo": Subcommand("emulators.demo", "the whole loop on 127.0.0.1, end to end", "local"),
}


def _usage() -> str:
    width = max(len(name) for name in SUBCOMMANDS)
    lines = ["usage: sebridge <command> [options]", "", "commands:"]
    lines += [f"  {name:<{width}}  {sub.summary}" for name, sub in SUBCOMMANDS.items()]
    lines += ["", "Run `sebridge <command> --help` for the options of one command."]
    return "\n".join(lines)


def _load(name: str) -> Callable[[list[str] | None], int]:
    sub = SUBCOMMANDS[name]
    try:
        module = importlib.import_module(sub.module)
    except ModuleNotFoundError as exc:
        hint = (
            f" (install the '{sub.extra}' extra: pip install '.[{sub.extra}]')" if sub.extra else ""
        )
        raise SystemExit(f"sebridge {name}: cannot load {sub.module}: {exc}{hint}") from exc
    entry: Callable[[list[str] | None], int] = module.main
    return entry


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in {"-h", "--help", "help"}:
        print(_usage())
        return 0
    if args[0] == "--version":
        from sebridge import __version__

        print(__version__)
        return 0
    if args[0] not in SUBCOMMANDS:
        print(f"sebridge: unknown command {args[0]!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    return _load(args[0])(args[1:])


if __name__ == "__main__":
    sys.exit(main())
