"""The hooks worker: which hooks a transition calls for, their durable queue, and the threads
that run them, never the poller's.

:meth:`HookWorker.observe` is called on the poller's thread with each transition: it picks the
matching hooks, writes them to the journal as pending (one small SQLite transaction) and
queues them; it never waits for a hook. Worker threads run the queue: the hooks of one event
one after another, in the order of the transitions and of the hooks file; up to
``max_parallel`` events at once, so a slow hook of one event never delays another event's
(a Preempt gives 30 s notice). At start, :meth:`resume` queues again what the journal shows
unfinished: hooks a crash, a reboot or a stop cut short run again (at least once); a hook that
finished never runs again for the same transition.

A prepare hook whose event has started or ended by the time its turn comes is skipped (there
is nothing left to prepare for), and recorded so.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sebridge.contract.events import Transition
from sebridge.forwarder.local.hooks_file import Hook, HooksFile
from sebridge.forwarder.local.journal import Journal, JournalError, Run
from sebridge.forwarder.local.preparation import Observed, Preparations
from sebridge.forwarder.local.runner import (
    KILL_GRACE,
    HookResult,
    Invocation,
    Outcome,
    run_hook,
)

log = logging.getLogger("forwarder.hooks")

DEFAULT_PARALLEL = 4


@dataclass(frozen=True)
class _Job:
    run: Run
    hook: Hook
    observed: Observed


class HookWorker:
    name = "hooks"

    def __init__(
        self,
        hooks: HooksFile,
        journal: Journal,
        preparations: Preparations | None = None,
        *,
        max_parallel: int = DEFAULT_PARALLEL,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
        base_env: Mapping[str, str] | None = None,
        kill_grace: float = KILL_GRACE,
    ) -> None:
        self.hooks = hooks
        self.by_name = {hook.name: hook for hook in hooks.hooks}
        self.journal = journal
        self.preparations = preparations
        self.max_parallel = max(1, max_parallel)
        self.now = now
        self.base_env = base_env
        self.kill_grace = kill_grace
        self._queues: dict[str, collections.deque[_Job]] = {}
        self._active: set[str] = set()
        self._cond = threading.Condition()
        self.succeeded = 0
        self.failed = 0
        self.last_failure: str | None = None
        self.running: dict[str, str] = {}  # thread name -> "hook for message id"
        # (hook, outcome) -> runs that ended so (the metrics read it; outcomes as journalled,
        # plus "interrupted", which is not an end: the run goes again after the restart).
        self._outcomes: collections.Counter[tuple[str, str]] = collections.Counter()

    # -- on the poller's thread -------------------------------------------------------------
    def observe(self, observed: Observed) -> int:
        """Journal and queue the hooks this transition calls for; returns how many. Never
        raises, never waits for a hook."""
        hooks = self.hooks.matching(
            observed.transition.value, observed.event.event_type, observed.affects_this_vm
        )
        if not hooks:
            return 0
        payload = observed.payload()
        runs = [
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
        try:
            new = self.journal.record(runs)
        except JournalError as exc:
            # Run them anyway: a hook not run is worse than one run twice after a crash.
            log.error("cannot journal hooks for %s (%s): run without a record", observed, exc)
            new = runs
        if len(new) < len(runs):
            log.info(
                "hooks for %s already recorded (ran or queued before a restart): %s",
                observed.message_id,
                sorted({r.hook for r in runs} - {r.hook for r in new}),
            )
        self._queue([_Job(run, self.by_name[run.hook], observed) for run in new])
        return len(new)

    def resume(self) -> int:
        """Queue what the journal shows unfinished (at start, before the first poll)."""
        try:
            runs = self.journal.unfinished()
        except JournalError as exc:
            log.error("cannot read the hook journal: %s; nothing resumed", exc)
            return 0
        jobs = []
        for run in runs:
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
            jobs.append(_Job(run, hook, observed))
        if jobs:
            log.info(
                "%d hook run(s) cut short by a stop, crash or reboot: running them again",
                len(jobs),
            )
        self._queue(jobs)
        return len(jobs)

    def _queue(self, jobs: list[_Job]) -> None:
        if not jobs:
            return
        with self._cond:
            for job in jobs:
                self._queues.setdefault(job.run.event_key, collections.deque()).append(job)
            self._cond.notify_all()

    def pending(self) -> int:
        with self._cond:
            return sum(len(q) for q in self._queues.values()) + len(self._active)

    def preparation_status(self, event_key: str) -> str | None:
        try:
            return self.journal.prepare_status(event_key)
        except JournalError as exc:
            log.error("cannot read the hook journal: %s", exc)
            return "pending"  # unknown is not prepared

    def outcome_counts(self) -> dict[tuple[str, str], int]:
        """How many runs of each hook ended with each outcome so far (for the metrics)."""
        with self._cond:
            return dict(self._outcomes)

    def health(self) -> dict[str, Any]:
        """For Heartbeats: only what is wrong."""
        if not self.failed:
            return {}
        return {"hooksFailed": self.failed, "lastHookFailure": (self.last_failure or "")[:300]}

    # -- worker threads ---------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        """Run hooks until ``stop``; a hook running then is killed and stays unfinished."""
        helpers = [
            threading.Thread(target=self._loop, args=(stop,), name=f"hooks-{i}", daemon=True)
            for i in range(1, self.max_parallel)
        ]
        helpers.append(
            threading.Thread(target=self._wake_on, args=(stop,), name="hooks-stop", daemon=True)
        )
        for thread in helpers:
            thread.start()
        try:
            self._loop(stop)
        finally:
            with self._cond:
                self._cond.notify_all()
            deadline = time.monotonic() + 2.0  # together: the forwarder stops within 5 s
            for thread in helpers:
                thread.join(timeout=max(0.0, deadline - time.monotonic()))

    def _wake_on(self, stop: threading.Event) -> None:
        stop.wait()
        with self._cond:
            self._cond.notify_all()

    def _next(self, stop: threading.Event) -> _Job | None:
        with self._cond:
            while not stop.is_set():
                for key, queue in self._queues.items():
                    if queue and key not in self._active:
                        self._active.add(key)
                        return queue.popleft()
                self._cond.wait(5.0)  # woken by new work and by stop (_wake_on)
        return None

    def _loop(self, stop: threading.Event) -> None:
        while (job := self._next(stop)) is not None:
            try:
                self._run(job, stop)
            except Exception:
                log.exception("hook %s for %s: worker failed", job.hook.name, job.run.message_id)
            finally:
                with self._cond:
                    self._active.discard(job.run.event_key)
                    if not self._queues.get(job.run.event_key):
                        self._queues.pop(job.run.event_key, None)
                    self._cond.notify_all()

    def _too_late(self, job: _Job) -> str | None:
        if not job.hook.prepare:
            return None
        try:
            record = self.journal.preparation(job.run.event_key)
        except JournalError:
            return None
        if record is None:
            return None
        if record.ended:
            return "the event ended before its turn came"
        status = record.payload.get("event", {}).get("EventStatus")
        if isinstance(status, str) and status.lower() == "started":
            return "the event started before its turn came"
        return None

    def _run(self, job: _Job, stop: threading.Event) -> None:
        run, hook = job.run, job.hook
        late = self._too_late(job)
        if late:
            log.warning("prepare hook %s for %s skipped: %s", hook.name, run.message_id, late)
            self._finish(run, "skipped", late)
            return
        try:
            attempt = self.journal.start(run.message_id, hook.name)
        except JournalError as exc:
            log.error("cannot journal the start of hook %s: %s", hook.name, exc)
            attempt = run.attempts + 1
        invocation = Invocation(
            hook,
            run.transition,
            run.message_id,
            job.observed.event,
            job.observed.observer.vm_name,
            attempt,
        )
        me = threading.current_thread().name
        self.running[me] = f"{hook.name} for {run.message_id}"
        log.info(
            "hook %s starting for %s (attempt %d)",
            hook.name,
            run.message_id,
            attempt,
            extra={"hook": hook.name, "messageId": run.message_id},
        )
        try:
            result = run_hook(
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
            return  # left "running" in the journal: it runs again after the restart
        self._finish(run, result.outcome.value, result.detail)
        if hook.prepare and self.preparations is not None:
            self.preparations.check(run.event_key)

    def _count(self, hook: str, outcome: str) -> None:
        with self._cond:
            self._outcomes[(hook, outcome)] += 1

    def _finish(self, run: Run, status: str, detail: str) -> None:
        self._count(run.hook, status)
        try:
            self.journal.finish(run.message_id, run.hook, status, detail)
        except JournalError as exc:
            log.error(
                "cannot journal the end of hook %s for %s (%s): it may run again after a restart",
                run.hook,
                run.message_id,
                exc,
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
