"""Throughput and latency of the Service Bus emulator through the real azure-servicebus SDK.

    .venv/bin/python benchmarks/servicebus_emulator.py [--messages 10000] [--size 1024]
        [--latency-count 500] [--connection-string CS]

Starts the emulator (tests/contract/Config.json, queue ``contract-bench``) unless a connection
string is given (then the queue is emptied first, untimed), then measures:
  * send: messages/s, sending batches built with create_message_batch;
  * receive: messages/s, receive-and-delete in batches of up to 100, half of what was sent;
  * receive + complete: messages/s, peek-lock, completing every message, the other half
    (informational: the SDK's complete_message waits for the broker's outcome, one round trip
    per message, so this is bound by round-trip latency rather than by the broker);
  * round trip: send one message, receive it, complete it; p50/p95/p99 over N messages.
Each phase times only its own work: links are opened before the clock starts, a receive phase
asks for no more than remains (an empty receive would add its whole wait) and stops the clock
at its last message, and a round trip counts only when it received the message it sent.
Targets: at least 1,000 messages/s each way; round-trip p99 at most 20 ms on loopback.
Everything is bounded by --deadline seconds per phase.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusReceiveMode

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from emulators.servicebus.testing import running_emulator  # noqa: E402

QUEUE = "contract-bench"


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def drain(client: ServiceBusClient, deadline: float) -> int:
    """Empty the queue (untimed): a shared namespace may hold an earlier run's messages."""
    removed = 0
    started = time.perf_counter()
    with client.get_queue_receiver(
        QUEUE, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
    ) as receiver:
        while time.perf_counter() - started < deadline:
            batch = receiver.receive_messages(max_message_count=100, max_wait_time=0.5)
            if not batch:
                break
            removed += len(batch)
    return removed


def bench_send(
    client: ServiceBusClient, count: int, size: int, deadline: float
) -> tuple[int, float]:
    """Send ``count`` messages (fewer if the deadline comes first); return how many and the rate."""
    payload = b"x" * size
    sent = 0
    with client.get_queue_sender(QUEUE) as sender:
        started = time.perf_counter()
        while sent < count and time.perf_counter() - started < deadline:
            batch = sender.create_message_batch()
            while sent + len(batch) < count:
                try:
                    batch.add_message(
                        ServiceBusMessage(payload, message_id=f"m-{sent + len(batch)}")
                    )
                except ValueError:  # batch full
                    break
            if len(batch) == 0:
                raise ValueError(f"a {size}-byte message does not fit in a batch")
            sender.send_messages(batch)
            sent += len(batch)  # counted once the broker has taken them
        elapsed = time.perf_counter() - started
    print(f"send:             {sent} messages in {elapsed:.2f} s = {sent / elapsed:,.0f} msg/s")
    return sent, sent / elapsed


def bench_receive(
    client: ServiceBusClient, count: int, deadline: float, *, complete: bool
) -> tuple[int, float]:
    """Receive ``count`` messages; return how many and the rate (0 when none arrived)."""
    mode = ServiceBusReceiveMode.PEEK_LOCK if complete else ServiceBusReceiveMode.RECEIVE_AND_DELETE
    got = 0
    with client.get_queue_receiver(QUEUE, receive_mode=mode, prefetch_count=0) as receiver:
        started = finished = time.perf_counter()
        while got < count and time.perf_counter() - started < deadline:
            batch = receiver.receive_messages(
                max_message_count=min(100, count - got), max_wait_time=2
            )
            if not batch:
                print(f"receive: queue empty after {got} of {count} messages", file=sys.stderr)
                break
            if complete:
                for message in batch:
                    receiver.complete_message(message)
            got += len(batch)
            finished = time.perf_counter()  # an empty receive's wait is not work
    elapsed = finished - started
    rate = got / elapsed if got else 0.0
    label = "receive+complete:" if complete else "receive (R&D):   "
    print(f"{label} {got} messages in {elapsed:.2f} s = {rate:,.0f} msg/s")
    return got, rate


def bench_round_trip(
    client: ServiceBusClient, count: int, size: int, deadline: float
) -> list[float]:
    payload = b"r" * size
    samples: list[float] = []
    with client.get_queue_sender(QUEUE) as sender, client.get_queue_receiver(QUEUE) as receiver:
        for i in range(20):  # warm up both links
            sender.send_messages(ServiceBusMessage(payload, message_id=f"warm-{i}"))
            for message in receiver.receive_messages(max_message_count=1, max_wait_time=5):
                receiver.complete_message(message)
        started = time.perf_counter()
        for i in range(count):
            if time.perf_counter() - started > deadline:
                break
            t0 = time.perf_counter()
            sender.send_messages(ServiceBusMessage(payload, message_id=f"rt-{i}"))
            received = receiver.receive_messages(max_message_count=1, max_wait_time=5)
            if not received:
                print(f"round trip {i}: message not received within 5 s", file=sys.stderr)
                break
            receiver.complete_message(received[0])
            elapsed_ms = (time.perf_counter() - t0) * 1000
            if received[0].message_id != f"rt-{i}":  # a leftover: not this round trip's time
                print(f"round trip {i}: got {received[0].message_id}", file=sys.stderr)
                break
            samples.append(elapsed_ms)
    if samples:
        print(
            f"round trip:       n={len(samples)} p50={_percentile(samples, 50):.2f} ms "
            f"p95={_percentile(samples, 95):.2f} ms p99={_percentile(samples, 99):.2f} ms "
            f"mean={statistics.fmean(samples):.2f} ms"
        )
    return samples


def run(connection_string: str, args: argparse.Namespace, *, fresh: bool) -> int:
    with ServiceBusClient.from_connection_string(connection_string) as client:
        if not fresh:
            print(f"drained {drain(client, args.deadline)} messages left in {QUEUE}")
        sent, send_rate = bench_send(client, args.messages, args.size, args.deadline)
        received, receive_rate = bench_receive(client, sent // 2, args.deadline, complete=False)
        completed, complete_rate = bench_receive(
            client, sent - received, args.deadline, complete=True
        )
        samples = bench_round_trip(client, args.latency_count, args.size, args.deadline)
    p99 = _percentile(samples, 99) if samples else float("inf")
    # a phase cut short by its deadline, or a lost message, is a failure in itself
    complete_run = (
        sent == args.messages
        and received + completed == sent
        and len(samples) == args.latency_count
    )
    ok = complete_run and send_rate >= 1000 and receive_rate >= 1000 and p99 <= 20
    print(f"receive+complete: {complete_rate:,.0f} msg/s (informational, SDK round-trip bound)")
    print(f"targets (>= 1,000 msg/s each way, p99 <= 20 ms): {'met' if ok else 'NOT met'}")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--size", type=int, default=1024, help="body size in bytes")
    parser.add_argument("--latency-count", type=int, default=500)
    parser.add_argument("--deadline", type=float, default=60.0, help="seconds per phase at most")
    parser.add_argument("--connection-string", help="use a running emulator or namespace")
    args = parser.parse_args(argv)
    print("command: " + " ".join([Path(sys.executable).name, *sys.argv]))
    if args.connection_string:
        return run(args.connection_string, args, fresh=False)
    with running_emulator(REPO / "tests" / "contract" / "Config.json") as emulator:
        print(f"emulator: pid {emulator.pid} on port {emulator.port}")
        return run(emulator.connection_string, args, fresh=True)


if __name__ == "__main__":
    sys.exit(main())
