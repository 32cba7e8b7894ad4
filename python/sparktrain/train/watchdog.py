"""The driver's stall watchdog: no rank may go ``stallTimeout`` seconds without progress.

Every rank runs a heartbeat thread (:class:`~sparktrain.train._executor.loop.Heartbeat`)
that reports, each second, its epoch, step, phase and the time of its last
finished step, even while its training thread is blocked.  The watchdog reads
those events from the progress channel.  When a rank has made no progress for
``timeout`` seconds (or has sent nothing at all for that long: a frozen or
lost process), it:

1. names the culprit: a rank that stopped outside a collective (its peers
   then wait inside one), else the rank with the oldest progress;
2. logs the rank, host, epoch, step and phase;
3. cancels the barrier stage's job group, so the fit returns within a few
   seconds and raises :class:`~sparktrain.errors.TrainingStalledError`.

A rank that went *silent* (no event at all) is checked with Spark before it
is blamed: ``task_state(rank)`` asks Spark's status tracker about the rank's
task.  A task Spark reports finished is not stalled (its rank is done); one
Spark reports failed is Spark's to retry; one Spark reports running while its
rank says nothing has probably lost its progress channel (the worker
reconnects with backoff), so it gets a second ``timeout`` before the fit is
stopped, and the error says what Spark reported.  A task a retried stage has
not started (``PENDING``: the retry waits for all its slots) gets the same
second ``timeout``; the launcher's slot monitor ends such a wait first, with
an error that names the slots.  Its peers waiting for it in
a collective get the same second ``timeout``: they are not the culprit.

While a stall builds up it logs ``rank 1 (host): no step for 45 s`` every
``timeout / 4`` seconds (at least 10 s).  Before its first step a rank gets
``max(timeout, 120 s)`` to start (Python worker, framework import, rendezvous).
The ranks' own collectives time out later (1.5 x ``max(timeout, 120 s)`` + 10 s) as a backstop.

A rank's phase says where it is: ``compute`` (its own network), ``collective``
(waiting for its peers), or ``step`` where the framework runs both as one call
(Keras' fused step); a rank in ``step`` could be either, so the error says
that every rank was inside its step rather than blaming one for waiting.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Dict, Optional

from sparktrain.train._executor.collectives import STARTUP_S

log = logging.getLogger(__name__)

_COLLECTIVE_PHASES = ("collective", "step")  # where a rank may be waiting for a peer
SILENT_S = 5.0  # heartbeats come every second: this long without any event means the process is gone


class StallWatchdog:
    """Watch ``num_workers`` ranks; call ``on_stall(info)`` once when one stalls."""

    def __init__(self, num_workers: int, timeout: float, on_stall: Callable[[Dict[str, Any]], None],
                 poll: float = 0.5, task_state: Optional[Callable[[int], Optional[str]]] = None,
                 run: Optional[str] = None) -> None:
        self.num_workers, self.timeout, self.on_stall = num_workers, float(timeout), on_stall
        self.task_state = task_state
        self.run = run  # listen to this run's events only (a shared channel)
        self.asked: Dict[int, str] = {}  # rank -> what Spark said about its task when it went silent
        self.started = time.time()
        self.ranks: Dict[int, Dict[str, Any]] = {}
        self.stalled: Optional[Dict[str, Any]] = None
        self._warned: Dict[int, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._poll = poll
        self._thread = threading.Thread(target=self._run, name="sparktrain-watchdog", daemon=True)
        self._thread.start()

    def __call__(self, event: Dict[str, Any]) -> None:
        """A progress-channel listener: every event of a rank is a sign of life, steps are progress."""
        rank = event.get("rank")
        if not isinstance(rank, int) or (self.run is not None and event.get("run", self.run) != self.run):
            return
        now = time.time()
        with self._lock:
            entry = self.ranks.setdefault(rank, {"progress": self.started})
            entry["seen"] = now
            if self.run is None or event.get("run") == self.run:  # not a reused gang's idle ping (no run yet)
                entry["seen_run"] = now
            entry["host"] = event.get("host", entry.get("host"))
            kind = event.get("type")
            if kind == "heartbeat":
                entry.update(epoch=event.get("epoch"), step=event.get("step"), phase=event.get("phase"))
                if event.get("progress_time"):
                    entry["progress"] = max(entry["progress"], float(event["progress_time"]))
            elif kind in ("step", "epoch"):
                entry["progress"] = now
                entry.update(epoch=event.get("epoch"), step=event.get("step", entry.get("step")))

    def check(self, now: Optional[float] = None) -> Optional[Dict[str, Any]]:
        """The stalled rank's facts if one has made no progress for ``timeout`` seconds, else None."""
        now = time.time() if now is None else now
        with self._lock:
            states = {r: dict(self.ranks.get(r, {"progress": self.started})) for r in range(self.num_workers)}
        ages: Dict[int, float] = {}
        silent: Dict[int, bool] = {}
        for r, s in states.items():  # a rank that went silent (frozen, lost): its last sign of life counts
            quiet = now - s.get("seen", self.started)
            silent[r] = quiet > SILENT_S
            ages[r] = max(now - s["progress"], quiet if silent[r] else 0.0)
        limits = {r: self.timeout if s.get("step") else max(self.timeout, STARTUP_S) for r, s in states.items()}
        self._warn(states, ages, now)
        excused = [r for r, a in ages.items() if a >= limits[r] and not self._blame(r, silent[r], a, limits[r])]
        overdue = [r for r, a in ages.items() if a >= limits[r] and r not in excused]
        if excused:  # a rank that waits in a collective on a peer Spark reports running waits with it
            overdue = [r for r in overdue
                       if states[r].get("phase") not in _COLLECTIVE_PHASES or ages[r] >= 2 * limits[r]]
        if not overdue:
            return None
        outside = [r for r in overdue if states[r].get("phase") not in _COLLECTIVE_PHASES]
        culprit = min(outside or overdue, key=lambda r: (states[r]["progress"], r))
        s = states[culprit]
        return {"rank": culprit, "host": s.get("host"), "epoch": s.get("epoch"), "step": s.get("step"),
                "phase": s.get("phase"), "seconds": round(ages[culprit], 1),
                "silent": silent[culprit], "detected_at": now, "progress_at": s["progress"],
                "spark_task": self.asked.get(culprit), "run": self.run,
                "all_in_step": not outside and all(states[r].get("phase") == "step" for r in overdue)}

    def _blame(self, rank: int, silent: bool, age: float, limit: float) -> bool:
        """Whether an overdue ``rank`` is stalled; a silent one only after asking Spark about its task."""
        if not silent or self.task_state is None:
            return True
        try:
            state = self.task_state(rank)
        except Exception as exc:  # noqa: BLE001 - the tracker is advisory
            log.debug("status tracker: %s", exc)
            state = None
        first = rank not in self.asked
        self.asked[rank] = state or "unknown"
        if state in ("SUCCESS", "FAILED", "KILLED"):
            if first:
                log.warning("rank %d is silent, and Spark reports its task %s: %s", rank, state,
                            "it finished" if state == "SUCCESS" else "Spark retries or fails the stage")
            return False
        if state == "PENDING" and age < 2 * limit:
            if first:
                log.warning("rank %d is silent: Spark's retry of the training stage has not started its task yet "
                            "(a barrier retry waits for all its task slots); stopping the fit at %.0f s if it does "
                            "not start", rank, 2 * limit)
            return False
        if state == "RUNNING" and age < 2 * limit:
            if first:
                log.warning("rank %d has sent nothing for %.0f s, but Spark reports its task running: its progress "
                            "channel may be cut (it reconnects); stopping the fit at %.0f s if it stays silent", rank,
                            age, 2 * limit)
            return False
        return True

    def _warn(self, states: Dict[int, Dict[str, Any]], ages: Dict[int, float], now: float) -> None:
        every = max(10.0, self.timeout / 4)
        for r, age in ages.items():
            if age >= every and now - self._warned.get(r, 0.0) >= every:
                self._warned[r] = now
                s = states[r]
                second = self.asked.get(r) in ("RUNNING", "PENDING")  # silent, with its task alive: see _blame
                starting = not s.get("step") and STARTUP_S > self.timeout  # the start-up allowance, not the timeout
                limit = max(self.timeout, STARTUP_S) if starting else self.timeout
                log.warning("rank %d (%s): no step for %.0f s (epoch %s, step %s, %s); the fit stops at %.0f s "
                            "(%s)", r, s.get("host", "?"), age, s.get("epoch"), s.get("step"),
                            s.get("phase", "starting"), limit * (2 if second else 1),
                            "2 x stallTimeout: Spark reports its task " + self.asked[r].lower() if second
                            else f"the first step's allowance, {STARTUP_S:.0f} s" if starting else "stallTimeout")

    def _run(self) -> None:
        while not self._stop.wait(self._poll):
            info = self.check()
            if info is not None and self.stalled is None:
                self.stalled = info
                log.error("rank %s (host %s) made no progress for %.0f s at epoch %s, step %s (%s): stopping the "
                          "fit", info["rank"], info["host"], info["seconds"], info["epoch"], info["step"],
                          info["phase"] or "starting")
                try:
                    self.on_stall(info)
                except Exception:  # noqa: BLE001 - cancelling is best effort; the error is raised anyway
                    log.exception("could not cancel the stalled barrier stage")
                return

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
