"""PyTorch data-parallel worker: DDP (gloo on CPU, nccl on GPU) or Horovod.

Runs inside one Spark barrier task.  Imports torch lazily so that importing
this module on the driver costs nothing.
"""

from __future__ import annotations

import contextlib
import io
import os
import random
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from sparktrain.train._executor.collectives import Collectives, init_process_group, shutdown_process_group
from sparktrain.train._executor.context import WorkerContext
from sparktrain.train._executor.loop import Adapter, Arrays, Hook, Loop
from sparktrain.train._executor.spec import FP16_ON_CPU, InputSpec, ModelSpec, WorkerSpec, bag_dim


def build_default_model(inputs: InputSpec, model: ModelSpec):
    """Embeddings for categorical indices, pooled embedding bags for token ids, numerics -> MLP -> task head.

    A bag (``inputs.bags``) is an ``nn.EmbeddingBag`` (``mode`` mean or sum)
    with ``padding_idx=0``, so padding takes no part in the pooling.
    """
    import torch
    from torch import nn

    cat_dims = [min(model.embedding_dim, card) for _, card in inputs.categorical]
    bag_dims = [bag_dim(model, rows) for _, _, rows, _ in inputs.bags]

    class TabularNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embeddings = nn.ModuleList(
                [nn.Embedding(card, d) for (_, card), d in zip(inputs.categorical, cat_dims)])
            self.bags = nn.ModuleList([nn.EmbeddingBag(rows, d, mode=mode, padding_idx=0)
                                       for (_, _, rows, mode), d in zip(inputs.bags, bag_dims)])
            self.n_cat = len(inputs.categorical)
            self.bag_slices = []
            start = self.n_cat
            for _, length, _, _ in inputs.bags:
                self.bag_slices.append((start, start + length))
                start += length
            width = inputs.numeric_width + sum(cat_dims) + sum(bag_dims)
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
            parts += [bag(x_cat[:, a:b]) for bag, (a, b) in zip(self.bags, self.bag_slices)]
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

        from sparktrain.train._executor.contract import torch_loss
        return torch_loss(cloudpickle.loads(factory)())
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


def train(spec: WorkerSpec, ctx: WorkerContext, hooks: Sequence[Hook] = ()) -> Dict[str, Any]:
    """Train on this rank's shards with :class:`~sparktrain.train._executor.loop.Loop`; rank 0 exports the model."""
    adapter: TorchAdapter = HorovodAdapter(spec, ctx) if spec.backend == "horovod" else TorchAdapter(spec, ctx)
    return Loop(spec, ctx, adapter.allreduce, hooks).run(adapter)


class TorchAdapter(Adapter):
    """PyTorch under DDP (gloo on CPU, nccl on CUDA); one process per rank.

    Mixed precision is ``torch.autocast`` (bf16 on CPU or CUDA; fp16 with a
    ``GradScaler`` on CUDA); gradient accumulation runs all micro-batches but
    the last under DDP's ``no_sync``, so gradients are all-reduced once per
    optimizer step.
    """

    _forward_phase = "compute"  # the heartbeat's phase in forward ("step" where DDP broadcasts buffers in it)

    def __init__(self, spec: WorkerSpec, ctx: WorkerContext) -> None:
        import torch

        self.spec, self.ctx = spec, ctx
        torch.set_num_threads(max(1, int(os.environ.get("SPARKTRAIN_TORCH_THREADS", "1"))))
        self.device = select_device(spec, ctx)
        self.coll = Collectives(spec.backend, ctx.world_size)
        self._init_collectives()
        torch.manual_seed(spec.optim.seed)
        np.random.seed(spec.optim.seed)
        random.seed(spec.optim.seed)
        self.task = spec.inputs.task
        self.amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(spec.optim.precision)
        self.scaler: Any = None  # torch.amp.GradScaler for fp16 on CUDA

    def allreduce(self, vec: np.ndarray) -> np.ndarray:
        return self.coll.allreduce_sum(vec)

    def _init_collectives(self) -> None:
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        init_process_group(self.ctx, self.spec.failure.stall_timeout_s, backend)

    def setup(self, loop: Loop) -> None:
        import torch

        spec = self.spec
        self.model = make_model(spec.inputs, spec.model, spec.model_factory).to(self.device)
        if spec.model_factory:  # on the rank's device, as training calls it
            from sparktrain.train._executor.contract import check_torch_model
            check_torch_model(self.model, spec.inputs)
        self.optimizer = self._optimizer(loop.learning_rate)
        self.loss_fn = make_loss(self.task, spec.loss_factory)
        if self.amp_dtype is torch.float16 and self.device.type != "cuda":
            from sparktrain.errors import ConfigError

            raise ConfigError("precision", "fp16", FP16_ON_CPU.format(why=f"it trains on {self.device.type}"),
                              kind="parameter")
        if self.amp_dtype is torch.float16:
            self.scaler = torch.amp.GradScaler("cuda")
        if loop.resume.state is not None:
            # tensors, numbers and containers only: a checkpoint cannot run code here
            state = torch.load(io.BytesIO(loop.resume.state), map_location=self.device, weights_only=True)
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            for group in self.optimizer.param_groups:  # an elastic resume may scale the learning rate
                group["lr"] = loop.learning_rate
            torch.set_rng_state(state["torch_rng"])
            if self.scaler is not None and state.get("scaler"):
                self.scaler.load_state_dict(state["scaler"])
        self.set_phase("collective")  # DDP (Horovod) broadcasts rank 0's weights: a peer still in setup is waited for
        self.net = self._wrap()
        # DDP broadcasts a network's buffers (BatchNorm's statistics) inside forward: a rank waiting there cannot
        # be told from one stuck in its own forward, so the phase says "step" (both), not "compute"
        buffers = getattr(self.net, "broadcast_buffers", False) and any(True for _ in self.model.buffers())
        self._forward_phase = "step" if buffers else "compute"

    def _optimizer(self, learning_rate: float):
        import torch

        if self.spec.optimizer_factory:
            import cloudpickle
            return cloudpickle.loads(self.spec.optimizer_factory)(self.model.parameters(), learning_rate)
        return torch.optim.Adam(self.model.parameters(), lr=learning_rate)

    def _wrap(self):
        if self.ctx.world_size == 1:
            return self.model
        from torch.nn.parallel import DistributedDataParallel as DDP
        return DDP(self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None)

    def _autocast(self):
        import torch
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.amp_dtype)

    def _tensors(self, x_num: np.ndarray, x_cat: np.ndarray, y: np.ndarray):
        import torch
        dev = self.device
        return torch.from_numpy(x_num).to(dev), torch.from_numpy(x_cat).to(dev), torch.from_numpy(y).to(dev)

    def _no_sync(self, last: bool):
        return self.net.no_sync() if not last and hasattr(self.net, "no_sync") else contextlib.nullcontext()

    def train_step(self, micros: Sequence[Arrays], weight: float,
                   after_micro: Callable[[int], None]) -> Tuple[float, np.ndarray]:
        import torch

        rows = sum(len(m[2]) for m in micros)
        self.optimizer.zero_grad()  # set_to_none by default; Horovod's wrapper takes no argument
        loss_sum, preds = 0.0, []
        for i, (x_num, x_cat, y) in enumerate(micros):
            xn, xc, yt = self._tensors(x_num, x_cat, y)
            last = i == len(micros) - 1
            with self._no_sync(last):  # DDP all-reduces in the last micro-batch's backward()
                self.set_phase(self._forward_phase)
                with self._autocast():
                    logits = self.net(xn, xc)
                    loss = self.loss_fn(logits, yt)
                scaled = loss * (len(y) / rows * weight)
                if last:
                    self.set_phase("collective")
                (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()
            loss_sum += float(loss.detach()) * len(y) * weight
            with torch.no_grad():
                preds.append(to_prediction(logits.detach().float(), self.task).cpu().numpy())
            if len(micros) > 1:
                after_micro(i + 1)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        return loss_sum, preds[0] if len(preds) == 1 else np.concatenate(preds)

    def eval_step(self, x_num: np.ndarray, x_cat: np.ndarray, y: np.ndarray) -> Tuple[float, np.ndarray]:
        import torch

        xn, xc, yt = self._tensors(x_num, x_cat, y)
        with torch.no_grad(), self._autocast():
            logits = self.net(xn, xc)
            loss = self.loss_fn(logits, yt)
        # detach: a network may return a view of a parameter, which requires grad even under no_grad
        return float(loss) * len(y), to_prediction(logits.detach().float(), self.task).cpu().numpy()

    def train_mode(self, training: bool) -> None:
        self.net.train(training)

    def state(self) -> bytes:
        import torch
        buf = io.BytesIO()
        torch.save({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                    "torch_rng": torch.get_rng_state(),
                    "scaler": self.scaler.state_dict() if self.scaler is not None else None}, buf)
        return buf.getvalue()

    def barrier(self) -> None:
        if self.ctx.world_size > 1:
            import torch.distributed as dist
            dist.barrier()

    def export(self) -> bytes:
        return export_model(self.model, self.spec)

    def digest(self) -> str:
        return _param_digest(self.model)

    def close(self) -> None:
        """``barrier()`` then ``destroy_process_group()``: without it rank 0 may abort at exit."""
        shutdown_process_group(self.ctx.world_size, keep=self.ctx.keep_group)
        del self.net  # DDP's reducer owns the process group: it goes here, while coll's buffers are still alive
        del self.coll


class HorovodAdapter(TorchAdapter):
    """PyTorch under Horovod (its env is set by ``horovod_rdzv`` in the barrier task)."""

    def _init_collectives(self) -> None:
        import horovod.torch as hvd
        hvd.init()

    def _optimizer(self, learning_rate: float):
        import horovod.torch as hvd
        return hvd.DistributedOptimizer(super()._optimizer(learning_rate),
                                        named_parameters=self.model.named_parameters())

    def _wrap(self):
        import horovod.torch as hvd
        hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(self.optimizer, root_rank=0)
        return self.model

    def barrier(self) -> None:
        if self.ctx.world_size > 1:
            import horovod.torch as hvd
            hvd.join()

    def close(self) -> None:
        import horovod.torch as hvd
        hvd.shutdown()


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


def select_device(spec: WorkerSpec, ctx: WorkerContext):
    """This rank's device: the GPU its task's resources name (never one picked by rank), else the CPU.

    The choice, the addresses and why is reported to the driver, which logs one line per rank.
    """
    import torch

    addresses = list(ctx.gpu_addresses)
    note = ""
    if spec.scaling.gpus_per_worker == 0:
        device, note = torch.device("cpu"), "no GPU requested"
    elif not torch.cuda.is_available():
        device, note = torch.device("cpu"), "CUDA is not available here: training on CPU"
    elif not addresses:
        device, note = torch.device("cpu"), ("the task was given no GPU address (Spark's task resources): "
                                             "training on CPU")
    else:
        index = int(addresses[0])
        if index >= torch.cuda.device_count():  # CUDA_VISIBLE_DEVICES already narrowed to this task's GPUs
            index = 0
        torch.cuda.set_device(index)
        device = torch.device("cuda", index)
    ctx.reporter.send("device", addresses=addresses, device=str(device), note=note)
    return device
