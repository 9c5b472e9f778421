"""The drain probe's latency under a connect-and-reset flood (a benchmark; hostile review 22,
item 4), or a flood of idle connections (review 22d, item 1).

    python benchmarks/probe_reset_flood.py [--seconds 20] [--floods 2] [--ask-every 0.2]
    python benchmarks/probe_reset_flood.py --mode idle [--hold 1000] [--rate 1500]

One real `sebridge forwarder --dry-run` serves its drain probe on 127.0.0.1 (IMDS: the loopback
stub of tests/support/imds_stub.py, no events). ``--floods`` child processes each open
non-blocking connections to the probe and close them at once with SO_LINGER 0 (a reset), as
fast as they can, for ``--seconds``: the reviewer's churn flood. Meanwhile a well-formed client
asks the probe every ``--ask-every`` s on a new connection; each latency counts from before
``connect`` (the review's delay was at connect: SYNs retransmitted while the accept queue was
full) to the answer's last byte. Printed as JSON: how many asked, answered 200, failed, and the
latency p50/p99/max.

``--mode idle``: each child instead keeps up to ``--hold`` connections that send nothing, opens
up to ``--rate`` new ones a second and replaces any the server drops (the reviewer's
holder.py), all from 127.0.0.1; the well-formed client asks from 127.0.0.2, as the load
balancer asks from an address of its own (168.63.129.16).

Target: every probe answered within the server's request deadline (2 s), p99 well under it.
Bounded: ``--seconds`` of flood (at most 120), the children are killed at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import platform
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from emulators.ports import reserve_port  # noqa: E402
from emulators.processes import forwarder  # noqa: E402
from tests.support.attackers import hold_idle  # noqa: E402
from tests.support.imds_stub import ImdsStub  # noqa: E402

LINGER_0 = struct.pack("ii", 1, 0)


def churn(port: int, seconds: float) -> None:
    """Non-blocking connect, then close with a reset, as fast as it goes, for ``seconds``."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sock = socket.socket()
        sock.setblocking(False)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_0)
        with contextlib.suppress(OSError):  # BlockingIOError: in progress, as wanted
            sock.connect(("127.0.0.1", port))
        sock.close()


def ask(port: int, timeout: float = 10.0, source: str | None = None) -> tuple[int | None, float]:
    started = time.monotonic()
    connection = http.client.HTTPConnection(
        "127.0.0.1", port, timeout=timeout, source_address=(source, 0) if source else None
    )
    try:
        connection.request("GET", "/")
        response = connection.getresponse()
        response.read()
        return response.status, time.monotonic() - started
    except (OSError, http.client.HTTPException):
        return None, time.monotonic() - started
    finally:
        connection.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--floods", type=int, default=2)
    parser.add_argument("--ask-every", type=float, default=0.2)
    parser.add_argument("--mode", choices=("reset", "idle"), default="reset")
    parser.add_argument("--hold", type=int, default=1000, help="idle: connections per child")
    parser.add_argument("--rate", type=float, default=1500.0, help="idle: opened per second")
    args = parser.parse_args()
    if args.floods == 0 and os.environ.get("CHURN_PORT"):
        port, churn_seconds = int(os.environ["CHURN_PORT"]), float(os.environ["CHURN_SECONDS"])
        if args.mode == "idle":
            opens = int(args.rate * churn_seconds) + 1
            hold_idle(port, args.hold, churn_seconds, opens, args.rate)
        else:
            churn(port, churn_seconds)
        return 0
    seconds = min(args.seconds, 120.0)
    port = reserve_port()
    with ImdsStub() as imds, tempfile.TemporaryDirectory() as state:
        imds.instance_status = 200
        probe = ["--drain-probe-port", str(port), "--drain-probe-address", "127.0.0.1"]
        with forwarder(imds.url, state, *probe):
            deadline = time.monotonic() + 60
            while ask(port, 2.0)[0] != 200:
                if time.monotonic() > deadline:
                    raise SystemExit("the probe never answered")
                time.sleep(0.1)
            env = {**os.environ, "CHURN_PORT": str(port), "CHURN_SECONDS": str(seconds)}
            child = [sys.executable, __file__, "--floods", "0", "--mode", args.mode]
            child += ["--hold", str(args.hold), "--rate", str(args.rate)]
            floods = [subprocess.Popen(child, env=env, cwd=ROOT) for _ in range(args.floods)]
            source = "127.0.0.2" if args.mode == "idle" else None
            answers: list[tuple[int | None, float]] = []
            try:
                end = time.monotonic() + seconds
                while time.monotonic() < end:
                    answers.append(ask(port, source=source))
                    time.sleep(args.ask_every)
            finally:
                for flood in floods:
                    if flood.poll() is None:
                        flood.send_signal(signal.SIGKILL)
                    flood.wait(10)
    latencies = sorted(seconds for _, seconds in answers)
    result = {
        "benchmark": "probe_reset_flood",
        "mode": args.mode,
        "floods": args.floods,
        "seconds": seconds,
        "asked": len(answers),
        "answered200": sum(1 for status, _ in answers if status == 200),
        "failed": sum(1 for status, _ in answers if status is None),
        "p50": round(statistics.median(latencies), 4) if latencies else None,
        "p99": round(latencies[max(0, int(len(latencies) * 0.99) - 1)], 4) if latencies else None,
        "max": round(latencies[-1], 4) if latencies else None,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
