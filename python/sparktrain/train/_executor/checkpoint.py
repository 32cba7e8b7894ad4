"""Checkpoints on a store: a local path or any pyarrow filesystem URI.

Layout under ``<store>/<run_id>/``::

    checkpoints/ckpt-000007.ckpt  checkpoints, numbered; the newest keep_checkpoints and the best stay
    checkpoints/best.json         which checkpoint had the best monitored metric
    checkpoints/log.jsonl         append-only event log (epoch started / finished / resumed)
    failures/                     one JSON file per failed rank and attempt
    run.json                      the run's fingerprint (written by the driver, sparktrain.train.plan)
    model/network/model.bin       the trained network, written by rank 0 (the driver reads it from here)
    model/network/spec.json

Writes are atomic (temporary name, then a rename), so a worker killed halfway
never leaves a checkpoint that looks complete.  Only rank 0 writes.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from typing import Any, Dict, List, Optional, Tuple

_CKPT = re.compile(r"ckpt-(\d+)\.ckpt$")


class Store:
    """A directory on a pyarrow filesystem, addressed by URI or local path."""

    def __init__(self, root: str) -> None:
        from pyarrow import fs as pafs

        if "://" in root:
            self.fs, self.root = pafs.FileSystem.from_uri(root)
        else:
            self.fs, self.root = pafs.LocalFileSystem(), os.path.abspath(root)
        self.uri = root

    def path(self, *parts: str) -> str:
        return "/".join([self.root.rstrip("/"), *parts])

    def makedirs(self, *parts: str) -> None:
        self.fs.create_dir(self.path(*parts), recursive=True)

    def exists(self, *parts: str) -> bool:
        from pyarrow import fs as pafs
        return self.fs.get_file_info(self.path(*parts)).type != pafs.FileType.NotFound

    def write_bytes(self, rel: str, data: bytes) -> None:
        """Write ``data`` to ``rel`` atomically."""
        final = self.path(rel)
        parent = final.rsplit("/", 1)[0]
        self.fs.create_dir(parent, recursive=True)
        tmp = f"{parent}/.tmp-{uuid.uuid4().hex}"
        with self.fs.open_output_stream(tmp) as out:
            out.write(data)
        self.fs.move(tmp, final)

    def read_bytes(self, rel: str) -> bytes:
        with self.fs.open_input_stream(self.path(rel)) as src:
            return src.read()

    def listdir(self, rel: str) -> List[str]:
        from pyarrow import fs as pafs
        if not self.exists(rel):
            return []
        infos = self.fs.get_file_info(pafs.FileSelector(self.path(rel)))
        return sorted(i.base_name for i in infos)

    def append_line(self, rel: str, line: str) -> None:
        """Append to a small log file (read-modify-write; only rank 0 calls this)."""
        old = self.read_bytes(rel) if self.exists(rel) else b""
        self.write_bytes(rel, old + line.encode() + b"\n")


class Checkpointer:
    """Per-run checkpoint manager used by rank 0 (and read by every rank on resume)."""

    def __init__(self, store_uri: str, run_id: str, launch_id: str = "") -> None:
        self.store = Store(store_uri)
        self.run_id = run_id
        self.launch_id = launch_id  # one fit() call; its Spark retries share it

    def _rel(self, *parts: str) -> str:
        return "/".join([self.run_id, *parts])

    def checkpoints(self) -> List[Tuple[int, str]]:
        """``[(sequence number, relative path)]`` of the complete checkpoints, oldest first."""
        found = []
        for name in self.store.listdir(self._rel("checkpoints")):
            m = _CKPT.match(name)  # a half-written checkpoint is a '.tmp-*' file: never listed
            if m:
                found.append((int(m.group(1)), self._rel("checkpoints", name)))
        return sorted(found)

    def latest(self) -> Optional[Tuple[int, str]]:
        """``(sequence number, relative path)`` of the newest complete checkpoint, or None."""
        found = self.checkpoints()
        return found[-1] if found else None

    def save(self, seq: int, payload: bytes) -> str:
        """Write checkpoint ``seq`` atomically (temporary file, then a rename); returns its relative path."""
        rel = self._rel("checkpoints", f"ckpt-{seq:06d}.ckpt")
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
        self.store.write_bytes(self._rel("model", "network", "model.bin"), model_bytes)
        self.store.write_bytes(self._rel("model", "network", "spec.json"), json.dumps(spec, indent=1).encode())
        return self.store.path(self._rel("model"))

    def read_model(self) -> Tuple[bytes, Dict[str, Any]]:
        """``(network bytes, spec)`` written by :meth:`write_model`."""
        return (self.store.read_bytes(self._rel("model", "network", "model.bin")),
                json.loads(self.store.read_bytes(self._rel("model", "network", "spec.json"))))

    def log_event(self, event: str, **fields: Any) -> None:
        line = json.dumps({"event": event, "time": time.time(), "launch": self.launch_id, **fields}, default=str)
        self.store.append_line(self._rel("checkpoints", "log.jsonl"), line)

    def events(self, this_launch: bool = False) -> List[Dict[str, Any]]:
        """The run's event log (only this ``fit()`` call's events with ``this_launch``)."""
        rel = self._rel("checkpoints", "log.jsonl")
        if not self.store.exists(rel):
            return []
        out = [json.loads(x) for x in self.store.read_bytes(rel).decode().splitlines() if x.strip()]
        return [e for e in out if e.get("launch") == self.launch_id] if this_launch else out

    def record_failure(self, attempt: int, rank: int, info: Dict[str, Any]) -> None:
        """Keep a worker's error (one file per attempt and rank: no write races)."""
        name = f"{self.launch_id}-attempt-{attempt:04d}-rank-{rank:04d}.json"
        self.store.write_bytes(self._rel("failures", name),
                               json.dumps({"time": time.time(), "attempt": attempt, **info}).encode())

    def failures(self) -> List[Dict[str, Any]]:
        """Recorded worker errors, oldest first (the first is usually the root cause)."""
        out = [json.loads(self.store.read_bytes(self._rel("failures", n)))
               for n in self.store.listdir(self._rel("failures"))
               if n.endswith(".json") and n.startswith(f"{self.launch_id}-")]
        return sorted(out, key=lambda d: d["time"])
