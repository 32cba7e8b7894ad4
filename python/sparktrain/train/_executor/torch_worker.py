"""PyTorch data-parallel worker: DDP (gloo on CPU, nccl on GPU) or Horovod.

Runs inside one Spark barrier task.  Imports torch lazily so that importing
this module on the driver costs nothing.
"""

from __future__ import annotations

import io
import os
import random
import time
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from sparktrain.train._executor import metrics as M
from sparktrain.train._executor.batches import epoch_batches
from sparktrain.train._executor.collectives import Collectives, init_process_group, shutdown_process_group
from sparktrain.train._executor.context import WorkerContext, maybe_inject_fault
from sparktrain.train._executor.epochs import Layer, dummy_row
from sparktrain.train._executor.loop import Loop
from sparktrain.train._executor.spec import InputSpec, ModelSpec, WorkerSpec


def build_default_model(inputs: InputSpec, model: ModelSpec):
    """Embeddings for categorical indices + numerics -> MLP -> task head."""
    import torch
    from torch import nn

    class TabularNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embeddings = nn.ModuleList(
                [nn.Embedding(card, min(model.embedding_dim, card)) for _, card in inputs.categorical])
            width = len(inputs.numeric) + sum(min(model.embedding_dim, c) for _, c in inputs.categorical)
            layers: List[nn.Module] = []
            for units in model.hidden_units:
                layers += [nn.Linear(width, units), nn.ReLU()]
                if model.dropout > 0:
                    layers.append(nn.Dropout(model.dropout))
                width = units
            out = inputs.num_classes if inputs.task == "multiclass" else 1
            layers.append(nn.Linear(width, out))
            self.mlp = nn.Sequential(*layers)

        def forward(self, x_num, x_cat):
            parts = [x_num] + [emb(x_cat[:, i]) for i, emb in enumerate(self.embeddings)]
            return self.mlp(torch.cat(parts, dim=1))

    return TabularNet()


def make_model(inputs: InputSpec, model: ModelSpec, factory: Optional[bytes]):
    if factory:
        import cloudpickle
        return cloudpickle.loads(factory)(inputs, model)
    return build_default_model(inputs, model)


def make_loss(task: str, factory: Optional[bytes]) -> Callable:
    import torch.nn.functional as F

    if factory:
        import cloudpickle
        return cloudpickle.loads(factory)()
    if task == "binary":
        return lambda logits, y: F.binary_cross_entropy_with_logits(logits.reshape(-1), y)
    if task == "multiclass":
        return lambda logits, y: F.cross_entropy(logits, y)
    return lambda logits, y: F.mse_loss(logits.reshape(-1), y)


def to_prediction(logits, task: str):
    """Logits -> probability of the positive class / class probabilities / value."""
    import torch
    if task == "binary":
        return torch.sigmoid(logits.reshape(-1))
    if task == "multiclass":
        return torch.softmax(logits, dim=1)
    return logits.reshape(-1)


def train(spec: WorkerSpec, ctx: WorkerContext) -> Dict[str, Any]:
    """Train on this rank's shards; rank 0 writes the exported model to the store."""
    import torch

    torch.set_num_threads(max(1, int(os.environ.get("SPARKTRAIN_TORCH_THREADS", "1"))))
    device = _device(spec, ctx)
    coll = Collectives(spec.backend, ctx.world_size)
    _init_process_group(spec, ctx)
    torch.manual_seed(spec.seed)
    np.random.seed(spec.seed)
    random.seed(spec.seed)
    inputs = spec.inputs
    loop = Loop(spec, ctx, coll.allreduce_sum)
    model = make_model(inputs, spec.model, spec.model_factory).to(device)
    optimizer = _make_optimizer(spec, model, loop.learning_rate)
    loss_fn = make_loss(inputs.task, spec.loss_factory)
    history = loop.resume.history
    if loop.resume.state is not None:
        state = torch.load(io.BytesIO(loop.resume.state), map_location=device, weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        for group in optimizer.param_groups:  # an elastic resume may scale the learning rate
            group["lr"] = loop.learning_rate
        torch.set_rng_state(state["torch_rng"])

    def state_bytes() -> bytes:
        buf = io.BytesIO()
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "torch_rng": torch.get_rng_state()}, buf)
        return buf.getvalue()

    net = _wrap(spec, ctx, model, optimizer, device)
    for epoch in range(loop.resume.epoch, spec.epochs):
        layers = loop.epoch_layers(epoch)
        if ctx.rank == 0:
            ctx.checkpointer.log_event("epoch_started", epoch=epoch, attempt=ctx.attempt, step=layers[-1].done)
        t0 = time.perf_counter()
        steps, first, batches = loop.batches(epoch, layers)
        net.train()
        train_state = loop.start_state(epoch, inputs.task)
        window = np.zeros(2)
        for k, ((x_num, x_cat, y), ids) in enumerate(batches):
            done = first + k + 1
            loop.beat.set_phase("compute")
            maybe_inject_fault(ctx, epoch, first + k)
            weight = 1.0
            if len(y) == 0:  # nothing left on this rank (tiny elastic tail): a zero-weight step keeps DDP in step
                x_num, x_cat, y = dummy_row(x_num, x_cat, y)
                weight = 0.0
            xn, xc = torch.from_numpy(x_num).to(device), torch.from_numpy(x_cat).to(device)
            yt = torch.from_numpy(y).to(device)
            logits = net(xn, xc)
            loss = loss_fn(logits, yt) * weight
            optimizer.zero_grad()  # set_to_none by default; Horovod's wrapper takes no argument
            loop.beat.set_phase("collective")  # DDP all-reduces the gradients inside backward()
            loss.backward()
            optimizer.step()
            if weight:
                with torch.no_grad():
                    pred = to_prediction(logits, inputs.task).cpu().numpy()
                batch_loss = float(loss.detach()) * len(y)
                M.update(train_state, inputs.task, batch_loss, y, pred)
                window += (batch_loss, len(y))
            reduced, due = loop.after_step(epoch, done, steps, window, t0, ids, k + 1)
            if reduced is not None:
                window[:] = 0
            if due:
                now = [*layers[:-1], Layer(layers[-1].world, layers[-1].batch, done)]
                loop.checkpoint(epoch, now, train_state, history, state_bytes)
            loop.beat.set_phase("data")
        loop.beat.set_phase("collective")
        train_time = time.perf_counter() - t0
        metrics = M.finalize(coll.allreduce_sum(train_state), inputs.task, prefix="train_")
        if spec.val_path:
            metrics.update(evaluate(spec.val_path, net, inputs, spec, ctx, coll, device, prefix="val_"))
        metrics["samples_per_s"] = (steps - first) * loop.batch * ctx.world_size / max(train_time, 1e-9)
        metrics["epoch_time_s"] = time.perf_counter() - t0
        history.append({"epoch": epoch, **metrics})
        loop.checkpoint(epoch + 1, [], None, history, state_bytes, metrics=metrics)
        if ctx.rank == 0:
            ctx.checkpointer.log_event("epoch_finished", epoch=epoch, attempt=ctx.attempt, metrics=metrics)
            ctx.reporter.send("epoch", epoch=epoch, epochs=spec.epochs, metrics=metrics)
        _barrier(spec, ctx)

    result: Dict[str, Any] = {"history": history}
    if ctx.rank == 0:
        result["model_bytes"] = export_model(model, spec)
    result["param_digest"] = _param_digest(model)
    loop.close()
    _shutdown(spec, ctx)
    del net  # DDP's reducer owns the process group: it is destroyed here, while coll's buffers are still alive
    del coll
    return result


def evaluate(path: str, net, inputs: InputSpec, spec: WorkerSpec, ctx: WorkerContext, coll: Collectives,
             device, prefix: str) -> Dict[str, float]:
    """Loss/accuracy/AUC over this rank's shard of ``path``, all-reduced."""
    import torch

    loss_fn = make_loss(inputs.task, spec.loss_factory)
    state = M.new_state(inputs.task)
    net.eval()
    _, batches = epoch_batches(path, inputs, max(spec.batch_size, 4096), ctx.rank, ctx.world_size, 0,
                               spec.seed, shuffle=False)
    with torch.no_grad():
        for x_num, x_cat, y in batches:
            logits = net(torch.from_numpy(x_num).to(device), torch.from_numpy(x_cat).to(device))
            yt = torch.from_numpy(y).to(device)
            pred = to_prediction(logits, inputs.task).cpu().numpy()
            M.update(state, inputs.task, float(loss_fn(logits, yt)) * len(y), y, pred)
    return M.finalize(coll.allreduce_sum(state), inputs.task, prefix=prefix)


def export_model(model, spec: WorkerSpec) -> bytes:
    """Serialize the trained network: state_dict + how to rebuild it."""
    import torch
    buf = io.BytesIO()
    torch.save({"state_dict": {k: v.cpu() for k, v in model.state_dict().items()},
                "factory": spec.model_factory, "inputs": spec.inputs.to_dict(),
                "model": spec.model.to_dict()}, buf)
    return buf.getvalue()


def _param_digest(model) -> str:
    import hashlib
    h = hashlib.sha256()
    for _, v in sorted(model.state_dict().items()):
        h.update(v.detach().cpu().numpy().tobytes())
    return h.hexdigest()


def _device(spec: WorkerSpec, ctx: WorkerContext):
    import torch
    if spec.use_gpu and torch.cuda.is_available():
        gpus = ctx.gpu_addresses
        index = int(gpus[0]) if gpus else ctx.rank % torch.cuda.device_count()
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


def _init_process_group(spec: WorkerSpec, ctx: WorkerContext) -> None:
    if spec.backend == "horovod":
        import horovod.torch as hvd  # env set by horovod_rdzv in the barrier task
        hvd.init()
        return
    init_process_group(ctx, spec.stall_timeout_s, "nccl" if spec.use_gpu and _cuda() else "gloo")


def _cuda() -> bool:
    import torch
    return torch.cuda.is_available()


def _make_optimizer(spec: WorkerSpec, model, learning_rate: float):
    import torch
    if spec.optimizer_factory:
        import cloudpickle
        opt = cloudpickle.loads(spec.optimizer_factory)(model.parameters(), learning_rate)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=learning_rate)
    if spec.backend == "horovod":
        import horovod.torch as hvd
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    return opt


def _wrap(spec: WorkerSpec, ctx: WorkerContext, model, optimizer, device):
    if spec.backend == "horovod":
        import horovod.torch as hvd
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        return model
    if ctx.world_size == 1:
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP
    return DDP(model, device_ids=[device.index] if device.type == "cuda" else None)


def _barrier(spec: WorkerSpec, ctx: WorkerContext) -> None:
    if ctx.world_size == 1:
        return
    if spec.backend == "horovod":
        import horovod.torch as hvd
        hvd.join()
        return
    import torch.distributed as dist
    dist.barrier()


def _shutdown(spec: WorkerSpec, ctx: WorkerContext) -> None:
    """``barrier()`` then ``destroy_process_group()``: without it rank 0 may abort at exit."""
    if spec.backend == "horovod":
        import horovod.torch as hvd
        hvd.shutdown()
        return
    shutdown_process_group(ctx.world_size)
