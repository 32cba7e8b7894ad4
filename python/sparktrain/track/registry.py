"""Model registry: log the one model, register it, keep ``champion`` on the best version.

A version's score is stored in its tags (``sparktrain.score_metric``,
``sparktrain.score``, ``sparktrain.higher_is_better``).  The score metric is
the test ROC AUC for binary models, test accuracy for multiclass, test RMSE for
regression, and the last epoch's validation loss when there is no test split.
The alias moves only to a strictly better version; a champion with no
comparable score (other metric, no tags, no such run metric) is replaced.
With no champion (the alias never set, or deleted with its version), the
new version takes it only if it beats every remaining version scored on the
same metric for the same target; otherwise the best of those holds it again.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

from sparktrain._internal.secrets import mask_value
from sparktrain.errors import TrackingError
from sparktrain.track.lookup import check_model_uri, pin_model_uri, registered_model_names  # noqa: F401 - API

log = logging.getLogger(__name__)

CHAMPION = "champion"


@dataclass(frozen=True)
class RegisteredVersion:
    """What :func:`log_model_and_register` produced."""

    name: Optional[str]          # registered model name (None when registration is off)
    version: Optional[int]       # registered version
    model_uri: str               # models:/NAME/VERSION, or the logged model's URI
    logged_model_uri: str        # models:/<model id>
    run_id: str                  # the run the model was logged to
    metric: Optional[str]        # score metric
    score: Optional[float]
    champion: bool = False       # whether the alias now points at this version


def score_of(task: str, metrics: Mapping[str, float], history: Optional[List[Mapping[str, float]]] = None
             ) -> Tuple[Optional[str], Optional[float], bool]:
    """``(metric, value, higher_is_better)`` used to rank versions (see the module docstring)."""
    preferred = {"binary": ("test_auc", True), "multiclass": ("test_accuracy", True),
                 "regression": ("test_rmse", False)}.get(task)
    if preferred and preferred[0] in metrics and _finite(metrics[preferred[0]]):
        return preferred[0], float(metrics[preferred[0]]), preferred[1]
    if "val_loss" in metrics and _finite(metrics["val_loss"]):
        return "val_loss", float(metrics["val_loss"]), False
    last = (history or [{}])[-1]
    if "val_loss" in last and _finite(last["val_loss"]):
        return "val_loss", float(last["val_loss"]), False
    return None, None, True


def _finite(v: Any) -> bool:
    try:
        return math.isfinite(float(v))
    except (TypeError, ValueError):
        return False


def score_basis(inputs: Any) -> str:
    """What a version's score measures: its label column, task and classes (JSON), from its ``InputSpec``.

    Two versions with different bases predict different targets, so their
    test metrics do not rank them (a redefined label with the same model name).
    """
    import json

    return json.dumps({"label": inputs.label, "task": inputs.task, "classes": [str(c) for c in inputs.classes]},
                      sort_keys=True)


def _same_target(a: str, b: str) -> bool:
    """Whether two :func:`score_basis` values predict the same target: the same label column and task, and
    classes that overlap (a rare class missing from one run's sample, or 1 against 1.0, still compare)."""
    import json

    def norm(c: str) -> str:
        try:
            return repr(float(c))
        except ValueError:
            return c

    try:
        x, y = json.loads(a), json.loads(b)
    except ValueError:
        return a == b
    if (x.get("label"), x.get("task")) != (y.get("label"), y.get("task")):
        return False
    cx, cy = {norm(str(c)) for c in x.get("classes") or ()}, {norm(str(c)) for c in y.get("classes") or ()}
    return not (cx and cy and not cx & cy)


def score_split(dataset_root: Optional[str], metric: Optional[str]) -> Optional[str]:
    """The identity of the rows ``metric`` is measured on: the test split for ``test_*`` metrics, else the
    validation split (:func:`sparktrain.train.inputs.split_identity`); None when the dataset cannot say."""
    from sparktrain.train.inputs import split_identity

    if metric is None:
        return None
    return split_identity(dataset_root, "test" if metric.startswith("test_") else "validation")


def set_champion_if_better(client: Any, name: str, version: int, metric: Optional[str], score: Optional[float],
                           higher_is_better: bool = True, alias: str = CHAMPION, basis: Optional[str] = None,
                           split: Optional[str] = None) -> bool:
    """Point ``alias`` at ``version`` when it beats the current holder; returns whether it moved.

    The version's score (and ``basis``, :func:`score_basis`) is written to its
    tags first, so later versions can compare against it.  A holder that
    predicts another target (another label column or task, or classes with
    none in common) does not count: ``version`` takes the alias with a
    warning naming both.  ``split`` (:func:`score_split`) says which rows the
    score was measured on; a holder scored on other rows (the dataset was
    preprocessed again with another split or other source data) is still
    compared, with a warning that the two scores come from different rows.
    """
    from mlflow.exceptions import MlflowException

    tags = {"sparktrain.score_basis": basis} if basis is not None else {}
    if split is not None:
        tags["sparktrain.score_split"] = split
    if metric is not None and score is not None:
        tags.update({"sparktrain.score_metric": metric, "sparktrain.score": repr(float(score)),
                     "sparktrain.higher_is_better": str(bool(higher_is_better)).lower()})
    for k, v in tags.items():
        client.set_model_version_tag(name, str(version), k, v)
    try:
        current = client.get_model_version_by_alias(name, alias)
    except MlflowException as exc:
        if "RESOURCE_DOES_NOT_EXIST" not in str(getattr(exc, "error_code", "")) and "not found" not in str(exc):
            raise TrackingError(f"cannot read alias {alias!r} of model {name!r} ({mask_value(str(exc))[:300]}); "
                                f"it was left as it is, and version {version} is registered. Fix the registry, then "
                                f"set the alias yourself if v{version} should hold it") from exc
        current = None  # no alias (never set, or deleted with its version) or one that names a deleted version
    theirs_basis = dict(current.tags or {}).get("sparktrain.score_basis") if current is not None else None
    if current is None:
        best = _best_other(client, name, version, metric, higher_is_better, basis)
        if best is not None and score is not None and \
                ((best[1] > score) if higher_is_better else (best[1] < score)):
            client.set_registered_model_alias(name, alias, str(best[0]))
            log.warning("%s had no %s (its version deleted?): v%s, the best remaining version (%s %.5f), holds it "
                        "again; v%s has %.5f", name, alias, best[0], metric, best[1], version, score)
            return False
        reason = "no current champion" + ("" if best is None else f"; it beats the best remaining v{best[0]}'s "
                                                                    f"{best[1]:.5f}")
    elif int(current.version) == int(version):
        return True
    elif basis is not None and theirs_basis is not None and not _same_target(theirs_basis, basis):
        reason = f"v{current.version} predicts another target ({theirs_basis}; v{version}: {basis}), so its scores " \
                 f"do not compare"
        log.warning("%s of %s: %s; moving it to v%s", alias, name, reason, version)
    elif score is None:
        log.info("keeping %s on %s v%s: v%s has no score", alias, name, current.version, version)
        return False
    else:
        theirs = _version_score(client, current, metric)
        theirs_split = dict(current.tags or {}).get("sparktrain.score_split")
        if theirs is not None and split is not None and theirs_split is not None and theirs_split != split:
            log.warning("%s of %s: v%s's %s was measured on other rows than v%s's (its dataset was preprocessed "
                        "with another split or from other source data), so the comparison below is not like for "
                        "like; score both on the same rows (sparktrain score) to compare them", alias, name,
                        current.version, metric, version)
        if theirs is None:
            reason = f"v{current.version} has no comparable {metric}"
        elif (score > theirs) if higher_is_better else (score < theirs):
            reason = f"{metric} {score:.5f} beats v{current.version}'s {theirs:.5f}"
        else:
            log.info("keeping %s on %s v%s (%s %.5f); v%s has %.5f", alias, name, current.version, metric,
                     theirs, version, score)
            return False
    client.set_registered_model_alias(name, alias, str(version))
    log.info("alias %s -> %s v%s (%s)", alias, name, version, reason)
    return True


def _best_other(client: Any, name: str, version: int, metric: Optional[str], higher_is_better: bool,
                basis: Optional[str]) -> Optional[Tuple[int, float]]:
    """``(version, score)`` of the best other version of ``name`` scored on ``metric`` for the same target."""
    if metric is None:
        return None
    best: Optional[Tuple[int, float]] = None
    for mv in client.search_model_versions(f"name='{name}'"):
        tags = dict(mv.tags or {})
        theirs_basis = tags.get("sparktrain.score_basis")
        if int(mv.version) == int(version) or tags.get("sparktrain.score_metric") != metric or \
                (basis is not None and theirs_basis is not None and not _same_target(theirs_basis, basis)):
            continue
        theirs = _version_score(client, mv, metric)
        if theirs is not None and (best is None or ((theirs > best[1]) if higher_is_better else (theirs < best[1]))):
            best = (int(mv.version), theirs)
    return best


def _version_score(client: Any, mv: Any, metric: Optional[str]) -> Optional[float]:
    if metric is None:
        return None
    tags = dict(mv.tags or {})
    if tags.get("sparktrain.score_metric") == metric and _finite(tags.get("sparktrain.score")):
        return float(tags["sparktrain.score"])
    if mv.run_id:
        try:
            value = client.get_run(mv.run_id).data.metrics.get(metric)
        except Exception:  # the run may have been deleted
            value = None
        if _finite(value):
            return float(value)
    return None


def log_model_and_register(model: Any, dataset: Any, cfg: Any, metrics: Mapping[str, float],
                           parent_run_id: Optional[str] = None, run_id: Optional[str] = None,
                           input_example: Any = None, client: Any = None) -> RegisteredVersion:
    """Log ``model`` as the one pyfunc model, register it and move ``champion`` if it is better.

    Parameters
    ----------
    model : _DistributedModel
        A fitted :class:`~sparktrain.train.model.TorchModel` or ``KerasModel``.
    dataset : str or preprocess result
        The materialized dataset (its ``features.json``, ``pipeline_model/``);
        anything with a ``.path`` works.
    cfg : JobConfig
        ``tracking.model_name`` and ``tracking.register`` are read.
    metrics : mapping
        Metrics of this model (``test_auc``...) used to rank versions.
    parent_run_id : str, optional
        When ``run_id`` is not given, the model is logged to a new child run
        ``register`` of this run.
    run_id : str, optional
        The run to log the model to (e.g. the train stage or the best trial).
    input_example : pandas.DataFrame, optional
        A few raw rows; stored with the model.
    """
    import os

    from mlflow import MlflowClient

    from sparktrain.serve.pyfunc import log_pyfunc_model

    client = client or MlflowClient()
    root = os.fspath(getattr(dataset, "path", dataset))
    own_run = run_id is None
    if run_id is None:
        if parent_run_id is None:
            raise TrackingError("log_model_and_register needs run_id or parent_run_id")
        parent = client.get_run(parent_run_id)
        run_id = client.create_run(parent.info.experiment_id, run_name="register",
                                   tags={"mlflow.parentRunId": parent_run_id, "sparktrain.kind": "register"}
                                   ).info.run_id
    target: str = run_id
    metric, score, higher = score_of(model.inputs.task, metrics, model.history)
    from sparktrain.features.reader_options import reader_record

    info = log_pyfunc_model(model, root, target, input_example=input_example,
                            metadata={"score_metric": metric, "score": score, "data": reader_record(cfg.data)},
                            params=client.get_run(target).data.params, client=client)
    if cfg.tracking.register:
        registered = register_logged(client, cfg.tracking.model_name, info.model_uri, target, model, metrics,
                                     dataset_root=root)
    else:
        registered = RegisteredVersion(name=None, version=None, model_uri=info.model_uri,
                                       logged_model_uri=info.model_uri, run_id=target, metric=metric, score=score)
    if own_run:
        client.set_terminated(target)
    return registered


def register_logged(client: Any, name: str, logged_uri: str, run_id: str, model: Any,
                    metrics: Mapping[str, float], dataset_root: Optional[str] = None) -> RegisteredVersion:
    """Register a logged model as a new version of ``name`` and apply the champion rule to it.

    ``metrics`` are the ones :func:`score_of` ranks it by (test metrics, else ``val_loss``);
    ``dataset_root``, the dataset they were measured on (:func:`score_split`).
    """
    import mlflow

    metric, score, higher = score_of(model.inputs.task, metrics, model.history)
    mv = mlflow.register_model(logged_uri, name, tags={"sparktrain.run_id": run_id})
    version = int(mv.version)
    if version == 1:
        _warn_case_twins(client, name)
    champion = set_champion_if_better(client, name, version, metric, score, higher, basis=score_basis(model.inputs),
                                      split=score_split(dataset_root, metric))
    return RegisteredVersion(name=name, version=version, model_uri=f"models:/{name}/{version}",
                             logged_model_uri=logged_uri, run_id=run_id, metric=metric, score=score,
                             champion=champion)


def _warn_case_twins(client: Any, name: str) -> None:
    """Warn when a new registered model's name differs from existing ones only by case: a typo's second model
    on sqlite, and one name on a database whose collation ignores case (MySQL, SQL Server)."""
    import re

    pattern = re.sub(r"['\"%_\\]", "_", name)  # quotes and wildcards: any one character, checked below
    try:
        twins = [m.name for m in client.search_registered_models(f"name ILIKE '{pattern}'")
                 if m.name != name and m.name.lower() == name.lower()]
    except Exception:  # noqa: BLE001 - a store that cannot search by ILIKE: no warning, nothing else changes
        return
    if twins:
        log.warning("registered a new model %r next to %s, whose name differs only by case; was "
                    "tracking.model_name meant to be %r? (on MySQL or SQL Server the names collide)", name,
                    ", ".join(repr(t) for t in sorted(twins)), sorted(twins)[0])


def version_summary(client: Any, name: str) -> Dict[str, Any]:
    """``{"versions": [...], "champion": version or None}`` of a registered model."""
    from mlflow.exceptions import MlflowException

    versions = sorted(int(v.version) for v in client.search_model_versions(f"name='{name}'"))
    try:
        champion: Optional[int] = int(client.get_model_version_by_alias(name, CHAMPION).version)
    except MlflowException:
        champion = None
    return {"versions": versions, "champion": champion}
