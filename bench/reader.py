"""Parquet -> framework throughput: sparktrain.data against raw pyarrow and petastorm 0.13.1.

Usage (from the repo root)::

    PYTHONPATH=python .venv/bin/python bench/reader.py [--rows 2000000] [--repeats 3] [--no-petastorm]

The dataset is generated once and cached under ``work/bench/reader/``: one
Parquet file (zstd, row groups of 65,536 rows) with 16 float32 columns and one
``array<float>`` column of length 8, plus its manifest.  Every loader reads
the whole file once per run; the table shows the best of ``--repeats`` runs in
rows per second, with ratios against raw ``pq.read_table`` (the limit) and
against petastorm's best loader.  petastorm runs in its own venv
(``bench/peers/.venv-petastorm``: pyarrow 14, numpy 1.26), which
``bench/peers/setup.sh`` creates when it is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from sparktrain.data import build_manifest, make_reader, read_manifest, write_manifest

PEERS = REPO / "bench" / "peers"
PEER_PY = PEERS / ".venv-petastorm" / "bin" / "python"
FLAT_COLS, ARRAY_LEN, ROW_GROUP, BATCH = 16, 8, 65_536, 1024


def dataset(rows: int) -> Path:
    """Write (once) and return the benchmark dataset directory."""
    d = REPO / "work" / "bench" / "reader" / f"flat{FLAT_COLS}-arr{ARRAY_LEN}-{rows}"
    if read_manifest(str(d)) is not None:
        return d
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    cols = {f"f{i}": rng.random(rows, dtype=np.float32) for i in range(FLAT_COLS)}
    offsets = pa.array(np.arange(0, rows * ARRAY_LEN + 1, ARRAY_LEN, dtype=np.int32))
    cols["arr"] = pa.ListArray.from_arrays(offsets, pa.array(rng.random(rows * ARRAY_LEN, dtype=np.float32)))
    pq.write_table(pa.table(cols), d / "part-00000.parquet", row_group_size=ROW_GROUP, compression="zstd")
    write_manifest(str(d), build_manifest(str(d)))
    return d


def best(fn, repeats: int) -> tuple[float, int]:
    """Best rows/s over ``repeats`` runs of ``fn`` (which returns the rows it read)."""
    rates, rows = [], 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        rows = fn()
        rates.append(rows / (time.perf_counter() - t0))
    return max(rates), rows


def raw(path: Path) -> int:
    return pq.read_table(path / "part-00000.parquet").num_rows


def ours_numpy(path: Path, shuffle: bool = True) -> int:
    rows = 0
    with make_reader(str(path), batch_size=BATCH, shuffle=shuffle) as reader:
        for batch in reader:
            rows += len(batch["f0"])
    return rows


def ours_torch(path: Path) -> int:
    from sparktrain.data import make_torch_dataloader

    rows = 0
    with make_torch_dataloader(str(path), batch_size=BATCH, num_epochs=1) as loader:
        for batch in loader:
            rows += batch["f0"].shape[0]
    return rows


def ours_tf(path: Path) -> int:
    from sparktrain.data import make_tf_dataset

    rows = 0
    with make_tf_dataset(str(path), batch_size=BATCH, num_epochs=1) as ds:
        for batch in ds:
            rows += int(batch["f0"].shape[0])
    return rows


def petastorm(path: Path, rows: int, repeats: int) -> tuple[dict[str, float], str]:
    """Run the petastorm peer; return ({loader: best rows/s}, note) or ({}, reason)."""
    if not PEER_PY.exists():
        print("setting up bench/peers/.venv-petastorm (once, a few minutes)...", flush=True)
        setup = subprocess.run(["bash", str(PEERS / "setup.sh")], capture_output=True, text=True, check=False)
        if setup.returncode != 0 or not PEER_PY.exists():
            tail = (setup.stderr or setup.stdout).strip().splitlines()[-1:] or ["no output"]
            return {}, f"setup failed: {tail[0]}"
    cmd = [str(PEER_PY), str(PEERS / "petastorm_bench.py"), "--url", path.resolve().as_uri(), "--rows", str(rows),
           "--batch-size", str(BATCH), "--repeats", str(repeats)]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, env=env, check=False)
    except subprocess.TimeoutExpired:
        return {}, "timed out after 20 minutes"
    results: dict[str, float] = {}
    notes = []
    for line in out.stdout.splitlines():
        if not line.startswith("{"):
            continue  # petastorm prints "Cache cleanup complete." on stdout
        r = json.loads(line)
        if r["rows"] < r["expected"]:
            notes.append(f"{r['name']}: a run returned {r['rows']} of {r['expected']} rows")
            continue
        rate = r["rows"] / r["seconds"]
        results[r["name"]] = max(results.get(r["name"], 0.0), rate)
        if r["note"]:
            notes.append(f"{r['name']}: {r['note']}")
    if not results:
        tail = out.stderr.strip().splitlines()[-1:] or ["no output"]
        return {}, f"exit {out.returncode}: {tail[0]}"
    return results, "; ".join(notes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-petastorm", action="store_true")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    path = dataset(args.rows)
    size_mb = (path / "part-00000.parquet").stat().st_size / 1e6
    print(f"dataset: {path.relative_to(REPO)} ({args.rows:,} rows, {FLAT_COLS} float32 + array<float>[{ARRAY_LEN}],"
          f" {size_mb:.0f} MB zstd); batch {BATCH}; best of {args.repeats}; {os.cpu_count()} CPUs; "
          f"pyarrow {pa.__version__}", flush=True)
    rows: list[tuple[str, float]] = []

    def run(name: str, fn) -> None:
        rate, n = best(fn, args.repeats)
        if n != args.rows:
            raise SystemExit(f"{name} read {n} rows, expected {args.rows}")
        rows.append((name, rate))
        print(f"  {name}: {rate / 1e6:.2f} M rows/s", flush=True)

    run("raw pq.read_table (limit)", lambda: raw(path))
    run("sparktrain reader -> numpy (shuffle)", lambda: ours_numpy(path))
    run("sparktrain reader -> numpy (no shuffle)", lambda: ours_numpy(path, shuffle=False))
    try:
        run("sparktrain -> torch tensors", lambda: ours_torch(path))
    except ImportError as e:
        print(f"  torch: unavailable ({e})")
    try:
        run("sparktrain -> tf.data", lambda: ours_tf(path))
    except ImportError as e:
        print(f"  tf.data: unavailable ({e})")
    peer, note = ({}, "skipped (--no-petastorm)") if args.no_petastorm else \
        petastorm(path, args.rows, max(1, args.repeats - 1))
    if not peer:
        print(f"petastorm: unavailable ({note})")
    rows += sorted(peer.items(), key=lambda kv: -kv[1])

    raw_rate = rows[0][1]
    pet_best = max([r for n, r in rows if n.startswith("petastorm") and "default" not in n], default=None)
    print()
    print(f"| {'loader':<42} | {'M rows/s':>9} | {'vs raw':>7} | {'vs petastorm best':>17} |")
    print(f"|{'-' * 44}|{'-' * 11}|{'-' * 9}|{'-' * 19}|")
    for name, rate in rows:
        vs_pet = f"{rate / pet_best:.1f}x" if pet_best else "n/a"
        print(f"| {name:<42} | {rate / 1e6:>9.2f} | {rate / raw_rate:>6.2f}x | {vs_pet:>17} |")
    ours = dict(rows)["sparktrain reader -> numpy (shuffle)"]
    print()
    print(f"ours-numpy / raw = {ours / raw_rate:.2f} (goal >= 0.5)")
    if pet_best:
        print(f"ours-numpy / petastorm-best = {ours / pet_best:.1f} (goal >= 3)")
    else:
        print("ours-numpy / petastorm-best = n/a (petastorm unavailable)")
    if note and peer:
        print(f"petastorm notes: {note}")


if __name__ == "__main__":
    main()
