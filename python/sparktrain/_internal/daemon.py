"""A PySpark worker daemon that imports torch once, before it forks the Python workers, and freezes it for gc.

Spark starts ``python -m <spark.python.daemon.module>`` on each executor and
forks every Python worker from it.  With this module
(``spark.python.daemon.module=sparktrain._internal.daemon``) a worker forked
after a crash starts with torch and its optimizer machinery (``torch._dynamo``,
which the first ``torch.optim`` call imports) already loaded: a retried barrier
stage trains again seconds sooner.  Nothing runs a torch op here, so no thread
pool exists at fork time.  ``SPARKTRAIN_PREIMPORT`` (comma-separated module
names) replaces the default list; a module that fails to import is skipped.

A reused Python worker runs ``gc.collect()`` after every task (PySpark's
daemon loop).  With torch loaded that full collection walks every object of
the imported modules, most of a short task's time (``bench/tune_profile.py``).
So after the imports the daemon calls ``gc.freeze()``: what it imported moves
to the permanent generation, which no collection walks (and which forked
children share, copy-on-write, instead of touching every page in each
collection).  ``SPARKTRAIN_GC_FREEZE=0`` turns it off.
"""

from __future__ import annotations

import gc
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


def freeze() -> bool:
    """Collect once, then move every object alive now out of gc's reach (unless ``SPARKTRAIN_GC_FREEZE=0``)."""
    if os.environ.get("SPARKTRAIN_GC_FREEZE", "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    gc.collect()  # what the imports left as garbage is freed, not frozen
    gc.freeze()
    return True


if __name__ == "__main__":
    preimport()
    from pyspark.daemon import manager

    freeze()  # after pyspark.daemon's and pyspark.worker's imports too
    manager()
