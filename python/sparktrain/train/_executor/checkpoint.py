"""Checkpoints of one run in the training store, as :class:`~sparktrain.data.run_store.RunStore` lays them out.

:class:`Checkpointer` writes numbered checkpoints, the event log, failure
records and the trained network under ``<store>/<run_id>/``
(see :mod:`sparktrain.data.run_store` for the layout).  Only rank 0 writes
checkpoints and events.

A checkpoint is one sealed object (:mod:`sparktrain.data.sealed`): JSON
metadata and the framework's state bytes, with their lengths and SHA-256.
Writes are atomic (a temporary file, then a rename of that file), fsynced on
a local disk; a failed write (a full disk) removes its temporary file and
raises :class:`~sparktrain.errors.StoreWriteError` naming the path.  Pruning
happens before a save (down to the newest checkpoint and the best), so a
full disk gets the space back before the next write, and after it.  On
resume, a checkpoint that does not pass its checks (truncated, altered) is
skipped with a warning (rank 0's ``resumed`` event lists it), and the
previous one is used; pruning never counts such a newer one as the newest.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Dict, List, Optional, Tuple

from sparktrain.data.run_store import RunStore, Store
from sparktrain.data.sealed import seal, unseal
from sparktrain.errors import CorruptObjectError

log = logging.getLogger(__name__)


class Checkpointer:
    """Per-run checkpoint manager used by rank 0 (and read by every rank on resume).

    Parameters
    ----------
    store_uri : str or Store
        The training store (local path or URI), or an open :class:`Store`.
    run_id : str
        The run whose folder it writes.
    launch_id : str
        One ``fit()`` call; its Spark retries share it (events and failures are tagged with it).

    Attributes
    ----------
    run : RunStore
        The run's folder; ``store`` and ``run_id`` are its :class:`Store` and id.
    """

    def __init__(self, store_uri: "str | Store", run_id: str, launch_id: str = "") -> None:
        self.run = RunStore(store_uri, run_id)
        self.store: Store = self.run.store
        self.run_id = run_id
        self.launch_id = launch_id  # one fit() call; its Spark retries share it
        self.skipped: List[int] = []  # unreadable checkpoints the last load_latest() skipped

    def checkpoints(self) -> List[Tuple[int, str]]:
        """``[(sequence number, relative path)]`` of the complete checkpoints, oldest first."""
        return self.run.checkpoints()

    def latest(self) -> Optional[Tuple[int, str]]:
        """``(sequence number, relative path)`` of the newest complete checkpoint, or None."""
        found = self.checkpoints()
        return found[-1] if found else None

    def save(self, seq: int, meta: Dict[str, Any], state: bytes, keep: int = 0,
             best: Optional[int] = None) -> str:
        """Write checkpoint ``seq`` (``meta`` as JSON and ``state``, sealed in one object); returns its path.

        With ``keep`` > 0, older checkpoints are pruned first down to the newest
        ``keep - 1`` (at least the newest one) and ``best``, then down to
        ``keep`` once the new one is written.

        Raises
        ------
        StoreWriteError
            The write failed (a full disk...): the path is named, no temporary file is left, and the
            previous checkpoints are there.
        """
        if keep > 0:
            self.prune(max(keep - 1, 1), best, below=seq)
        rel = self.run.checkpoint_rel(seq)
        self.store.write_bytes(rel, seal(meta, state))
        if keep > 0:
            self.prune(keep, best, below=seq + 1)
        return rel

    def load(self, rel: str) -> Tuple[Dict[str, Any], bytes]:
        """``(meta, state)`` of one checkpoint; :class:`CorruptObjectError` when it fails its checks."""
        return unseal(self.store.read_bytes(rel), self.store.path(rel))

    def load_latest(self) -> Optional[Tuple[int, Dict[str, Any], bytes]]:
        """``(seq, meta, state)`` of the newest checkpoint that passes its checks, or None when there is none.

        An unreadable one (truncated, altered, a read error) is skipped with a
        warning (its number goes to :attr:`skipped`); the one before it is used.

        Raises
        ------
        CorruptObjectError
            Checkpoints exist but none is readable (resuming from scratch would silently redo the run).
        """
        found = self.checkpoints()
        reasons = []
        self.skipped = []
        for seq, rel in reversed(found):
            try:
                meta, state = self.load(rel)
            except (CorruptObjectError, OSError, ValueError) as exc:
                reasons.append(f"{rel}: {exc}")
                self.skipped.append(seq)
                log.warning("run %s: checkpoint %d is unreadable, trying the one before: %s", self.run_id, seq, exc)
                continue
            if reasons:
                log.warning("run %s: resuming from checkpoint %d after skipping %d unreadable one(s)",
                            self.run_id, seq, len(reasons))
            return seq, meta, state
        if found:
            raise CorruptObjectError(
                f"run {self.run_id}: none of its {len(found)} checkpoints in '{self.store.path(self.run_id)}' is "
                f"readable ({'; '.join(reasons)}). Fix: fit with a new runId (or none) to start over, or restore "
                f"a checkpoint into that folder")
        return None

    def prune(self, keep: int, best: Optional[int], below: Optional[int] = None) -> List[int]:
        """Delete all but the newest ``keep`` checkpoints and ``best``; returns the deleted sequence numbers.

        With ``below``, only checkpoints numbered below it count (and go): those from ``below`` on are
        an earlier launch's, skipped as unreadable on resume, that the run is about to write again.
        """
        found = [(seq, rel) for seq, rel in self.checkpoints() if below is None or seq < below]
        doomed = [(seq, rel) for seq, rel in found[:-keep] if seq != best] if keep > 0 else []
        for _, rel in doomed:
            try:
                self.store.fs.delete_file(self.store.path(rel))
            except OSError:  # another attempt may have pruned it already
                pass
        return [seq for seq, _ in doomed]

    def write_model(self, model_bytes: bytes, spec: Dict[str, Any]) -> str:
        """The trained network in the store, ``<run>/model/network/`` (what the driver reads back)."""
        return self.run.write_network(model_bytes, spec)

    def read_model(self) -> Tuple[bytes, Dict[str, Any]]:
        """``(network bytes, spec)`` written by :meth:`write_model`."""
        return self.run.read_network()

    def log_event(self, event: str, **fields: Any) -> None:
        self.run.append_event({"event": event, "time": time.time(), "launch": self.launch_id, **fields})

    def events(self, this_launch: bool = False) -> List[Dict[str, Any]]:
        """The run's event log (only this ``fit()`` call's events with ``this_launch``)."""
        out = self.run.read_events()
        return [e for e in out if e.get("launch") == self.launch_id] if this_launch else out

    def record_failure(self, attempt: int, rank: int, info: Dict[str, Any]) -> None:
        """Keep a worker's error (one file per attempt and rank: no write races)."""
        name = f"{self.launch_id}-attempt-{attempt:04d}-rank-{rank:04d}.json"
        self.run.write_failure(name, {"time": time.time(), "attempt": attempt, **info})

    def failures(self) -> List[Dict[str, Any]]:
        """Recorded worker errors, oldest first (the first is usually the root cause)."""
        return sorted(self.run.read_failures(prefix=f"{self.launch_id}-"), key=lambda d: d["time"])


__all__ = ["Checkpointer"]
