"""Record jobs in MLflow and register one model (scoring it is :mod:`sparktrain.serve`).

A job is a parent run; each stage (profile, preprocess, train) and each
tuning trial is a child run (tag ``mlflow.parentRunId``).  The registered
model is one pyfunc model (:mod:`sparktrain.serve.pyfunc`) that carries the fitted feature transforms and the
network, so it scores raw rows in Spark (``mlflow.pyfunc.spark_udf``) and
without Spark (``load_model(...).predict``, ``mlflow models serve``).

API (what :func:`sparktrain.job.run_job` uses, and what tuning builds on)
--------------------------------------------------------------------------
``JobTracker(cfg, uri=None)``
    Preflight (an unreachable server fails here, naming the URI, before any
    Spark work), process-wide MLflow URIs, the experiment.
``with tracker.job(spark, master) as job_run:``
    The parent run: masked config params, system tags, ``config/job.yaml``.
``with tracker.stage("train") as run:``
    A stage child run; ``run.run_id``, ``run.log_metrics(d, step)``,
    ``run.log_params``, ``run.set_tags``, ``run.log_artifact``,
    ``run.log_figure``, ``run.callback()`` (a training callback that logs
    per-epoch metrics by run id, safe from the progress thread).
``with tracker.child_run("trial-3", params={...}) as run:``
    A trial child run (``FAILED`` with the error message if the body raises,
    never dropped).  ``tracker.start_run(...)``/``tracker.end_run(run_id,
    status)`` do the same without a ``with`` block.
``log_model_and_register(model, dataset, cfg, metrics, parent_run_id=None, run_id=None)``
    Logs the pyfunc model (to ``run_id``, or a new ``register`` child of
    ``parent_run_id``), registers it under ``cfg.tracking.model_name`` and
    calls ``set_champion_if_better``; returns a ``RegisteredVersion``
    (``.version``, ``.model_uri``, ``.champion``...).
``set_champion_if_better(client, name, version, metric, score, higher_is_better=True, basis=None)``
    Moves alias ``champion`` to ``version`` when it strictly beats the current one.
``resolve_model(model_uri, registry_uri=None)`` / ``use_store(model_uri, tracking_uri=None)``
    Find a model before anything reads it (:mod:`sparktrain.track.lookup`): the store the
    CLI reads by default, a clear ``ModelNotFoundError`` for a missing store, name, alias,
    version or its files, and the URI pinned to the version it names now.
``MlflowServer`` / ``serve_forever``
    A real ``mlflow server`` on 127.0.0.1 (tests; ``sparktrain mlflow-server``).
``install_log_masking()``
    Mask secrets in every record the root logger's handlers write (the CLI
    calls it; a notebook or an application calls it after configuring logging).

Example
-------
>>> tracker = JobTracker(cfg)                                  # doctest: +SKIP
>>> with tracker.job(spark) as job_run:                        # doctest: +SKIP
...     with tracker.child_run("trial-0", params={"train.learning_rate": 1e-3}) as trial:
...         result = train_stage(spark, cfg, path, callbacks=[trial.callback()], run_id=trial.run_id)
...     best = log_model_and_register(result.model, path, cfg, result.test, run_id=trial.run_id)
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "JobTracker": "sparktrain.track.tracker",
    "StageRun": "sparktrain.track.tracker",
    "MlflowCallback": "sparktrain.track.tracker",
    "log_model_and_register": "sparktrain.track.registry",
    "set_champion_if_better": "sparktrain.track.registry",
    "RegisteredVersion": "sparktrain.track.registry",
    "resolve_model": "sparktrain.track.lookup",
    "use_store": "sparktrain.track.lookup",
    "MlflowServer": "sparktrain.track.server",
    "serve_forever": "sparktrain.track.server",
    "install_log_masking": "sparktrain._internal.log_masking",
}

__all__ = ["JobTracker", "MlflowCallback", "MlflowServer", "RegisteredVersion", "StageRun", "install_log_masking",
           "log_model_and_register", "resolve_model", "serve_forever", "set_champion_if_better", "use_store"]


def __getattr__(name: str) -> Any:  # lazy: importing sparktrain.track does not import mlflow
    import importlib

    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'sparktrain.track' has no attribute {name!r}")
