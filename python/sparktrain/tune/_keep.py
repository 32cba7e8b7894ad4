"""The search's best model in the store, and a continued study's best from an earlier search.

After the trials, and before any MLflow call, the best trial's model is
written to its own run folder in ``train.store`` (``<store>/<prefix>-tNNN/model``,
the layout of :func:`sparktrain.track.bundle.save_bundle`), as a fit's model
is: a tracking outage loses nothing, and ``sparktrain register --from-store
<store>/<prefix>-tNNN`` finishes the tracking later.  This needs a dataset
written by ``sparktrain preprocess`` (its ``features.json`` goes in the bundle).

An Optuna study outlives a search: each trial records its store folder (user
attribute ``store_run``), so a continued search whose study's best trial ran
in an earlier search finds that trial's model in the store, when that search
kept it (:func:`study_best`).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from typing import Any, Dict, Mapping, Optional, Sequence

from sparktrain.tune._engines import STORE_RUN_ATTR
from sparktrain.tune.result import FINISHED, TrialRecord

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EarlierBest:
    """A continued study's best trial, from an earlier search.

    Attributes
    ----------
    number : int
        Its trial number in the study.
    metric : float
        Its ``tune.metric``.
    params : dict
        Its ``train.*`` values.
    model : object or None
        Its model, loaded from the store (None when the earlier search did not keep it).
    run_dir : str or None
        Its run folder in the store.
    mlflow_run_id : str or None
        The MLflow child run the earlier search logged it to.
    metrics : dict
        Its final validation metrics and the test metrics its search measured.
    """

    number: int
    metric: float
    params: Dict[str, Any]
    model: Any = None
    run_dir: Optional[str] = None
    mlflow_run_id: Optional[str] = None
    metrics: Mapping[str, float] = ()  # type: ignore[assignment]


def keep_model(cfg: Any, record: TrialRecord, model: Any, test: Mapping[str, float], dataset_path: Optional[str],
               mlflow_run_id: Optional[str]) -> Optional[str]:
    """Write the best trial's model to its run folder in the store; returns the model folder, or None.

    None when there is nothing to keep in the bundle layout: a custom objective
    (no model), or a dataset without ``features.json`` (Parquet not written by
    ``sparktrain preprocess``).
    """
    import pyarrow.fs as pafs

    from sparktrain.data import _fs
    from sparktrain.data.commit import resolve
    from sparktrain.track.bundle import save_bundle
    from sparktrain.train.inputs import FEATURES_JSON
    from sparktrain.train.evaluate import baseline_name
    from sparktrain.train.result import TrainResult

    if model is None or dataset_path is None or cfg.train is None:
        return None
    root = resolve(dataset_path)
    fs, inner = _fs.resolve(_fs.join(root, FEATURES_JSON))  # a local path or an object store's URI
    if fs.get_file_info(inner).type != pafs.FileType.File:
        log.info("the best trial's model is not kept in the store: %s has no features.json (not written by "
                 "`sparktrain preprocess`)", root)
        return None
    trial_cfg = replace(cfg, train=replace(cfg.train, **record.params))
    result = TrainResult(model=model, test=dict(test), baseline={}, history=list(model.history),
                         seconds=record.seconds, baseline_model=baseline_name(model.inputs.task))
    return save_bundle(result, trial_cfg, root, mlflow_run_id=mlflow_run_id)


def study_best(engine: Any, records: Sequence[TrialRecord], store: Optional[str]) -> Optional[EarlierBest]:
    """The continued study's best trial when an earlier search ran it, with its model when the store kept it.

    None for Hyperopt, a new study, or when this search's best is the study's best.
    """
    study = getattr(engine, "study", None)
    if study is None or not engine.previous:
        return None
    from optuna.trial import TrialState

    if not study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        return None
    best = study.best_trial
    if best.number + 1 in {r.number for r in records} or best.value is None:
        return None
    ours = [r.metric for r in records if r.status == FINISHED and r.metric is not None]
    if ours and (min(ours) if study.direction.name == "MINIMIZE" else max(ours)) == best.value:
        return None  # a tie: this search's own model is as good, and the one it has
    params = json.loads(best.user_attrs.get("train_params", "{}"))
    found = EarlierBest(number=best.number + 1, metric=float(best.value), params=params)
    folder = best.user_attrs.get(STORE_RUN_ATTR)
    if not folder or not store:
        return found
    return _with_stored_model(found, f"{store.rstrip('/')}/{folder}")


def _with_stored_model(found: EarlierBest, run_dir: str) -> EarlierBest:
    """``found`` with the model its search kept at ``run_dir``, when there is one."""
    from sparktrain.errors import ModelNotFoundError, StoreReadError
    from sparktrain.track.bundle import load_model, read_bundle

    try:
        body = read_bundle(run_dir)
    except ModelNotFoundError:
        return replace(found, run_dir=run_dir)
    except StoreReadError as exc:  # the earlier search's folder cannot be read now: this search goes on without
        log.warning("the earlier best model at %s cannot be read (%s); it is left out of the comparison",
                    run_dir, str(exc)[:300])
        return replace(found, run_dir=run_dir)
    model = load_model(body["_dir"], body.get("files"))
    last = {k: float(v) for k, v in (body.get("history") or [{}])[-1].items()
            if k != "epoch" and isinstance(v, (int, float))}
    return replace(found, model=model, run_dir=run_dir, mlflow_run_id=body.get("mlflow_run_id"),
                   metrics={**last, **(body.get("test") or {})})


def retrain_hint(cfg_name: str, params: Mapping[str, Any]) -> str:
    """``sparktrain train CONFIG --set train.k=v ...``: the command that trains a trial's params again."""
    sets = " ".join(f"--set train.{k}={json.dumps(list(v)) if isinstance(v, (list, tuple)) else v}"
                    for k, v in sorted(params.items()))
    return f"sparktrain train <{cfg_name} config> {sets}".rstrip()


__all__ = ["EarlierBest", "keep_model", "study_best", "retrain_hint"]
