"""The one training loop: epochs, steps, accumulation, validation, checkpoints, heartbeats, resume.

Frameworks plug in through a small :class:`Adapter` (torch DDP and Horovod in
``torch_worker``, Keras gloo and MWMS in ``keras_worker``): it builds the
network and optimizer, runs one optimizer step over a step's micro-batches,
evaluates a batch, and (de)serializes its state.  Everything else is here,
once: the order of rows and its sharding, gradient accumulation (a step of
``accumulate_steps`` micro-batches of ``batch_size`` rows; every counter,
checkpoint and progress report is in optimizer steps), the empty-batch step
that keeps ranks in step, fault hooks, heartbeats, metrics, mid-epoch and
end-of-epoch checkpoints, resume, and the per-step/epoch :class:`Hook` s
(``on_epoch`` may stop the run: what trial pruning uses).

A checkpoint is one sealed object (:mod:`sparktrain.data.sealed`) of JSON
``meta`` and ``state`` bytes, nothing pickled: ``state`` is the adapter's
serialization (model, optimizer, loss scaler, framework RNG: torch state dicts
loaded with ``weights_only=True``, Keras arrays as ``.npz`` without pickles),
``meta`` is the same for every framework:

``epoch``, ``layers``
    where training continues: the epoch and its progress
    (:class:`~sparktrain.train._executor.epochs.Layer` s; empty at an epoch's start).
``train_state``
    the all-reduced metric sums of that epoch so far (rank 0 restores them).
``history``, ``rng`` (numpy, Python), ``global_batch``, ``seq``, ``world``,
``shards`` (the world size whose sharding the run follows: after a shrink to a
divisor of it, each rank trains several of its shards).

Mid-epoch checkpoints happen every ``checkpoint_every_steps`` optimizer
steps, and/or when ``checkpoint_every_s`` passed on rank 0 (decided at the
periodic all-reduce, so every rank checkpoints at the same step).  Every
epoch ends with one.  Only rank 0 writes; the newest ``keep_checkpoints``
and the best epoch (lowest ``val_loss``, else ``train_loss``) are kept.  A
resume takes the newest checkpoint that passes its checks: a truncated one is
skipped with a warning, and rank 0's ``resumed`` event lists it.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from sparktrain.train._executor import batches as B
from sparktrain.train._executor import metrics as M
from sparktrain.train._executor.context import WorkerContext, maybe_inject_fault
from sparktrain.train._executor.epochs import Layer, ReadSettings, continue_layers, dummy_row, epoch_batches
from sparktrain.train._executor.spec import WorkerSpec

Arrays = Tuple[np.ndarray, np.ndarray, np.ndarray]  # (numeric float32, categorical int, label)

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


def _no_phase(phase: str) -> None:
    """:attr:`Adapter.set_phase` before :class:`Loop` gives the adapter its rank's heartbeat."""


class Adapter:
    """What a framework does for :class:`Loop` (torch DDP/Horovod, Keras gloo/MWMS).

    ``__init__`` starts the framework's collectives; :meth:`setup` builds the
    network and optimizer and restores ``loop.resume.state``.  The rest is
    called by :meth:`Loop.run` on every rank in the same order.  Inside
    :meth:`train_step` the adapter tells its heartbeat ``set_phase("compute")``
    while the rank runs its own network and ``set_phase("collective")`` from
    where it all-reduces, where it can tell them apart (the Loop's ``"step"``
    covers both otherwise): a rank stuck in its forward pass is then named, not
    its peers waiting for it.
    """

    set_phase = staticmethod(_no_phase)

    def allreduce(self, vec: np.ndarray) -> np.ndarray:
        """Sum ``vec`` (float64) over the ranks."""
        raise NotImplementedError

    def setup(self, loop: "Loop") -> None:
        """Build the network and optimizer (learning rate ``loop.learning_rate``); restore ``loop.resume.state``."""
        raise NotImplementedError

    def train_step(self, micros: Sequence[Arrays], weight: float,
                   after_micro: Callable[[int], None]) -> Tuple[float, np.ndarray]:
        """One optimizer step over a step's micro-batches; ``(loss sum over its rows, predictions)``.

        Gradients of all micro-batches are accumulated and all-reduced once.
        ``weight`` 0 is the empty step of a rank with no rows left (it must
        still take part in the collectives).  ``after_micro(i)`` is called
        after the ``i``-th (1-based) micro-batch's backward pass when there
        are several.
        """
        raise NotImplementedError

    def eval_step(self, x_num: np.ndarray, x_cat: np.ndarray, y: np.ndarray) -> Tuple[float, np.ndarray]:
        """``(loss sum, predictions)`` of one validation batch, in inference mode."""
        raise NotImplementedError

    def train_mode(self, training: bool) -> None:
        """Switch dropout and friends on or off."""

    def sync_state(self) -> None:
        """Make state the all-reduce does not cover equal on every rank (before a checkpoint, after an epoch)."""

    def state(self) -> bytes:
        """The framework's state (model, optimizer, scaler, RNG) for a checkpoint."""
        raise NotImplementedError

    def barrier(self) -> None:
        """Wait for every rank (after an epoch's checkpoint)."""
        self.allreduce(np.zeros(1))

    def export(self) -> bytes:
        """The trained network as the model bundle stores it (rank 0)."""
        raise NotImplementedError

    def digest(self) -> str:
        """SHA-256 of the weights (ranks must agree)."""
        raise NotImplementedError

    def close(self) -> None:
        """Tear the collectives down."""


class Hook:
    """Called by :meth:`Loop.run`: ``on_step`` on every rank, ``on_epoch`` on rank 0; subclass what you need."""

    def on_step(self, epoch: int, step: int, steps: int) -> None:
        """After each optimizer step (``step`` of ``steps`` done in this epoch)."""

    def on_epoch(self, epoch: int, metrics: Dict[str, float]) -> bool:
        """After each epoch's checkpoint; return True on rank 0 to stop the run (all ranks stop)."""
        return False


class Loop:
    """One rank's training loop around a framework :class:`Adapter`."""

    def __init__(self, spec: WorkerSpec, ctx: WorkerContext, allreduce: Callable[[np.ndarray], np.ndarray],
                 hooks: Sequence[Hook] = ()) -> None:
        self.spec, self.ctx, self.allreduce = spec, ctx, allreduce
        self.hooks = list(hooks)
        self.world = ctx.world_size
        self.resume = self._load()
        optim = spec.optim
        step_rows = optim.batch_size * optim.accumulate_steps  # rows per rank per optimizer step
        self.global_batch = self.resume.global_batch or step_rows * spec.num_workers
        shards = self.resume.shards or self.world
        if spec.failure.elastic_batch == "per_rank":
            self.batch = step_rows
            self.learning_rate = optim.learning_rate * (self.batch * self.world) / self.global_batch
        else:  # keep the run's global batch: per-rank batch follows the world size
            self.batch = max(1, math.ceil(self.global_batch / self.world))
            self.learning_rate = optim.learning_rate
        if spec.failure.elastic_batch == "global" and shards > self.world and shards % self.world == 0 \
                and self.global_batch % shards == 0:
            # Fewer ranks, a divisor of the run's: each takes over shards/world of the run's shards, so every
            # global batch holds the rows it had before (the uninterrupted run's order, this epoch and later).
            self.shards, self.shard_batch = shards, self.global_batch // shards
            self.batch = self.global_batch // self.world
        else:
            self.shards, self.shard_batch = self.world, self.batch
        self.settings = ReadSettings(seed=optim.seed, shuffle=True, shuffle_buffer=optim.shuffle_buffer)
        self.seq = self.resume.seq
        self.best = self.resume.best
        self._last_ckpt = time.monotonic()
        self._waited = 0.0
        self._trace = _Trace.from_env(ctx, spec)
        self.beat = Heartbeat(ctx.reporter)
        if ctx.rank == 0:
            first = self.resume.state is None
            self.log_event("started" if first else "resumed", from_epoch=self.resume.epoch,
                           from_step=self.resume.layers[-1].done if self.resume.layers else 0,
                           attempt=ctx.attempt, world_size=self.world, batch_size=self.batch,
                           learning_rate=self.learning_rate, global_batch=self.global_batch,
                           shards=self.shards, skipped_checkpoints=list(ctx.checkpointer.skipped))
            last_world = self.resume.world if self.resume.layers else None
            if last_world is not None and last_world != self.world:
                ctx.reporter.send("world_size", epoch=self.resume.epoch, step=self.resume.layers[-1].done,
                                  old=last_world, new=self.world, batch_size=self.batch)

    # -- the loop -------------------------------------------------------------------------------------------

    def run(self, adapter: Adapter) -> Dict[str, Any]:
        """Train the rest of the run; ``{"history", "param_digest"[, "model_bytes" on rank 0]}``."""
        adapter.set_phase = self.beat.set_phase  # type: ignore[method-assign]
        try:
            return self._train(adapter)
        finally:
            self.close()  # the heartbeat stops with the run, a failed one too (a reused gang trains on)

    def _train(self, adapter: Adapter) -> Dict[str, Any]:
        spec, ctx, task = self.spec, self.ctx, self.spec.inputs.task
        history = self.resume.history
        self.beat.set_phase("setup")  # the network (a model factory of the user's), a checkpoint to restore
        adapter.setup(self)
        for epoch in range(self.resume.epoch, spec.optim.epochs):
            self.beat.set_phase("data")  # its shard, then the first batch (a stuck read is this rank's own)
            layers = self.epoch_layers(epoch)
            if ctx.rank == 0:
                self.log_event("epoch_started", epoch=epoch, attempt=ctx.attempt, step=layers[-1].done)
            t0 = time.perf_counter()
            steps, first, batches = self.batches(epoch, layers)
            adapter.train_mode(True)
            train_state = self.start_state(epoch, task)
            restored = float(train_state[1])  # rows of this epoch trained before a resume (rank 0's sums)
            window = np.zeros(2)
            for k, ((x_num, x_cat, y), ids) in enumerate(_timed(batches, self._add_wait)):
                done = first + k + 1
                self.beat.set_phase("compute")
                maybe_inject_fault(ctx, epoch, first + k)
                weight = 1.0
                if len(y) == 0:  # nothing left on this rank (tiny elastic tail): a zero-weight step keeps ranks in step
                    x_num, x_cat, y = dummy_row(x_num, x_cat, y)
                    weight = 0.0
                self.beat.set_phase("step")  # forward, backward, the gradients' all-reduce (adapters refine it)
                loss_sum, pred = adapter.train_step(self.micro_batches(x_num, x_cat, y), weight,
                                                    functools.partial(_micro_fault, ctx, epoch, first + k))
                if weight:
                    M.update(train_state, task, loss_sum, y, pred)
                    window += (loss_sum, len(y))
                reduced, due = self.after_step(epoch, done, steps, window, t0, ids, k + 1)
                if reduced is not None:
                    window[:] = 0
                if due:
                    adapter.sync_state()
                    now = [*layers[:-1], Layer(layers[-1].world, layers[-1].batch, done)]
                    self.checkpoint(epoch, now, train_state, history, adapter.state)
                for hook in self.hooks:
                    hook.on_step(epoch, done, steps)
                self.beat.set_phase("data")
            self.beat.set_phase("collective")
            train_time = time.perf_counter() - t0
            adapter.sync_state()
            # one collective: the epoch's sums, then the rows restored from a checkpoint (rank 0's; 0 elsewhere)
            reduced = self.allreduce(np.append(train_state, restored))
            summed, restored_all = reduced[:-1], float(reduced[-1])
            metrics = M.finalize(summed, task, prefix="train_")
            if spec.val_path:
                metrics.update(self.validate(adapter, spec.val_path))
            waited, self._waited = self._waited, 0.0
            # rows trained on all ranks in this launch (a batch larger than the shard holds fewer than batch
            # rows), less those a resume inside the epoch restored with the sums
            trained = float(summed[1]) - restored_all
            metrics["samples_per_s"] = trained / max(train_time, 1e-9)
            metrics["input_wait_share"] = waited / max(train_time, 1e-9)  # rank 0's share of the epoch spent reading
            metrics["epoch_time_s"] = time.perf_counter() - t0
            history.append({"epoch": epoch, **metrics})
            self.checkpoint(epoch + 1, [], None, history, adapter.state, metrics=metrics)
            if ctx.rank == 0:
                self.log_event("epoch_finished", epoch=epoch, attempt=ctx.attempt, metrics=metrics)
                ctx.reporter.send("epoch", epoch=epoch, epochs=spec.optim.epochs, metrics=metrics)
            adapter.barrier()  # nobody starts the next epoch before the checkpoint exists
            if self._stop_after(epoch, metrics):
                break
        result: Dict[str, Any] = {"history": history, "param_digest": adapter.digest()}
        if ctx.rank == 0:
            result["model_bytes"] = adapter.export()
        self.close()
        adapter.close()
        return result

    def _add_wait(self, seconds: float) -> None:
        self._waited += seconds

    def micro_batches(self, x_num: np.ndarray, x_cat: np.ndarray, y: np.ndarray) -> List[Arrays]:
        """A step's rows as micro-batches of at most ``batch_size`` rows (one when not accumulating)."""
        size = self.spec.optim.batch_size
        n = len(y)
        if n <= size:
            return [(x_num, x_cat, y)]
        return [(x_num[i:i + size], x_cat[i:i + size], y[i:i + size]) for i in range(0, n, size)]

    def validate(self, adapter: Adapter, path: str) -> Dict[str, float]:
        """Loss and metrics over this rank's shard of ``path``, all-reduced (``val_`` prefix)."""
        spec, ctx, task = self.spec, self.ctx, self.spec.inputs.task
        state = M.new_state(task)
        adapter.train_mode(False)
        self.beat.set_phase("data")  # the reads and the forward passes are this rank's own, then one all-reduce
        _, batches = B.epoch_batches(path, spec.inputs, max(spec.optim.batch_size, 4096), ctx.rank, ctx.world_size,
                                     0, spec.optim.seed, shuffle=False)
        for x_num, x_cat, y in batches:
            loss_sum, pred = adapter.eval_step(x_num, x_cat, y)
            M.update(state, task, loss_sum, y, pred)
        self.beat.set_phase("collective")
        return M.finalize(self.allreduce(state), task, prefix="val_")

    def _stop_after(self, epoch: int, metrics: Dict[str, float]) -> bool:
        """Whether a hook asked to stop after ``epoch`` (rank 0 decides; every rank learns it)."""
        if not self.hooks:
            return False
        asked = self.ctx.rank == 0 and any([hook.on_epoch(epoch, metrics) for hook in self.hooks])
        return bool(self.allreduce(np.array([1.0 if asked else 0.0]))[0] > 0)

    # -- resume ---------------------------------------------------------------------------------------------

    def _load(self) -> Resume:
        latest = self.ctx.checkpointer.load_latest()
        if latest is None:
            return Resume()
        _, meta, state = latest
        _set_rng(meta["rng"])
        ts = meta.get("train_state")
        return Resume(epoch=meta["epoch"], layers=[Layer.from_dict(x) for x in meta["layers"]],
                      history=list(meta["history"]), train_state=None if ts is None else np.asarray(ts),
                      state=state, global_batch=int(meta["global_batch"]), seq=int(meta["seq"]) + 1,
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
        ckpt = self.spec.checkpoint
        inside = done < steps
        every = ckpt.checkpoint_every_steps
        due = every is not None and inside and done % every == 0
        reduced = None
        if done % self.spec.logging.log_every_steps == 0:
            timed = ckpt.checkpoint_every_s is not None and now - self._last_ckpt >= ckpt.checkpoint_every_s
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
                "rng": _get_rng(),
                "global_batch": self.global_batch, "seq": self.seq, "world": self.world, "shards": self.shards,
                "best": list(self.best) if self.best else None}
        cp = self.ctx.checkpointer
        state = state_fn()
        _maybe_fail_in_checkpoint(self.ctx, epoch, layers, self.seq, meta, state)
        with self.in_store("a write of checkpoint", self.seq):
            cp.save(self.seq, meta, state, keep=self.spec.checkpoint.keep_checkpoints,
                    best=self.best[1] if self.best else None)
        self.log_event("checkpoint", seq=self.seq, epoch=epoch, step=layers[-1].done if layers else 0,
                       world_size=self.world, attempt=self.ctx.attempt)
        self.seq += 1
        self._last_ckpt = time.monotonic()

    def in_store(self, what: str, detail: Any = "") -> "contextlib.AbstractContextManager[None]":
        """The heartbeat's phase while rank 0 waits on the store: a stuck store is named, not a collective."""
        from sparktrain._internal.secrets import mask_value

        where = mask_value(str(self.ctx.checkpointer.run.store_uri))
        return self.beat.during(f"{what}{f' {detail}' if detail != '' else ''} to the store {where}")

    def log_event(self, event: str, **fields: Any) -> None:
        """Append to the run's event log (rank 0), with the heartbeat saying so."""
        with self.in_store("a write of event", repr(event)):
            self.ctx.checkpointer.log_event(event, **fields)

    def close(self) -> None:
        self.beat.close()
        if self._trace:
            self._trace.close()


def _get_rng() -> Dict[str, Any]:
    """NumPy's and Python's global RNG states as JSON."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    return {"numpy": [name, [int(k) for k in keys], int(pos), int(has_gauss), float(cached)],
            "python": [version, list(internal), gauss_next]}


def _set_rng(rng: Dict[str, Any]) -> None:
    """Restore what :func:`_get_rng` returned."""
    name, keys, pos, has_gauss, cached = rng["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    version, internal, gauss_next = rng["python"]
    random.setstate((version, tuple(internal), gauss_next))


def _timed(items: Any, add: Callable[[float], None]) -> Any:
    """Yield from ``items``, adding the seconds each ``next`` took."""
    it = iter(items)
    while True:
        t = time.perf_counter()
        try:
            item = next(it)
        except StopIteration:
            return
        add(time.perf_counter() - t)
        yield item


def _micro_fault(ctx: WorkerContext, epoch: int, step: int, micro: int) -> None:
    maybe_inject_fault(ctx, epoch, step, micro=micro)


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

    @contextlib.contextmanager
    def during(self, phase: str) -> Iterator[None]:
        """``phase`` for the ``with`` block, then the phase before it again."""
        before, self.phase = self.phase, phase
        try:
            yield
        finally:
            self.phase = before

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


def _maybe_fail_in_checkpoint(ctx: WorkerContext, epoch: int, layers: Sequence[Layer], seq: int,
                              meta: Dict[str, Any], state: bytes) -> None:
    """Test hook: ``SPARKTRAIN_FAULT_INJECT=0:E:S:ckpt`` dies while writing the checkpoint at (E, S).

    ``...:torn`` instead leaves that checkpoint truncated under its final name (what a store without
    atomic writes, or a damaged disk, can leave), then dies.
    """
    value = os.environ.get("SPARKTRAIN_FAULT_INJECT", "")
    parts = value.split(":")
    if len(parts) == 4 and parts[3] in ("ckpt", "torn") and ctx.attempt == 0 and int(parts[0]) == ctx.rank:
        step = layers[-1].done if layers else 0
        if (int(parts[1]), int(parts[2])) == (epoch, step):
            from sparktrain.data.sealed import seal

            store = ctx.checkpointer.store
            if parts[3] == "torn":
                blob = seal(meta, state)
                path = store.path(ctx.checkpointer.run.checkpoint_rel(seq))
                data = blob[:len(blob) // 2]
            else:
                path, data = store.path(ctx.checkpointer.run_id, "checkpoints", ".tmp-dying"), b"half a checkpoint"
            with store.fs.open_output_stream(path) as out:
                out.write(data)
            os._exit(3)
