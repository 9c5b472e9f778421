"""The hooks worker: which hooks a transition calls for, and the threads that run them, never
the poller's.

:meth:`HookWorker.runs_for` says which hooks a transition calls for (the local actions record
them in the store, in the same journal transaction as the view that produced them; prepare
hooks only once the event's drain moment has come, :mod:`sebridge.timing`), and
:meth:`HookWorker.queue` hands them to the threads. The hooks of one event run one after
another, in the order of the transitions and of the hooks file.

Scheduled by deadline, so that a Preempt's 30 s are never spent waiting:

- an event that affects this VM (its own) gets a thread of its own as soon as it has work, up
  to :data:`MAX_OWN_WORKERS` at once (only a few events can affect one VM): the neighbours'
  hooks can never occupy them;
- the neighbours' events (``allEvents`` hooks) share :data:`DEFAULT_PARALLEL` threads, each
  taking the waiting event with the earliest NotBefore first (a Started event, or one whose
  NotBefore is unknown, before any other).

An event's hooks queue in the lane of its judgment: own, or a neighbour's. When this VM's
identity resolves after some of an event's hooks were queued under the host name (the local
actions judge the event again, :meth:`HookWorker.rebind`), the runs that have not started are
judged again under the identity (their observer, their lane, their journal record), and the
event's own work starts at once: a run already started under the earlier judgment finishes in
the neighbours' pool beside it (it never holds the event's own hooks back). Within one
transition, runs that have not started keep the order of the hooks file.

At start, :meth:`resume` queues again what the store (the journal) shows unfinished: hooks a
crash, a reboot or a stop cut short run again (at least once); a hook that finished never runs
again for the same transition. A prepare hook whose event has started or ended by the time its
turn comes is skipped (there is nothing left to prepare for), and recorded so.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Protocol

from sebridge.contract.events import Transition
from sebridge.forwarder.local.containment import end_left_behind, reap_orphans
from sebridge.forwarder.local.hooks_file import Hook, HooksFile
from sebridge.forwarder.local.journal import FAILED, SUCCEEDED, UNFINISHED, Run
from sebridge.forwarder.local.preparation import Observed, Preparations
from sebridge.forwarder.local.runner import (
    KILL_GRACE,
    HookResult,
    Invocation,
    Outcome,
    run_hook,
)
from sebridge.forwarder.local.store import LocalStore

log = logging.getLogger("forwarder.hooks")

DEFAULT_PARALLEL = 2  # threads the neighbours' events share
MAX_OWN_WORKERS = 8  # threads for this VM's own events at once
_EARLIEST = datetime.min.replace(tzinfo=UTC)
Lane = tuple[str, bool]  # (event key, own): the hooks of one lane run one after another


class HookRunner(Protocol):
    def __call__(
        self,
        invocation: Invocation,
        *,
        now: datetime,
        cancel: threading.Event | None = None,
        base_env: Mapping[str, str] | None = None,
        kill_grace: float = KILL_GRACE,
    ) -> HookResult: ...


@dataclass(frozen=True)
class Job:
    """One hook run to do, with what it needs (the run, the hook, the transition)."""

    run: Run
    hook: Hook
    observed: Observed

    @property
    def own(self) -> bool:
        return self.observed.affects_this_vm

    @property
    def lane(self) -> Lane:
        """The queue it waits in: its event's, in the lane of its judgment."""
        return (self.run.event_key, self.own)

    @property
    def deadline(self) -> datetime:
        """When the event starts: NotBefore; a Started event or an unknown NotBefore is now."""
        event = self.observed.event
        if event.is_started or event.not_before is None:
            return _EARLIEST
        return event.not_before


class HookWorker:
    name = "hooks"

    def __init__(
        self,
        hooks: HooksFile,
        store: LocalStore,
        preparations: Preparations | None = None,
        *,
        max_parallel: int = DEFAULT_PARALLEL,
        max_own: int = MAX_OWN_WORKERS,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
        base_env: Mapping[str, str] | None = None,
        kill_grace: float = KILL_GRACE,
        runner: HookRunner = run_hook,
    ) -> None:
        self.hooks = hooks
        self.by_name = {hook.name: hook for hook in hooks.hooks}
        self.store = store
        self.preparations = preparations
        self.max_parallel = max(1, max_parallel)
        self.max_own = max(1, max_own)
        self.now = now
        self.base_env = base_env
        self.kill_grace = kill_grace
        self.runner = runner
        self._queues: dict[Lane, collections.deque[Job]] = {}
        self._active: set[Lane] = set()
        self._own_threads: dict[Lane, threading.Thread] = {}
        self._order = {hook.name: index for index, hook in enumerate(hooks.hooks)}
        self._cond = threading.Condition()
        self._stop: threading.Event | None = None
        self.succeeded = 0
        self.failed = 0
        self.last_failure: str | None = None
        self.running: dict[str, str] = {}  # thread name -> "hook for message id"
        # (hook, outcome) -> runs that ended so (the metrics read it; outcomes as journalled,
        # plus "interrupted", which is not an end: the run goes again after the restart).
        self._outcomes: collections.Counter[tuple[str, str]] = collections.Counter()

    # -- on the poller's thread -------------------------------------------------------------
    def runs_for(self, observed: Observed) -> list[Run]:
        """The runs this transition calls for, pending, in hooks-file order."""
        hooks = self.hooks.matching(
            observed.transition.value, observed.event.event_type, observed.affects_this_vm
        )
        payload = observed.payload()
        return [
            Run(
                observed.message_id,
                hook.name,
                observed.event.key,
                observed.transition.value,
                hook.prepare,
                payload,
            )
            for hook in hooks
        ]

    def job(self, run: Run, observed: Observed) -> Job:
        return Job(run, self.by_name[run.hook], observed)

    def resume(self) -> int:
        """Queue what the store shows unfinished (at start, before the first poll)."""
        jobs = []
        for run in self.store.unfinished():
            hook = self.by_name.get(run.hook)
            try:
                observed = Observed.from_payload(
                    Transition(run.transition), run.message_id, run.payload
                )
            except ValueError as exc:
                self._finish(run, "not-started", f"damaged journal record: {exc}")
                continue
            if hook is None:
                log.warning(
                    "hook %s for %s was cut short but is no longer in the hooks file: dropped",
                    run.hook,
                    run.message_id,
                )
                self._finish(run, "not-started", "no longer in the hooks file")
                continue
            jobs.append(Job(run, hook, observed))
        if jobs:
            log.info(
                "%d hook run(s) cut short by a stop, crash or reboot: running them again",
                len(jobs),
            )
        self.queue(jobs)
        return len(jobs)

    def queue(self, jobs: list[Job]) -> None:
        if not jobs:
            return
        with self._cond:
            for job in jobs:
                self._enqueue(job)
            self._cond.notify_all()

    def _enqueue(self, job: Job) -> None:
        """(Under the lock.) At the end of its lane, but before the waiting runs of the same
        transition that come after it in the hooks file (a run judged again joins its lane
        late)."""
        queue = self._queues.setdefault(job.lane, collections.deque())
        rank = self._order.get(job.hook.name, len(self._order))
        for index, waiting in enumerate(queue):
            if waiting.run.message_id == job.run.message_id and rank < self._order.get(
                waiting.hook.name, len(self._order)
            ):
                queue.insert(index, job)
                return
        queue.append(job)

    def rebind(self, observed: Callable[[Observed], Observed]) -> int:
        """Judge the runs that wait (not started) again: ``observed`` gives each transition as
        seen now (this VM's identity resolved). Each moves to the lane of its new judgment, and
        its journal record carries the new observer (a restart runs it so). Called by the local
        actions under the store's lock, before they queue what the new judgment calls for.
        Returns how many changed lanes."""
        moved = 0
        with self.store.lock, self._cond:
            waiting = [job for queue in self._queues.values() for job in queue]
            for lane in [lane for lane in self._queues if lane not in self._active]:
                del self._queues[lane]
            for lane in self._active:
                self._queues[lane] = collections.deque()
            for job in waiting:
                again = observed(job.observed)
                rebound = replace(job, observed=again)
                if again != job.observed:
                    run = self.store.run(job.run.key)
                    if run is not None and run.status == "pending":
                        self.store.update_run(replace(run, payload=again.payload()))
                moved += rebound.lane != job.lane
                self._enqueue(rebound)
            for lane in [lane for lane, queue in self._queues.items() if not queue]:
                if lane not in self._active:
                    del self._queues[lane]
            self._cond.notify_all()
        return moved

    def pending(self) -> int:
        with self._cond:
            return sum(len(q) for q in self._queues.values()) + len(self._active)

    def preparation_status(self, event_key: str) -> str | None:
        """The prepare hooks of the event's current cause (its latest Scheduled or Updated):
        ``pending``, ``failed`` or ``succeeded``; None when that cause called for none."""
        with self.store.lock:
            record = self.store.preparation(event_key)
            if record is None or record.cause is None:
                return None
            statuses = {
                run.status
                for run in self.store.runs.values()
                if run.prepare and run.message_id == record.cause and run.event_key == event_key
            }
            if not statuses and self.store.deferred_prepare(event_key) == record.cause:
                return "pending"  # they wait for the event's drain moment
        if not statuses:
            return None
        if statuses & set(UNFINISHED):
            return "pending"
        if statuses & set(FAILED):
            return "failed"
        return SUCCEEDED  # succeeded, or skipped: the event started or ended (nothing to do)

    def outcome_counts(self) -> dict[tuple[str, str], int]:
        """How many runs of each hook ended with each outcome so far (for the metrics)."""
        with self._cond:
            return dict(self._outcomes)

    def health(self) -> dict[str, Any]:
        """For Heartbeats: only what is wrong."""
        if not self.failed:
            return {}
        return {"hooksFailed": self.failed, "lastHookFailure": (self.last_failure or "")[:300]}

    # -- threads ----------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        """Run hooks until ``stop``; a hook running then is killed and stays unfinished. This
        thread hands each own event with work a thread of its own; the neighbours' pool runs
        beside it."""
        self._stop = stop
        pool = [
            threading.Thread(target=self._pool_loop, args=(stop,), name=f"hooks-{i}", daemon=True)
            for i in range(1, self.max_parallel + 1)
        ]
        waker = threading.Thread(target=self._wake_on, args=(stop,), name="hooks-stop", daemon=True)
        for thread in [*pool, waker]:
            thread.start()
        try:
            self._dispatch(stop)
        finally:
            with self._cond:
                self._cond.notify_all()
                own = list(self._own_threads.values())
            deadline = time.monotonic() + 2.0  # together: the forwarder stops within 5 s
            for thread in [*pool, *own]:
                thread.join(timeout=max(0.0, deadline - time.monotonic()))
            end_left_behind()  # nothing a hook started outlives the forwarder

    def _wake_on(self, stop: threading.Event) -> None:
        stop.wait()
        with self._cond:
            self._cond.notify_all()

    def _dispatch(self, stop: threading.Event) -> None:
        with self._cond:
            while not stop.is_set():
                waiting = sorted(
                    (
                        (queue[0].deadline, key)
                        for key, queue in self._queues.items()
                        if queue and key not in self._active and key[1]
                    ),
                )
                for _, key in waiting[: max(0, self.max_own - len(self._own_threads))]:
                    self._active.add(key)
                    thread = threading.Thread(
                        target=self._own_loop,
                        args=(key, stop),
                        name=f"hooks-own-{key[0][:8]}",
                        daemon=True,
                    )
                    self._own_threads[key] = thread
                    thread.start()
                self._cond.wait(5.0)  # woken by new work, by an own thread ending and by stop
                reap_orphans()  # zombies of what hooks orphaned, between runs too

    def _own_loop(self, key: Lane, stop: threading.Event) -> None:
        """Run one own event's queue to its end, then hand the event back."""
        try:
            while not stop.is_set():
                with self._cond:
                    queue = self._queues.get(key)
                    if not queue:
                        break
                    job = queue.popleft()
                self._run_job(job, stop)
        finally:
            with self._cond:
                self._active.discard(key)
                self._own_threads.pop(key, None)
                if not self._queues.get(key):
                    self._queues.pop(key, None)
                self._cond.notify_all()

    def _next_neighbour(self, stop: threading.Event) -> Job | None:
        with self._cond:
            while not stop.is_set():
                job = self._take(own=False)
                if job is not None:
                    return job
                self._cond.wait(5.0)  # woken by new work and by stop (_wake_on)
        return None

    def _take(self, *, own: bool | None) -> Job | None:
        """The head job of the waiting event with the earliest deadline (under the lock);
        ``own``: only own events, only neighbours', or (None) any."""
        candidates = [
            (queue[0].deadline, key)
            for key, queue in self._queues.items()
            if queue and key not in self._active and (own is None or key[1] is own)
        ]
        if not candidates:
            return None
        _, key = min(candidates)
        self._active.add(key)
        return self._queues[key].popleft()

    def _pool_loop(self, stop: threading.Event) -> None:
        while (job := self._next_neighbour(stop)) is not None:
            try:
                self._run_job(job, stop)
            finally:
                self._release(job.lane)

    def _release(self, key: Lane) -> None:
        with self._cond:
            self._active.discard(key)
            if not self._queues.get(key):
                self._queues.pop(key, None)
            self._cond.notify_all()

    def drain(self, stop: threading.Event | None = None) -> int:
        """Run everything queued on the calling thread, earliest deadline first, until nothing
        is left (a deterministic order, for in-process crash tests); returns how many ran."""
        stop = stop or threading.Event()
        count = 0
        while not stop.is_set():
            with self._cond:
                job = self._take(own=None)
            if job is None:
                return count
            try:
                self._run_job(job, stop)
            finally:
                self._release(job.lane)
            count += 1
        return count

    def _run_job(self, job: Job, stop: threading.Event) -> None:
        try:
            self._run(job, stop)
        except Exception:
            log.exception("hook %s for %s: worker failed", job.hook.name, job.run.message_id)

    def _too_late(self, job: Job) -> str | None:
        if not job.hook.prepare:
            return None
        record = self.store.preparation(job.run.event_key)
        if record is None:
            return None
        if record.ended:
            return "the event ended before its turn came"
        status = record.payload.get("event", {}).get("EventStatus")
        if isinstance(status, str) and status.strip().lower() == "started":
            return "the event started before its turn came"
        return None

    def _run(self, job: Job, stop: threading.Event) -> None:
        hook = job.hook
        run = self.store.run(job.run.key) or job.run
        if run.finished:
            return  # finished meanwhile (queued twice by a resume and a derivation)
        late = self._too_late(job)
        if late:
            log.warning("prepare hook %s for %s skipped: %s", hook.name, run.message_id, late)
            self._finish(run, "skipped", late)
            return
        run = replace(run, status="running", attempts=run.attempts + 1)
        self.store.update_run(run)
        self.store.flush()  # when it fails, the run still goes: at least once
        invocation = Invocation(
            hook,
            run.transition,
            run.message_id,
            job.observed.event,
            job.observed.observer.vm_name,
            run.attempts,
        )
        me = threading.current_thread().name
        self.running[me] = f"{hook.name} for {run.message_id}"
        log.info(
            "hook %s starting for %s (attempt %d)",
            hook.name,
            run.message_id,
            run.attempts,
            extra={"hook": hook.name, "messageId": run.message_id},
        )
        try:
            result = self.runner(
                invocation,
                now=self.now(),
                cancel=stop,
                base_env=self.base_env,
                kill_grace=self.kill_grace,
            )
        finally:
            self.running.pop(me, None)
        self._report(run, hook, result)
        if result.outcome is Outcome.INTERRUPTED:
            self._count(run.hook, result.outcome.value)
            return  # left "running": it runs again after the restart
        self._finish(run, result.outcome.value, result.detail)
        if hook.prepare and self.preparations is not None:
            self.preparations.check(run.event_key)

    def _count(self, hook: str, outcome: str) -> None:
        with self._cond:
            self._outcomes[(hook, outcome)] += 1

    def _finish(self, run: Run, status: str, detail: str) -> None:
        self._count(run.hook, status)
        self.store.update_run(replace(run, status=status, detail=detail[:1000]))
        if not self.store.flush():
            log.error(
                "cannot journal the end of hook %s for %s: it may run again after a restart",
                run.hook,
                run.message_id,
            )

    def _report(self, run: Run, hook: Hook, result: HookResult) -> None:
        fields = {
            "hook": hook.name,
            "messageId": run.message_id,
            "outcome": result.outcome.value,
            "exitCode": result.exit_code,
            "seconds": round(result.seconds, 3),
        }
        with self._cond:
            if result.ok:
                self.succeeded += 1
                level = logging.INFO
            elif result.outcome is Outcome.INTERRUPTED:
                level = logging.WARNING
            else:
                self.failed += 1
                self.last_failure = f"{hook.name} for {run.message_id}: {result.detail}"
                level = logging.ERROR
        kind = "prepare hook" if hook.prepare else "hook"
        log.log(
            level,
            "%s %s for %s %s: %s after %.1f s",
            kind,
            hook.name,
            run.transition,
            run.event_key,
            result.detail if not result.ok else "succeeded",
            result.seconds,
            extra=fields,
        )
        for stream, text, dropped in (
            ("stdout", result.stdout, result.stdout_dropped),
            ("stderr", result.stderr, result.stderr_dropped),
        ):
            if text or dropped:
                note = f"\n[{dropped} more bytes dropped]" if dropped else ""
                log.log(
                    level if level > logging.INFO else logging.INFO,
                    "hook %s %s:%s%s%s",
                    hook.name,
                    stream,
                    os.linesep,
                    text.rstrip("\n"),
                    note,
                    extra={"hook": hook.name, "stream": stream},
                )
