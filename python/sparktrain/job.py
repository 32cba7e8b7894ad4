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
    return result


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
