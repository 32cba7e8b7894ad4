"""Hyperparameter search on Spark with Hyperopt or Optuna (``tune.engine``).

The driver runs the engine by ask-and-tell (:mod:`sparktrain.tune._engines`,
:mod:`sparktrain.tune._loop`); an Optuna study can prune trials from their
per-epoch validation metrics (``tune.pruner``) and persists, so a rerun
continues it.  Two modes (``tune.mode``):

* ``single``: every trial trains a one-worker model inside one Spark task,
  ``parallelism`` trials at a time, each its own tiny Spark job;
* ``distributed``: every trial is a barrier-mode training run of
  ``train.num_workers`` workers on a reused gang (one barrier stage that
  runs trial after trial), as many trials at once as the slots allow.

Trials report their epochs, and a pruner's verdicts go back, over the
search's progress channel (:mod:`sparktrain.tune._channel`; the store under
Spark Connect).

Exports are resolved lazily: executors import :mod:`sparktrain.tune._trial`
and must not pay for (or depend on) Hyperopt, Optuna, MLflow or the driver modules.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "run_search": "sparktrain.tune.search",
    "tune_stage": "sparktrain.tune.search",
    "SearchResult": "sparktrain.tune.result",
    "TrialRecord": "sparktrain.tune.result",
    "format_trials": "sparktrain.tune.result",
    "compile_space": "sparktrain.tune.space",
    "CompiledSpace": "sparktrain.tune.space",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'sparktrain.tune' has no attribute '{name}'")


__all__ = ["CompiledSpace", "SearchResult", "TrialRecord", "compile_space", "format_trials", "run_search",
           "tune_stage"]
