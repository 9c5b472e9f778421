"""The `sebridge` console script: one subcommand per program, found through entry points.

Each installed distribution registers its own subcommands in the entry-point group
``sebridge.commands``: the VM package (this one) the forwarder's (``forwarder``, ``approve``,
``status``), the local tools (``emulators/``) theirs (``demo``, ``imds-sim``, ...). So this
module knows none of them, and a VM, where only the VM package is installed, lists only what
runs there. An entry point names a :class:`Subcommand`: a module path and a summary, cheap to
load; the module itself is imported only when its subcommand runs, so ``sebridge --help``
never loads the Azure SDK or Qpid Proton.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points
from typing import NamedTuple

ENTRY_POINT_GROUP = "sebridge.commands"


class Subcommand(NamedTuple):
    """What an entry point of ``sebridge.commands`` points at."""

    module: str  # exposes main(argv: list[str] | None) -> int
    summary: str

    def load(self) -> Callable[[list[str] | None], int]:
        entry: Callable[[list[str] | None], int] = importlib.import_module(self.module).main
        return entry


def installed_subcommands() -> dict[str, Subcommand]:
    """Every subcommand the installed distributions register, by name."""
    found: dict[str, Subcommand] = {}
    for point in entry_points(group=ENTRY_POINT_GROUP):
        try:
            value = point.load()
        except ImportError as exc:  # a half-installed distribution must not break the others
            print(f"sebridge: ignoring subcommand {point.name!r}: {exc}", file=sys.stderr)
            continue
        if isinstance(value, Subcommand):
            found.setdefault(point.name, value)
    return dict(sorted(found.items()))


def _usage(commands: dict[str, Subcommand]) -> str:
    lines = ["usage: sebridge <command> [options]", "", "commands:"]
    width = max((len(name) for name in commands), default=0)
    lines += [f"  {name:<{width}}  {sub.summary}" for name, sub in commands.items()]
    lines += ["", "Run `sebridge <command> --help` for the options of one command."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    commands = installed_subcommands()
    if not args or args[0] in {"-h", "--help", "help"}:
        print(_usage(commands))
        return 0
    if args[0] == "--version":
        from sebridge import __version__

        print(__version__)
        return 0
    if args[0] not in commands:
        print(f"sebridge: unknown command {args[0]!r}\n\n{_usage(commands)}", file=sys.stderr)
        return 2
    return commands[args[0]].load()(args[1:])


if __name__ == "__main__":
    # `python -m sebridge.cli`: run the imported module's main, so that entry points (which
    # import sebridge.cli) and this script agree on what a Subcommand is.
    from sebridge.cli import main as installed_main

    sys.exit(installed_main())
