"""Keras 3 worker: a custom training loop, gradients all-reduced by gloo (or under MWMS).

``backend='gloo'`` (the default): every rank runs the same single-device
Keras model; each step computes the gradients in one ``tf.function``, packs
them into one flat vector, sums it over the ranks with ``torch.distributed``
(gloo, the rendezvous and collectives the torch path uses, confined to the
executor's address) from a ``numpy_function`` inside the same
``tf.function``, and applies it.  All ranks receive the same sum, so their
weights stay identical.  Embedding gradients are made dense first, for both
backends: left sparse (``IndexedSlices``), MWMS exchanged them outside its
packed all-reduce and Keras ran 6x slower than torch on the demo job
(docs/training.md).

``backend='mwms'``: the loop runs under ``MultiWorkerMirroredStrategy``
(``model.fit`` under MWMS fails with Keras 3, keras-team/keras#20585); its
gRPC servers listen on all interfaces.

Run as ``python -m sparktrain.train._executor.keras_worker ARGS.pkl OUT.pkl``.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import pickle
import socket
import sys
import tempfile
import traceback
from typing import Any, Callable, Dict, List, Sequence, Tuple

import numpy as np

from sparktrain._internal.secrets import mask_value
from sparktrain.train._executor.checkpoint import Checkpointer
from sparktrain.train._executor.collectives import Collectives, init_process_group, shutdown_process_group
from sparktrain.train._executor.context import WorkerContext
from sparktrain.train._executor.keras_model import build_default_model, make_loss, split_inputs, to_prediction_np
from sparktrain.train._executor.loop import Adapter, Arrays, Hook, Loop
from sparktrain.train._executor.reporter import Reporter
from sparktrain.train._executor.spec import WorkerSpec


def train(spec: WorkerSpec, ctx: WorkerContext, hooks: Sequence[Hook] = ()) -> Dict[str, Any]:
    """Train on this rank's shards with :class:`~sparktrain.train._executor.loop.Loop`; rank 0 exports the model."""
    adapter = MwmsAdapter(spec, ctx) if spec.backend == "mwms" else KerasAdapter(spec, ctx)
    return Loop(spec, ctx, adapter.allreduce, hooks).run(adapter)


class KerasAdapter(Adapter):
    """Keras 3 on TensorFlow, gradients summed over the ranks by gloo (``backend='gloo'``).

    Runs in the Spark task's own Python worker, so TensorFlow is imported once
    per worker.  Mixed precision is Keras' dtype policy (``mixed_bfloat16``,
    or ``mixed_float16`` with a ``LossScaleOptimizer``); the logits stay
    float32.  Accumulation sums each micro-batch's gradients on the host and
    all-reduces them once per optimizer step.
    """

    def __init__(self, spec: WorkerSpec, ctx: WorkerContext) -> None:
        import tensorflow as tf

        import keras

        self.spec, self.ctx, self.tf = spec, ctx, tf
        _configure_tf(tf, spec, ctx)  # before anything starts TensorFlow's runtime
        keras.backend.clear_session()  # this Python worker may have trained before
        keras.mixed_precision.set_dtype_policy(_POLICY[spec.optim.precision])
        keras.utils.set_random_seed(spec.optim.seed)  # before the Loop restores a checkpoint's RNG states
        self.coll = Collectives("ddp", ctx.world_size)
        self._init_collectives()
        self.task = spec.inputs.task

    def _init_collectives(self) -> None:
        init_process_group(self.ctx, self.spec.failure.stall_timeout_s)

    def allreduce(self, vec: np.ndarray) -> np.ndarray:
        return self.coll.allreduce_sum(vec)

    def _scope(self) -> Any:
        return contextlib.nullcontext()

    def setup(self, loop: Loop) -> None:
        import keras

        tf, spec = self.tf, self.spec
        with self._scope():
            if spec.model_factory:
                import cloudpickle

                from sparktrain.train._executor.contract import check_export, check_model
                self.model = cloudpickle.loads(spec.model_factory)(spec.inputs, spec.model)
                check_model(self.model, spec.inputs)  # builds a model without keras.Input before its weights sync
                if self.ctx.rank == 0:  # what scoring loads back, where the driver could not check it
                    check_export(self.model)
            else:
                self.model = build_default_model(spec.inputs, spec.model)
            if spec.optimizer_factory:
                import cloudpickle
                optimizer = cloudpickle.loads(spec.optimizer_factory)(loop.learning_rate)
            else:
                optimizer = keras.optimizers.Adam(learning_rate=loop.learning_rate)
            if spec.optim.precision == "fp16":
                optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
            self.optimizer = optimizer
            self.optimizer.build(self.model.trainable_variables)
        self.loss_obj = make_loss(self.task)
        self._summed = False
        if spec.loss_factory:
            import cloudpickle

            from sparktrain.train._executor.contract import check_loss
            self.loss_obj = cloudpickle.loads(spec.loss_factory)()
            self._summed = _reduction(self.loss_obj) == "sum"
            check_loss(lambda y, x: self.per_example_loss(tf.constant(y), tf.constant(x)), spec.inputs)
        self.n_cat = spec.inputs.cat_width
        y_dtype = tf.int64 if self.task == "multiclass" else tf.float32
        self.sig = (tf.TensorSpec([None, spec.inputs.numeric_width], tf.float32),
                    tf.TensorSpec([None, self.n_cat], tf.int64), tf.TensorSpec([None], y_dtype),
                    tf.TensorSpec([], tf.float32), tf.TensorSpec([], tf.float32))
        self._build_steps()
        self.set_phase("collective")  # rank 0's weights to every rank: a peer still in setup is waited for
        self._sync_initial()
        if loop.resume.state is not None:
            weights, opt_vars = load_state(loop.resume.state)
            self.model.set_weights(weights)
            for var, value in zip(self.optimizer.variables, opt_vars):
                var.assign(value)
        if loop.learning_rate != spec.optim.learning_rate:  # an elastic resume with elasticBatch='per_rank'
            self.optimizer.learning_rate.assign(loop.learning_rate)
        self.global_batch = tf.constant(float(loop.batch * self.ctx.world_size), tf.float32)

    # -- the compiled pieces ------------------------------------------------------------------------------

    def forward(self, x_num: Any, x_cat: Any, training: bool) -> Any:
        out = self.model(split_inputs(x_num, x_cat, self.spec.inputs), training=training)
        return self.tf.cast(out, self.tf.float32)

    def per_example_loss(self, y: Any, logits: Any) -> Any:
        """The loss of each row; a loss that gives one mean for the batch (Keras' default reduction,
        ``sum_over_batch_size``) counts as that mean for each row, so the sum over the ranks is the same."""
        tf = self.tf
        per = self.loss_obj(y if self.task == "multiclass" else tf.reshape(y, [-1, 1]), logits)
        if per.shape.rank == 0:
            rows = tf.shape(logits)[:1]
            if self._summed:  # reduction="sum": the batch's total, each row's share of it
                per = per / tf.cast(rows[0], per.dtype)
            per = tf.fill(rows, per)
        return per

    def loss_and_grads(self, x_num: Any, x_cat: Any, y: Any, weight: Any, global_batch: Any) -> Any:
        tf = self.tf
        variables = self.model.trainable_variables
        with tf.GradientTape() as tape:
            logits = self.forward(x_num, x_cat, True)
            per = self.per_example_loss(y, logits) * weight
            loss = tf.reduce_sum(per) / global_batch
            if isinstance(self.optimizer, _loss_scale_class()):
                loss = self.optimizer.scale_loss(loss)
        grads = tape.gradient(loss, variables)
        # Dense (sparse embedding gradients slowed MWMS 6x); a variable without a gradient is left out, as
        # Keras does (decided when the step is traced: the same on every rank).
        pairs = [(tf.convert_to_tensor(g), v) for g, v in zip(grads, variables) if g is not None]
        return pairs, tf.reduce_sum(per), logits

    def _build_steps(self) -> None:
        tf, coll, sig = self.tf, self.coll, self.sig
        layout: Dict[str, Any] = {}

        def flat_grads(*args: Any) -> Any:
            pairs, loss_sum, logits = self.loss_and_grads(*args)
            wide = any(g.dtype == tf.float64 for g, _ in pairs)
            layout.update(dtype=tf.float64 if wide else tf.float32, np_dtype=np.float64 if wide else np.float32,
                          shapes=[tuple(v.shape) for _, v in pairs], variables=[v for _, v in pairs])
            flat = tf.concat([tf.reshape(tf.cast(g, layout["dtype"]), [-1]) for g, _ in pairs], 0)
            return flat, loss_sum, logits

        def apply(flat: Any) -> None:
            parts = tf.split(flat, [int(np.prod(s)) for s in layout["shapes"]])
            self.optimizer.apply_gradients([(tf.cast(tf.reshape(p, s), v.dtype), v)
                                            for p, s, v in zip(parts, layout["shapes"], layout["variables"])])

        def summed(flat: Any) -> Any:
            if coll.world_size == 1:
                return flat
            total = tf.numpy_function(lambda a: coll.allreduce_sum(a, dtype=layout["np_dtype"]), [flat],
                                      layout["dtype"], stateful=True)
            total.set_shape(flat.shape)
            return total

        # autograph=False: no tensor-dependent Python control flow here, nothing for AutoGraph to convert
        @tf.function(input_signature=sig, autograph=False)
        def fused(*args: Any) -> Any:  # one micro-batch per step: gradients, their sum over the ranks, the update
            flat, loss_sum, logits = flat_grads(*args)
            apply(summed(flat))
            return loss_sum, logits

        self._fused = fused
        self._grads = tf.function(flat_grads, input_signature=sig, autograph=False)
        self._apply = tf.function(lambda flat: apply(summed(flat)), autograph=False)

    def _sync_initial(self) -> None:
        _sync_weights(self.model, self.coll)

    # -- the adapter ------------------------------------------------------------------------------------

    def train_step(self, micros: Sequence[Arrays], weight: float,
                   after_micro: Callable[[int], None]) -> Tuple[float, np.ndarray]:
        tf = self.tf
        w = tf.constant(weight, tf.float32)
        if len(micros) == 1:
            loss_sum, logits = self._fused(*micros[0], w, self.global_batch)
            return float(loss_sum) * weight, to_prediction_np(np.asarray(logits), self.task)
        total: Any = None
        loss, preds = 0.0, []
        for i, (x_num, x_cat, y) in enumerate(micros):
            self.set_phase("compute")
            flat, loss_sum, logits = self._grads(x_num, x_cat, y, w, self.global_batch)
            total = flat if total is None else total + flat
            loss += float(loss_sum) * weight
            preds.append(to_prediction_np(np.asarray(logits), self.task))
            after_micro(i + 1)
        self.set_phase("collective")  # the summed gradients' all-reduce, then the update
        self._apply(total)
        return loss, np.concatenate(preds)

    def eval_step(self, x_num: np.ndarray, x_cat: np.ndarray, y: np.ndarray) -> Tuple[float, np.ndarray]:
        logits = np.asarray(self.forward(x_num, x_cat, False))
        per = np.asarray(self.per_example_loss(y, logits))
        return float(per.sum()), to_prediction_np(logits, self.task)

    def sync_state(self) -> None:
        _average_non_trainable(self.model, self.coll)

    def state(self) -> bytes:
        return dump_state(self.model.get_weights(), [v.numpy() for v in self.optimizer.variables])

    def export(self) -> bytes:
        return export_model(self.model)

    def digest(self) -> str:
        h = hashlib.sha256()
        for w in self.model.get_weights():
            h.update(np.ascontiguousarray(w).tobytes())
        return h.hexdigest()

    def close(self) -> None:
        shutdown_process_group(self.ctx.world_size, keep=self.ctx.keep_group)


class MwmsAdapter(KerasAdapter):
    """Keras under ``MultiWorkerMirroredStrategy`` (``backend='mwms'``), in its own child process.

    TensorFlow's collective runtime is configured once per process, so the
    task starts a child for it (``keras_launch``); its gRPC servers listen on
    all interfaces.  ``model.fit`` under MWMS fails with Keras 3
    (keras-team/keras#20585): this is the same custom loop under the strategy.
    Accumulation is refused for it before launch (use ``gloo``).
    """

    def _init_collectives(self) -> None:
        tf = self.tf
        self.strategy = tf.distribute.MultiWorkerMirroredStrategy(  # all gradients in one packed all-reduce
            communication_options=tf.distribute.experimental.CommunicationOptions(
                bytes_per_pack=64 << 20,
                implementation=tf.distribute.experimental.CommunicationImplementation.RING))

        @tf.function
        def reduce(vec: Any) -> Any:
            replica = self.strategy.run(lambda v: tf.identity(v), args=(vec,))
            return self.strategy.reduce(tf.distribute.ReduceOp.SUM, replica, axis=None)
        self._reduce = reduce

    def allreduce(self, vec: np.ndarray) -> np.ndarray:
        return self._reduce(self.tf.constant(vec, dtype=self.tf.float64)).numpy()

    def _scope(self) -> Any:
        return self.strategy.scope()

    def _build_steps(self) -> None:
        strategy = self.strategy

        def step_fn(*args: Any) -> Any:
            pairs, loss_sum, logits = self.loss_and_grads(*args)
            self.optimizer.apply_gradients(pairs)  # the strategy all-reduces them
            return loss_sum, logits

        self._fused = self.tf.function(lambda *args: strategy.run(step_fn, args=args), input_signature=self.sig,
                                       autograph=False)

    def _sync_initial(self) -> None:
        """The strategy's variables start equal on every worker."""

    def sync_state(self) -> None:
        """MWMS aggregates non-trainable statistics itself."""

    def close(self) -> None:
        """The child process exits after the fit; nothing to tear down."""


_POLICY = {"fp32": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}


def _reduction(loss: Any) -> str:
    """A Keras loss object's ``reduction`` ("" for a plain function, which is taken as a mean or per row)."""
    try:
        return str((loss.get_config() or {}).get("reduction") or "") if hasattr(loss, "get_config") else ""
    except Exception:  # noqa: BLE001 - a loss without a readable config
        return ""


def _loss_scale_class() -> Any:
    import keras
    return keras.optimizers.LossScaleOptimizer


def _configure_tf(tf: Any, spec: WorkerSpec, ctx: WorkerContext) -> None:
    """Threads and visible GPUs, before TensorFlow's runtime starts (a reused worker keeps the first setting)."""
    # One intra-op thread per worker by default, as for torch: N workers on N cores otherwise fight for them.
    threads = max(1, int(os.environ.get("SPARKTRAIN_TF_THREADS", os.environ.get("SPARKTRAIN_TORCH_THREADS", "1"))))
    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(max(2, threads))
    except RuntimeError:  # already initialized in this Python worker
        pass
    gpus = tf.config.list_physical_devices("GPU")
    wanted = set(ctx.gpu_addresses) if spec.scaling.gpus_per_worker else set()
    chosen = [g for g in gpus if g.name.rsplit(":", 1)[-1] in wanted]
    note = ""
    if not spec.scaling.gpus_per_worker:
        note = "no GPU requested"
    elif not gpus:
        note = "TensorFlow sees no GPU here: training on CPU"
    elif not chosen:
        note = "the task was given no GPU address TensorFlow knows: training on CPU"
    try:
        tf.config.set_visible_devices(chosen, "GPU")
    except (RuntimeError, ValueError):  # the runtime is already up: keep what it has
        pass
    device = f"GPU:{','.join(g.name.rsplit(':', 1)[-1] for g in chosen)}" if chosen else "cpu"
    ctx.reporter.send("device", addresses=list(ctx.gpu_addresses), device=device, note=note)
    if spec.optim.precision == "fp16" and not chosen:
        from sparktrain.errors import ConfigError
        from sparktrain.train._executor.spec import FP16_ON_CPU

        raise ConfigError("precision", "fp16", FP16_ON_CPU.format(why=note or "no GPU"), kind="parameter")


def _average_non_trainable(model: Any, coll: Collectives) -> None:
    """Average the float non-trainable variables (e.g. BatchNorm's moving statistics) over the ranks.

    Under gloo only the gradients are summed: statistics a layer updates in
    its forward pass would drift apart per rank.  Called on every rank before
    a checkpoint and at the end of the fit, so what rank 0 saves holds all
    ranks' statistics (MWMS aggregates them itself).
    """
    if coll.world_size == 1:
        return
    floats = [v for v in model.non_trainable_variables if str(v.dtype).startswith("float")]
    if not floats:
        return
    values = [np.asarray(v.numpy(), dtype=np.float64) for v in floats]
    flat = coll.allreduce_sum(np.concatenate([x.reshape(-1) for x in values])) / coll.world_size
    pos = 0
    for v, x in zip(floats, values):
        v.assign(flat[pos:pos + x.size].reshape(x.shape).astype(str(v.dtype)))
        pos += x.size


def _sync_weights(model: Any, coll: Collectives) -> None:
    """Rank 0's initial weights on every rank (a user's model factory may not be seeded)."""
    if coll.world_size == 1:
        return
    weights = model.get_weights()
    flat = coll.broadcast(np.concatenate([np.asarray(w, dtype=np.float64).reshape(-1) for w in weights]))
    out, pos = [], 0
    for w in weights:
        out.append(flat[pos:pos + w.size].reshape(w.shape).astype(w.dtype))
        pos += w.size
    model.set_weights(out)


def dump_state(weights: Sequence[np.ndarray], optimizer: Sequence[np.ndarray]) -> bytes:
    """The network's weights and the optimizer's variables as one ``.npz`` (no pickles: plain arrays)."""
    arrays = {f"w{i:05d}": np.asarray(w) for i, w in enumerate(weights)}
    arrays.update({f"o{i:05d}": np.asarray(v) for i, v in enumerate(optimizer)})
    buf = io.BytesIO()
    np.savez(buf, **arrays)  # type: ignore[arg-type]
    return buf.getvalue()


def load_state(blob: bytes) -> Tuple[List[np.ndarray], List[np.ndarray]]:
    """``(weights, optimizer variables)`` from :func:`dump_state` (``allow_pickle=False``: nothing runs)."""
    with np.load(io.BytesIO(blob), allow_pickle=False) as npz:
        names = sorted(npz.files)
        return ([npz[n] for n in names if n.startswith("w")], [npz[n] for n in names if n.startswith("o")])


def export_model(model) -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.keras")
        model.save(path)
        with open(path, "rb") as fh:
            return fh.read()


def main(argv: List[str]) -> int:
    args_path, out_path = argv[1], argv[2]
    with open(args_path, "rb") as fh:
        args = pickle.load(fh)
    spec: WorkerSpec = args["spec"]
    reporter = Reporter(spec.progress_address, args["rank"], args["host"], spec.token, run=spec.run_id)
    fd = args.get("listen_fd")
    ctx = WorkerContext(rank=args["rank"], world_size=args["world_size"], host=args["host"],
                        master_host=args.get("master_host", ""), master_port=int(args.get("master_port") or 0),
                        aux_port=0, attempt=args["attempt"],
                        checkpointer=Checkpointer(spec.store, spec.run_id, spec.launch_id), reporter=reporter,
                        listen_sock=socket.socket(fileno=fd) if fd is not None else None)
    try:
        result = train(spec, ctx)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent task
        result = {"error": mask_value(f"{type(exc).__name__}: {exc}"), "traceback": mask_value(traceback.format_exc())}
    finally:
        reporter.close()
    buf = io.BytesIO()
    pickle.dump(result, buf)
    with open(out_path, "wb") as fh:
        fh.write(buf.getvalue())
    sys.stdout.flush()
    # Skip interpreter teardown: TF's collective threads can hang at exit.
    os._exit(0 if "error" not in result else 1)


if __name__ == "__main__":
    main(sys.argv)
