"""The flights job on Ray 2.60 (Data + Train + Tune): the actor-based peer of bench/actors.py.

Runs only in ``bench/peers/.venv-ray`` (``bench/peers/setup-ray.sh``); bench/actors.py
starts it in a subprocess and reads its ``RESULT {...}`` lines.  The network and the
feature assembly are sparktrain's own executor-side code (``build_default_model``,
``to_arrays``: numpy + torch only, no pyspark), so both sides train the same MLP on
the same arrays; everything else (reading, sharding, scheduling, DDP setup,
checkpoints, restarts, trials) is Ray's.

Ray is confined to 127.0.0.1: ``ray.init(_node_ip_address="127.0.0.1",
include_dashboard=False)``; the ``listeners`` result lists every listening socket
of this process tree, so bench/actors.py can say whether anything listens beyond
loopback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

# Set before ray is imported: no usage stats, no log dedup noise.
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
# ray.init(_node_ip_address="127.0.0.1") alone is not enough: Ray replaces a loopback node IP with the
# machine's "reachable" address (services.resolve_ip_for_localhost), and its gRPC servers then listen
# on that address and on [::].  With Ray's single-machine mode (its default on macOS and Windows) the
# node IP stays 127.0.0.1 and every server of Ray 2.60 binds to it.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


def emit(kind: str, **payload: Any) -> None:
    print("RESULT " + json.dumps({"kind": kind, **payload}, default=float), flush=True)


def listeners() -> List[str]:
    """``host:port`` of every listening TCP socket of this process and its children (Ray's daemons)."""
    import psutil

    me = psutil.Process()
    pids = {me.pid, *(p.pid for p in me.children(recursive=True))}
    out = set()
    for c in psutil.net_connections(kind="inet"):
        if c.status == psutil.CONN_LISTEN and c.pid in pids and c.laddr:
            out.add(f"{c.laddr.ip}:{c.laddr.port}")
    return sorted(out)


# ---------------------------------------------------------------------------------------------- model
def _inputs(args):
    from sparktrain.train._executor.spec import InputSpec

    return InputSpec.from_dict(json.loads(Path(args.inputs).read_text()))


def _columns(inputs) -> List[str]:
    return [*inputs.columns, inputs.label]


def train_loop(config: Dict[str, Any]) -> None:
    """Ray Train worker loop: DDP over Ray Data shards, a checkpoint per epoch, optional injected kill."""
    import numpy as np
    import ray.train
    import ray.train.torch
    import torch

    from sparktrain.train._executor.batches import to_arrays
    from sparktrain.train._executor.spec import InputSpec, ModelSpec
    from sparktrain.train._executor.torch_worker import build_default_model

    torch.set_num_threads(1)
    ctx = ray.train.get_context()
    rank = ctx.get_world_rank()
    inputs = InputSpec.from_dict(config["inputs"])
    torch.manual_seed(config["seed"])
    net = build_default_model(inputs, ModelSpec(tuple(config["hidden"]), config["emb"], 0.0))
    opt = torch.optim.Adam(net.parameters(), lr=config["lr"])
    start_epoch = 0
    ckpt = ray.train.get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"), weights_only=False)
        net.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start_epoch = state["epoch"] + 1
    model = ray.train.torch.prepare_model(net)
    shard = ray.train.get_dataset_shard("train")
    marks = config.get("marks")
    first = True
    for epoch in range(start_epoch, config["epochs"]):
        t0 = time.perf_counter()
        steps = 0
        losses = []
        for batch in shard.iter_batches(batch_size=config["batch"], batch_format="numpy",
                                        local_shuffle_buffer_size=config["shuffle_buffer"],
                                        local_shuffle_seed=config["seed"] + epoch):
            if marks and config.get("kill") and rank == config["kill"][0] and epoch == config["kill"][1] \
                    and steps == config["kill"][2] and not os.path.exists(os.path.join(marks, "killed")):
                Path(marks, "killed").write_text(json.dumps({"time": time.time(), "epoch": epoch, "step": steps}))
                os._exit(3)
            x_num, x_cat, y = to_arrays(batch, inputs)
            logits = model(torch.from_numpy(x_num), torch.from_numpy(x_cat)).reshape(-1)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, torch.from_numpy(y))
            opt.zero_grad()
            loss.backward()
            opt.step()
            steps += 1
            if rank == 0 and first:
                first = False
                if marks:
                    n = len(list(Path(marks).glob("start-*.json")))
                    Path(marks, f"start-{n}.json").write_text(json.dumps(
                        {"time": time.time(), "epoch": epoch, "resumed_from_epoch": start_epoch}))
            if rank == 0 and marks:
                with open(os.path.join(marks, "progress.json"), "w") as f:
                    f.write(json.dumps({"epoch": epoch, "step": steps}))
            if steps % 50 == 0:
                losses.append(float(loss.detach()))
        train_s = time.perf_counter() - t0
        metrics = {"epoch": epoch, "steps": steps, "train_s": train_s, "loss": float(np.mean(losses or [0.0]))}
        with tempfile.TemporaryDirectory() as d:
            if rank == 0:
                torch.save({"epoch": epoch, "model": net.state_dict(), "optimizer": opt.state_dict()},
                           os.path.join(d, "state.pt"))
                ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(d))
            else:
                ray.train.report(metrics)


def run_train(args, ds_train, inputs, kill=None, marks=None) -> Dict[str, Any]:
    import ray.train
    from ray.train.torch import TorchTrainer

    config = {"inputs": inputs.to_dict(), "seed": 42, "hidden": args.hidden, "emb": args.emb, "lr": args.lr,
              "epochs": args.epochs, "batch": args.batch, "shuffle_buffer": 8192, "kill": kill, "marks": marks,
              "t_fit": None}
    storage = tempfile.mkdtemp(prefix="ray-train-", dir=args.scratch)
    trainer = TorchTrainer(
        train_loop, train_loop_config=config,
        scaling_config=ray.train.ScalingConfig(num_workers=args.workers, use_gpu=False,
                                               resources_per_worker={"CPU": 1}),
        run_config=ray.train.RunConfig(storage_path=storage, name="flights",
                                       failure_config=ray.train.FailureConfig(max_failures=1 if kill else 0)),
        datasets={"train": ds_train})
    t0 = time.time()
    result = trainer.fit()
    total = time.time() - t0
    return {"t_fit": t0, "total_s": total, "result": result}


def evaluate(args, inputs, checkpoint) -> float:
    """Test AUC of the checkpointed model, on the test split read with pyarrow (as our evaluation reads it)."""
    import numpy as np
    import pyarrow.parquet as pq
    import torch
    from sklearn.metrics import roc_auc_score

    from sparktrain.train._executor.batches import to_arrays
    from sparktrain.train._executor.spec import ModelSpec
    from sparktrain.train._executor.torch_worker import build_default_model

    net = build_default_model(inputs, ModelSpec(tuple(args.hidden), args.emb, 0.0))
    with checkpoint.as_directory() as d:
        net.load_state_dict(torch.load(os.path.join(d, "state.pt"), weights_only=False)["model"])
    net.eval()
    table = pq.read_table(args.test, columns=_columns(inputs))
    batch = {c: table.column(c).to_numpy(zero_copy_only=False) for c in table.column_names}
    x_num, x_cat, y = to_arrays(batch, inputs)
    with torch.no_grad():
        scores = torch.sigmoid(net(torch.from_numpy(x_num), torch.from_numpy(x_cat)).reshape(-1)).numpy()
    return float(roc_auc_score(y.astype(np.int64), scores))


# ---------------------------------------------------------------------------------------------- parts
def part_reader(args, inputs) -> None:
    import ray.data

    for _ in range(args.repeats):
        t0 = time.perf_counter()
        rows = 0
        ds = ray.data.read_parquet(args.train).select_columns(_columns(inputs))
        for batch in ds.iter_batches(batch_size=args.batch, batch_format="numpy"):
            rows += len(batch[inputs.label])
        emit("reader", rows=rows, seconds=time.perf_counter() - t0)


def part_train(args, inputs) -> None:
    import ray.data

    for rep in range(args.repeats):
        marks = tempfile.mkdtemp(prefix="ray-marks-", dir=args.scratch)
        ds = ray.data.read_parquet(args.train).select_columns(_columns(inputs))
        out = run_train(args, ds, inputs, marks=marks)
        start = json.loads(Path(marks, "start-0.json").read_text())
        res = out["result"]
        auc = evaluate(args, inputs, res.checkpoint) if res.checkpoint is not None else None
        emit("train", repeat=rep, total_s=out["total_s"], first_step_s=start["time"] - out["t_fit"],
             train_s=res.metrics.get("train_s"), steps=res.metrics.get("steps"), test_auc=auc,
             error=str(res.error) if res.error else None)


def part_fault(args, inputs) -> None:
    import ray.data

    marks = tempfile.mkdtemp(prefix="ray-fault-", dir=args.scratch)
    ds = ray.data.read_parquet(args.train).select_columns(_columns(inputs))
    kill = [1, 1, args.kill_step]  # rank 1, epoch 1 (the second), before step kill_step
    out = run_train(args, ds, inputs, kill=kill, marks=marks)
    killed = json.loads(Path(marks, "killed").read_text())
    starts = sorted((json.loads(p.read_text()) for p in Path(marks).glob("start-*.json")), key=lambda s: s["time"])
    after = [s for s in starts if s["time"] > killed["time"]]
    res = out["result"]
    emit("fault", kill_epoch=killed["epoch"], kill_step=killed["step"],
         recovery_s=(after[0]["time"] - killed["time"]) if after else None,
         resumed_from_epoch=after[0]["resumed_from_epoch"] if after else None,
         # a per-epoch checkpoint: the interrupted epoch restarts at step 0, so every step of it done
         # before the kill is done again
         steps_redone=killed["step"] if after and after[0]["resumed_from_epoch"] == killed["epoch"] else None,
         total_s=out["total_s"], error=str(res.error) if res.error else None)


def trial(config: Dict[str, Any], ds=None, inputs_dict=None, epochs=1, batch=512) -> None:
    """A Ray Tune function trainable: one process trains the MLP for ``epochs`` and reports val_loss."""
    import numpy as np
    import torch
    from ray import tune

    from sparktrain.train._executor.batches import to_arrays
    from sparktrain.train._executor.spec import InputSpec, ModelSpec
    from sparktrain.train._executor.torch_worker import build_default_model

    torch.set_num_threads(1)
    inputs = InputSpec.from_dict(inputs_dict)
    torch.manual_seed(42)
    batch = int(config.get("batch_size", batch))
    net = build_default_model(inputs, ModelSpec(tuple(config["hidden_units"]), 8, float(config.get("dropout", 0.0))))
    opt = torch.optim.Adam(net.parameters(), lr=config["learning_rate"])
    t0 = time.perf_counter()
    for epoch in range(epochs):
        for b in ds["train"].iter_batches(batch_size=batch, batch_format="numpy", local_shuffle_buffer_size=8192,
                                          local_shuffle_seed=epoch):
            x_num, x_cat, y = to_arrays(b, inputs)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(
                net(torch.from_numpy(x_num), torch.from_numpy(x_cat)).reshape(-1), torch.from_numpy(y))
            opt.zero_grad()
            loss.backward()
            opt.step()
        total, n = 0.0, 0
        net.eval()  # no dropout while validating, as sparktrain's loop does
        with torch.no_grad():
            for b in ds["validation"].iter_batches(batch_size=4096, batch_format="numpy"):
                x_num, x_cat, y = to_arrays(b, inputs)
                out = net(torch.from_numpy(x_num), torch.from_numpy(x_cat)).reshape(-1)
                total += float(torch.nn.functional.binary_cross_entropy_with_logits(
                    out, torch.from_numpy(y), reduction="sum"))
                n += len(y)
        net.train()
        tune.report({"val_loss": total / max(n, 1), "compute_s": time.perf_counter() - t0, "epoch": epoch,
                     "wall": time.time()})
    del np


def part_tune(args, inputs) -> None:
    import ray.data
    from ray import tune

    # Materialized once, before the timed search (as our Parquet is): trials then only iterate blocks,
    # which needs no extra CPU slots while 2 trials hold both CPUs.
    ds = {"train": ray.data.read_parquet(args.train).select_columns(_columns(inputs)).materialize(),
          "validation": ray.data.read_parquet(args.validation).select_columns(_columns(inputs)).materialize()}
    trainable = tune.with_resources(
        tune.with_parameters(trial, ds=ds, inputs_dict=inputs.to_dict(), epochs=args.tune_epochs, batch=args.batch),
        {"cpu": 1})
    space = {"learning_rate": tune.loguniform(5e-4, 1e-2), "hidden_units": tune.choice([[64, 64], [128, 64], [32]])}
    tuner = tune.Tuner(trainable, param_space=space,
                       tune_config=tune.TuneConfig(num_samples=args.trials, max_concurrent_trials=args.parallelism,
                                                   metric="val_loss", mode="min"),
                       run_config=tune.RunConfig(storage_path=tempfile.mkdtemp(prefix="ray-tune-", dir=args.scratch),
                                                 name="flights-tune", verbose=0))
    t0 = time.perf_counter()
    grid = tuner.fit()
    wall = time.perf_counter() - t0
    computes = [r.metrics.get("compute_s") for r in grid if r.metrics and r.metrics.get("compute_s")]
    emit("tune", wall_s=wall, trials=len(grid), finished=len(computes), at_once=args.parallelism,
         compute_s=(sum(computes) / len(computes)) if computes else None,
         best_val_loss=grid.get_best_result().metrics.get("val_loss") if computes else None)


def ray_space(spec: Dict[str, Any]) -> Dict[str, Any]:
    """sparktrain's ``tune.space`` (``{key: {loguniform|uniform: [low, high]}}`` or ``{key: {choice: [...]}}``)
    as Ray Tune's search space, so both benches search exactly the same space."""
    from ray import tune

    ranges = {"loguniform": tune.loguniform, "uniform": tune.uniform}
    out: Dict[str, Any] = {}
    for key, dist in spec.items():
        (kind, arg), = dist.items()
        if kind == "choice":
            out[key] = tune.choice(arg)
        elif kind in ranges:
            out[key] = ranges[kind](*arg)
        else:
            raise SystemExit(f"--ttt-space: key {key!r} has distribution {kind!r}; this bench maps only "
                             f"choice, {', '.join(ranges)}")
    return out


def part_ttt(args, inputs) -> None:
    """bench/tune.py part 3's search on Ray Tune: the same space (``--ttt-space``) and epochs, ASHA (grace
    ``--ttt-grace`` epochs, reduction factor 3), Optuna's TPE as the searcher when optuna imports (else Ray's
    random search); stops when a trial reports val_loss <= ``--ttt-target`` or after ``--ttt-budget-s``, at most
    ``--trials`` trials."""
    import ray.data
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    space = ray_space(json.loads(args.ttt_space))
    ds = {"train": ray.data.read_parquet(args.train).select_columns(_columns(inputs)).materialize(),
          "validation": ray.data.read_parquet(args.validation).select_columns(_columns(inputs)).materialize()}
    try:
        from ray.tune.search.optuna import OptunaSearch

        searcher: Any = OptunaSearch(seed=args.seed)
        name = "optuna tpe"
    except Exception as e:  # noqa: BLE001 - optuna missing or not supported by this Ray
        searcher, name = None, f"random ({type(e).__name__}: {e})"[:200]
    hit: Dict[str, float] = {}
    start = time.time()

    class Target(tune.Stopper):
        def __call__(self, trial_id: str, result: Dict[str, Any]) -> bool:
            if result.get("val_loss", float("inf")) <= args.ttt_target and "at" not in hit:
                hit["at"] = float(result.get("wall", time.time())) - start
            return False

        def stop_all(self) -> bool:
            return "at" in hit

    trainable = tune.with_resources(tune.with_parameters(trial, ds=ds, inputs_dict=inputs.to_dict(),
                                                         epochs=args.tune_epochs), {"cpu": 1})
    asha = ASHAScheduler(time_attr="training_iteration", max_t=args.tune_epochs, grace_period=args.ttt_grace,
                         reduction_factor=3)
    tuner = tune.Tuner(trainable, param_space=space,
                       tune_config=tune.TuneConfig(num_samples=args.trials, max_concurrent_trials=args.parallelism,
                                                   metric="val_loss", mode="min", search_alg=searcher,
                                                   scheduler=asha, time_budget_s=args.ttt_budget_s),
                       run_config=tune.RunConfig(storage_path=tempfile.mkdtemp(prefix="ray-ttt-", dir=args.scratch),
                                                 name="flights-ttt", verbose=0, stop=Target()))
    start = time.time()
    grid = tuner.fit()
    wall = time.time() - start
    iters = [int(r.metrics.get("training_iteration") or 0) for r in grid if r.metrics]
    losses = [float(r.metrics["val_loss"]) for r in grid if r.metrics and "val_loss" in r.metrics]
    emit("ttt", searcher=name, ttt_s=hit.get("at"), wall_s=wall, trials=len(grid), epochs=sum(iters),
         stopped_early=sum(i < args.tune_epochs for i in iters), best_val_loss=min(losses) if losses else None)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--train", required=True)
    ap.add_argument("--validation", required=True)
    ap.add_argument("--test", required=True)
    ap.add_argument("--inputs", required=True, help="JSON file of the InputSpec (from our fitted model)")
    ap.add_argument("--parts", default="reader,train,fault,tune")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--lr", type=float, default=0.002)
    ap.add_argument("--hidden", type=int, nargs="+", default=[64, 64])
    ap.add_argument("--emb", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--kill-step", type=int, default=100)
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--tune-epochs", type=int, default=1)
    ap.add_argument("--scratch", default=tempfile.gettempdir())
    ap.add_argument("--ttt-target", type=float, default=0.0, help="part ttt: stop at this val_loss")
    ap.add_argument("--ttt-budget-s", type=float, default=None, help="part ttt: Ray Tune's time_budget_s")
    ap.add_argument("--ttt-space", default="{}", help="part ttt: the search space, sparktrain's tune.space as JSON")
    ap.add_argument("--ttt-grace", type=int, default=1, help="part ttt: ASHA's first rung, in epochs")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    os.makedirs(args.scratch, exist_ok=True)

    import ray

    inputs = _inputs(args)
    t0 = time.perf_counter()
    # Logical CPUs: 2 per core.  With num_cpus = cores, the 2 training workers (1 CPU each) hold every
    # CPU and Ray Data's read tasks never get one ("Cluster resources are not enough to run any task
    # from ReadFilesParquetV2. The job may hang forever"): Ray Train's documented setup leaves CPUs
    # for Ray Data.  Spark's tasks read inside the task, so local[2] needs no such headroom.
    ray.init(_node_ip_address="127.0.0.1", include_dashboard=False, num_cpus=2 * (os.cpu_count() or 1),
             log_to_driver=False, configure_logging=True, logging_level="ERROR")
    emit("init", seconds=time.perf_counter() - t0, ray=ray.__version__, listeners=listeners())
    parts = args.parts.split(",")
    try:
        if "reader" in parts:
            part_reader(args, inputs)
        if "train" in parts:
            part_train(args, inputs)
            emit("listeners", listeners=listeners())
        if "fault" in parts:
            part_fault(args, inputs)
        if "tune" in parts:
            part_tune(args, inputs)
        if "ttt" in parts:
            part_ttt(args, inputs)
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
