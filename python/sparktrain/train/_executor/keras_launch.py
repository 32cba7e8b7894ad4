"""Run the Keras worker in a child process of the barrier task.

TensorFlow's collective runtime can be configured once per process, and Spark
reuses Python workers between tasks; a child process per task gives each
training run a fresh TF.  The child has its own process group and dies with
the task (a parent-death signal, and a kill of its group when the task fails
or is interrupted), so a failed fit or a timed-out trial leaves no process and
no open port behind.  With ``backend='gloo'`` rank 0's child serves the
rendezvous TCPStore on the socket the task bound to its own address (passed
as a file descriptor); with ``'mwms'``, ``TF_CONFIG`` is built from the
barrier task addresses gathered with ``allGather``.
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
            # gloo: rank 0's child serves the TCPStore on the socket the task pre-bound to its own address
            sock = ctx.listen_sock if spec.backend != "mwms" else None
            listen_fd = sock.fileno() if sock is not None else None
            pickle.dump({"spec": spec, "rank": ctx.rank, "world_size": ctx.world_size, "host": ctx.host,
                         "attempt": ctx.attempt, "master_host": ctx.master_host, "master_port": ctx.master_port,
                         "listen_fd": listen_fd}, fh)
        env = dict(os.environ)
        if spec.backend == "mwms":
            env["TF_CONFIG"] = tf_config(peers, ctx.rank)
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        env["CUDA_VISIBLE_DEVICES"] = ",".join(ctx.gpu_addresses) if spec.scaling.gpus_per_worker else "-1"
        pkg_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_root, env.get("PYTHONPATH", "")) if p)
        log_path = os.path.join(tmp, "child.log")
        with open(log_path, "wb") as log:
            proc = subprocess.Popen([spec.python or sys.executable, "-m", "sparktrain.train._executor.keras_worker",
                                     args_path, out_path], env=env, stdout=log, stderr=subprocess.STDOUT,
                                    preexec_fn=_die_with_parent, pass_fds=() if listen_fd is None else (listen_fd,))
            if sock is not None:  # the child owns the rendezvous socket now
                sock.close()
            try:
                proc.wait()
            finally:  # the task failed or was interrupted (a cancelled job): never leave the child behind
                kill_group(proc)
        if os.path.exists(out_path):
            with open(out_path, "rb") as fh:
                result = pickle.load(fh)
            if "error" not in result:
                return result
            raise ChildFailed(result["error"], result["traceback"])
        with open(log_path, "rb") as fh:
            tail = fh.read()[-6000:].decode(errors="replace")
        raise ChildFailed(f"the Keras worker process exited with code {proc.returncode}", tail)


def _die_with_parent() -> None:
    """In the child, before exec: its own process group, and SIGKILL when the task's process dies.

    Spark kills a cancelled or failed task's Python worker; ``PR_SET_PDEATHSIG``
    makes the kernel kill the Keras child with it (Linux), so no orphan keeps
    training or holding its TensorFlow port.
    """
    import signal

    os.setsid()
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):  # not Linux: the parent's kill_group() is the only guard
        pass


def kill_group(proc: "subprocess.Popen[bytes]") -> None:
    """SIGKILL the child's process group unless it already exited (idempotent)."""
    import signal

    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
