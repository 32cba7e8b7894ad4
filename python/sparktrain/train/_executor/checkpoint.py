"""Checkpoints of one run in the training store, as :class:`~sparktrain.data.run_store.RunStore` lays them out.

:class:`Checkpointer` writes numbered checkpoints, the event log, failure
records and the trained network under ``<store>/<run_id>/`` (see
:mod:`sparktrain.data.run_store` for the layout).  Writes are atomic
(temporary name, then a rename), so a worker killed halfway never leaves a
checkpoint that looks complete.  Only rank 0 writes checkpoints and events.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Tuple

from sparktrain.data.run_store import RunStore, Store


class Checkpointer:
    """Per-run checkpoint manager used by rank 0 (and read by every rank on resume).

    Parameters
    ----------
    store_uri : str
        The training store (local path or URI).
    run_id : str
        The run whose folder it writes.
    launch_id : str
        One ``fit()`` call; its Spark retries share it (events and failures are tagged with it).

    Attributes
    ----------
    run : RunStore
        The run's folder; ``store`` and ``run_id`` are its :class:`Store` and id.
    """

    def __init__(self, store_uri: str, run_id: str, launch_id: str = "") -> None:
        self.run = RunStore(store_uri, run_id)
        self.store: Store = self.run.store
        self.run_id = run_id
        self.launch_id = launch_id  # one fit() call; its Spark retries share it

    def checkpoints(self) -> List[Tuple[int, str]]:
        """``[(sequence number, relative path)]`` of the complete checkpoints, oldest first."""
        return self.run.checkpoints()

    def latest(self) -> Optional[Tuple[int, str]]:
        """``(sequence number, relative path)`` of the newest complete checkpoint, or None."""
        found = self.checkpoints()
        return found[-1] if found else None

    def save(self, seq: int, payload: bytes) -> str:
        """Write checkpoint ``seq`` atomically (temporary file, then a rename); returns its relative path."""
        rel = self.run.checkpoint_rel(seq)
        self.store.write_bytes(rel, payload)
        return rel

    def load(self, rel: str) -> bytes:
        return self.store.read_bytes(rel)

    def prune(self, keep: int, best: Optional[int]) -> List[int]:
        """Delete all but the newest ``keep`` checkpoints and ``best``; returns the deleted sequence numbers."""
        found = self.checkpoints()
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
