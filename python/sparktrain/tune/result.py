"""What a search returns: one :class:`TrialRecord` per trial, and the best one."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

#: Trial statuses, named as MLflow names run statuses; PRUNED (stopped early by the pruner) is Optuna's.
FINISHED, FAILED, KILLED, PRUNED = "FINISHED", "FAILED", "KILLED", "PRUNED"

_MAXIMIZE_HINTS = ("auc", "accuracy", "acc", "f1", "precision", "recall", "r2")


#: What a trial reports at each epoch's end, by task: ``train_<name>`` and ``val_<name>``
#: (:mod:`sparktrain.train._executor.metrics`); ``tune.metric`` names one of them.
EPOCH_METRICS = {"binary": ("loss", "accuracy", "auc"), "multiclass": ("loss", "accuracy"),
                 "regression": ("loss", "rmse")}


def check_metric(metric: str, task: Optional[str] = None, label: str = "") -> None:
    """Refuse a ``tune.metric`` no trial reports, before any trial trains (every one would fail after its epochs).

    ``task``: the dataset's (``features.json``), when known; else the metric must be one some task reports.
    A name without a ``train_``/``val_`` prefix is left to the trials (a custom objective's).
    """
    import difflib

    from sparktrain.errors import ConfigError

    prefix, _, name = metric.partition("_")
    if prefix not in ("train", "val") or not name:
        return
    names = EPOCH_METRICS.get(task or "", ()) or tuple(dict.fromkeys(n for ns in EPOCH_METRICS.values() for n in ns))
    if name in names:
        return
    valid = [f"{prefix}_{n}" for n in names]
    tasks = [t for t, ns in EPOCH_METRICS.items() if name in ns]
    if task and tasks:
        why = (f"{metric} is reported for a {' or '.join(tasks)} label only; this dataset's label"
               f"{f' {label!r}' if label else ''} is {task}")
    else:
        close = difflib.get_close_matches(metric, valid, n=1)
        why = f"no trial reports {metric}" + (f" (did you mean {close[0]!r}?)" if close else "")
    raise ConfigError("tune.metric", metric, f"{why}; use one of {', '.join(valid)}"
                                             f"{f' (what a {task} label reports)' if task else ''}")


def goal_of(metric: str) -> str:
    """``"max"`` for score-like metrics (``val_auc``, ``val_accuracy``...), ``"min"`` for losses/errors."""
    leaf = metric.lower().rsplit("_", 1)[-1] if "_" in metric else metric.lower()
    return "max" if leaf in _MAXIMIZE_HINTS or metric.lower() in _MAXIMIZE_HINTS else "min"


@dataclass(frozen=True)
class TrialRecord:
    """One trial.

    Attributes
    ----------
    number : int
        1-based, in the order trials were launched.
    params : dict
        The ``train.*`` values the trial used.
    status : str
        ``FINISHED``, ``PRUNED`` (stopped early by ``tune.pruner``), ``FAILED`` (the objective
        raised) or ``KILLED`` (timed out and cancelled).
    metric : float or None
        The searched metric (``tune.metric``) of the trial's final epoch (of its last one when pruned).
    metrics : dict
        Every final metric the trial reported.
    error : str or None
        The failure's message (first line: exception type and message).
    seconds : float
        Wall time from launch to result on the driver.
    objective_seconds : float or None
        Time spent inside the objective on the executor.
    job_group : str
        The Spark job group of the trial's jobs (cancelled on timeout).
    run_id : str or None
        The MLflow child run.
    history : tuple of dict
        One dict of metrics per epoch trained.
    traceback : str or None
        The failure's traceback.
    epochs : int
        Epochs the trial trained (fewer than planned when pruned; 0 for a custom objective).
    end_s : float
        When its result reached the driver, in seconds since the search started (time to a good model).
    gpus : tuple of str
        The GPU addresses Spark gave the trial's task(s), by rank (empty without GPUs).
    """

    number: int
    params: Dict[str, Any]
    status: str
    metric: Optional[float] = None
    metrics: Dict[str, float] = field(default_factory=dict)
    error: Optional[str] = None
    seconds: float = 0.0
    objective_seconds: Optional[float] = None
    job_group: str = ""
    run_id: Optional[str] = None
    history: Tuple[Dict[str, float], ...] = ()
    traceback: Optional[str] = None
    epochs: int = 0
    end_s: float = 0.0
    gpus: Tuple[str, ...] = ()


@dataclass(frozen=True)
class SearchResult:
    """The outcome of :func:`sparktrain.tune.search.run_search`.

    Attributes
    ----------
    trials : tuple of TrialRecord
        Every trial, in launch order (failed and killed ones included).
    best_params : dict
        ``train.*`` values of the best trial.
    best_metric : float
        Its ``metric``.
    best_number : int
        Its trial number.
    best_model : object or None
        The fitted model of the best trial (a ``TorchModel``/``KerasModel``
        when training; ``None`` for a custom objective that returns no model).
    test_metrics : dict
        The best model's metrics on the dataset's ``test`` split (``test_auc``...), when it has one.
    metric, goal : str
        The searched metric and ``"min"``/``"max"``.
    mode : str
        ``single``, ``distributed`` or ``objective`` (a custom objective).
    concurrency : int
        Trials that ran at once.
    stopped_early : bool
        Whether a stop criterion, not ``max_trials``, ended the search (``stop_reason`` says which).
    stop_reason : str or None
        ``early_stop_trials``, ``time_budget_s`` or ``stop_at`` (the ``tune.*`` key that stopped it).
    seconds : float
        Wall time of the search.
    parent_run_id : str or None
        MLflow run holding the trials as child runs.
    model_version : str or None
        Registered model version of the best trial.
    model_champion : bool
        Whether the alias ``champion`` moved to that version (only when it beats the holder).
    engine : str
        ``hyperopt`` or ``optuna``.
    study : str or None
        The Optuna study's name (it persists; a rerun continues it).
    previous_trials : int
        Trials the continued study held before this search (they are not in ``trials``).
    model_dir : str or None
        Where the best trial's model was kept in the store (``<train.store>/<run>/model``;
        ``sparktrain register --from-store <train.store>/<run>`` takes its parent folder).
        None for a custom objective or a dataset not written by ``sparktrain preprocess``.
    study_best_number, study_best_metric : int or float or None
        Set when a continued Optuna study's best trial ran in an earlier search and beats
        every trial of this one (``best_*`` always describe this search's trials).
    registered_number : int or None
        The trial whose model was registered as ``model_version``: the study's best when
        its model is in the store, else this search's best.
    """

    trials: Tuple[TrialRecord, ...]
    best_params: Dict[str, Any]
    best_metric: float
    best_number: int = 0
    best_model: Any = None
    test_metrics: Dict[str, float] = field(default_factory=dict)
    metric: str = "val_loss"
    goal: str = "min"
    mode: str = "single"
    concurrency: int = 1
    stopped_early: bool = False
    stop_reason: Optional[str] = None
    seconds: float = 0.0
    parent_run_id: Optional[str] = None
    model_version: Optional[str] = None
    model_champion: bool = False
    engine: str = "hyperopt"
    study: Optional[str] = None
    previous_trials: int = 0
    model_dir: Optional[str] = None
    study_best_number: Optional[int] = None
    study_best_metric: Optional[float] = None
    registered_number: Optional[int] = None

    def table(self) -> List[Dict[str, Any]]:
        """Rows of plain values (``pandas.DataFrame(result.table())`` for a frame)."""
        return [{"trial": t.number, "status": t.status, self.metric: t.metric, "seconds": round(t.seconds, 3),
                 "epochs": t.epochs, **{f"param.{k}": v for k, v in t.params.items()}, "error": t.error,
                 "run_id": t.run_id}
                for t in self.trials]


def format_trials(result: SearchResult, max_error: int = 60) -> str:
    """A plain-text table of the trials, best marked with ``*`` (``epochs``: how many each trained)."""
    keys = sorted({k for t in result.trials for k in t.params})
    best = result.best_number
    header = ["", "trial", "status", result.metric, "seconds", "epochs run", *keys, "error"]
    rows = []
    for t in result.trials:
        metric = "-" if t.metric is None else f"{t.metric:.5g}"
        params = [_fmt(t.params.get(k, "")) for k in keys]
        error = (t.error or "").splitlines()[0][:max_error] if t.error else ""
        rows.append(["*" if t.number == best else "", str(t.number), t.status, metric, f"{t.seconds:.1f}",
                     str(t.epochs) if t.epochs else "-", *params, error])
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    done = sum(t.status == FINISHED for t in result.trials)
    pruned = sum(t.status == PRUNED for t in result.trials)
    summary = (f"{len(result.trials)} trials ({done} finished" + (f", {pruned} pruned" if pruned else "")
               + f"), {result.engine}, mode {result.mode}, {result.concurrency} at a "
               f"time, {result.seconds:.1f} s; best {result.metric} = {result.best_metric:.5g} "
               f"({result.goal}imize) at trial {best}")
    if result.study:
        summary += f"; study {result.study}" + (f" (continued: {result.previous_trials} earlier trials)"
                                                 if result.previous_trials else "")
    if result.stopped_early:
        why = {"time_budget_s": "tune.time_budget_s spent", "stop_at": f"{result.metric} reached tune.stop_at"}
        summary += f"; stopped early ({why.get(result.stop_reason or '', 'no improvement')})"
    if result.test_metrics:
        summary += (f"; this search's best (trial {best}) on test: "
                    + ", ".join(f"{k} = {v:.4f}" for k, v in result.test_metrics.items()))
    if result.study_best_number is not None and result.study_best_metric is not None:
        summary += (f"; the study's best is trial {result.study_best_number} of an earlier search "
                    f"({result.metric} = {result.study_best_metric:.5g}), better than this search's best")
    if result.model_version:
        moved = "alias champion -> this version" if result.model_champion else "champion unchanged (not better)"
        which = "" if result.registered_number is None else f" from trial {result.registered_number}"
        summary += f"; registered{which} as version {result.model_version} ({moved})"
    if result.model_dir:
        summary += f"; trial {best}'s model kept in {result.model_dir}"
    return "\n".join([*lines, summary])


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, tuple):
        return "[" + ",".join(map(str, value)) + "]"
    return str(value)
