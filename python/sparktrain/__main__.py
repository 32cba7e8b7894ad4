"""``python -m sparktrain`` and ``spark-submit python/sparktrain/__main__.py``.

Under spark-submit this file runs as a script, so the package directory's
parent is put on ``sys.path`` before importing ``sparktrain``.
"""

import os
import sys

if __package__ in (None, ""):
    # Run as a script, sys.path[0] is this directory, whose profile.py would
    # shadow the stdlib ``profile`` module (imported by pyspark): drop it.
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]
    sys.path.insert(0, os.path.dirname(_here))

from sparktrain.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
