"""Simulated ranks for the progress-channel tests and bench/faults.py: ``python -m tests.train._ranks``.

``ADDRESS TOKEN FIRST COUNT SECONDS``: ranks FIRST..FIRST+COUNT-1, each a thread with the real
:class:`~sparktrain.train._executor.reporter.Reporter` and heartbeat, stepping every 0.25 s for SECONDS;
every 20 steps a rank sends an epoch event (rank 0 also a step event each step).  Prints one JSON line
per rank at the end: ``{"rank", "steps", "epochs", "reconnects", "dropped"}``.  Separate processes, as
real ranks are: in one process with the server, a thousand threads starve it of the GIL.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import List

REPO = Path(__file__).resolve().parents[2]


def start(address: str, token: str, ranks: int, seconds: float, processes: int = 4) -> List[subprocess.Popen]:
    """``ranks`` simulated ranks in ``processes`` processes against the server at ``address``; their Popens
    (read each one's stdout for its ranks' JSON lines)."""
    env = dict(os.environ, PYTHONPATH=f"{REPO / 'python'}{os.pathsep}{REPO}")
    per = -(-ranks // processes)
    return [subprocess.Popen([sys.executable, "-m", "tests.train._ranks", address, token, str(first),
                              str(min(per, ranks - first)), str(seconds)], cwd=REPO, env=env,
                             stdout=subprocess.PIPE, text=True)
            for first in range(0, ranks, per)]


def main(argv) -> None:
    from sparktrain.train._executor.loop import Heartbeat
    from sparktrain.train._executor.reporter import Reporter

    address, token, first, count, seconds = argv[1], argv[2], int(argv[3]), int(argv[4]), float(argv[5])
    out = {}
    end = time.monotonic() + seconds

    def rank_main(rank: int) -> None:
        reporter = Reporter(address, rank, f"h{rank % 7}", token, run="r")
        beat = Heartbeat(reporter)
        step = epochs = 0
        while time.monotonic() < end:
            time.sleep(0.25)
            step += 1
            beat.progress(0, step, 100)
            if rank == 0:
                reporter.send("step", epoch=0, step=step, steps=100, metrics={"loss": 0.5})
            if step % 20 == 0:
                epochs += 1
                reporter.send("epoch", epoch=epochs, epochs=999, metrics={"val_loss": 0.5})
        beat.close()
        reporter.close()  # delivers what is still buffered
        out[rank] = {"rank": rank, "steps": step, "epochs": epochs, "reconnects": reporter.reconnects,
                     "dropped": reporter.dropped}

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(first, first + count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for rank in sorted(out):
        print(json.dumps(out[rank]), flush=True)


if __name__ == "__main__":
    main(sys.argv)
