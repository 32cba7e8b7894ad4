"""What a training worker knows about its place in the job (rank, peers, store, channel)."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from typing import List, Optional

from sparktrain.train._executor.checkpoint import Checkpointer
from sparktrain.train._executor.reporter import Reporter

FAULT_ENV = "SPARKTRAIN_FAULT_INJECT"


@dataclass
class WorkerContext:
    """Per-rank facts gathered in the barrier task (mutable: it holds live sockets)."""

    rank: int
    world_size: int
    host: str
    master_host: str
    master_port: int
    aux_port: int
    attempt: int
    checkpointer: Checkpointer
    reporter: Reporter
    local_rank: int = 0
    local_size: int = 1
    listen_sock: Optional[socket.socket] = None
    gpu_addresses: List[str] = field(default_factory=list)
    keep_group: bool = False  # a reused gang: the process group outlives the run (see collectives)

    def make_store(self):
        """The rendezvous TCPStore; rank 0's server listens on its own address only."""
        from sparktrain.train._executor.rendezvous import make_tcp_store
        return make_tcp_store(self.master_host, self.master_port, self.world_size, self.rank == 0,
                              listen_sock=self.listen_sock)


def maybe_inject_fault(ctx: WorkerContext, epoch: int, step: int, micro: Optional[int] = None) -> None:
    """Test hook: ``SPARKTRAIN_FAULT_INJECT=rank:epoch:step[:kind]`` fails that rank (``*``: every rank) there.

    ``kind`` is ``exit`` (``os._exit(3)``: a crashed worker, only on the
    stage's first attempt, so a retried stage succeeds), ``raise`` (a Python
    exception on every attempt, like a bug in user code), ``hang`` (the rank
    blocks for good, like a stuck data source) or ``ckpt`` (dies while writing
    the checkpoint of that step, see ``loop._maybe_fail_in_checkpoint``) or ``micro`` (``os._exit(3)``
    after the step's first micro-batch, mid-accumulation; called with ``micro`` by the adapters).
    """
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    parts = spec.split(":")
    rank, f_epoch, f_step = (-1 if parts[0] == "*" else int(parts[0])), int(parts[1]), int(parts[2])
    kind = parts[3] if len(parts) > 3 else "exit"
    if kind in ("exit", "micro") and ctx.attempt != 0:
        return
    if (kind == "micro") != (micro is not None) or (micro is not None and micro != 1):
        return
    if (rank if parts[0] != "*" else ctx.rank, f_epoch, f_step) == (ctx.rank, epoch, step):
        if kind == "raise":
            raise ValueError(f"injected failure on rank {ctx.rank} at epoch {epoch} step {step}")
        if kind == "hang":
            import time
            time.sleep(10 ** 6)
        if kind in ("exit", "micro"):
            os._exit(3)
