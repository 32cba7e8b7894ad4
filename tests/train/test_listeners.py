"""During a local training run, nothing listens beyond the executor's address (127.0.0.1).

A poller lists, every 20 ms, the TCP sockets of this process tree: the driver
(this pytest process), the Spark JVM, the PySpark daemon and its Python
workers (which run the barrier tasks and so the torch ranks), and the Keras
worker processes those workers launch (grandchildren of the JVM).  It keeps
which process owned each listening socket, which process connected to which
port, and each process's name, command line and parent, so a test can tell
the ranks' listeners from the JVM's and the daemon's.  Python workers are
reused across tests, and sockets an earlier fit left open in them are still
there: the listeners seen before the fit are kept apart (``before``).
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from typing import Dict, Optional, Set, Tuple

import psutil
import pytest

LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}
WILDCARD = {"::", "0.0.0.0"}
POLL_S = 0.02
KERAS_WORKER = "sparktrain.train._executor.keras_worker"


@dataclass
class _Proc:
    name: str
    cmdline: Tuple[str, ...]
    ppid: int
    tf_config: Optional[dict] = None


class _Listeners:
    """Polls the TCP sockets of this process and all its descendants while training runs."""

    def __init__(self) -> None:
        self.me = os.getpid()
        self.seen: Dict[Tuple[str, int], int] = {}  # listening (ip, port) -> pid of the owner
        self.before: Dict[Tuple[str, int], int] = {}  # those already listening when the poller started
        self.connected: Set[Tuple[int, int]] = set()  # (pid, remote port) of the tree's established connections
        self.procs: Dict[int, _Proc] = {}
        self.polls = 0
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        me = psutil.Process(self.me)
        while not self._stop.wait(POLL_S):
            self._poll_once(me)
        self._poll_once(me)

    def _poll_once(self, me: psutil.Process) -> None:
        try:
            kids = me.children(recursive=True)
        except psutil.Error:
            self.errors += 1
            return
        pids = {self.me} | {p.pid for p in kids}
        for p in kids:
            self._note(p)
        try:
            conns = psutil.net_connections(kind="tcp")
        except psutil.Error:
            self.errors += 1
            return
        for c in conns:
            if c.pid not in pids:
                continue
            if c.status == psutil.CONN_LISTEN:
                self.seen.setdefault((c.laddr.ip, c.laddr.port), c.pid)
            elif c.status == psutil.CONN_ESTABLISHED and c.raddr:
                self.connected.add((c.pid, c.raddr.port))
        self.polls += 1

    def _note(self, p: psutil.Process) -> None:
        """Record (and refresh: a forked child execs later) a process's name, command line and parent."""
        try:
            with p.oneshot():
                info = _Proc(p.name(), tuple(p.cmdline()), p.ppid())
        except psutil.Error:
            return
        old = self.procs.get(p.pid)
        if old is not None and old.cmdline == info.cmdline:
            if old.tf_config is not None or not _is_keras_worker(old):
                return
            info = old
        if _is_keras_worker(info) and info.tf_config is None:
            try:
                raw = p.environ().get("TF_CONFIG")
            except psutil.Error:
                raw = None
            info.tf_config = json.loads(raw) if raw else None
        self.procs[p.pid] = info

    # -- what the processes are ------------------------------------------------------------------------------

    def is_python(self, pid: int) -> bool:
        proc = self.procs.get(pid)
        if proc is None:
            return False
        exe = os.path.basename(proc.cmdline[0]) if proc.cmdline else ""
        return "python" in proc.name.lower() or "python" in exe.lower()

    def is_jvm(self, pid: int) -> bool:
        proc = self.procs.get(pid)
        return proc is not None and (proc.name == "java" or bool(proc.cmdline) and
                                     os.path.basename(proc.cmdline[0]) == "java")

    def below_jvm(self, pid: int) -> bool:
        """True for a process whose parent, grandparent, ... is the Spark JVM."""
        seen: Set[int] = set()
        pid = self.procs[pid].ppid if pid in self.procs else 0
        while pid in self.procs and pid not in seen:
            if self.is_jvm(pid):
                return True
            seen.add(pid)
            pid = self.procs[pid].ppid
        return False

    def python_workers(self) -> Set[int]:
        """PySpark's Python processes: the daemon and the workers it forks (not the driver, not the JVM)."""
        return {pid for pid in self.procs if pid != self.me and self.is_python(pid) and self.below_jvm(pid)}

    def keras_workers(self) -> Set[int]:
        """The Keras worker processes: their command line, and a parent that is not one (a fork of one,
        e.g. a ``uname`` run by a library before its exec, keeps the command line for a moment)."""
        return {pid for pid, proc in self.procs.items() if _is_keras_worker(proc)
                and not (proc.ppid in self.procs and _is_keras_worker(self.procs[proc.ppid]))}

    def keras_root(self, pid: int) -> Optional[int]:
        """The Keras worker that ``pid`` is, or descends from (None if neither)."""
        roots, seen = self.keras_workers(), set()
        while pid in self.procs and pid not in seen:
            if pid in roots:
                return pid
            seen.add(pid)
            pid = self.procs[pid].ppid
        return None

    def spark_python_workers(self) -> Set[int]:
        """PySpark's own daemon and worker processes (not what they start)."""
        return {pid for pid in self.python_workers() if any("pyspark" in part for part in self.procs[pid].cmdline)}

    def new(self) -> Dict[Tuple[str, int], int]:
        """The listeners that appeared while the poller ran."""
        return {addr: pid for addr, pid in self.seen.items() if self.before.get(addr) != pid}

    def clients_of(self, port: int, among: Set[int]) -> Set[int]:
        return {pid for pid, rport in self.connected if rport == port and pid in among}

    def describe(self) -> str:
        lines = [f"{self.polls} polls, {self.errors} errors; listeners:"]
        for (ip, port), pid in sorted(self.seen.items(), key=lambda kv: (kv[1], kv[0][1])):
            proc = self.procs.get(pid)
            what = "this pytest process" if pid == self.me else (" ".join(proc.cmdline)[:100] if proc else "?")
            clients = sorted({p for p, rport in self.connected if rport == port})
            old = " (before)" if self.before.get((ip, port)) == pid else ""
            lines.append(f"  {ip}:{port}{old} pid {pid} ({what}); connected from pids {clients}")
        return "\n".join(lines)

    def __enter__(self) -> "_Listeners":
        self._poll_once(psutil.Process(self.me))
        self.before = dict(self.seen)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def _is_keras_worker(proc: _Proc) -> bool:
    return KERAS_WORKER in proc.cmdline


def _watch_fit(est, dataset: str) -> Tuple["_Listeners", str]:
    """Fit ``est`` while the poller records every listener of the process tree; (listeners, report)."""
    est.show_progress = False
    with _Listeners() as listeners:
        est.fit(dataset)
    return listeners, listeners.describe()


@pytest.fixture(scope="module")
def small_dataset(spark, tmp_path_factory):
    from pyspark.sql import functions as F

    from sparktrain.data.manifest import write_parquet

    root = tmp_path_factory.mktemp("listen") / "ds"
    df = spark.range(6000).select((F.rand(3) * 2 - 1).cast("float").alias("x"),
                                  (F.col("id") % 5).cast("int").alias("c"))
    write_parquet(df.withColumn("label", F.col("x") > 0), str(root / "train"))
    return str(root)


def _assert_ranks_on_loopback(listeners: "_Listeners", report: str) -> None:
    """The ranks' TCPStore and gloo listeners were seen, in the Python workers, all on loopback."""
    workers = listeners.python_workers()
    assert workers, f"no PySpark Python worker process observed\n{report}"
    new = listeners.new()
    # The TCPStore is the one new listener in a Python worker that every rank (rank 0 included) is a client of.
    stores = {(ip, port): pid for (ip, port), pid in new.items()
              if pid in workers and len(listeners.clients_of(port, workers)) >= 2}
    assert len(stores) == 1, f"expected one TCPStore listener in a Python worker, saw {sorted(stores)}\n{report}"
    (store_addr, store_pid), = stores.items()
    ranks = listeners.clients_of(store_addr[1], workers)
    assert len(ranks) == 2 and store_pid in ranks, f"ranks {sorted(ranks)}, TCPStore in pid {store_pid}\n{report}"
    # gloo: each rank listens for its pairs (beside rank 0's TCPStore); the peers connect to those ports.
    gloo = {addr: pid for addr, pid in new.items() if pid in ranks and addr != store_addr}
    assert {pid for pid in gloo.values()} == ranks, f"a rank without a gloo listener: {sorted(gloo)}\n{report}"
    peer_connected = [addr for addr, pid in gloo.items() if listeners.clients_of(addr[1], ranks - {pid})]
    assert peer_connected, f"no rank connected to another rank's gloo listener\n{report}"
    for addr in [store_addr, *gloo]:
        assert not listeners.is_jvm(listeners.seen[addr])
    wide = sorted(addr for addr in listeners.seen if addr[0] not in LOOPBACK)
    assert not wide, f"listeners beyond loopback: {wide}\n{report}"


@pytest.mark.torch
def test_torch_ddp_listeners_stay_on_loopback(spark, small_dataset, tmp_path):
    """The ranks' TCPStore and gloo listeners were seen, in the Python workers, all on loopback."""
    from sparktrain.train.estimator import TorchEstimator

    est = TorchEstimator(numWorkers=2, epochs=2, batchSize=128, labelCol="label", store=str(tmp_path))
    listeners, report = _watch_fit(est, small_dataset)
    _assert_ranks_on_loopback(listeners, report)


@pytest.mark.tensorflow
def test_keras_gloo_listeners_stay_on_loopback(spark, small_dataset, tmp_path):
    """Keras' default backend trains in the Python workers themselves (no child process): the same
    TCPStore and gloo pairs as torch, all on loopback."""
    from sparktrain.train.estimator import KerasEstimator

    est = KerasEstimator(numWorkers=2, epochs=1, batchSize=128, labelCol="label", store=str(tmp_path))
    listeners, report = _watch_fit(est, small_dataset)
    assert not listeners.keras_workers(), f"a Keras child process was started under gloo\n{report}"
    _assert_ranks_on_loopback(listeners, report)


@pytest.mark.tensorflow
def test_keras_mwms_listeners_documented(spark, small_dataset, tmp_path):
    """backend='mwms': TF's gRPC server binds every interface ('::'), as docs/training.md says.

    Each Keras worker process (one per rank, a child of a Python worker) must
    have been seen with its gRPC server on its own ``TF_CONFIG`` port; every
    other listener of the tree is on loopback.
    """
    from sparktrain.train.estimator import KerasEstimator

    est = KerasEstimator(numWorkers=2, epochs=1, batchSize=128, labelCol="label", store=str(tmp_path),
                         backend="mwms")
    listeners, report = _watch_fit(est, small_dataset)
    keras = listeners.keras_workers()
    assert len(keras) == 2, f"expected 2 Keras worker processes, saw {sorted(keras)}\n{report}"
    expected: Dict[int, int] = {}
    for pid in keras:
        cfg = listeners.procs[pid].tf_config
        assert cfg is not None, f"TF_CONFIG of Keras worker {pid} not read\n{report}"
        own = cfg["cluster"]["worker"][cfg["task"]["index"]]
        expected[pid] = int(own.rsplit(":", 1)[1])
    wide: Dict[int, Set[int]] = {}
    for (ip, port), pid in listeners.seen.items():
        if ip in LOOPBACK:
            continue
        root = listeners.keras_root(pid)
        assert ip in WILDCARD and root in keras, f"unexpected listener {ip}:{port} (pid {pid})\n{report}"
        wide.setdefault(root, set()).add(port)
    # Exactly one gRPC server per Keras worker, on the port TF_CONFIG gives that worker.
    assert wide == {pid: {port} for pid, port in expected.items()}, \
        f"gRPC servers seen {wide}, TF_CONFIG ports {expected}\n{report}"
