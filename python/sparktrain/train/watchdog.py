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
``timeout / 4`` seconds (at least 10 s); more than :data:`GROUP_OVER` ranks in the
same state share one line that lists them as ranges (a network cut silences hundreds at
once).  Before its first step a rank gets ``max(timeout, 120 s)`` to start (Python
worker, framework import, rendezvous).
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
from typing import Any, Callable, Dict, List, Optional, Tuple

from sparktrain.train._executor.collectives import STARTUP_S

log = logging.getLogger(__name__)

_COLLECTIVE_PHASES = ("collective", "step")  # where a rank may be waiting for a peer
SILENT_S = 5.0  # heartbeats come every second: this long without any event means the process is gone
_Note = Tuple[str, int, float, float]  # what Spark said of a rank: (state, rank, seconds without a step, limit)
GROUP_OVER = 3  # more ranks than this in the same state: one log line for them all (a cut silences hundreds)


#: What Spark said about a silent rank's task (see StallWatchdog._blame): one rank's line, and many ranks' line.
_NOTES = {
    "SUCCESS": ("%(who)s is silent, and Spark reports its task SUCCESS: it finished",
                "%(who)s are silent, and Spark reports their tasks SUCCESS: they finished"),
    "FAILED": ("%(who)s is silent, and Spark reports its task %(state)s: Spark retries or fails the stage",
               "%(who)s are silent, and Spark reports their tasks %(state)s: Spark retries or fails the stage"),
    "PENDING": ("%(who)s is silent: Spark's retry of the training stage has not started its task yet (a barrier retry "
                "waits for all its task slots); stopping the fit at %(stops).0f s if it does not start",
                "%(who)s are silent: Spark's retry of the training stage has not started their tasks yet (a barrier "
                "retry waits for all its task slots); stopping the fit at %(stops).0f s if they do not start"),
    "RUNNING": ("%(who)s has sent nothing for %(age).0f s, but Spark reports its task running: its progress channel "
                "may be cut (it reconnects); stopping the fit at %(stops).0f s if it stays silent",
                "%(who)s have sent nothing for up to %(age).0f s, but Spark reports their tasks running: their "
                "progress channels may be cut (they reconnect); stopping the fit at %(stops).0f s if they stay silent"),
}
_NOTES["KILLED"] = _NOTES["FAILED"]  # (its state is in the line)


def rank_list(ranks: List[int], runs: int = 6) -> str:
    """``[0, 1, 2, 5, 7, 8]`` as ``"0-2, 5, 7-8"``; after ``runs`` runs, ``", ..."``."""
    parts: List[Tuple[int, int]] = []
    for r in sorted(set(ranks)):
        if parts and parts[-1][1] == r - 1:
            parts[-1] = (parts[-1][0], r)
        else:
            parts.append((r, r))
    text = [str(a) if a == b else f"{a}-{b}" for a, b in parts]
    return ", ".join(text[:runs]) + (", ..." if len(text) > runs else "")


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
        notes: List[_Note] = []  # what Spark said of ranks asked for the first time, logged by _warn
        excused = [r for r, a in ages.items()
                   if a >= limits[r] and not self._blame(r, silent[r], a, limits[r], notes)]
        self._warn(states, ages, silent, limits, notes, now)
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

    def _ask(self, rank: int) -> Tuple[Optional[str], bool]:
        """What Spark says about ``rank``'s task (recorded in ``asked``), and whether it was the first time."""
        try:
            state = self.task_state(rank) if self.task_state is not None else None
        except Exception as exc:  # noqa: BLE001 - the tracker is advisory
            log.debug("status tracker: %s", exc)
            state = None
        first = rank not in self.asked
        self.asked[rank] = state or "unknown"
        return state, first

    def _blame(self, rank: int, silent: bool, age: float, limit: float, notes: List[_Note]) -> bool:
        """Whether an overdue ``rank`` is stalled; a silent one only after asking Spark about its task."""
        if not silent or self.task_state is None:
            return True
        state, first = self._ask(rank)
        if state in ("SUCCESS", "FAILED", "KILLED") or (state in ("PENDING", "RUNNING") and age < 2 * limit):
            if first:
                notes.append((state, rank, age, limit))
            return False  # done, Spark's to retry, or alive: a second timeout
        return True

    def _warn(self, states: Dict[int, Dict[str, Any]], ages: Dict[int, float], silent: Dict[int, bool],
              limits: Dict[int, float], notes: List[_Note], now: float) -> None:
        """Log what Spark said (``notes``), then the ranks without a step for ``every`` seconds: a line per rank,
        or one per group of more than :data:`GROUP_OVER` ranks that stop the fit at the same time for one reason."""
        every = max(10.0, self.timeout / 4)
        due: Dict[Tuple[Optional[float], str], List[int]] = {}  # (when the fit stops, why) -> ranks
        for r, age in ages.items():
            if age < every or now - self._warned.get(r, 0.0) < every:
                continue
            self._warned[r] = now
            if silent[r] and self.task_state is not None and r not in self.asked:  # ask now: say the right limit
                state, _ = self._ask(r)
                if state in _NOTES:
                    notes.append((state, r, age, limits[r]))
            state = self.asked.get(r)
            if state == "SUCCESS":  # its rank is done: nothing to warn of
                continue
            starting = not states[r].get("step") and STARTUP_S > self.timeout  # the first step's allowance
            if state in ("FAILED", "KILLED"):
                key: Tuple[Optional[float], str] = (None, f"Spark reports its task {state.lower()}: Spark's to retry")
            elif state in ("RUNNING", "PENDING"):  # silent, with its task alive: see _blame
                key = (2 * limits[r], "2 x stallTimeout: Spark reports its task " + state.lower())
            else:
                key = (limits[r], f"the first step's allowance, {STARTUP_S:.0f} s" if starting else "stallTimeout")
            due.setdefault(key, []).append(r)
        self._log_notes(notes)
        for (stops_at, why), ranks in due.items():
            tail = f"the fit stops at {stops_at:.0f} s ({why})" if stops_at is not None else why
            if len(ranks) <= GROUP_OVER:
                for r in ranks:
                    s = states[r]
                    log.warning("rank %d (%s): no step for %.0f s (epoch %s, step %s, %s); %s", r, s.get("host", "?"),
                                ages[r], s.get("epoch"), s.get("step"), s.get("phase", "starting"), tail)
                continue
            r = max(ranks, key=lambda k: ages[k])
            s = states[r]
            low = min(ages[k] for k in ranks)
            span = f"{ages[r]:.0f}" if round(low) == round(ages[r]) else f"{low:.0f}-{ages[r]:.0f}"
            log.warning("%d ranks (%s): no step for %s s (the longest: rank %d (%s), epoch %s, step %s, %s); %s",
                        len(ranks), rank_list(ranks), span, r, s.get("host", "?"), s.get("epoch"), s.get("step"),
                        s.get("phase", "starting"), tail.replace("its task", "their tasks"))

    @staticmethod
    def _log_notes(notes: List[_Note]) -> None:
        """What Spark said about ranks asked for the first time: a line per rank, or per state and limit for many."""
        groups: Dict[Tuple[str, float], List[_Note]] = {}
        for note in notes:
            groups.setdefault((note[0], note[3]), []).append(note)
        for (state, limit), group in groups.items():
            one, many = _NOTES[state]
            if len(group) <= GROUP_OVER:
                for _, rank, age, _ in group:
                    log.warning(one, {"who": f"rank {rank}", "state": state, "age": age, "stops": 2 * limit})
            else:
                ranks = [n[1] for n in group]
                log.warning(many, {"who": f"{len(ranks)} ranks ({rank_list(ranks)})", "state": state,
                                   "age": max(n[2] for n in group), "stops": 2 * limit})

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
