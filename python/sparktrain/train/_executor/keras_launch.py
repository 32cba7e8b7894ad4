"""Run the Keras worker in a child process of the barrier task.

TensorFlow's collective runtime can be configured once per process, and Spark
reuses Python workers between tasks; a child process per task gives each
training run a fresh TF.  ``TF_CONFIG`` is built from the barrier task
addresses gathered with ``allGather``.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import tempfile
from typing import Any, Dict, List

from sparktrain.train._executor.context import WorkerContext
from sparktrain.train._executor.spec import WorkerSpec


class ChildFailed(RuntimeError):
    """The Keras child process failed; ``remote_traceback`` holds its traceback."""

    def __init__(self, message: str, remote_traceback: str) -> None:
        super().__init__(message)
        self.remote_traceback = remote_traceback


def tf_config(peers: List[Dict[str, Any]], rank: int) -> str:
    workers = [f"{p['host']}:{p['aux']}" for p in peers]
    return json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": rank}})


def train_in_subprocess(spec: WorkerSpec, ctx: WorkerContext, peers: List[Dict[str, Any]]) -> Dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="sparktrain-keras-") as tmp:
        args_path, out_path = os.path.join(tmp, "args.pkl"), os.path.join(tmp, "result.pkl")
        with open(args_path, "wb") as fh:
            pickle.dump({"spec": spec, "rank": ctx.rank, "world_size": ctx.world_size, "host": ctx.host,
                         "attempt": ctx.attempt}, fh)
        env = dict(os.environ)
        env["TF_CONFIG"] = tf_config(peers, ctx.rank)
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        env["CUDA_VISIBLE_DEVICES"] = ",".join(ctx.gpu_addresses) if spec.use_gpu else "-1"
        pkg_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_root, env.get("PYTHONPATH", "")) if p)
        log_path = os.path.join(tmp, "child.log")
        with open(log_path, "wb") as log:
            proc = subprocess.run([spec.python or sys.executable, "-m", "sparktrain.train._executor.keras_worker",
                                   args_path, out_path], env=env, stdout=log, stderr=subprocess.STDOUT)
        if os.path.exists(out_path):
            with open(out_path, "rb") as fh:
                result = pickle.load(fh)
            if "error" not in result:
                return result
            raise ChildFailed(result["error"], result["traceback"])
        with open(log_path, "rb") as fh:
            tail = fh.read()[-6000:].decode(errors="replace")
        raise ChildFailed(f"the Keras worker process exited with code {proc.returncode}", tail)
