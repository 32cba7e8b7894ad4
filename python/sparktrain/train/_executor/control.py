"""The loop hooks a :class:`WorkerSpec` asks for: today, stopping a trial that a search pruned.

A pruned search (``tune.pruner``) decides on the driver, from each epoch's
metrics in the run's event log; the decision reaches the trial through the
run's folder in the store (:class:`~sparktrain.data.run_store.RunStore`
``control/``), which works whether or not the driver can be reached over a
socket (Spark Connect has no progress channel).  After each epoch's
checkpoint, rank 0's :class:`PruneHook` waits, at most
``spec.prune_wait_s``, for the driver's verdict on that epoch; a stop ends the
run on every rank (the loop all-reduces the decision), so a pruned trial
trains no further epoch and frees its slots.

Executor side: it imports nothing of the driver.
"""

from __future__ import annotations

import logging
import time
from typing import Dict, List

from sparktrain.data.run_store import RunStore
from sparktrain.train._executor.context import WorkerContext
from sparktrain.train._executor.loop import Hook
from sparktrain.train._executor.spec import WorkerSpec

log = logging.getLogger(__name__)

POLL_S = 0.05


class PruneHook(Hook):
    """Stop after an epoch when the search's driver wrote ``control/stop.json`` for this run.

    Parameters
    ----------
    spec : WorkerSpec
        The run (its store, id, epochs and ``prune_wait_s``).
    ctx : WorkerContext
        This rank (its checkpointer logs the stop in the run's event log).
    """

    def __init__(self, spec: WorkerSpec, ctx: WorkerContext) -> None:
        self.run = RunStore(spec.store, spec.run_id)
        self.wait_s = float(spec.prune_wait_s or 0.0)
        self.epochs = spec.optim.epochs
        self.ctx = ctx

    def on_epoch(self, epoch: int, metrics: Dict[str, float]) -> bool:
        if epoch >= self.epochs - 1:
            return False  # the run ends anyway
        deadline = time.monotonic() + self.wait_s
        while True:
            stop = self.run.stop_requested()
            if stop is not None:
                self.ctx.checkpointer.log_event("pruned", epoch=epoch, attempt=self.ctx.attempt,
                                                verdict_epoch=stop.get("epoch"), reason=stop.get("reason", ""))
                return True
            if self.run.has_verdict(epoch):
                return False
            if time.monotonic() >= deadline:
                log.warning("run %s: no verdict from the search after epoch %d within %.1f s; training on",
                            self.run.run_id, epoch, self.wait_s)
                return False
            time.sleep(POLL_S)


def hooks_for(spec: WorkerSpec, ctx: WorkerContext) -> List[Hook]:
    """The hooks ``spec`` asks for (none for a plain fit)."""
    hooks: List[Hook] = []
    if spec.prune_wait_s is not None:
        hooks.append(PruneHook(spec, ctx))
    return hooks


__all__ = ["PruneHook", "hooks_for"]
