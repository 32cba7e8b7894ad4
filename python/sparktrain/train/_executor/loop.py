"""What the torch and Keras worker loops share: resume, step checkpoints, heartbeats, row traces.

A checkpoint is a pickle of ``{"meta": {...}, "state": bytes}``: ``state`` is
the framework's own serialization (model, optimizer, its RNG), ``meta`` is
the same for every framework:

``epoch``, ``layers``
    where training continues: the epoch and its progress
    (:class:`~sparktrain.train._executor.epochs.Layer` s; empty at an epoch's start).
``train_state``
    the all-reduced metric sums of that epoch so far (rank 0 restores them).
``history``, ``rng`` (numpy, Python), ``global_batch``, ``seq``, ``world``,
``shards`` (the world size whose sharding the run follows: after a shrink to a
divisor of it, each rank trains several of its shards).

Mid-epoch checkpoints happen every ``checkpoint_every_steps`` steps, and/or
when ``checkpoint_every_s`` passed on rank 0 (decided at the periodic
all-reduce, so every rank checkpoints at the same step).  Every epoch ends
with one.  Only rank 0 writes; the newest ``keep_checkpoints`` and the best
epoch (lowest ``val_loss``, else ``train_loss``) are kept.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from sparktrain.train._executor import metrics as M
from sparktrain.train._executor.context import WorkerContext
from sparktrain.train._executor.epochs import Layer, ReadSettings, continue_layers, epoch_batches
from sparktrain.train._executor.spec import WorkerSpec

TRACE_ENV = "SPARKTRAIN_TRACE_ROWS"  # test hook: "column:directory" records the row ids each step trained
HEARTBEAT_S = 1.0


@dataclass
class Resume:
    """Where a launch continues (all defaults: a fresh run)."""

    epoch: int = 0
    layers: List[Layer] = field(default_factory=list)
    history: List[Dict[str, Any]] = field(default_factory=list)
    train_state: Optional[np.ndarray] = None
    state: Optional[bytes] = None
    global_batch: int = 0
    seq: int = 0
    best: Optional[Tuple[float, int]] = None
    world: Optional[int] = None  # ranks when the checkpoint was written
    shards: Optional[int] = None  # the run's sharding world size (see Loop)


class Loop:
    """One rank's bookkeeping around the framework's training step."""

    def __init__(self, spec: WorkerSpec, ctx: WorkerContext, allreduce: Callable[[np.ndarray], np.ndarray]) -> None:
        self.spec, self.ctx, self.allreduce = spec, ctx, allreduce
        self.world = ctx.world_size
        self.resume = self._load()
        configured = spec.batch_size * spec.num_workers
        self.global_batch = self.resume.global_batch or configured
        shards = self.resume.shards or self.world
        if spec.elastic_batch == "per_rank":
            self.batch = spec.batch_size
            self.learning_rate = spec.learning_rate * (self.batch * self.world) / self.global_batch
        else:  # keep the run's global batch: per-rank batch follows the world size
            self.batch = max(1, math.ceil(self.global_batch / self.world))
            self.learning_rate = spec.learning_rate
        if spec.elastic_batch == "global" and shards > self.world and shards % self.world == 0 \
                and self.global_batch % shards == 0:
            # Fewer ranks, a divisor of the run's: each takes over shards/world of the run's shards, so every
            # global batch holds the rows it had before (the uninterrupted run's order, this epoch and later).
            self.shards, self.shard_batch = shards, self.global_batch // shards
            self.batch = self.global_batch // self.world
        else:
            self.shards, self.shard_batch = self.world, self.batch
        self.settings = ReadSettings(seed=spec.seed, shuffle=True, shuffle_buffer=spec.shuffle_buffer)
        self.seq = self.resume.seq
        self.best = self.resume.best
        self._last_ckpt = time.monotonic()
        self._trace = _Trace.from_env(ctx, spec)
        self.beat = Heartbeat(ctx.reporter)
        if ctx.rank == 0:
            first = self.resume.state is None
            ctx.checkpointer.log_event("started" if first else "resumed", from_epoch=self.resume.epoch,
                                       from_step=self.resume.layers[-1].done if self.resume.layers else 0,
                                       attempt=ctx.attempt, world_size=self.world, batch_size=self.batch,
                                       learning_rate=self.learning_rate, global_batch=self.global_batch,
                                       shards=self.shards)
            last_world = self.resume.world if self.resume.layers else None
            if last_world is not None and last_world != self.world:
                ctx.reporter.send("world_size", epoch=self.resume.epoch, step=self.resume.layers[-1].done,
                                  old=last_world, new=self.world, batch_size=self.batch)

    # -- resume ---------------------------------------------------------------------------------------------

    def _load(self) -> Resume:
        latest = self.ctx.checkpointer.latest()
        if latest is None:
            return Resume()
        blob = pickle.loads(self.ctx.checkpointer.load(latest[1]))
        meta = blob["meta"]
        np.random.set_state(meta["rng"]["numpy"])
        random.setstate(meta["rng"]["python"])
        ts = meta.get("train_state")
        return Resume(epoch=meta["epoch"], layers=[Layer.from_dict(x) for x in meta["layers"]],
                      history=list(meta["history"]), train_state=None if ts is None else np.asarray(ts),
                      state=blob["state"], global_batch=int(meta["global_batch"]), seq=int(meta["seq"]) + 1,
                      best=tuple(meta["best"]) if meta.get("best") else None,  # type: ignore[arg-type]
                      world=int(meta["world"]), shards=int(meta.get("shards") or meta["world"]))

    def epoch_layers(self, epoch: int) -> List[Layer]:
        """This launch's layers for ``epoch`` (the checkpoint's progress only in the epoch it was taken)."""
        base = self.resume.layers if epoch == self.resume.epoch else []
        return continue_layers(base, self.shards, self.shard_batch)

    def start_state(self, epoch: int, task: str) -> np.ndarray:
        """The epoch's metric sums: the checkpoint's on rank 0 when resuming inside it, else zeros."""
        if epoch == self.resume.epoch and self.resume.train_state is not None and self.resume.layers \
                and self.ctx.rank == 0:
            return self.resume.train_state.copy()
        return M.new_state(task)

    def batches(self, epoch: int, layers: Sequence[Layer]):
        """``(steps, first step, iterator)`` of this rank's rest of ``epoch``.

        A rank standing in for several of the run's shards (see ``__init__``)
        trains, at each step, the concatenation of those shards' batches.
        """
        extra = [self._trace.column] if self._trace else []
        parts = [epoch_batches(self.spec.train_path, self.spec.inputs, layers, shard, epoch, self.settings,
                               extra=extra) for shard in range(self.ctx.rank, self.shards, self.world)]
        if len(parts) == 1:
            return parts[0]
        return parts[0][0], parts[0][1], _concat_batches([p[2] for p in parts])

    # -- per step -------------------------------------------------------------------------------------------

    def after_step(self, epoch: int, done: int, steps: int, window: np.ndarray, t0: float,
                   ids: Optional[np.ndarray], step_in_launch: int) -> Tuple[Optional[np.ndarray], bool]:
        """Call after every optimizer step (``done`` steps of this layer trained).

        Returns ``(the all-reduced [loss_sum, rows] window or None, checkpoint now?)``; the same on
        every rank.
        """
        now = time.monotonic()
        if self._trace:
            self._trace.write(epoch, done, ids)
        self.beat.progress(epoch, done, steps)
        spec = self.spec
        inside = done < steps
        every = spec.checkpoint_every_steps
        due = every is not None and inside and done % every == 0
        reduced = None
        if done % spec.log_every_steps == 0:
            timed = spec.checkpoint_every_s is not None and now - self._last_ckpt >= spec.checkpoint_every_s
            vec = self.allreduce(np.array([window[0], window[1], 1.0 if (timed and self.ctx.rank == 0) else 0.0]))
            reduced = vec[:2]
            due = due or (inside and vec[2] > 0)
            if self.ctx.rank == 0:
                elapsed = time.perf_counter() - t0
                self.ctx.reporter.send("step", epoch=epoch, step=done, steps=steps, world_size=self.world,
                                       metrics={"loss": vec[0] / max(vec[1], 1),
                                                "samples_per_s": step_in_launch * self.batch * self.world
                                                / max(elapsed, 1e-9)})
        return reduced, due

    # -- checkpoints ----------------------------------------------------------------------------------------

    def checkpoint(self, epoch: int, layers: Sequence[Layer], train_state: Optional[np.ndarray],
                   history: List[Dict[str, Any]], state_fn: Callable[[], bytes],
                   metrics: Optional[Dict[str, float]] = None) -> None:
        """Write a checkpoint (rank 0 only; every rank calls it: the metric sums are all-reduced first)."""
        reduced = self.allreduce(train_state) if train_state is not None else None
        if self.ctx.rank != 0:
            return
        if metrics is not None:
            monitored = metrics.get("val_loss", metrics.get("train_loss"))
            if monitored is not None and (self.best is None or monitored < self.best[0]):
                self.best = (float(monitored), self.seq)
        meta = {"epoch": epoch, "layers": [x.to_dict() for x in layers],
                "train_state": None if reduced is None else reduced.tolist(), "history": history,
                "rng": {"numpy": np.random.get_state(), "python": random.getstate()},
                "global_batch": self.global_batch, "seq": self.seq, "world": self.world, "shards": self.shards,
                "best": list(self.best) if self.best else None}
        cp = self.ctx.checkpointer
        _maybe_fail_in_checkpoint(self.ctx, epoch, layers)
        cp.save(self.seq, pickle.dumps({"meta": meta, "state": state_fn()}))
        cp.log_event("checkpoint", seq=self.seq, epoch=epoch, step=layers[-1].done if layers else 0,
                     world_size=self.world, attempt=self.ctx.attempt)
        cp.prune(self.spec.keep_checkpoints, self.best[1] if self.best else None)
        self.seq += 1
        self._last_ckpt = time.monotonic()

    def close(self) -> None:
        self.beat.close()
        if self._trace:
            self._trace.close()


def _concat_batches(iterators: Sequence[Any]) -> Any:
    """Step by step, the batches of several shards as one (arrays and row ids concatenated in shard order)."""
    for items in zip(*iterators):
        arrays = tuple(np.concatenate([it[0][i] for it in items]) for i in range(3))
        ids = None if items[0][1] is None else np.concatenate([it[1] for it in items])
        yield arrays, ids


class Heartbeat:
    """A thread that tells the driver, every second, where this rank is and since when.

    It keeps beating while the training thread is blocked (a stuck data
    source, a deadlock, a collective waiting for a peer), so the driver's
    watchdog can tell a rank that stopped making progress (``phase`` other
    than ``collective``) from the peers waiting for it.
    """

    def __init__(self, reporter: Any) -> None:
        import threading

        self.reporter = reporter
        self.epoch, self.step, self.steps = 0, 0, 0
        self.phase = "start"
        self.since = time.time()  # last progress
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sparktrain-heartbeat", daemon=True)
        self._thread.start()

    def progress(self, epoch: int, step: int, steps: int) -> None:
        self.epoch, self.step, self.steps, self.since = epoch, step, steps, time.time()

    def set_phase(self, phase: str) -> None:
        self.phase = phase

    def _run(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            self.reporter.send("heartbeat", epoch=self.epoch, step=self.step, steps=self.steps, phase=self.phase,
                               progress_time=self.since)

    def close(self) -> None:
        self._stop.set()


class _Trace:
    """Test hook: one JSON line per trained step with its row ids (``SPARKTRAIN_TRACE_ROWS=col:dir``)."""

    def __init__(self, column: str, folder: str, ctx: WorkerContext, spec: WorkerSpec) -> None:
        self.column = column
        os.makedirs(folder, exist_ok=True)
        name = f"{spec.run_id}-{spec.launch_id}-a{ctx.attempt}-w{ctx.world_size}-r{ctx.rank}-{os.getpid()}.jsonl"
        self.fh = open(os.path.join(folder, name), "a", buffering=1)
        self.ctx, self.launch = ctx, spec.launch_id

    @classmethod
    def from_env(cls, ctx: WorkerContext, spec: WorkerSpec) -> Optional["_Trace"]:
        value = os.environ.get(TRACE_ENV)
        if not value:
            return None
        column, _, folder = value.partition(":")
        return cls(column, folder, ctx, spec)

    def write(self, epoch: int, done: int, ids: Optional[np.ndarray]) -> None:
        rows = [] if ids is None else [int(i) for i in ids]
        self.fh.write(json.dumps({"launch": self.launch, "attempt": self.ctx.attempt,
                                  "world": self.ctx.world_size, "rank": self.ctx.rank,
                                  "epoch": epoch, "step": done, "t": time.time(), "ids": rows}) + "\n")

    def close(self) -> None:
        self.fh.close()


def _maybe_fail_in_checkpoint(ctx: WorkerContext, epoch: int, layers: Sequence[Layer]) -> None:
    """Test hook: ``SPARKTRAIN_FAULT_INJECT=0:E:S:ckpt`` dies while writing the checkpoint at (E, S)."""
    value = os.environ.get("SPARKTRAIN_FAULT_INJECT", "")
    parts = value.split(":")
    if len(parts) == 4 and parts[3] == "ckpt" and ctx.attempt == 0 and int(parts[0]) == ctx.rank:
        step = layers[-1].done if layers else 0
        if (int(parts[1]), int(parts[2])) == (epoch, step):
            store = ctx.checkpointer.store
            tmp = store.path(ctx.checkpointer.run_id, "checkpoints", ".tmp-dying")
            with store.fs.open_output_stream(tmp) as out:
                out.write(b"half a checkpoint")
            os._exit(3)
