"""The job driver: runs the stages a config defines, in the data's order.

profile -> preprocess (features) -> train -> tune, all under one MLflow parent
run when tracking is enabled.  Each stage is a function of (spark, cfg, ...) so
notebooks can call them one at a time (:func:`run_preprocess`,
:func:`train_stage`, :func:`sparktrain.tune.search.tune_stage`).

The job is where the embedded datasets (:data:`sparktrain.datasets.EMBEDDED`)
meet the library: it checks ``data.scale`` against them (:func:`check_scale`)
and hands them to the layers below, which know no dataset by name.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import posixpath
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from sparktrain._internal.secrets import mask_value
from sparktrain.config import JobConfig
from sparktrain.datasets import EMBEDDED
from sparktrain.errors import ConfigError, TrackingDownError
from sparktrain.features.sections import DataConfig
from sparktrain.session import get_or_create_session
from sparktrain.train.result import TrainResult

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
    tracking: Any = None  # TrackingSummary when tracking is enabled


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
            master: Optional[str] = None, spark=None, resume: Optional[str] = None) -> JobResult:
    """Run ``stages`` of ``cfg`` and print a short report of each.

    With ``tracking.enabled`` (the default) the job is an MLflow parent run and
    each stage a child run (see :mod:`sparktrain.track`); the tracking store
    is checked before any Spark work, and the trained model is registered.

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
    resume : str, optional
        A training run in ``train.store`` to resume from its last checkpoint
        (``sparktrain train --resume``): the train stage fits with that
        ``runId`` (same dataset and params, or :class:`RunMismatchError`).
        Only with the ``train`` stage alone; a run the store lacks is refused
        before Spark starts.
    """
    check_scale(cfg.data)
    if resume is not None:
        check_resume(cfg, stages, resume)
    result = JobResult()
    wanted = [s for s in stages if _defined(cfg, s)]
    missing = [s for s in wanted if not stage_available(s)]
    if missing:
        _print(f"stages not built yet: {', '.join(missing)} (see the issues tracker)")
        result.skipped.extend(missing)
        wanted = [s for s in wanted if s not in missing]
    if "profile" in wanted or "preprocess" in wanted:
        cfg.data.require_input()  # no input set: fail before the tracker and the JVM start
    if "tune" in wanted:
        from sparktrain.tune.search import check_search

        check_search(cfg)  # a bad tune: section fails here, not after profile, preprocess and train
    if {"preprocess", "train", "tune"} & set(wanted):
        from sparktrain.data.guard import check_job_paths
        # outputs sparktrain may not replace, overlaps: before any Spark work
        check_job_paths(cfg, wanted, embedded=EMBEDDED)
    if "tune" in wanted:
        _check_tune_budget(cfg, preprocessed="preprocess" in wanted)
    if ("profile" in wanted or "preprocess" in wanted) and spark is None and _local_files(master or cfg.spark.master):
        from sparktrain.features.load import check_local_source

        check_local_source(cfg.data, EMBEDDED)  # a local path that is not there: no MLflow run, no JVM
    tracker = None
    if cfg.tracking.enabled:
        from sparktrain.track.tracker import JobTracker

        tracker = JobTracker(cfg)  # preflight: fails here, naming the URI, before any Spark work
    spark = spark or get_or_create_session(master or cfg.spark.master, cfg.spark.app_name, cfg.spark.conf)

    with contextlib.ExitStack() as stack:
        if tracker is not None:
            result.tracking = TrackingSummary(uri=tracker.uri, experiment_id=tracker.experiment_id,
                                              run_id=stack.enter_context(tracker.job(spark, master)).run_id,
                                              model_name=cfg.tracking.model_name or cfg.name)
        if "profile" in wanted:
            from sparktrain.features.label import max_classes_of
            from sparktrain.features.load import load_input
            from sparktrain.profile import profile

            with _stage(tracker, "profile") as run:
                t0 = time.perf_counter()
                df = load_input(spark, cfg.data, EMBEDDED)
                result.profile = profile(df, label=cfg.data.label, max_classes=max_classes_of(cfg))
                result.seconds["profile"] = time.perf_counter() - t0
                if run is not None:
                    from sparktrain.track.stages import log_profile
                    _logged("profile", lambda: log_profile(run, result.profile), "nothing was written")
            scale = f" (scale {cfg.data.scale})" if cfg.data.source in EMBEDDED else ""
            _print(f"== profile of {cfg.data.describe()}{scale}")
            _print(result.profile.format())
        if "preprocess" in wanted:
            from sparktrain.features.materialize import format_summary

            with _stage(tracker, "preprocess") as run:
                t0 = time.perf_counter()
                result.preprocess = run_preprocess(spark, cfg)
                result.seconds["preprocess"] = time.perf_counter() - t0
                if run is not None:
                    from sparktrain.track.stages import log_preprocess
                    written = result.preprocess.generation or result.preprocess.path
                    _logged("preprocess", lambda: log_preprocess(run, written),
                            f"the dataset is committed at {mask_value(result.preprocess.path)}: once MLflow works, "
                            f"`sparktrain train CONFIG` (and tune) go on from it without preprocessing again")
            _print("== preprocess")
            _print(format_summary(result.preprocess))
        if "train" in wanted or "tune" in wanted:
            from sparktrain.data.commit import reading

            # the generation this job trains on stays while it runs, whatever another job commits meanwhile
            written = posixpath.basename(result.preprocess.generation) if result.preprocess is not None and \
                result.preprocess.generation else None
            dataset = stack.enter_context(reading(_dataset_root(result.preprocess, cfg), "output.path", written))
            if result.preprocess is None:
                _warn_other_dataset(cfg, dataset)
        if "train" in wanted:
            with _stage(tracker, "train") as run:
                t0 = time.perf_counter()
                callback = run.callback() if run is not None else None
                if resume is not None and run is not None:
                    run.set_tags({"sparktrain.resumed_run": resume})
                result.train = train_stage(spark, cfg, dataset, callbacks=[callback] if callback else [],
                                           run_id=resume or (run.run_id if run is not None else None))
                result.seconds["train"] = time.perf_counter() - t0
                from sparktrain.track.bundle import save_bundle

                # the model goes to the store before any MLflow call: an outage cannot lose it
                saved = save_bundle(result.train, cfg, dataset, mlflow_run_id=run.run_id if run else None,
                                    parent_run_id=tracker.parent.run_id if tracker and tracker.parent else None)
                _print("== train")
                _print(result.train.format())
                _print(f"model saved: {saved}")
                if run is not None and tracker is not None and result.tracking is not None:
                    result.tracking.model = _track_training(tracker, run, spark, cfg, result.train, dataset,
                                                            callback, saved)
        if "tune" in wanted:
            from sparktrain.tune.search import format_trials, tune_stage

            with _stage(tracker, "tune") as run:
                t0 = time.perf_counter()
                try:
                    result.tune = tune_stage(spark, cfg, dataset,
                                             parent_run_id=run.run_id if run is not None else None,
                                             tracking_uri=tracker.uri if tracker is not None else None,
                                             embedded=EMBEDDED)
                except TrackingDownError as exc:  # the search's table still prints; the job's runs are left
                    if tracker is not None:
                        tracker.mark_down(exc.reason)
                    if exc.result is not None:
                        _print("== tune")
                        _print(format_trials(exc.result))
                    raise
                result.seconds["tune"] = time.perf_counter() - t0
                if result.tracking is not None and result.tune.model_version:
                    result.tracking.tuned = result.tune
            _print("== tune")
            _print(format_trials(result.tune))
    if result.tracking is not None:
        _print("== MLflow")
        _print(result.tracking.format())
    return result


@dataclass
class TrackingSummary:
    """Where a job's MLflow runs and model went."""

    uri: str
    experiment_id: str
    run_id: str
    model: Any = None  # sparktrain.track.registry.RegisteredVersion
    model_name: str = ""  # tracking.model_name (or the job's name)
    tuned: Any = None  # the tune stage's SearchResult, when it registered a version

    def format(self) -> str:
        from sparktrain.track.params import mask_url_password
        from sparktrain.track.store import is_remote

        lines = [f"job run:  {self.run_id} (experiment {self.experiment_id}, {mask_url_password(self.uri)})"]
        # the commands below read the default store unless told: name this run's store when it is another
        store = "" if self.uri == "sqlite:///" + os.path.abspath("work/mlflow.db") else mask_url_password(self.uri)
        m, t = self.model, self.tuned
        moved = t is not None and t.model_champion  # the search's version took the alias after the train stage's
        if m is not None and m.version is not None:
            score = f", {m.metric} {m.score:.4f}" if m.score is not None else ""
            champ = ("champion until the search's version below" if m.champion and moved else
                     "alias champion -> this version" if m.champion else "champion unchanged (not better)")
            lines.append(f"model:    registered '{m.name}' version {m.version}{score}; {champ}")
        elif m is not None:
            lines.append(f"model:    {m.model_uri} (tracking.register is off)")
        if t is not None:
            test = "".join(f", {k} {v:.4f}" for k, v in list(t.test_metrics.items())[:1]
                           if t.registered_number in (None, t.best_number))  # else another trial's metric
            champ = "alias champion -> this version" if moved else "champion unchanged (not better)"
            lines.append(f"tuned:    registered version {t.model_version} (trial {t.registered_number}){test}; "
                         f"{champ}")
        name = m.name if m is not None and m.version is not None else None
        if name is not None or t is not None:
            name = name or self.model_name
            lines.append(f"score:    sparktrain score --model models:/{name}@champion --input RAW --output OUT"
                         + (f" --tracking-uri {store}" if store else ""))
        if is_remote(self.uri):
            base = mask_url_password(self.uri).rstrip("/")
            lines.append(f"UI:       {base}/#/experiments/{self.experiment_id}/runs/{self.run_id}")
        else:
            server = f"sparktrain mlflow-server --backend-store-uri {store}" if store else \
                "sparktrain mlflow-server"
            lines.append(f"UI:       {server}, then open "
                         f"http://127.0.0.1:5000/#/experiments/{self.experiment_id}/runs/{self.run_id}")
        return "\n".join(lines)


def _track_training(tracker: Any, run: Any, spark: Any, cfg: JobConfig, train: "TrainResult", dataset: str,
                    callback: Any, saved: str) -> Any:
    """Log and register the trained model; an unreachable tracking server ends the job in seconds.

    The model is already in the store (``saved``).  When MLflow does not
    answer, the rest of the job's MLflow calls are skipped and the error says
    where the model is and the one command that finishes the tracking.
    """
    from sparktrain.track.stages import log_training

    try:
        if callback is not None:
            callback.flush(timeout=10.0)
        tracker.check_alive(timeout=5.0)
        return log_training(tracker, run, spark, cfg, train, dataset, callback, embedded=EMBEDDED)
    except Exception as exc:
        from sparktrain.track.bundle import tracking_down_error, tracking_failure

        try:
            tracker.check_alive(timeout=5.0)
        except Exception:  # noqa: BLE001 - the server is down: that is the error to report
            raise tracking_down_error(tracker, exc, saved, "after training") from exc
        if tracking_failure(exc):  # it answers, but fails (a locked sqlite store, a broken artifact store)
            raise tracking_down_error(tracker, exc, saved, "after training", answering=True) from exc
        raise


def _local_files(master: Optional[str]) -> bool:
    """Whether a path without a scheme names this machine's files for the session this job starts: a local
    master, not under spark-submit (its cluster's default filesystem, HDFS, may own such paths), no Hadoop
    configuration that could set another default filesystem."""
    from sparktrain.session import launched_by_spark_submit

    return str(master or "local").startswith("local") and not launched_by_spark_submit() and \
        not (os.environ.get("HADOOP_CONF_DIR") or os.environ.get("YARN_CONF_DIR"))


def _logged(stage: str, log_stage: Any, done: str) -> None:
    """Run ``log_stage`` (a stage's MLflow logging); an MLflow failure (its server, store or artifact store:
    :func:`~sparktrain.track.bundle.tracking_failure`) becomes a :class:`TrackingError` saying what is kept."""
    try:
        log_stage()
    except Exception as exc:
        from sparktrain.errors import TrackingError
        from sparktrain.track.bundle import tracking_failure

        if not tracking_failure(exc):
            raise
        reason = " ".join(str(exc).split())[:300] or type(exc).__name__
        raise TrackingError(f"MLflow failed while logging the {stage} stage ({type(exc).__name__}: "
                            f"{mask_value(reason)}); {done}. Check the tracking server and its artifact location "
                            f"(tracking.uri, tracking.artifact_location)") from exc


def _stage(tracker: Any, name: str):
    """The tracker's stage run, or a no-op context yielding ``None`` when tracking is off."""
    return tracker.stage(name) if tracker is not None else contextlib.nullcontext(None)


def check_resume(cfg: JobConfig, stages: Sequence[str], run_id: str) -> None:
    """Refuse ``--resume RUN`` unless the job trains and nothing else, and ``train.store`` holds that run.

    Raises
    ------
    ConfigError
        On ``--resume``: with stages other than ``train`` (a new preprocess is
        other data, which the run refuses), without a ``train:`` section, or
        for a run the store does not hold (the runs it holds are listed).
    """
    if list(stages) != ["train"] or cfg.train is None:
        raise ConfigError("--resume", run_id, "resume a training run with `sparktrain train CONFIG --resume RUN` "
                                              "(the train stage alone, on the dataset the run was trained on)")
    from sparktrain.data.run_store import RunStore

    run = RunStore(cfg.train.store, run_id)
    try:
        recorded = run.is_recorded()
    except OSError as exc:  # the store did not answer, or refused: whether it holds the run is unknown
        from sparktrain.errors import StoreReadError

        raise StoreReadError(f"could not read train.store {mask_value(cfg.train.store)} to resume run {run_id} "
                             f"({mask_value(' '.join(str(exc).split())[:300])}): the store did not answer or refused "
                             f"access. Nothing was changed: run the same command again once it answers (check its "
                             f"endpoint and credentials)") from exc
    if not recorded:
        try:
            held = sorted(n for n in run.store.listdir("") if not n.startswith(("_", ".")))
        except Exception:  # noqa: BLE001 - a store that does not exist yet holds no run
            held = []
        listed = ", ".join(held[-10:]) if held else "(none)"
        raise ConfigError("--resume", run_id, f"train.store {mask_value(cfg.train.store)} holds no run "
                                              f"'{run_id}' (its runs: {listed}); pass the run id the failed "
                                              f"job printed, with the same train.store")
    from sparktrain.track.bundle import read_bundle

    try:
        bundle = read_bundle(run.uri())
    except Exception:  # noqa: BLE001 - no saved model: the run did not finish, resume it
        return
    trained = len(bundle.get("history") or [])
    if cfg.train.epochs <= trained:
        raise ConfigError("--resume", run_id, f"run {run_id} finished {trained} epochs and its model is saved "
                                              f"({mask_value(run.uri('model'))}): nothing to resume. Set "
                                              f"train.epochs above {trained} to train it further; if its tracking "
                                              f"failed, `sparktrain register --from-store {mask_value(run.uri())}` "
                                              f"registers it (and says so when it is registered already)")


def _check_tune_budget(cfg: JobConfig, preprocessed: bool) -> None:
    """A tune stage whose stored study has run its ``max_trials`` is refused before Spark and the MLflow runs.

    The study's name covers the dataset's generation, so a job that
    preprocesses first starts a new study, unless ``tune.study`` names one.
    """
    if preprocessed and not (cfg.tune is not None and cfg.tune.study):
        return
    from sparktrain.data.commit import resolve
    from sparktrain.errors import DataError
    from sparktrain.tune._engines import check_budget

    try:
        dataset = resolve(cfg.output.path)
    except DataError:  # the tune stage reports an unreadable dataset itself
        return
    check_budget(cfg, dataset, tracking_uri=cfg.tracking.uri if cfg.tracking.enabled else None)


def _dataset_root(preprocess: Any, cfg: JobConfig) -> str:
    """The dataset's path: this job's preprocess output, else ``output.path``."""
    return preprocess.path if preprocess is not None else cfg.output.path


def check_scale(data: DataConfig) -> None:
    """Refuse ``data.scale`` > 1 unless ``data.source`` names an embedded dataset (only those replicate).

    Pure Python: :func:`run_job` calls it before any Spark work.

    Raises
    ------
    ConfigError
        Naming ``data.scale``, its value and the fix.
    """
    if data.scale > 1 and data.source not in EMBEDDED:
        raise ConfigError("data.scale", data.scale,
                          f"only an embedded dataset ({', '.join(sorted(EMBEDDED))}) can be replicated; "
                          f"set data.scale: 1 for data.{data.input_kind or 'source'}")


def run_preprocess(spark: Any, cfg: JobConfig) -> Any:
    """The ``sparktrain preprocess CONFIG`` stage: load ``cfg.data`` (a path, a table, a query or an
    embedded dataset) and :func:`sparktrain.features.materialize.materialize` it.

    Returns the :class:`~sparktrain.features.materialize.PreprocessResult`.
    """
    from sparktrain.features.materialize import materialize

    check_scale(cfg.data)
    return materialize(spark, cfg, embedded=EMBEDDED)


def train_stage(spark, cfg: JobConfig, dataset_path: str, callbacks: Sequence[Any] = (),
                run_id: Optional[str] = None) -> TrainResult:
    """Fit the ``train:`` section's estimator on a materialized dataset, then evaluate on its test split."""
    from sparktrain.train.evaluate import baseline_name, estimator_from_config, evaluate_model
    from sparktrain.train.inputs import exists

    from sparktrain.data.commit import resolve

    if cfg.train is None:
        raise ConfigError("train", None, "add a train: section to the job config to train a model")
    dataset_path = resolve(dataset_path)  # a committed output: its generation (what every later read uses)
    t0 = time.perf_counter()
    est = estimator_from_config(cfg.train, cfg.data.label, run_id=run_id).setCallbacks(list(callbacks))
    test_path = f"{dataset_path.rstrip('/')}/test"
    has_test = exists(test_path)  # local path or filesystem URI (hdfs://, s3://)
    if has_test:  # Spark evaluates it after training: a connector it lacks must fail now, not after the fit
        from sparktrain._internal.spark_compat import check_spark_reads

        check_spark_reads(spark, [test_path], "output.path", "the dataset's test split (evaluated with Spark after "
                                                             "training; nothing was trained)")
    _check_features_json(dataset_path)
    model = est.fit(dataset_path)
    test, baseline = {}, {}
    if has_test:
        test = evaluate_model(model, spark.read.parquet(test_path)).metrics
        if cfg.train.compare_baseline:
            baseline = _baseline(spark, dataset_path, model, cfg.data.label)
    log.info("task %s (label '%s'%s)", model.inputs.task, cfg.data.label,
             f", classes {list(model.inputs.classes)[:10]}" if model.inputs.classes else "")
    _warn_below_mean(test, cfg)
    return TrainResult(model=model, test=test, baseline=baseline, history=model.history,
                       seconds=time.perf_counter() - t0, baseline_model=baseline_name(model.inputs.task))


def _baseline(spark: Any, dataset_path: str, model: Any, label: str) -> Dict[str, float]:
    """The MLlib baseline's test metrics; {} with a warning when it fails, since the trained model is what the
    job is for (``train.compare_baseline`` only adds a comparison)."""
    from sparktrain.train.evaluate import baseline_name, mllib_baseline

    try:
        return mllib_baseline(spark, dataset_path, model.inputs, label).metrics
    except Exception as exc:  # noqa: BLE001 - a comparison that fails leaves the model and its metrics as they are
        reason = (str(getattr(exc, "desc", None) or exc).strip().splitlines() or [""])[0][:300]
        log.warning("the %s baseline failed (%s: %s); the model is kept, tracked and registered without the "
                    "comparison. Set train.compare_baseline: false to skip it", baseline_name(model.inputs.task),
                    type(exc).__name__, mask_value(reason))
        return {}


def config_differences(cfg: JobConfig, meta: Dict[str, Any]) -> List[str]:
    """How the dataset's ``features.json`` differs from what ``cfg`` would preprocess: features, label, split."""
    out: List[str] = []
    want = {f.name: f.type for f in cfg.features}
    have = {str(f.get("name")): f.get("type") for f in meta.get("features") or [] if isinstance(f, dict)}
    if want and want != have:
        missing, extra = sorted(set(want) - set(have)), sorted(set(have) - set(want))
        retyped = sorted(n for n in set(want) & set(have) if want[n] != have[n])
        out += ([f"features the config lists but the dataset lacks: {', '.join(missing)}"] if missing else []) + \
            ([f"features the dataset has but the config does not list: {', '.join(extra)}"] if extra else []) + \
            [f"feature '{n}' is {have[n]} in the dataset, {want[n]} in the config" for n in retyped]
    label = (meta.get("label") or {}).get("column") if isinstance(meta.get("label"), dict) else None
    if label and cfg.data.label and label != cfg.data.label:
        out.append(f"label: '{label}' in the dataset, '{cfg.data.label}' in the config")
    split = ((meta.get("dataset") or {}).get("split") or {})
    if split.get("seed") is not None and split.get("seed") != cfg.split.seed:
        out.append(f"split.seed: {split['seed']} in the dataset, {cfg.split.seed} in the config")
    fractions = split.get("fractions") or {}
    for name in ("train", "validation", "test"):
        if name in fractions and abs(float(fractions[name]) - float(getattr(cfg.split, name))) > 1e-9:
            out.append(f"split.{name}: {fractions[name]} in the dataset, {getattr(cfg.split, name)} in the config")
    return out


def _warn_other_dataset(cfg: JobConfig, dataset: str) -> None:
    """Warn when ``train``/``tune`` run on an output.path preprocessed from another config than this one: the
    job's MLflow params would describe features and a split the model never saw (probe I)."""
    from sparktrain.train.inputs import read_features_json

    try:
        meta = read_features_json(dataset) or {}
    except Exception:  # noqa: BLE001 - the stage itself reports an unreadable features.json
        return
    diffs = config_differences(cfg, meta)
    if diffs:
        log.warning("output.path '%s' was preprocessed with other settings than this config's (%s); this job "
                    "trains on the dataset as it is, and logs the config's settings. Fix: `sparktrain preprocess "
                    "CONFIG` (or `sparktrain run CONFIG`) to rebuild it from this config", mask_value(dataset),
                    "; ".join(diffs))


def _warn_below_mean(test: Dict[str, float], cfg: JobConfig) -> None:
    """Warn when a regression model predicts the test split worse than the label's mean (``test_r2`` < 0)."""
    r2 = test.get("test_r2")
    if r2 is None or not r2 == r2 or r2 >= 0 or cfg.train is None:
        return
    log.warning("the model predicts the test split worse than the label's mean would (test_r2 %.3f): it has not "
                "learned the label yet. Usually too few optimizer steps for its scale: raise train.epochs (now %d) "
                "or train.learning_rate (now %g), or lower train.batch_size (now %d)", r2, cfg.train.epochs,
                cfg.train.learning_rate, cfg.train.batch_size)


def _check_features_json(dataset_path: str) -> None:
    """Refuse, before training, a dataset with no ``features.json``: the model the job saves and registers
    scores raw rows through it (the fitted features).  Raw Parquet trains with the Python API instead."""
    from sparktrain.errors import DataError
    from sparktrain.train.inputs import FEATURES_JSON, read_features_json

    if read_features_json(dataset_path) is None:
        raise DataError(f"output.path '{mask_value(dataset_path)}' has no {FEATURES_JSON}: the job trains on a "
                        f"dataset `sparktrain preprocess` wrote (its splits, {FEATURES_JSON} and fitted pipeline, "
                        f"which the saved model scores raw rows with). Run `sparktrain preprocess CONFIG` (or "
                        f"`sparktrain run CONFIG`) first; to train on your own Parquet, use the Python API "
                        f"(TorchEstimator(...).fit(path)). Nothing was trained")


def _print(text: str) -> None:
    """Print a report line with its secrets masked (a source URI's password, a trial's error)."""
    print(mask_value(text))


def _defined(cfg: JobConfig, stage: str) -> bool:
    if stage == "train":
        return cfg.train is not None
    if stage == "tune":
        return cfg.tune is not None
    return True


def score_command(model_uri: str, input_path: Optional[str], output_path: str, fmt: Optional[str] = None,
                  tracking_uri: Optional[str] = None, master: Optional[str] = None,
                  options: Optional[Dict[str, str]] = None, table: Optional[str] = None,
                  query: Optional[str] = None) -> int:
    """``sparktrain score``: score raw rows (a file or folder, a table or a query) with a registered model."""
    from sparktrain.serve.scoring import score_path

    # Spark starts once the arguments, --output and the registry are checked: a wrong name or store costs no ~10 s
    n = score_path(lambda: get_or_create_session(master), model_uri, input_path, output_path, fmt=fmt,
                   tracking_uri=tracking_uri, options=options, table=table, query=query)
    print(f"scored {n:,} rows with {model_uri} -> {output_path} (committed generation; read it with "
          f"spark.read.parquet(*sparktrain.data.committed_files({output_path!r})))")
    return 0


def register_command(run_dir: str, tracking_uri: Optional[str] = None, master: Optional[str] = None) -> int:
    """``sparktrain register --from-store``: log and register a model the store kept through an outage."""
    from sparktrain.track.bundle import register_from_store

    spark = get_or_create_session(master)
    registered = register_from_store(spark, run_dir, tracking_uri=tracking_uri, embedded=EMBEDDED)
    where = f"version {registered.version} of '{registered.name}'" if registered.version is not None else \
        registered.model_uri
    print(f"registered {where} from {run_dir}")
    return 0
