"""How a search sees its trials' epochs and tells them to stop: over the progress channel, or the store.

A search that prunes, or runs distributed trials on reused gangs, opens one
:class:`~sparktrain.train.progress.ProgressServer` for all its trials
(:class:`SearchChannel`).  Each trial's rank 0 asks it for a ``verdict`` after
every epoch, with that epoch's metrics: those feed the pruner, and the
answer (go on, or stop) goes back on the same connection.  The search loop
reads a trial's epochs and gives its verdicts through a watch:

* :class:`ChannelWatch`: epochs from the ``verdict`` requests (and the
  ``epoch`` events) of that trial's run, verdicts answered to the waiting
  request (or to the next one, after a reconnect);
* :class:`StoreWatch`: epochs from the run's event log in the store, verdicts
  written into the run's ``control/`` folder.  Only where there is no
  channel: under Spark Connect the driver is a client the executors generally
  cannot reach, while both reach the store.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Dict, List, Optional, Protocol

from sparktrain._internal import spark_compat
from sparktrain.train.progress import ProgressServer, connection_cap

log = logging.getLogger(__name__)


class Watch(Protocol):
    """What pruning reads from a running trial and tells it."""

    epochs: int  # planned

    def finished_epochs(self) -> Dict[int, Dict[str, Any]]:
        """Every epoch the trial reported so far: ``{epoch: metrics}``."""

    def verdict(self, epoch: int, stop: bool, reason: str) -> None:
        """The search's decision after ``epoch``."""


class StoreWatch:
    """A trial's epochs from its event log, its verdicts into its ``control/`` folder (the Connect fallback)."""

    def __init__(self, run: Any, epochs: int) -> None:
        self.run, self.epochs = run, epochs  # run: sparktrain.data.run_store.RunStore

    def finished_epochs(self) -> Dict[int, Dict[str, Any]]:
        try:
            events = self.run.read_events()
        except (OSError, ValueError) as exc:  # a half-visible log on an eventually consistent store: next poll
            log.debug("run %s: event log not readable yet: %s", self.run.run_id, exc)
            return {}
        return {int(e["epoch"]): e.get("metrics") or {} for e in events if e.get("event") == "epoch_finished"}

    def verdict(self, epoch: int, stop: bool, reason: str) -> None:
        self.run.write_verdict(epoch, stop, reason)


class ChannelWatch:
    """A trial's epochs and verdicts over the search's progress channel."""

    def __init__(self, run_id: str, epochs: int) -> None:
        self.run_id, self.epochs = run_id, epochs
        self._lock = threading.Lock()
        self._epochs: Dict[int, Dict[str, Any]] = {}
        self._verdicts: Dict[int, Dict[str, Any]] = {}
        self._stop: Optional[Dict[str, Any]] = None
        self._waiting: Dict[int, List[Callable[[Any], None]]] = {}

    def feed(self, epoch: int, metrics: Dict[str, Any]) -> None:
        with self._lock:
            self._epochs.setdefault(int(epoch), dict(metrics or {}))

    def ask(self, epoch: int, metrics: Dict[str, Any], reply: Callable[[Any], None]) -> None:
        """Rank 0 finished ``epoch``: feed its metrics; answer now if the verdict is known, else when it is."""
        self.feed(epoch, metrics)
        with self._lock:
            known = self._stop or self._verdicts.get(int(epoch))
            if known is None:
                self._waiting.setdefault(int(epoch), []).append(reply)
                return
        reply(known)

    def finished_epochs(self) -> Dict[int, Dict[str, Any]]:
        with self._lock:
            return dict(self._epochs)

    def verdict(self, epoch: int, stop: bool, reason: str) -> None:
        body = {"epoch": epoch, "stop": bool(stop), "reason": reason}
        with self._lock:
            self._verdicts[epoch] = body
            if stop and self._stop is None:
                self._stop = body  # any later question gets this answer (a stop seen after the fact)
            waiting = self._waiting.pop(epoch, [])
        for reply in waiting:
            reply(body)


class SearchChannel:
    """The search's progress server: ``verdict`` requests and ``epoch`` events routed to each trial's watch.

    Parameters
    ----------
    spark : SparkSession
        Classic Spark (under Connect there is no channel: see :func:`open_channel`).
    ranks : int
        Worker processes that may report at once (sizes the connection cap).
    """

    def __init__(self, host: str, ranks: int) -> None:
        self.server = ProgressServer(host, show_bar=False, max_connections=connection_cap(ranks))
        self._watches: Dict[str, ChannelWatch] = {}
        self._lock = threading.Lock()
        self.server.on_request("verdict", self.on_verdict)
        self.server.listeners.append(self._on_event)

    @property
    def address(self) -> str:
        return self.server.address

    @property
    def token(self) -> str:
        return self.server.token

    def watch(self, run_id: str, epochs: int) -> ChannelWatch:
        with self._lock:
            watch = self._watches[run_id] = ChannelWatch(run_id, epochs)
        return watch

    def release(self, run_id: str) -> None:
        with self._lock:
            self._watches.pop(run_id, None)

    def _find(self, event: Dict[str, Any]) -> Optional[ChannelWatch]:
        with self._lock:
            return self._watches.get(str(event.get("run")))

    def on_verdict(self, request: Dict[str, Any], reply: Callable[[Any], None]) -> None:
        watch = self._find(request)
        if watch is None:  # not a trial of this search (any more): let it train on
            reply({"epoch": request.get("epoch"), "stop": False, "reason": "no such trial"})
            return
        watch.ask(int(request["epoch"]), request.get("metrics") or {}, reply)

    def _on_event(self, event: Dict[str, Any]) -> None:
        if event.get("type") == "epoch" and event.get("rank") == 0:
            watch = self._find(event)
            if watch is not None:
                watch.feed(int(event["epoch"]), event.get("metrics") or {})

    def close(self) -> None:
        self.server.close()


def open_channel(spark, ranks: int) -> Optional[SearchChannel]:
    """A :class:`SearchChannel` on the driver's host; None under Spark Connect (the store carries verdicts)."""
    host = spark_compat.driver_host(spark)
    return SearchChannel(host, ranks) if host else None
