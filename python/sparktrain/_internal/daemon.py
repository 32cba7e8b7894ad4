"""A PySpark worker daemon that imports torch once, before it forks the Python workers.

Spark starts ``python -m <spark.python.daemon.module>`` on each executor and
forks every Python worker from it.  With this module
(``spark.python.daemon.module=sparktrain._internal.daemon``) a worker forked
after a crash starts with torch and its optimizer machinery (``torch._dynamo``,
which the first ``torch.optim`` call imports) already loaded: a retried barrier
stage trains again seconds sooner.  Nothing runs a torch op here, so no thread
pool exists at fork time.  ``SPARKTRAIN_PREIMPORT`` (comma-separated module
names) replaces the default list; a module that fails to import is skipped.
"""

from __future__ import annotations

import importlib
import os

DEFAULT = "torch,torch._dynamo,torch.optim,pyarrow.parquet"


def preimport() -> None:
    """Import the modules named by ``SPARKTRAIN_PREIMPORT`` (best effort)."""
    for name in filter(None, os.environ.get("SPARKTRAIN_PREIMPORT", DEFAULT).split(",")):
        try:
            importlib.import_module(name.strip())
        except Exception:  # noqa: BLE001 - a missing framework is the task's problem, not the daemon's
            pass


if __name__ == "__main__":
    preimport()
    from pyspark.daemon import manager

    manager()
