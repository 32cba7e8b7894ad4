"""petastorm 0.13.1 side of bench/reader.py; runs inside bench/peers/.venv-petastorm.

Prints one JSON object per line: {"name", "rows", "seconds", "expected", "note"}.
Only petastorm, pyarrow 14, numpy 1.26 and torch are importable here, not sparktrain.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings


def _emit(name: str, rows: int, seconds: float, expected: int, note: str = "") -> None:
    print(json.dumps({"name": name, "rows": rows, "seconds": seconds, "expected": expected, "note": note}),
          flush=True)


def _count(batch) -> int:
    first = batch[0] if isinstance(batch, tuple) else next(iter(batch.values()))
    return len(first)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True, help="file:///... dataset directory")
    ap.add_argument("--rows", type=int, required=True, help="rows in the dataset")
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--default-loader-rows", type=int, default=100_000,
                    help="rows to time petastorm's default (row-by-row) torch DataLoader on")
    args = ap.parse_args()
    warnings.simplefilter("ignore")

    from petastorm import make_batch_reader
    from petastorm.pytorch import BatchedDataLoader, DataLoader

    for _ in range(args.repeats):
        t0 = time.perf_counter()
        rows = 0
        with make_batch_reader(args.url, num_epochs=1) as reader:
            for batch in reader:
                rows += _count(batch)
        _emit("petastorm make_batch_reader", rows, time.perf_counter() - t0, args.rows)

    for _ in range(args.repeats):
        t0 = time.perf_counter()
        rows = 0
        with make_batch_reader(args.url, num_epochs=1) as reader:
            for batch in BatchedDataLoader(reader, batch_size=args.batch_size):
                rows += _count(batch)
        _emit("petastorm BatchedDataLoader (torch)", rows, time.perf_counter() - t0, args.rows)

    # The default loader collates row by row; time it on a prefix only.
    t0 = time.perf_counter()
    rows = 0
    with make_batch_reader(args.url, num_epochs=1) as reader:
        for batch in DataLoader(reader, batch_size=args.batch_size):
            rows += _count(batch)
            if rows >= args.default_loader_rows:
                break
    _emit("petastorm DataLoader (torch, default)", rows, time.perf_counter() - t0, rows,
          note=f"first {rows} rows only")


if __name__ == "__main__":
    main()
