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

import hashlib
import io
import os
import pickle
import socket
import sys
import tempfile
import time
import traceback
from typing import Any, Callable, Dict, List

import numpy as np

from sparktrain.train._executor import metrics as M
from sparktrain.train._executor.batches import epoch_batches
from sparktrain.train._executor.checkpoint import Checkpointer
from sparktrain.train._executor.collectives import Collectives, init_process_group, shutdown_process_group
from sparktrain.train._executor.context import WorkerContext, maybe_inject_fault
from sparktrain.train._executor.epochs import Layer, dummy_row
from sparktrain.train._executor.loop import Loop
from sparktrain.train._executor.keras_model import build_default_model, make_loss, to_prediction_np
from sparktrain.train._executor.reporter import Reporter
from sparktrain.train._executor.spec import WorkerSpec


def train(spec: WorkerSpec, ctx: WorkerContext) -> Dict[str, Any]:
    import tensorflow as tf

    # One intra-op thread per worker by default, as for torch: N workers on N cores otherwise fight for them.
    threads = max(1, int(os.environ.get("SPARKTRAIN_TF_THREADS", os.environ.get("SPARKTRAIN_TORCH_THREADS", "1"))))
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(max(2, threads))
    mwms = spec.backend == "mwms"
    if mwms:  # all gradients in one all-reduce per step (packed), not one per variable
        strategy = tf.distribute.MultiWorkerMirroredStrategy(
            communication_options=tf.distribute.experimental.CommunicationOptions(
                bytes_per_pack=64 << 20,
                implementation=tf.distribute.experimental.CommunicationImplementation.RING))
    else:
        strategy = tf.distribute.get_strategy()  # the default: one device, no cross-worker ops
        init_process_group(ctx, spec.stall_timeout_s)
    coll = Collectives("ddp", ctx.world_size)
    import keras

    keras.utils.set_random_seed(spec.seed)
    inputs = spec.inputs
    with strategy.scope():
        if spec.model_factory:
            import cloudpickle
            model = cloudpickle.loads(spec.model_factory)(inputs, spec.model)
        else:
            model = build_default_model(inputs, spec.model)
        if spec.optimizer_factory:
            import cloudpickle
            optimizer = cloudpickle.loads(spec.optimizer_factory)(spec.learning_rate)
        else:
            optimizer = keras.optimizers.Adam(learning_rate=spec.learning_rate)
        optimizer.build(model.trainable_variables)
    loss_obj = make_loss(inputs.task)
    if spec.loss_factory:
        import cloudpickle
        loss_obj = cloudpickle.loads(spec.loss_factory)()
    n_cat = len(inputs.categorical)
    y_dtype = tf.int64 if inputs.task == "multiclass" else tf.float32
    sig = (tf.TensorSpec([None, len(inputs.numeric)], tf.float32), tf.TensorSpec([None, n_cat], tf.int64),
           tf.TensorSpec([None], y_dtype), tf.TensorSpec([], tf.float32), tf.TensorSpec([], tf.float32))

    def forward(x_num, x_cat, training):
        return model([x_num, *[x_cat[:, i:i + 1] for i in range(n_cat)]], training=training)

    def per_example_loss(y, logits):
        if inputs.task == "multiclass":
            return loss_obj(y, logits)
        return loss_obj(tf.reshape(y, [-1, 1]), logits)

    variables = model.trainable_variables

    def loss_and_grads(x_num, x_cat, y, weight, global_batch):
        with tf.GradientTape() as tape:
            logits = forward(x_num, x_cat, True)
            per = per_example_loss(y, logits) * weight
            loss = tf.reduce_sum(per) / global_batch
        grads = tape.gradient(loss, variables)
        # Dense (sparse embedding gradients slowed MWMS 6x); a variable without a gradient is left out, as
        # Keras does (decided when the step is traced: the same on every rank).
        pairs = [(tf.convert_to_tensor(g), v) for g, v in zip(grads, variables) if g is not None]
        return pairs, tf.reduce_sum(per), logits

    if mwms:
        @tf.function(input_signature=sig)
        def train_step(x_num, x_cat, y, weight, global_batch):
            def step_fn(*args):
                pairs, loss_sum, logits = loss_and_grads(*args)
                optimizer.apply_gradients(pairs)
                return loss_sum, logits
            return strategy.run(step_fn, args=(x_num, x_cat, y, weight, global_batch))

        @tf.function
        def allreduce(vec):
            return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda v: tf.identity(v), args=(vec,)),
                                   axis=None)

        def allreduce_np(vec: np.ndarray) -> np.ndarray:
            return allreduce(tf.constant(vec, dtype=tf.float64)).numpy()
    else:
        train_step = _gloo_step(tf, sig, loss_and_grads, optimizer, coll)
        allreduce_np = coll.allreduce_sum
        _sync_weights(model, coll)

    loop = Loop(spec, ctx, allreduce_np)
    history = loop.resume.history
    if loop.resume.state is not None:
        state = pickle.loads(loop.resume.state)
        model.set_weights(state["weights"])
        for var, value in zip(optimizer.variables, state["optimizer"]):
            var.assign(value)
    if loop.learning_rate != spec.learning_rate:  # an elastic resume with elasticBatch='per_rank'
        optimizer.learning_rate.assign(loop.learning_rate)

    def state_bytes() -> bytes:
        return pickle.dumps({"weights": model.get_weights(), "optimizer": [v.numpy() for v in optimizer.variables]})

    for epoch in range(loop.resume.epoch, spec.epochs):
        layers = loop.epoch_layers(epoch)
        global_batch = tf.constant(float(loop.batch * ctx.world_size), tf.float32)
        if ctx.rank == 0:
            ctx.checkpointer.log_event("epoch_started", epoch=epoch, attempt=ctx.attempt, step=layers[-1].done)
        t0 = time.perf_counter()
        steps, first, batches = loop.batches(epoch, layers)
        state_vec = loop.start_state(epoch, inputs.task)
        window = np.zeros(2)
        for k, ((x_num, x_cat, y), ids) in enumerate(batches):
            done = first + k + 1
            loop.beat.set_phase("compute")
            maybe_inject_fault(ctx, epoch, first + k)
            weight = 1.0
            if len(y) == 0:  # nothing left on this rank (tiny elastic tail): a zero-weight step keeps ranks in step
                x_num, x_cat, y = dummy_row(x_num, x_cat, y)
                weight = 0.0
            loop.beat.set_phase("collective")  # the step all-reduces the gradients
            loss_sum, logits = train_step(x_num, x_cat, y, tf.constant(weight, tf.float32), global_batch)
            if weight:
                pred = to_prediction_np(np.asarray(logits), inputs.task)
                M.update(state_vec, inputs.task, float(loss_sum), y, pred)
                window += (float(loss_sum), len(y))
            reduced, due = loop.after_step(epoch, done, steps, window, t0, ids, k + 1)
            if reduced is not None:
                window[:] = 0
            if due:
                if not mwms:
                    _average_non_trainable(model, coll)
                now = [*layers[:-1], Layer(layers[-1].world, layers[-1].batch, done)]
                loop.checkpoint(epoch, now, state_vec, history, state_bytes)
            loop.beat.set_phase("data")
        loop.beat.set_phase("collective")
        train_time = time.perf_counter() - t0
        if not mwms:
            _average_non_trainable(model, coll)
        metrics = M.finalize(allreduce_np(state_vec), inputs.task, prefix="train_")
        if spec.val_path:
            val = M.new_state(inputs.task)
            _, vb = epoch_batches(spec.val_path, inputs, max(spec.batch_size, 4096), ctx.rank, ctx.world_size,
                                  0, spec.seed, shuffle=False)
            for x_num, x_cat, y in vb:
                logits = np.asarray(forward(x_num, x_cat, False))
                per = np.asarray(per_example_loss(y, logits))
                M.update(val, inputs.task, float(per.sum()), y, to_prediction_np(logits, inputs.task))
            metrics.update(M.finalize(allreduce_np(val), inputs.task, prefix="val_"))
        metrics["samples_per_s"] = (steps - first) * loop.batch * ctx.world_size / max(train_time, 1e-9)
        metrics["epoch_time_s"] = time.perf_counter() - t0
        history.append({"epoch": epoch, **metrics})
        loop.checkpoint(epoch + 1, [], None, history, state_bytes, metrics=metrics)
        if ctx.rank == 0:
            ctx.checkpointer.log_event("epoch_finished", epoch=epoch, attempt=ctx.attempt, metrics=metrics)
            ctx.reporter.send("epoch", epoch=epoch, epochs=spec.epochs, metrics=metrics)
        allreduce_np(np.zeros(1))  # barrier: nobody starts the next epoch before the checkpoint exists
    loop.close()

    h = hashlib.sha256()
    for w in model.get_weights():
        h.update(np.ascontiguousarray(w).tobytes())
    result: Dict[str, Any] = {"history": history, "param_digest": h.hexdigest()}
    if ctx.rank == 0:
        result["model_bytes"] = export_model(model)
    if not mwms:
        shutdown_process_group(ctx.world_size)
    return result


def _gloo_step(tf: Any, sig: Any, loss_and_grads: Callable, optimizer: Any, coll: Collectives) -> Callable:
    """The training step, one ``tf.function``: gradients, their sum over the ranks by gloo, the update.

    All gradients go as one flat vector (float64 if any variable is, else
    float32) through ``coll`` (a ``numpy_function`` inside the graph); the
    loss is already divided by the global batch, so the sum is the global
    batch's gradient.  One rank: no all-reduce.
    """
    if coll.world_size == 1:
        @tf.function(input_signature=sig)
        def local_step(*args):
            pairs, loss_sum, logits = loss_and_grads(*args)
            optimizer.apply_gradients(pairs)
            return loss_sum, logits
        return local_step

    @tf.function(input_signature=sig)
    def step(*args):
        pairs, loss_sum, logits = loss_and_grads(*args)
        wide = any(g.dtype == tf.float64 for g, _ in pairs)
        dtype, np_dtype = (tf.float64, np.float64) if wide else (tf.float32, np.float32)
        shapes = [tuple(v.shape) for _, v in pairs]
        sizes = [int(np.prod(s)) for s in shapes]
        flat = tf.concat([tf.reshape(tf.cast(g, dtype), [-1]) for g, _ in pairs], 0)
        total = tf.numpy_function(lambda a: coll.allreduce_sum(a, dtype=np_dtype), [flat], dtype, stateful=True)
        total.set_shape(flat.shape)
        parts = tf.split(total, sizes)
        optimizer.apply_gradients([(tf.cast(tf.reshape(p, s), v.dtype), v)
                                   for p, s, (_, v) in zip(parts, shapes, pairs)])
        return loss_sum, logits

    return step


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
    reporter = Reporter(spec.progress_address, args["rank"], args["host"], spec.token)
    fd = args.get("listen_fd")
    ctx = WorkerContext(rank=args["rank"], world_size=args["world_size"], host=args["host"],
                        master_host=args.get("master_host", ""), master_port=int(args.get("master_port") or 0),
                        aux_port=0, attempt=args["attempt"],
                        checkpointer=Checkpointer(spec.store, spec.run_id, spec.launch_id), reporter=reporter,
                        listen_sock=socket.socket(fileno=fd) if fd is not None else None)
    try:
        result = train(spec, ctx)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent task
        result = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
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
