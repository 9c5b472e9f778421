"""``sebridge demo``: the command line (``--list``, ``--scenario``, ``--source``, ...)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys

from emulators.demo import scenario, vm_side
from emulators.demo.world import DEFAULT_SCENARIO, load_packaged, scenario_names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="sebridge demo",
        description="Run one maintenance event through the whole bridge on 127.0.0.1.",
    )
    parser.add_argument(
        "--scenario",
        default=DEFAULT_SCENARIO,
        help="a packaged scenario (see --list; default %(default)s)",
    )
    parser.add_argument(
        "--speed", type=float, default=2.0, help="scenario time scale (default %(default)s)"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="give up after this many seconds (default %(default)s)",
    )
    parser.add_argument(
        "--source",
        choices=("forwarder", "eventgrid", "both"),
        default="forwarder",
        help="where events come from: the forwarder polling IMDS, Event Grid with no forwarder "
        "at all (agentless), or both at once (default %(default)s)",
    )
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    parser.add_argument("--verbose", action="store_true", help="show the functions host's log")
    args = parser.parse_args(argv)
    if args.list:
        for name in scenario_names():
            print(f"{name:<24} {load_packaged(name)['description']}")
        print(f"{vm_side.NAME:<24} {vm_side.DESCRIPTION}")
        return 0
    if args.scenario not in [*scenario_names(), vm_side.NAME]:
        print(f"sebridge demo: unknown scenario {args.scenario!r} (see --list)", file=sys.stderr)
        return 2
    if not 0.1 <= args.speed <= 20 or args.timeout <= 0:
        print("sebridge demo: --speed must be 0.1..20 and --timeout positive", file=sys.stderr)
        return 2
    # SIGTERM (`timeout`, a CI job cancelled, systemd) ends the demo as Ctrl-C does: as a
    # KeyboardInterrupt in the main thread, so that every stand-in it started is stopped on the
    # way out. By default SIGTERM ended this process alone and left the emulator, the
    # simulator and the forwarder running for ever.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    logging.basicConfig(
        level=logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.scenario == vm_side.NAME:
        if args.source != "forwarder":
            print("sebridge demo: the vm-side scenario is the forwarder's", file=sys.stderr)
            return 2
        return vm_side.run(args.speed, args.timeout, args.verbose)
    return scenario.run(args.scenario, args.speed, args.timeout, args.verbose, args.source)


if __name__ == "__main__":
    sys.exit(main())
