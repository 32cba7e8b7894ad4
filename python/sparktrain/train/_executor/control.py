"""The loop hooks a :class:`WorkerSpec` asks for: today, stopping a trial that a search pruned.

A pruned search (``tune.pruner``) decides on the driver, from each epoch's
metrics.  After each epoch's checkpoint, rank 0's :class:`PruneHook` asks for
the driver's verdict on that epoch, waiting at most ``spec.prune_wait_s``:

* **over the progress channel** (the normal case): a ``verdict`` request that
  carries the epoch's metrics (what the pruner is fed) and is answered on the
  same connection; it survives a reconnect (the request is re-sent, the driver
  answers it again);
* **through the run's folder in the store** (:class:`~sparktrain.data.run_store.RunStore`
  ``control/``) when the spec has no channel: under Spark Connect the driver is
  a client that executors generally cannot reach, while both reach the store.
  The driver then reads the epochs from the run's event log.

A stop ends the run on every rank (the loop all-reduces the decision), so a
pruned trial trains no further epoch and frees its slots.

Executor side: it imports nothing of the driver.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Dict, List, Optional

from sparktrain.data.run_store import RunStore
from sparktrain.train._executor.context import WorkerContext
from sparktrain.train._executor.loop import Hook
from sparktrain.train._executor.reporter import ChannelClosed
from sparktrain.train._executor.spec import WorkerSpec

log = logging.getLogger(__name__)

POLL_S = 0.05


class PruneHook(Hook):
    """Stop after an epoch when the search's driver says so (over the channel, else ``control/stop.json``).

    Parameters
    ----------
    spec : WorkerSpec
        The run (its store, id, epochs and ``prune_wait_s``).
    ctx : WorkerContext
        This rank (its reporter asks the driver; its checkpointer logs the stop in the run's event log).
    """

    def __init__(self, spec: WorkerSpec, ctx: WorkerContext) -> None:
        self.run = RunStore(spec.store, spec.run_id)
        self.wait_s = float(spec.prune_wait_s or 0.0)
        self.epochs = spec.optim.epochs
        self.ctx = ctx
        self.channel = ctx.reporter.enabled

    def on_epoch(self, epoch: int, metrics: Dict[str, float]) -> bool:
        if epoch >= self.epochs - 1:
            return False  # the run ends anyway
        stop = self._ask_channel(epoch, metrics) if self.channel else self._ask_store(epoch)
        if stop is None:
            return False
        self.ctx.checkpointer.log_event("pruned", epoch=epoch, attempt=self.ctx.attempt,
                                        verdict_epoch=stop.get("epoch"), reason=stop.get("reason", ""))
        return True

    def _ask_channel(self, epoch: int, metrics: Dict[str, float]) -> Optional[Dict[str, Any]]:
        try:
            verdict = self.ctx.reporter.request("verdict", timeout=self.wait_s, epoch=epoch, metrics=metrics)
        except TimeoutError:
            log.warning("run %s: no verdict from the search after epoch %d within %.1f s; training on",
                        self.run.run_id, epoch, self.wait_s)
            return None
        except ChannelClosed:
            return None
        if isinstance(verdict, dict) and verdict.get("stop"):
            return {"epoch": verdict.get("epoch", epoch), "reason": verdict.get("reason", "")}
        return None

    def _ask_store(self, epoch: int) -> Optional[Dict[str, Any]]:
        deadline = time.monotonic() + self.wait_s
        while True:
            stop = self.run.stop_requested()
            if stop is not None:
                return stop
            if self.run.has_verdict(epoch):
                return None
            if time.monotonic() >= deadline:
                log.warning("run %s: no verdict from the search after epoch %d within %.1f s; training on",
                            self.run.run_id, epoch, self.wait_s)
                return None
            time.sleep(POLL_S)


def hooks_for(spec: WorkerSpec, ctx: WorkerContext) -> List[Hook]:
    """The hooks ``spec`` asks for (none for a plain fit)."""
    hooks: List[Hook] = []
    if spec.prune_wait_s is not None:
        hooks.append(PruneHook(spec, ctx))
    return hooks


__all__ = ["PruneHook", "hooks_for"]
