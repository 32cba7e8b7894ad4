"""How the shuffle window changes test AUC on flights: the reader's ``shuffle_buffer`` against a full permutation.

Usage (from the repo root; needs ``work/flights/dataset``, made by ``sparktrain preprocess conf/flights.yaml``)::

    PYTHONPATH=python .venv/bin/python bench/shuffle.py [--epochs 3] [--buffers 8192,65536,0] [--repeats 1]

One process, one torch thread, the default network (64-64, embeddings 8), Adam
2e-3, batch 1024, seed 42.  Each run trains ``--epochs`` epochs reading the
training split with our reader (``epoch_batches``, shuffled in windows of
``shuffle_buffer`` rows; 0 here means one window of the whole split), and once
from a full random permutation of the split held in memory (the ideal).  The
flights rows are stored in time order, so a window of 8,192 rows holds about a
week of flights: batches are correlated, and SGD converges to a lower AUC.
Results: ``work/bench/shuffle.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(REPO / "bench"))

from benchlib import Results  # noqa: E402

ROOT = REPO / "work" / "flights" / "dataset"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--buffers", default="8192,65536,0")
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args()

    import numpy as np
    import pyarrow.parquet as pq
    import torch

    from sparktrain.train._executor.batches import epoch_batches, to_arrays
    from sparktrain.train._executor.spec import ModelSpec
    from sparktrain.train._executor.torch_worker import build_default_model
    from sparktrain.train.inputs import infer_inputs, read_features_json

    from sparktrain.data.commit import resolve

    if read_features_json(str(ROOT)) is None:
        raise SystemExit(f"no {ROOT}: run `sparktrain preprocess conf/flights.yaml` first")
    meta = read_features_json(str(ROOT))
    inputs = infer_inputs(resolve(str(ROOT / "train")), "late", exclude=(meta or {}).get("exclude") or [], meta=meta)
    cols = [*inputs.columns, inputs.label]

    def load(split: str):
        t = pq.read_table(resolve(str(ROOT / split)), columns=cols)
        return to_arrays({c: t.column(c).to_numpy(zero_copy_only=False) for c in cols}, inputs)

    test, train = load("test"), load("train")
    rows = len(train[2])

    def auc(net) -> float:
        from sklearn.metrics import roc_auc_score

        with torch.no_grad():
            scores = net(torch.from_numpy(test[0]), torch.from_numpy(test[1])).reshape(-1).numpy()
        return float(roc_auc_score(test[2], scores))

    def run(buffer: int | None, seed: int) -> tuple[float, float]:
        torch.manual_seed(42 + seed)
        net = build_default_model(inputs, ModelSpec((64, 64), 8, 0.0))
        opt = torch.optim.Adam(net.parameters(), lr=0.002)
        rng = np.random.default_rng(seed)
        t0 = time.perf_counter()
        for epoch in range(args.epochs):
            if buffer is None:
                p = rng.permutation(rows)
                batches = ((train[0][p[i:i + 1024]], train[1][p[i:i + 1024]], train[2][p[i:i + 1024]])
                           for i in range(0, rows, 1024))
            else:
                _, batches = epoch_batches(str(ROOT / "train"), inputs, 1024, 0, 1, epoch, 42 + seed,
                                           shuffle_buffer=buffer or rows)
            for xn, xc, y in batches:
                loss = torch.nn.functional.binary_cross_entropy_with_logits(
                    net(torch.from_numpy(xn), torch.from_numpy(xc)).reshape(-1), torch.from_numpy(y))
                opt.zero_grad()
                loss.backward()
                opt.step()
        return auc(net), time.perf_counter() - t0

    torch.set_num_threads(1)
    res = Results("shuffle", {"epochs": args.epochs, "batch": 1024, "rows": rows, "repeats": args.repeats},
                  title=f"flights test AUC after {args.epochs} epochs, one process, by shuffle window")
    variants = [(f"reader, shuffle_buffer={int(b) or rows:,}" + (" (whole split)" if not int(b) else ""), int(b))
                for b in args.buffers.split(",")] + [("full random permutation in memory", None)]
    out = {}
    for name, buf in variants:
        aucs, secs = [], []
        for seed in range(args.repeats):
            a, s = run(buf, seed)
            aucs.append(a)
            secs.append(s)
        out[name] = aucs
        res.add(f"{name}: test AUC", aucs, "AUC", digits=4)
        res.add(f"{name}: training s", secs, "s", digits=1)
        print(f"{name}: AUC {np.median(aucs):.4f}  ({np.median(secs):.1f} s)", flush=True)
    res.note("flights rows are stored in time order: a small shuffle window keeps batches within days of each "
             "other. Ray Data's local_shuffle_buffer_size samples from a rolling buffer, which mixes more.")
    res.write()
    print(json.dumps({k: round(float(np.median(v)), 4) for k, v in out.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
