"""Horovod (gloo controller) rendezvous inside a Spark barrier stage.

Rank 0 runs Horovod's HTTP rendezvous server; every rank gets the Horovod
environment that ``horovodrun`` would set, with Horovod ranks equal to Spark
partition ids.  Imported only when ``backend='horovod'``.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Tuple


def start_server() -> Tuple[Any, int]:
    """Start Horovod's rendezvous server on this executor; returns ``(server, port)``."""
    from horovod.runner.http.http_server import RendezvousServer

    server = RendezvousServer(verbose=0)
    return server, int(server.start())


def slot_plan(hosts: List[str]) -> List[Any]:
    """One SlotInfo per rank, in Spark rank order (local ranks counted per host)."""
    from horovod.runner.common.util.hosts import SlotInfo

    order = list(dict.fromkeys(hosts))
    plan = []
    for rank, host in enumerate(hosts):
        same = [i for i, h in enumerate(hosts) if h == host]
        plan.append(SlotInfo(hostname=host, rank=rank, local_rank=same.index(rank), cross_rank=order.index(host),
                             size=len(hosts), local_size=len(same), cross_size=len(order)))
    return plan


def worker_env(slot: Any, rdzv_host: str, rdzv_port: int, iface: str) -> Dict[str, str]:
    return {
        "HOROVOD_HOSTNAME": slot.hostname, "HOROVOD_RANK": str(slot.rank), "HOROVOD_SIZE": str(slot.size),
        "HOROVOD_LOCAL_RANK": str(slot.local_rank), "HOROVOD_LOCAL_SIZE": str(slot.local_size),
        "HOROVOD_CROSS_RANK": str(slot.cross_rank), "HOROVOD_CROSS_SIZE": str(slot.cross_size),
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": rdzv_host, "HOROVOD_GLOO_RENDEZVOUS_PORT": str(rdzv_port),
        "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo", "HOROVOD_GLOO_IFACE": iface,
    }


def apply_env(env: Dict[str, str]) -> None:
    os.environ.update(env)
