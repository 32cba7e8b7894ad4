"""Keras 3 worker: a custom training loop under ``MultiWorkerMirroredStrategy``.

``model.fit`` under MWMS fails with Keras 3 (keras-team/keras#20585); a custom
loop with ``strategy.run`` keeps the weights identical on every worker.
Run as ``python -m sparktrain.train._executor.keras_worker ARGS.pkl OUT.pkl``.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import random
import sys
import tempfile
import time
import traceback
from typing import Any, Dict, List

import numpy as np

from sparktrain.train._executor import metrics as M
from sparktrain.train._executor.batches import epoch_batches
from sparktrain.train._executor.checkpoint import Checkpointer
from sparktrain.train._executor.context import WorkerContext, maybe_inject_fault
from sparktrain.train._executor.keras_model import build_default_model, make_loss, to_prediction_np
from sparktrain.train._executor.reporter import Reporter
from sparktrain.train._executor.spec import WorkerSpec


def train(spec: WorkerSpec, ctx: WorkerContext) -> Dict[str, Any]:
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.RING))
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
    global_batch = spec.batch_size * ctx.world_size
    n_cat = len(inputs.categorical)
    y_dtype = tf.int64 if inputs.task == "multiclass" else tf.float32
    sig = (tf.TensorSpec([None, len(inputs.numeric)], tf.float32), tf.TensorSpec([None, n_cat], tf.int64),
           tf.TensorSpec([None], y_dtype))

    def forward(x_num, x_cat, training):
        return model([x_num, *[x_cat[:, i:i + 1] for i in range(n_cat)]], training=training)

    def per_example_loss(y, logits):
        if inputs.task == "multiclass":
            return loss_obj(y, logits)
        return loss_obj(tf.reshape(y, [-1, 1]), logits)

    @tf.function(input_signature=sig)
    def train_step(x_num, x_cat, y):
        def step_fn(x_num, x_cat, y):
            with tf.GradientTape() as tape:
                logits = forward(x_num, x_cat, True)
                loss = tf.nn.compute_average_loss(per_example_loss(y, logits), global_batch_size=global_batch)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return tf.reduce_sum(per_example_loss(y, logits)), logits
        return strategy.run(step_fn, args=(x_num, x_cat, y))

    @tf.function
    def allreduce(vec):
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda v: tf.identity(v), args=(vec,)),
                               axis=None)

    def allreduce_np(vec: np.ndarray) -> np.ndarray:
        return allreduce(tf.constant(vec, dtype=tf.float64)).numpy()

    start_epoch, history = 0, []
    latest = ctx.checkpointer.latest()
    if latest is not None:
        state = pickle.loads(ctx.checkpointer.load(latest[1]))
        model.set_weights(state["weights"])
        for var, value in zip(optimizer.variables, state["optimizer"]):
            var.assign(value)
        np.random.set_state(state["rng"]["numpy"])
        random.setstate(state["rng"]["python"])
        start_epoch, history = state["epoch"] + 1, state["history"]
    if ctx.rank == 0:
        ctx.checkpointer.log_event("resumed" if latest else "started", from_epoch=start_epoch,
                                   attempt=ctx.attempt, world_size=ctx.world_size)

    for epoch in range(start_epoch, spec.epochs):
        if ctx.rank == 0:
            ctx.checkpointer.log_event("epoch_started", epoch=epoch, attempt=ctx.attempt)
        t0 = time.perf_counter()
        steps, batches = epoch_batches(spec.train_path, inputs, spec.batch_size, ctx.rank, ctx.world_size,
                                       epoch, spec.seed, shuffle=True, shuffle_buffer=spec.shuffle_buffer)
        state_vec = M.new_state(inputs.task)
        for step, (x_num, x_cat, y) in enumerate(batches):
            maybe_inject_fault(ctx, epoch, step)
            loss_sum, logits = train_step(x_num, x_cat, y)
            pred = to_prediction_np(np.asarray(logits), inputs.task)
            M.update(state_vec, inputs.task, float(loss_sum), y, pred)
            if (step + 1) % spec.log_every_steps == 0 and ctx.rank == 0:
                elapsed = time.perf_counter() - t0
                ctx.reporter.send("step", epoch=epoch, step=step + 1, steps=steps,
                                  metrics={"loss": state_vec[0] / max(state_vec[1], 1),
                                           "samples_per_s": (step + 1) * global_batch / max(elapsed, 1e-9)})
        train_time = time.perf_counter() - t0
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
        metrics["samples_per_s"] = steps * global_batch / max(train_time, 1e-9)
        metrics["epoch_time_s"] = time.perf_counter() - t0
        history.append({"epoch": epoch, **metrics})
        if ctx.rank == 0:
            payload = pickle.dumps({"epoch": epoch, "weights": model.get_weights(),
                                    "optimizer": [v.numpy() for v in optimizer.variables],
                                    "rng": {"numpy": np.random.get_state(), "python": random.getstate()},
                                    "cursor": {"epoch": epoch + 1, "batch_index": 0}, "history": history})
            ctx.checkpointer.save(epoch, payload)
            ctx.checkpointer.log_event("epoch_finished", epoch=epoch, attempt=ctx.attempt, metrics=metrics)
            ctx.reporter.send("epoch", epoch=epoch, epochs=spec.epochs, metrics=metrics)
        allreduce_np(np.zeros(1))  # barrier: nobody starts the next epoch before the checkpoint exists

    h = hashlib.sha256()
    for w in model.get_weights():
        h.update(np.ascontiguousarray(w).tobytes())
    result: Dict[str, Any] = {"history": history, "param_digest": h.hexdigest()}
    if ctx.rank == 0:
        result["model_bytes"] = export_model(model)
    return result


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
    ctx = WorkerContext(rank=args["rank"], world_size=args["world_size"], host=args["host"], master_host="",
                        master_port=0, aux_port=0, attempt=args["attempt"],
                        checkpointer=Checkpointer(spec.store, spec.run_id, spec.launch_id), reporter=reporter)
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
