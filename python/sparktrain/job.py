"""The job driver: runs the stages a config defines, in the data's order.

profile -> preprocess (features) -> train -> tune, all under one MLflow parent
run when tracking is enabled.  Each stage is a function of (spark, cfg, ...) so
notebooks can call them one at a time.
"""

from __future__ import annotations

import importlib.util
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from sparktrain.config import JobConfig
from sparktrain.session import get_or_create_session

log = logging.getLogger(__name__)

STAGE_MODULES = {
    "preprocess": "sparktrain.features.materialize",
    "train": "sparktrain.train.estimator",
    "tune": "sparktrain.tune.search",
}


@dataclass
class JobResult:
    """What :func:`run_job` produced (handy in notebooks and tests)."""

    profile: Any = None
    preprocess: Any = None
    train: Any = None
    tune: Any = None
    skipped: List[str] = field(default_factory=list)
    seconds: Dict[str, float] = field(default_factory=dict)


def stage_available(stage: str) -> bool:
    """Whether the module implementing ``stage`` is part of this build."""
    mod = STAGE_MODULES.get(stage)
    if mod is None:
        return True
    try:
        return importlib.util.find_spec(mod) is not None
    except ModuleNotFoundError:  # the parent package is missing too (e.g. no tune/ yet)
        return False


def run_job(cfg: JobConfig, stages: Sequence[str] = ("profile", "preprocess", "train", "tune"),
            master: Optional[str] = None, spark=None) -> JobResult:
    """Run ``stages`` of ``cfg`` and print a short report of each.

    Parameters
    ----------
    cfg : JobConfig
        A validated job config (see :func:`sparktrain.config.load_config`).
    stages : sequence of str
        Any of ``profile``, ``preprocess``, ``train``, ``tune``; stages the
        config does not define (no ``train:``/``tune:`` section) are skipped.
    master : str, optional
        Overrides ``cfg.spark.master``.
    spark : SparkSession, optional
        Use this session instead of getting or creating one.
    """
    result = JobResult()
    wanted = [s for s in stages if _defined(cfg, s)]
    missing = [s for s in wanted if not stage_available(s)]
    if missing:
        print(f"stages not built yet: {', '.join(missing)} (see the issues tracker)")
        result.skipped.extend(missing)
        wanted = [s for s in wanted if s not in missing]
    spark = spark or get_or_create_session(master or cfg.spark.master, cfg.spark.app_name, cfg.spark.conf)

    if "profile" in wanted:
        from sparktrain.datasets import load_source
        from sparktrain.profile import profile

        t0 = time.perf_counter()
        df = load_source(spark, cfg.data.source, cfg.data.format, cfg.data.scale)
        result.profile = profile(df, label=cfg.data.label)
        result.seconds["profile"] = time.perf_counter() - t0
        print(f"== profile of {cfg.data.source} (scale {cfg.data.scale})")
        print(result.profile.format())
    if "preprocess" in wanted:
        from sparktrain.features.materialize import format_summary, run_preprocess

        t0 = time.perf_counter()
        result.preprocess = run_preprocess(spark, cfg)
        result.seconds["preprocess"] = time.perf_counter() - t0
        print("== preprocess")
        print(format_summary(result.preprocess))
    if "train" in wanted:
        t0 = time.perf_counter()
        dataset = result.preprocess.path if result.preprocess is not None else cfg.output.path
        result.train = train_stage(spark, cfg, dataset)
        result.seconds["train"] = time.perf_counter() - t0
        print("== train")
        print(result.train.format())
    return result


@dataclass
class TrainResult:
    """A fitted model with its test metrics and the MLlib baseline."""

    model: Any
    test: Dict[str, float]
    baseline: Dict[str, float]
    history: List[Dict[str, float]]
    seconds: float

    def format(self) -> str:
        last = self.history[-1] if self.history else {}
        lines = [f"epochs: {len(self.history)}  last epoch: " + "  ".join(
            f"{k}={v:.4f}" for k, v in last.items() if k != "epoch")]
        lines.append("test metrics:")
        width = max((len(k) for k in (*self.test, *self.baseline)), default=8)
        for k, v in self.test.items():
            base = self.baseline.get(k)
            extra = f"   (Spark MLlib LogisticRegression: {base:.4f})" if base is not None else ""
            lines.append(f"  {k:<{width}}  {v:.4f}{extra}")
        lines.append(f"time: {self.seconds:.1f} s")
        return "\n".join(lines)


def train_stage(spark, cfg: JobConfig, dataset_path: str, callbacks: Sequence[Any] = (),
                run_id: Optional[str] = None) -> TrainResult:
    """Fit the ``train:`` section's estimator on a materialized dataset, then evaluate on its test split."""
    import os

    from sparktrain.train.evaluate import estimator_from_config, evaluate_model, logistic_baseline

    t0 = time.perf_counter()
    est = estimator_from_config(cfg.train, cfg.data.label, run_id=run_id).setCallbacks(list(callbacks))
    model = est.fit(dataset_path)
    test_path = os.path.join(dataset_path, "test")
    test, baseline = {}, {}
    if os.path.isdir(test_path):
        test = evaluate_model(model, spark.read.parquet(test_path)).metrics
        if cfg.train.compare_baseline and model.inputs.task == "binary":
            baseline = logistic_baseline(spark, dataset_path, model.inputs, cfg.data.label).metrics
    return TrainResult(model=model, test=test, baseline=baseline, history=model.history,
                       seconds=time.perf_counter() - t0)


def _defined(cfg: JobConfig, stage: str) -> bool:
    if stage == "train":
        return cfg.train is not None
    if stage == "tune":
        return cfg.tune is not None
    return True


def score_command(model_uri: str, input_path: str, output_path: str, fmt: Optional[str] = None,
                  tracking_uri: Optional[str] = None, master: Optional[str] = None) -> int:
    """``sparktrain score``: score raw rows with a registered model in Spark."""
    from sparktrain.track.scoring import score_path

    spark = get_or_create_session(master)
    n = score_path(spark, model_uri, input_path, output_path, fmt=fmt, tracking_uri=tracking_uri)
    print(f"scored {n:,} rows with {model_uri} -> {output_path}")
    return 0
