"""Executor-side rendezvous helpers: addresses, free ports, a confined TCPStore.

Every listener binds to the executor's own address (``SPARK_LOCAL_IP`` in
local mode), never to all interfaces:

* the torch ``TCPStore`` is handed a socket we pre-bound to that address
  (``master_listen_fd`` + ``use_libuv=True``); a default ``TCPStore`` listens
  on ``*``;
* gloo pairs follow ``GLOO_SOCKET_IFNAME``, set to the interface that holds the
  executor's address.

This module imports nothing from the driver side.
"""

from __future__ import annotations

import os
import socket
from typing import Optional


def executor_host(task_address: Optional[str] = None) -> str:
    """The address this executor's listeners should bind to.

    ``task_address`` is the ``host:port`` Spark reports for the barrier task
    (``BarrierTaskContext.getTaskInfos()[rank].address``).
    """
    if task_address:
        host = task_address.rsplit(":", 1)[0].strip("[]")
        if host:
            return host
    return os.environ.get("SPARK_LOCAL_IP") or socket.gethostbyname(socket.gethostname())


def bind_free_port(host: str) -> socket.socket:
    """A listening-ready TCP socket bound to ``(host, 0)``; caller keeps it open."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    return sock


def free_port(host: str) -> int:
    """Pick a currently free port on ``host`` (closed again; small race accepted)."""
    with bind_free_port(host) as sock:
        return sock.getsockname()[1]


def interface_for(host: str) -> Optional[str]:
    """Name of the network interface that carries ``host`` (``lo`` for 127.0.0.1)."""
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil is a dependency
        return None
    try:
        target = socket.gethostbyname(host)
    except OSError:
        return None
    for name, addrs in psutil.net_if_addrs().items():
        for addr in addrs:
            if addr.address == target:
                return name
    return None


def confine_gloo(host: str) -> None:
    """Make gloo bind its pairs to ``host``'s interface (unless the user chose one)."""
    if "GLOO_SOCKET_IFNAME" not in os.environ:
        ifname = interface_for(host)
        if ifname:
            os.environ["GLOO_SOCKET_IFNAME"] = ifname


def make_tcp_store(host: str, port: int, world_size: int, is_master: bool,
                   listen_sock: Optional[socket.socket] = None, timeout_s: float = 300.0):
    """A ``torch.distributed.TCPStore`` whose server (rank 0) listens on ``host`` only."""
    from datetime import timedelta

    import torch.distributed as dist

    if is_master:
        if listen_sock is None:
            raise ValueError("rank 0 needs the pre-bound listen socket")
        listen_sock.listen(max(16, world_size * 2))
        store = dist.TCPStore(host, port, world_size, True, timedelta(seconds=timeout_s),
                              wait_for_workers=False, master_listen_fd=listen_sock.fileno(), use_libuv=True)
        listen_sock.detach()  # the store owns (and closes) the descriptor now
        return store
    return dist.TCPStore(host, port, world_size, False, timedelta(seconds=timeout_s))
