"""The collectives a worker loop needs, over ``torch.distributed`` (gloo/nccl) or Horovod.

Both frameworks use them: the torch worker for its metric sums (DDP does the
gradients), the Keras worker for its gradients too (``backend='gloo'``: one
flat gradient vector per step, all-reduced by gloo; see docs/training.md for
its speed against ``MultiWorkerMirroredStrategy``).  Imports torch lazily.
"""

from __future__ import annotations

from typing import Any, Dict, Tuple

import numpy as np

from sparktrain.train._executor.context import WorkerContext


_SETTLE_S = 0.25


#: how long a rank may take before its first step (Python worker, framework import, the model factory,
#: meeting its peers): the driver's watchdog allows ``max(stallTimeout, STARTUP_S)`` then
STARTUP_S = 120.0


def collective_timeout(stall_timeout_s: float) -> float:
    """The collectives' own timeout: a backstop after the driver's watchdog, start-up included
    (1.5 x max(stallTimeout, STARTUP_S) + 10 s), so that a rank stuck before its first step (in its model
    factory, say) is named by the watchdog, not by a peer's gloo timeout in DDP's first broadcast."""
    return 1.5 * max(stall_timeout_s, STARTUP_S) + 10.0


def init_process_group(ctx: WorkerContext, stall_timeout_s: float, backend: str = "gloo") -> None:
    """Join the run's process group through the rank-0 TCPStore (nothing to do for one rank).

    A rank that stops making progress fails its peers' collectives (gloo's
    default timeout is 30 min); the driver's watchdog
    (:mod:`sparktrain.train.watchdog`) names the stalled rank first, at ``stall_timeout_s``.
    """
    if ctx.world_size == 1:
        return
    from datetime import timedelta

    import torch.distributed as dist

    if ctx.keep_group and dist.is_initialized() and dist.get_world_size() == ctx.world_size:
        return  # a reused gang's group, still whole (the gang re-creates it after a failed trial)

    dist.init_process_group(backend, store=ctx.make_store(), rank=ctx.rank, world_size=ctx.world_size,
                            timeout=timedelta(seconds=collective_timeout(stall_timeout_s)))


def shutdown_process_group(world_size: int, keep: bool = False) -> None:
    """``barrier()``, a pause, then ``destroy_process_group()``: without it rank 0 may abort at exit.

    With ``keep`` (a reused gang) the group stays for the next trial, after the barrier.
    The pause lets gloo's threads destroy their finished work objects first.
    A barrier's work holds the collectives still queued when it was issued,
    and freeing their tensors takes the GIL; ``~ProcessGroupGloo`` joins those
    threads while the main thread holds it (through DDP's Reducer, or here).
    Without the pause both can wait forever: seen in a test run, the main
    thread in ``~ProcessGroupGloo`` joining, a gloo thread in
    ``~AsyncBarrierWork`` -> ``decref_pyobject`` waiting for the GIL.
    """
    if world_size == 1:
        return
    import time

    import torch.distributed as dist

    dist.barrier()
    if keep:  # a reused gang keeps its group for the next trial: every rank has left this one
        return
    time.sleep(_SETTLE_S)  # releases the GIL
    dist.destroy_process_group()


class Collectives:
    """Sum-all-reduce of numpy vectors for DDP (gloo) or Horovod.

    All-reduces go through buffers this object owns (one per length and
    dtype) and keeps until it is dropped, after the process group.  A tensor
    made for one call and dropped by Python while a gloo thread still holds
    the finished work would have its Python object freed by that thread, which
    needs the GIL; if the main thread is then destroying the process group
    (joining those threads, GIL held), both wait forever (seen once in a test
    run: the main thread in ``~ProcessGroupGloo`` joining, a gloo thread in
    ``~AsyncWork`` waiting for the GIL).
    """

    def __init__(self, backend: str, world_size: int) -> None:
        self.backend = backend
        self.world_size = world_size
        self._buffers: Dict[Tuple[int, str], Any] = {}

    def allreduce_sum(self, vec: np.ndarray, dtype: Any = np.float64) -> np.ndarray:
        """The element-wise sum of ``vec`` over all ranks (``vec`` itself for one rank)."""
        import torch

        if self.world_size == 1:
            return vec
        flat = np.ascontiguousarray(vec, dtype=dtype).reshape(-1)
        if self.backend == "horovod":
            import horovod.torch as hvd
            return hvd.allreduce(torch.from_numpy(flat), op=hvd.Sum).numpy().reshape(np.shape(vec))
        import torch.distributed as dist
        key = (flat.size, np.dtype(dtype).str)
        buf = self._buffers.get(key)
        if buf is None:
            buf = self._buffers[key] = torch.zeros(flat.size, dtype=getattr(torch, np.dtype(dtype).name))
        buf.copy_(torch.from_numpy(flat))
        dist.all_reduce(buf)
        return buf.numpy().copy().reshape(np.shape(vec))

    def broadcast(self, vec: np.ndarray, root: int = 0) -> np.ndarray:
        """Rank ``root``'s ``vec`` on every rank (gloo only)."""
        import torch
        import torch.distributed as dist

        if self.world_size == 1:
            return vec
        buf = torch.from_numpy(np.array(vec, copy=True).reshape(-1))
        self._buffers[(-buf.numel(), str(buf.dtype))] = buf  # kept alive with the others (see the class docstring)
        dist.broadcast(buf, src=root)
        return buf.numpy().copy().reshape(np.shape(vec))

