"""A reused gang: one barrier stage of ``n`` tasks that trains trial after trial (``tune.mode: distributed``).

Each task (a rank) holds one progress-channel connection for the gang's life
and loops::

    ask the driver "next" (the result of the trial it just ran, whether its process group is whole,
        rank 0: a fresh port)  -> the next trial's spec and one plan for the process group, or stop
    train the trial with the one training loop (train_rank), rank 0 writes the model to the store

The spec comes signed with the launch's token (see :mod:`.channel`).  Between
trials a rank resets what a trial leaves behind, as Ray Tune's
``reuse_actors`` resets an actor: ``SPARKTRAIN_*`` environment, the reporter's
run id; the network, optimizer, readers, RNG seeds and checkpoint state are
built per trial by the loop anyway.  The torch process group is kept while it
is whole on every rank (no rendezvous, no teardown per trial: the driver sees
every rank's group in its request and answers all of them with one plan) and
re-created from rank 0's fresh port after a trial that failed or a retried
stage.  No ``BarrierTaskContext.allGather`` per trial: it costs about 1 s.

A trial's failure is caught here and reported as its result: it ends that
trial.  When every rank fails alike (a trial whose model or optimizer cannot be
built), the gang goes on; when some ranks fail while their peers wait inside
a collective, those peers cannot be freed (gloo gives up a dead peer only at
its collective timeout, and keeps its sockets until the process exits), so the
driver cancels the gang after a short grace and the next trial gets a new one.
A dead rank fails the barrier stage; Spark retries the stage and the new
tasks ask again with no result, so the driver hands them the trial
that was running, which resumes from its last checkpoint.

Executor side: it imports nothing of the driver.
"""

from __future__ import annotations

import os
import time
import traceback
from typing import Any, Callable, Dict, Iterator, Optional

from sparktrain.train._executor.channel import unsign
from sparktrain.train._executor.checkpoint import Checkpointer
from sparktrain.train._executor.context import WorkerContext
from sparktrain.train._executor.rendezvous import bind_free_port, confine_gloo, executor_host, free_port
from sparktrain.train._executor.reporter import ChannelClosed, Reporter
from sparktrain.train._executor.spec import WorkerSpec

GANG_SCHEMA = "rank INT, trials INT"
#: seconds one "next" request waits before it is asked again (the driver may be between trials)
NEXT_WAIT_S = 30.0


#: this process's kept process group (a Python worker outlives its tasks): {"id", "world"}
_GROUP: Dict[str, Any] = {}


def make_gang_task(gang_id: str, address: str, token: str, idle_s: float
                   ) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The ``mapInArrow`` function of a gang; it ends when the driver says stop or is silent for ``idle_s``."""

    def gang_task(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa
        from pyspark import BarrierTaskContext

        for _ in batches:  # one placeholder row per rank
            pass
        bctx = BarrierTaskContext.get()
        rank = bctx.partitionId()
        host = executor_host(bctx.getTaskInfos()[rank].address)
        reporter = Reporter(address, rank, host, token)
        trials = 0
        result: Optional[Dict[str, Any]] = None
        try:
            while True:
                listen = bind_free_port(host) if rank == 0 else None  # the master port, if the group is rebuilt
                try:
                    job = _next(reporter, gang_id, result, idle_s, host, listen)
                    if job is None:
                        break
                    spec: WorkerSpec = unsign(job["spec"], token)
                    result = run_trial(spec, int(job["seq"]), int(job.get("attempt", 0)), job["group"], bctx, rank,
                                       host, reporter, listen)
                finally:
                    if listen is not None and listen.fileno() != -1:  # not handed over to a TCPStore
                        listen.close()
                trials += 1
        finally:
            drop_process_group()
            reporter.close()
        yield pa.RecordBatch.from_pylist([{"rank": rank, "trials": trials}],
                                         schema=pa.schema([("rank", pa.int32()), ("trials", pa.int32())]))

    return gang_task


def drop_process_group() -> None:
    """Destroy this process's default process group, if any (after a failed trial, at the gang's end)."""
    import sys

    _GROUP.clear()
    if "torch.distributed" not in sys.modules:
        return
    import torch.distributed as dist

    try:
        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - a broken group: the next init replaces it
        pass


def _group_id() -> Optional[str]:
    """The id of this process's process group while it is whole, else None."""
    import sys

    if not _GROUP or "torch.distributed" not in sys.modules:
        return None
    import torch.distributed as dist

    ok = dist.is_available() and dist.is_initialized() and dist.get_world_size() == _GROUP.get("world")
    return _GROUP.get("id") if ok else None


def _next(reporter: Reporter, gang_id: str, result: Optional[Dict[str, Any]], idle_s: float, host: str,
          listen: Any) -> Optional[Dict[str, Any]]:
    """The driver's next trial (``{"seq", "spec", "group"}``), or None: stop, or no answer for ``idle_s``.

    The request says where this rank stands: its kept process group (if whole) and, on rank 0, a
    fresh port for a new one; the driver answers every rank at once with one plan (reuse, or rebuild).
    """
    deadline = time.monotonic() + idle_s
    after = result["seq"] if result is not None else -1
    while time.monotonic() < deadline:
        try:
            reply = reporter.request("next", timeout=NEXT_WAIT_S, gang=gang_id, client=reporter.client, after=after,
                                     result=result, group=_group_id(), master_host=host,
                                     master_port=listen.getsockname()[1] if listen is not None else None)
        except TimeoutError:
            continue
        except ChannelClosed:
            return None
        if not isinstance(reply, dict) or reply.get("stop") or "error" in reply:
            return None
        return reply
    return None


def run_trial(spec: WorkerSpec, seq: int, attempt: int, group: Dict[str, Any], bctx: Any, rank: int, host: str,
              reporter: Reporter, listen: Any) -> Dict[str, Any]:
    """Train one trial on this rank; its result (``ok``, history on rank 0, digest, timing), or its failure.

    ``attempt`` counts the driver's earlier hand-outs of this trial (a retried stage's; the loop
    resumes from the trial's last checkpoint).  ``group`` is the driver's plan for the process
    group: ``reuse`` the kept one (every rank has it whole), or build ``id`` anew from ``master``
    (rank 0's ``listen`` socket); ``hosts`` by rank.
    """
    from sparktrain.train._executor.task import train_rank

    t0 = time.perf_counter()
    reporter.run = spec.run_id
    for key in [k for k in os.environ if k.startswith("SPARKTRAIN_") and k not in spec.env]:
        del os.environ[key]
    os.environ.update(spec.env)
    checkpointer = Checkpointer(spec.store, spec.run_id, spec.launch_id)
    base = {"seq": seq, "rank": rank, "host": host, "attempt": attempt}
    try:
        if not group.get("reuse"):
            drop_process_group()  # the loop's adapter builds the new one from rank 0's port
        hosts = list(group["hosts"])
        confine_gloo(host)
        same_host = [i for i, h in enumerate(hosts) if h == host]
        resources = bctx.resources()
        master_host, master_port = group["master"]
        ctx = WorkerContext(
            rank=rank, world_size=len(hosts), host=host, master_host=master_host, master_port=int(master_port),
            aux_port=free_port(host) if spec.framework == "keras" else 0, attempt=attempt,
            checkpointer=checkpointer, reporter=reporter, local_rank=same_host.index(rank),
            local_size=len(same_host), listen_sock=listen if not group.get("reuse") else None, keep_group=True,
            gpu_addresses=list(resources["gpu"].addresses) if "gpu" in resources else [])
        t1 = time.perf_counter()
        out = train_rank(spec, ctx, [{"host": h, "port": master_port, "aux": 0} for h in hosts])
        _GROUP.update(id=group["id"], world=len(hosts))
        t2 = time.perf_counter()
        if rank == 0:  # the model goes to the store, as a fit's does
            checkpointer.write_model(out.pop("model_bytes"), {
                "framework": spec.framework, "inputs": spec.inputs.to_dict(), "launch": spec.launch_id,
                "history": out.get("history", [])})
        return {**base, "ok": True, "digest": out.get("param_digest", ""), "gpus": list(ctx.gpu_addresses),
                "history": out.get("history", []) if rank == 0 else None,
                "timing": {"setup_s": t1 - t0, "train_s": t2 - t1, "model_s": time.perf_counter() - t2,
                           "reused_group": bool(group.get("reuse"))}}
    except Exception as exc:  # noqa: BLE001 - the trial failed, the gang goes on
        detail = getattr(exc, "remote_traceback", None) or traceback.format_exc()
        info = {"rank": rank, "host": host, "message": f"{type(exc).__name__}: {exc}", "traceback": detail}
        try:
            checkpointer.record_failure(attempt, rank, info)
        except Exception:  # noqa: BLE001 - the store may be the problem; the result carries the error
            pass
    # Out of the except block (no traceback holds the loop's objects): the next trial rebuilds the group.
    # Peers already inside a collective do not notice (gloo closes its sockets only at process exit):
    # the driver stops the gang after a grace, and the next trial gets a new one.
    drop_process_group()
    return {**base, "ok": False, "error": info}
