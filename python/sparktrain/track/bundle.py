"""The trained model in the store first, MLflow second: ``<store>/<run>/model/``.

After ``fit`` returns, and before any MLflow call, the job writes the model
to its run's folder in the training store, in the layout the registry gets
(:func:`sparktrain.serve.pyfunc.write_bundle`), plus the Spark ML model and
what the tracking needs::

    <store>/<run>/model/
        network/model.bin, network/spec.json   the network (rank 0 wrote model.bin already)
        features/features.json                 the fitted feature transforms
        pipeline_model/                        the fitted Spark PipelineModel
        model.json                             the Spark ML model's class, params, inputs and history
        bundle.json                            config, metrics, history, MLflow run ids, and the
                                               size and SHA-256 of every other file (written last)

``bundle.json`` is the commit record: it is written after every other file,
and lists them with their sizes and SHA-256, so a reader takes only a
complete bundle of one job (:func:`load_model` checks the network and
``model.json`` against it).  A tracking outage then loses nothing: ``sparktrain register --from-store
<store>/<run>`` logs and registers the model later, with the usual alias
rules (:func:`register_from_store`).

No secret is written: ``bundle.json`` holds the config masked as in MLflow
(:func:`sparktrain._internal.secrets.mask_config`), and ``model.json`` the
model's params with any URL password masked.  Nothing that loads or scores
the model needs them.  ``register --from-store`` needs the tracking URI:
when the stored one had a password (``https://user:***@host``) it takes
``--tracking-uri``, else ``MLFLOW_TRACKING_URI``, else refuses and says so;
MLflow's ``MLFLOW_TRACKING_USERNAME``/``MLFLOW_TRACKING_PASSWORD`` (or
``MLFLOW_TRACKING_TOKEN``) keep a password out of the URI altogether.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from typing import Any, Dict, List, Optional

from sparktrain._internal.secrets import MASK, mask_config, mask_strings, mask_value
from sparktrain._internal.spark_compat import error_summary
from sparktrain.features.load import Embedded

log = logging.getLogger(__name__)

BUNDLE_FILE = "bundle.json"
MODEL_FILE = "model.json"
FORMAT = "sparktrain.bundle/1"
#: set on the MLflow run a ``register --from-store`` logged the model to (value: the bundle folder)
REGISTERED_TAG = "sparktrain.registered_from_store"


def model_dir(store: str, run_id: str) -> str:
    """``<store>/<run_id>/model`` (local path or URI; :meth:`~sparktrain.data.run_store.RunStore.model_uri`)."""
    from sparktrain.data.run_store import RunStore

    return RunStore(store, run_id).model_uri()


def save_bundle(result: Any, cfg: Any, dataset_root: str, mlflow_run_id: Optional[str] = None,
                parent_run_id: Optional[str] = None) -> str:
    """Write the trained model and what its tracking needs to the store; returns the model folder.

    Parameters
    ----------
    result : TrainResult
        From :func:`sparktrain.job.train_stage` (:class:`sparktrain.train.result.TrainResult`).
    cfg : JobConfig
        The job's config (stored, so the tracking can be finished without it).
    dataset_root : str
        The materialized dataset (its ``features.json`` and pipeline go in the bundle).
    mlflow_run_id, parent_run_id : str, optional
        The MLflow train-stage and job runs this model belongs to, when tracking is on.
    """
    from sparktrain.serve.pyfunc import write_bundle

    model = result.model
    target = model_dir(_store_of(cfg), model.getRunId())
    with tempfile.TemporaryDirectory(prefix="sparktrain-bundle-") as tmp:
        local = os.path.join(tmp, "model")
        write_bundle(model, dataset_root, local)
        with open(os.path.join(local, MODEL_FILE), "w") as fh:  # plain JSON: no Spark job, works over Connect
            json.dump(mask_strings(model_description(model)), fh, indent=1, default=str)
        body: Dict[str, Any] = {
            "format": FORMAT, "run_id": model.getRunId(), "framework": model.framework,
            "mlflow_run_id": mlflow_run_id, "mlflow_parent_run_id": parent_run_id, "created_at": time.time(),
            "dataset": dataset_root, "test": result.test, "baseline": result.baseline,
            "baseline_model": result.baseline_model, "history": result.history, "seconds": result.seconds}
        body = {**mask_strings(body), "config": mask_config(cfg.to_dict()), "files": _file_digests(local)}
        _upload(local, target)
        _write_last(f"{target}/{BUNDLE_FILE}", json.dumps(body, indent=1, default=str).encode())
    log.info("model of run %s saved to %s", model.getRunId(), target)
    return target


def model_description(model: Any) -> Dict[str, Any]:
    """What rebuilds the fitted Spark ML model with its network (:func:`load_model`)."""
    return {"class": type(model).__name__, "framework": model.framework, "inputs": model.inputs.to_dict(),
            "history": model.history, "params": {p.name: v for p, v in model.extractParamMap().items()}}


def load_model(folder: str, files: Optional[Dict[str, Any]] = None) -> Any:
    """The TorchModel / KerasModel a bundle folder holds (``model.json`` + ``network/model.bin``).

    ``files``: ``bundle.json``'s list of sizes and digests; each file read is checked against it
    (:class:`~sparktrain.errors.CorruptObjectError` naming the file when it does not match).
    """
    from sparktrain.train.model import KerasModel, TorchModel
    from sparktrain.train.worker import InputSpec

    desc = json.loads(_read_checked(folder, MODEL_FILE, files))
    model_bytes = _read_checked(folder, "network/model.bin", files)
    cls = TorchModel if desc["class"] == "TorchModel" else KerasModel
    model = cls(framework=desc["framework"], model_bytes=model_bytes, inputs=InputSpec.from_dict(desc["inputs"]),
                history=desc["history"])
    model._set(**{k: v for k, v in desc["params"].items() if model.hasParam(k)})
    return model


def _file_digests(local: str) -> Dict[str, Dict[str, Any]]:
    """``{relative path: {"size", "sha256"}}`` of every file under ``local``."""
    import hashlib

    out = {}
    for dirpath, _, names in os.walk(local):
        for name in names:
            path = os.path.join(dirpath, name)
            h = hashlib.sha256()
            with open(path, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
            out[os.path.relpath(path, local).replace(os.sep, "/")] = {"size": os.path.getsize(path),
                                                                       "sha256": h.hexdigest()}
    return out


def _read_checked(folder: str, rel: str, files: Optional[Dict[str, Any]]) -> bytes:
    """The bytes of ``<folder>/<rel>``, checked against ``bundle.json``'s list when there is one."""
    import hashlib

    from sparktrain.data import _fs
    from sparktrain.errors import CorruptObjectError

    fs, inner = _fs.resolve(f"{folder}/{rel}")
    try:
        with fs.open_input_stream(inner) as fh:
            data = fh.read()
    except FileNotFoundError as exc:
        raise CorruptObjectError(f"'{folder}/{rel}' is missing from the model's bundle (deleted?); "
                                 f"{BUNDLE_FILE} lists it. Fix: restore that folder, or train the run again") from exc
    want = (files or {}).get(rel)
    if files is not None and (want is None or want.get("size") != len(data)
                              or want.get("sha256") != hashlib.sha256(data).hexdigest()):
        raise CorruptObjectError(f"'{folder}/{rel}' does not match the bundle's {BUNDLE_FILE} (another job wrote "
                                 f"it, or it is truncated). Fix: train the run again, or restore that folder")
    return data


def _write_last(path: str, data: bytes) -> None:
    """Write the bundle's commit record (atomically: a temporary file, then a rename of that file)."""
    from sparktrain.data.run_store import Store

    folder, name = path.rsplit("/", 1)
    Store(folder).write_bytes(name, data)


def _store_of(cfg: Any) -> str:
    store = cfg.train.store
    return store if "://" in store else os.path.abspath(store)


def _upload(local: str, target: str) -> None:
    """Copy the folder ``local`` over ``target`` (a local path or a pyarrow filesystem URI)."""
    if "://" not in target or target.startswith("file://"):
        dest_dir = target[len("file://"):] if target.startswith("file://") else target
        os.makedirs(dest_dir, exist_ok=True)
        shutil.copytree(local, dest_dir, dirs_exist_ok=True)
        return
    from pyarrow import fs as pafs

    from sparktrain.data._fs import resolve

    dest_fs, dest_path = resolve(target)
    dest_fs.create_dir(dest_path, recursive=True)
    pafs.copy_files(local, dest_path, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=dest_fs)


def _stored_tracking_uri(stored: str) -> str:
    """The bundle's tracking URI, or ``MLFLOW_TRACKING_URI`` when the stored one lost its password to masking."""
    from sparktrain.errors import TrackingError

    if MASK not in stored:
        return stored
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        log.info("the stored tracking URI %s was masked; using MLFLOW_TRACKING_URI (%s)", stored, mask_value(env))
        return env
    raise TrackingError(f"the saved model's tracking URI {stored} had a password, which sparktrain never stores. "
                        "Pass it again: --tracking-uri https://user:<password>@host (or set MLFLOW_TRACKING_URI), "
                        "or keep it out of the URI with MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD")


def read_bundle(run_dir: str) -> Dict[str, Any]:
    """``bundle.json`` of a run folder (``<store>/<run>``) or of its ``model/`` folder."""
    from sparktrain.data import _fs
    from sparktrain.errors import ModelNotFoundError

    from sparktrain._internal.secrets import mask_value
    from sparktrain.errors import StoreReadError

    root = run_dir.rstrip("/")
    candidates = [f"{root}/{BUNDLE_FILE}", f"{root}/model/{BUNDLE_FILE}"]
    unread: List[str] = []
    for path in candidates:
        fs, inner = _fs.resolve(path)
        try:
            with fs.open_input_stream(inner) as fh:
                body = json.loads(fh.read())
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            continue
        except OSError as exc:  # the store did not answer, or refused: not "no model"
            if "is a directory" in str(exc):
                continue
            unread.append(f"{path}: {' '.join(str(exc).split())[:300]}")
            continue
        body["_dir"] = path[: -len(BUNDLE_FILE) - 1]
        return body
    if unread:
        raise StoreReadError(f"could not read the saved model's {BUNDLE_FILE} in '{mask_value(run_dir)}' "
                              f"({mask_value('; '.join(unread))}): the store did not answer or refused access, so "
                              f"whether the model is there is unknown. Nothing was changed: run the same command "
                              f"again once the store answers (check its endpoint and credentials)")
    raise ModelNotFoundError(f"no saved model at '{run_dir}' (looked for {', '.join(candidates)}). Pass the run "
                             f"folder the failed job printed, e.g. --from-store work/store/<run id>")


def register_from_store(spark: Any, run_dir: str, tracking_uri: Optional[str] = None,
                        embedded: Optional[Embedded] = None) -> Any:
    """Log and register a model the store kept through a tracking outage; returns its RegisteredVersion.

    ``embedded``: the datasets ``data.source`` may name, for the model's
    input example (:func:`sparktrain.track.stages.raw_input_example`).
    """
    from sparktrain.config import parse_config
    from sparktrain.track.tracker import JobTracker

    from dataclasses import replace

    body = read_bundle(run_dir)
    folder = body["_dir"]
    cfg = parse_config(body["config"])
    off = not cfg.tracking.register
    if off:  # asked for by name: a job run with tracking.register: false is registered now
        log.info("%s was trained with tracking.register off; `register --from-store` registers it as '%s'", folder,
                 cfg.tracking.model_name)
        cfg = replace(cfg, tracking=replace(cfg.tracking, register=True))
    uri = tracking_uri or _stored_tracking_uri(cfg.tracking.uri)
    tracker = JobTracker(cfg, uri=uri)  # preflight: still down -> a clear error, nothing changes
    done = already_registered(tracker.client, tracker.experiment_id, cfg, folder, body.get("mlflow_run_id"))
    if done is not None:
        return done
    model = load_model(folder, body.get("files"))
    if off:
        logged = _register_logged(tracker.client, cfg, body, model)
        if logged is not None:
            return logged
    with tempfile.TemporaryDirectory(prefix="sparktrain-register-") as tmp:
        return _register(spark, tracker, cfg, body, folder, model, _trained_on(folder, body, tmp), embedded)


def _register_logged(client: Any, cfg: Any, body: Dict[str, Any], model: Any) -> Any:
    """Register the model a job with ``tracking.register: false`` logged on its run (tag ``sparktrain.model_uri``),
    with the usual champion rule, rather than log it a second time; None when that run logged none."""
    from mlflow.exceptions import MlflowException

    from sparktrain.track.registry import register_logged

    run_id = body.get("mlflow_run_id")
    try:
        logged = client.get_run(run_id).data.tags.get("sparktrain.model_uri") if run_id else None
    except MlflowException:
        return None
    if not logged or not str(logged).startswith("models:/m-"):
        return None
    metrics = dict(body.get("test") or {})
    if body.get("history") and "val_loss" in body["history"][-1]:
        metrics.setdefault("val_loss", body["history"][-1]["val_loss"])
    registered = register_logged(client, cfg.tracking.model_name, str(logged), str(run_id), model, metrics,
                                 dataset_root=body.get("dataset"))
    client.set_tag(run_id, "sparktrain.model_version", registered.version)
    client.set_tag(run_id, "sparktrain.model_name", registered.name)
    log.info("registered the model run %s logged (%s) as v%s of '%s'", run_id, logged, registered.version,
             registered.name)
    return registered


def _trained_on(folder: str, body: Dict[str, Any], tmp: str) -> str:
    """The dataset the model's features come from: the generation it was trained on, or, once another preprocess
    of the same output.path has replaced it, a local copy of the bundle's own ``features.json`` and
    ``pipeline_model/`` (each file checked against ``bundle.json``)."""
    import pyarrow.fs as pafs

    from sparktrain.data import _fs
    from sparktrain.data.commit import resolve

    dataset = body["dataset"]
    try:
        here = _fs.kind(_fs.join(resolve(dataset), "features.json")) == pafs.FileType.File
    except Exception:  # noqa: BLE001 - a store that cannot say: the bundle's copies
        here = False
    if here:
        return dataset
    files = body.get("files") or {}
    view = os.path.join(tmp, "dataset")
    for rel in ["features/features.json", *sorted(f for f in files if f.startswith("pipeline_model/"))]:
        target = os.path.join(view, "features.json" if rel == "features/features.json" else rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "wb") as fh:
            fh.write(_read_checked(folder, rel, files or None))
    log.warning("the dataset this model was trained on (%s) is gone (another preprocess of its output.path replaced "
                "it): registering it with the bundle's own features.json and pipeline_model; the test-split plots "
                "and the dataset lineage are left out", mask_value(dataset))
    return view


def _register(spark: Any, tracker: Any, cfg: Any, body: Dict[str, Any], folder: str, model: Any, dataset: str,
              embedded: Optional[Embedded]) -> Any:
    """:func:`register_from_store` once the bundle is read: the runs, the model, the registry."""
    from sparktrain.track.stages import log_training
    from sparktrain.train.result import TrainResult
    from sparktrain.track.tracker import MlflowCallback, StageRun

    run_id = body.get("mlflow_run_id")
    run = None
    if run_id:
        try:
            tracker.client.get_run(run_id)
            run = StageRun(tracker.client, run_id, "train")
        except Exception:  # noqa: BLE001 - the run is not in this store: make a new one
            run = None
    if run is None:
        run = tracker.start_run("train", tags={"sparktrain.kind": "stage", "sparktrain.stage": "train",
                                               "sparktrain.from_store": folder})
    callback = MlflowCallback(tracker.client, run.run_id)
    for m in tracker.client.get_metric_history(run.run_id, "train_loss"):
        callback.epochs_logged.add(int(m.step))  # epochs the live callback logged before the outage
    result = TrainResult(model=model, test=body["test"], baseline=body["baseline"], history=body["history"],
                         seconds=body["seconds"], baseline_model=body.get("baseline_model", "LogisticRegression"))
    parent = body.get("mlflow_parent_run_id")
    if parent:
        tracker.parent = StageRun(tracker.client, parent, cfg.name)
    registered = log_training(tracker, run, spark, cfg, result, dataset, callback, embedded=embedded)
    tracker.client.set_tag(run.run_id, REGISTERED_TAG, folder)
    tracker.end_run(run.run_id, "FINISHED")
    if parent:
        tracker.end_run(parent, "FINISHED")
    tracker.parent = None
    return registered


def already_registered(client: Any, experiment_id: str, cfg: Any, folder: str,
                       run_id: Optional[str] = None) -> Any:
    """The RegisteredVersion the bundle at ``folder`` already has, or None.

    An earlier ``register --from-store`` tagged its run ``sparktrain.registered_from_store = <folder>``
    after logging the model, and a job whose tracking did not fail registered the bundle's own run
    (``run_id``): a version of ``tracking.model_name`` from either run is the bundle's.  A second call
    then changes nothing and logs ``already registered as vN``.
    """
    from sparktrain.track.registry import RegisteredVersion

    quoted = folder.replace("\\", "\\\\").replace("'", "\\'")
    tagged = [r.info.run_id for r in client.search_runs([experiment_id], f"tags.`{REGISTERED_TAG}` = '{quoted}'",
                                                        order_by=["attributes.start_time DESC"])]
    name = cfg.tracking.model_name
    for rid in [*tagged, *([run_id] if run_id else [])]:
        versions = [v for v in client.search_model_versions(f"run_id = '{rid}'") if v.name == name]
        if cfg.tracking.register and versions:
            mv = max(versions, key=lambda v: int(v.version))
            log.info("%s is already registered as v%s of '%s' (MLflow run %s); nothing logged again", folder,
                     mv.version, name, rid)
            return RegisteredVersion(name=name, version=int(mv.version), model_uri=f"models:/{name}/{mv.version}",
                                     logged_model_uri=mv.source, run_id=rid,
                                     metric=mv.tags.get("sparktrain.score_metric"),
                                     score=_float(mv.tags.get("sparktrain.score")),
                                     champion=_alias_version(client, name) == int(mv.version))
    if tagged and not cfg.tracking.register:
        log.info("%s is already logged on MLflow run %s (tracking.register is off); nothing logged again", folder,
                 tagged[0])
        uri = f"runs:/{tagged[0]}/model"
        return RegisteredVersion(name=None, version=None, model_uri=uri, logged_model_uri=uri, run_id=tagged[0],
                                 metric=None, score=None)
    return None


def _alias_version(client: Any, name: str) -> Optional[int]:
    """The version ``champion`` points at, or None."""
    from mlflow.exceptions import MlflowException

    from sparktrain.track.registry import CHAMPION

    try:
        return int(client.get_model_version_by_alias(name, CHAMPION).version)
    except MlflowException:
        return None


def _float(text: Optional[str]) -> Optional[float]:
    try:
        return None if text is None else float(text)
    except ValueError:
        return None


def tracking_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is MLflow's (its store, its server, its artifact store) rather than the job's."""
    from mlflow.exceptions import MlflowException

    chain: list = []
    while exc is not None and exc not in chain:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return any(isinstance(e, (MlflowException, OSError)) or type(e).__module__.split(".")[0] in
               ("requests", "urllib3", "sqlalchemy", "botocore", "boto3", "s3transfer") for e in chain)


def tracking_down_error(tracker: Any, exc: BaseException, saved: str, when: str, result: Any = None,
                        answering: bool = False) -> Any:
    """Mark ``tracker`` down and build the :class:`~sparktrain.errors.TrackingDownError` for a model saved at ``saved``.

    ``saved`` is the model folder :func:`save_bundle` wrote (``<store>/<run>/model``); the error
    names the tracking URI (password masked) and the one command that finishes the tracking:
    ``sparktrain register --from-store <store>/<run> --tracking-uri URI``.  ``when`` says what had
    finished (``after training``); ``answering``: the server answers but MLflow failed (a locked
    store, a broken artifact store: :func:`tracking_failure`).  The caller raises it ``from exc``.
    """
    from sparktrain.errors import TrackingDownError
    from sparktrain.track.params import mask_url_password

    tracker.mark_down(error_summary(exc, 300))
    run_dir = saved.rstrip("/").rsplit("/", 1)[0]
    uri = mask_url_password(tracker.uri)
    what = (f"MLflow at {uri} failed {when} ({tracker.down}; it answers, but its store or artifact store does not "
            f"work: a locked sqlite file, a full or unwritable artifact location)" if answering else
            f"the MLflow tracking server at {uri} stopped answering {when} ({tracker.down})")
    again = "When it works again" if answering else "When the server is back"
    return TrackingDownError(
        f"{what}. Nothing is lost: the "
        f"trained model is in the store at {saved}. {again}, finish the tracking (metrics, model, "
        f"registry and alias rules) with:\n  sparktrain register --from-store {run_dir} --tracking-uri {uri}"
        + (" (the password in place of ***)" if uri != tracker.uri else ""),
        reason=tracker.down or "", run_dir=run_dir, result=result)
