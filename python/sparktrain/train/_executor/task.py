"""The barrier task: one per rank, run by ``mapInArrow(..., barrier=True)``.

Flow (after xgboost.spark and TorchDistributor): learn the rank from
``BarrierTaskContext``; rank 0 pre-binds the rendezvous port on its own
address and every rank shares ``host/port`` through ``allGather``; then the
framework worker trains.  Any exception is reported to the driver with the
rank, host and full traceback, and re-raised with a parseable marker so the
driver can rebuild it even when the progress channel is down.

The closure captures only a :class:`WorkerSpec`; never an Estimator.
"""

from __future__ import annotations

import json
import traceback
from typing import Any, Callable, Dict, Iterator

from sparktrain._internal.secrets import mask_value
from sparktrain.train._executor.checkpoint import Checkpointer
from sparktrain.train._executor.context import WorkerContext
from sparktrain.train._executor.rendezvous import bind_free_port, confine_gloo, executor_host, free_port
from sparktrain.train._executor.reporter import Reporter
from sparktrain.train._executor.spec import WorkerSpec

ERROR_MARKER = "@@SPARKTRAIN_WORKER_ERROR@@"
RESULT_SCHEMA = "rank INT, host STRING, attempt INT, history STRING, model BINARY, param_digest STRING"


def make_task(spec: WorkerSpec) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The function given to ``mapInArrow``; it captures ``spec`` only."""

    def barrier_task(batches: Iterator[Any]) -> Iterator[Any]:
        import os

        import pyarrow as pa
        from pyspark import BarrierTaskContext

        for _ in batches:  # the input is one placeholder row per rank
            pass
        bctx = BarrierTaskContext.get()
        rank = bctx.partitionId()
        infos = bctx.getTaskInfos()
        host = executor_host(infos[rank].address)
        # Python workers are reused across tasks: drop SPARKTRAIN_* left by an earlier task, then apply ours.
        for key in [k for k in os.environ if k.startswith("SPARKTRAIN_") and k not in spec.env]:
            del os.environ[key]
        os.environ.update(spec.env)
        reporter = Reporter(spec.progress_address, rank, host, spec.token, run=spec.run_id)
        checkpointer = Checkpointer(spec.store, spec.run_id, spec.launch_id)
        # PySpark's TaskContext has no stage attempt number: count earlier launches in the run's log
        # (read before allGather; rank 0 logs this launch only after it).
        attempt = sum(1 for e in checkpointer.events(this_launch=True) if e.get("event") in ("started", "resumed"))
        if attempt >= spec.failure.max_attempts:
            # Spark resubmits a failed barrier stage up to spark.stage.maxConsecutiveAttempts times, more
            # than spark.task.maxFailures allows; fail fast with the original (root-cause) error.
            failures = checkpointer.failures()
            root = failures[0] if failures else {"rank": rank, "host": host, "traceback": "",
                                                  "message": f"training failed {attempt} time(s)"}
            root = dict(root, message=f"{root['message']} (gave up after {attempt} attempt(s))")
            raise RuntimeError(f"{ERROR_MARKER}{json.dumps(root)}{ERROR_MARKER}")
        listen = bind_free_port(host) if rank == 0 else None
        hvd_server = None
        try:
            aux = free_port(host)
            if spec.backend == "horovod" and rank == 0:
                from sparktrain.train._executor import horovod_rdzv
                hvd_server, aux = horovod_rdzv.start_server()
            msg = json.dumps({"host": host, "port": listen.getsockname()[1] if listen else None, "aux": aux})
            peers = [json.loads(m) for m in bctx.allGather(msg)]
            confine_gloo(host)
            if spec.backend == "horovod":
                from sparktrain.train._executor import horovod_rdzv
                plan = horovod_rdzv.slot_plan([p["host"] for p in peers])
                if hvd_server is not None:
                    hvd_server.init(plan)
                bctx.barrier()  # the rendezvous server knows the plan before anyone connects
                horovod_rdzv.apply_env(horovod_rdzv.worker_env(
                    plan[rank], peers[0]["host"], int(peers[0]["aux"]), os.environ.get("GLOO_SOCKET_IFNAME", "lo")))
            same_host = [i for i, p in enumerate(peers) if p["host"] == host]
            resources = bctx.resources()
            ctx = WorkerContext(
                rank=rank, world_size=len(peers), host=host, master_host=peers[0]["host"],
                master_port=int(peers[0]["port"]), aux_port=int(peers[0]["aux"]),
                attempt=attempt, checkpointer=checkpointer,
                reporter=reporter, local_rank=same_host.index(rank), local_size=len(same_host),
                listen_sock=listen, gpu_addresses=list(resources["gpu"].addresses) if "gpu" in resources else [])
            result = train_rank(spec, ctx, peers)
            if rank == 0:  # the model goes to the store, never through the stage's result (maxResultSize)
                checkpointer.write_model(result.pop("model_bytes"), {
                    "framework": spec.framework, "inputs": spec.inputs.to_dict(), "launch": spec.launch_id,
                    "history": result.get("history", [])})
        except BaseException as exc:  # noqa: BLE001 - re-raised with context below
            detail = mask_value(getattr(exc, "remote_traceback", None) or traceback.format_exc())
            message = mask_value(f"{type(exc).__name__}: {exc}")
            reporter.send("error", message=message, traceback=detail)
            info = {"rank": rank, "host": host, "message": message, "traceback": detail}
            try:
                checkpointer.record_failure(attempt, rank, info)
            except Exception:  # the store may be the problem; the marker below still carries the error
                pass
            payload = json.dumps(info)
            # not chained: Spark logs and ships the Python traceback it sees, and the cause's text is unmasked
            raise RuntimeError(f"{ERROR_MARKER}{payload}{ERROR_MARKER}") from None
        finally:
            if hvd_server is not None:
                hvd_server.stop()
            reporter.close()
            if listen is not None and listen.fileno() != -1:  # not handed over to a TCPStore
                listen.close()
        yield pa.RecordBatch.from_pylist([{
            "rank": rank, "host": host, "attempt": attempt,
            "history": json.dumps(result.get("history", [])), "model": None,
            "param_digest": result.get("param_digest", "")}],
            schema=pa.schema([("rank", pa.int32()), ("host", pa.string()), ("attempt", pa.int32()),
                              ("history", pa.string()), ("model", pa.binary()), ("param_digest", pa.string())]))

    return barrier_task


def train_rank(spec: WorkerSpec, ctx: WorkerContext, peers: list) -> Dict[str, Any]:
    """Train this rank: torch and Keras (gloo) in this Python worker, Keras under MWMS in a child process.

    The loop's hooks come from the spec (:func:`~sparktrain.train._executor.control.hooks_for`: a
    pruned search's trial stops when the driver says so).
    """
    from sparktrain.train._executor.control import hooks_for

    hooks = hooks_for(spec, ctx)
    if spec.framework == "torch":
        from sparktrain.train._executor import torch_worker
        return torch_worker.train(spec, ctx, hooks)
    if spec.backend == "mwms":
        from sparktrain.train._executor import keras_launch
        return keras_launch.train_in_subprocess(spec, ctx, peers)
    from sparktrain.train._executor import keras_worker
    return keras_worker.train(spec, ctx, hooks)
