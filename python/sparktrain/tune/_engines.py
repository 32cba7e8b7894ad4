"""The search engines behind the driver's ask/tell loop: Hyperopt and Optuna.

Both are driven the same way by :class:`sparktrain.tune._loop.SearchLoop`, on
the driver only (nothing of either runs on an executor, so both work over
Spark Connect)::

    asked = engine.ask()                       # (number, handle, train params), or None when exhausted
    prune = engine.report(handle, epoch, x)    # Optuna: a per-epoch metric; True when the pruner says stop
    engine.tell(handle, status, metric)        # FINISHED / PRUNED / FAILED / KILLED

:class:`OptunaEngine` keeps its study in persistent storage (a journal file
under ``train.store`` by default, or ``tune.storage``), so a restarted search
loads the same study and goes on from the trials it holds.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import logging
import math
import os
from typing import Any, Callable, Dict, Literal, Optional, Tuple

import numpy as np

from sparktrain._internal.secrets import mask_value
from sparktrain.config import JobConfig, TuneConfig
from sparktrain.errors import ConfigError
from sparktrain.tune._study import STUDIES_DIR, DatabaseLease, check_same_search, lease_target
from sparktrain.tune.result import FINISHED, PRUNED
from sparktrain.tune.space import CompiledSpace, max_value

log = logging.getLogger(__name__)

#: the Optuna user attribute holding a trial's run folder name in ``train.store``
STORE_RUN_ATTR = "store_run"


#: the error a trial that a Ctrl-C stopped ends with (:mod:`sparktrain.tune._loop`)
INTERRUPTED = "interrupted:"


def _cut_off(trial: Any) -> bool:
    """A FAIL trial that did not fail on its own: stopped by an interrupt, or left RUNNING by a killed search
    (no error recorded).  It does not count against ``tune.max_trials``: a rerun runs its budget again."""
    from optuna.trial import TrialState

    error = str(trial.user_attrs.get("error") or "")
    return trial.state == TrialState.FAIL and (not error or error.startswith(INTERRUPTED))


class Engine:
    """What the search loop asks of an engine (see the module docstring)."""

    name = ""
    #: whether :meth:`report` can ask to stop a trial
    prunes = False
    #: trials the (continued) study held before this search
    previous = 0

    def ask(self) -> Optional[Tuple[int, Any, Dict[str, Any]]]:
        """``(trial number, 1-based; handle; train params)``, or None when the engine has nothing left."""
        raise NotImplementedError

    def report(self, handle: Any, epoch: int, value: float) -> bool:
        """Tell the engine the metric after ``epoch`` (0-based); True when the trial should stop."""
        return False

    def tell(self, handle: Any, status: str, metric: Optional[float], error: Optional[str] = None) -> None:
        """The trial ended with ``status`` (``metric`` is None unless it finished or was pruned)."""
        raise NotImplementedError

    def record_curve(self, handle: Any, values: Dict[int, float]) -> None:
        """An unpruned trial's per-epoch metric (``{epoch, 0-based: value}``), before :meth:`tell`."""

    def settings(self) -> Dict[str, Any]:
        """What to log on the search's MLflow run."""
        return {"engine": self.name}

    def close(self) -> None:
        """The search is over: release what the engine holds."""


# ---- Hyperopt ------------------------------------------------------------------------------------------------

class HyperoptEngine(Engine):
    """Hyperopt's TPE or random search over ``hyperopt.Domain``/``Trials``, asked one point at a time.

    Parameters
    ----------
    space : CompiledSpace
        The search space.
    goal : {"min", "max"}
        Hyperopt minimizes; a maximized metric is told negated.
    algo : {"tpe", "random"}
        The suggestion algorithm.
    seed : int
        Seeds it.
    options : dict, optional
        Keyword arguments of the algorithm (``tune.sampler_options``, checked by :func:`check_sampler`).
    """

    name = "hyperopt"

    def __init__(self, space: CompiledSpace, goal: str, algo: str = "tpe", seed: int = 0,
                 options: Optional[Dict[str, Any]] = None) -> None:
        from hyperopt import Domain, Trials

        self.space, self.goal, self.algo_name = space, goal, algo
        self.options = dict(options or {})
        self.algo = functools.partial(sampler_target("hyperopt", algo), **self.options)
        self.rstate = np.random.default_rng(seed)
        self.domain = Domain(lambda _: 0.0, space.hyperopt)
        self.trials = Trials()

    def ask(self) -> Optional[Tuple[int, Any, Dict[str, Any]]]:
        from hyperopt import JOB_STATE_RUNNING, space_eval
        from hyperopt.utils import coarse_utcnow

        new_ids = self.trials.new_trial_ids(1)
        self.trials.refresh()
        docs = self.algo(new_ids, self.domain, self.trials, int(self.rstate.integers(2 ** 31 - 1)))
        if not docs:
            return None
        self.trials.insert_trial_docs(docs)
        self.trials.refresh()
        doc = self._doc(new_ids[0])
        doc["state"] = JOB_STATE_RUNNING
        doc["book_time"] = doc["refresh_time"] = coarse_utcnow()
        point = {k: v[0] for k, v in doc["misc"]["vals"].items() if len(v)}
        tid = doc["tid"]
        return tid + 1, tid, self.space.to_train_params(space_eval(self.space.hyperopt, point))

    def tell(self, handle: Any, status: str, metric: Optional[float], error: Optional[str] = None) -> None:
        from hyperopt import JOB_STATE_DONE, STATUS_FAIL, STATUS_OK
        from hyperopt.utils import coarse_utcnow

        doc = self._doc(handle)
        doc["state"] = JOB_STATE_DONE  # failed trials stay visible to the algo, with status 'fail'
        if status == FINISHED and metric is not None:
            doc["result"] = {"status": STATUS_OK, "loss": metric if self.goal == "min" else -metric}
        else:
            doc["result"] = {"status": STATUS_FAIL, "error": error or status.lower()}
        doc["refresh_time"] = coarse_utcnow()
        self.trials.refresh()

    def _doc(self, tid: int) -> Dict[str, Any]:
        return next(d for d in reversed(self.trials._dynamic_trials) if d["tid"] == tid)

    def settings(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"engine": self.name, "sampler": self.algo_name}
        if self.options:
            out["sampler_options"] = dict(self.options)
        return out


# ---- Optuna --------------------------------------------------------------------------------------------------

def max_epochs(tune: TuneConfig, cfg: JobConfig, space: CompiledSpace) -> int:
    """The most epochs any trial trains (``train.epochs``, or the space's largest ``epochs``)."""
    from_space = max_value(space, "epochs")
    base = cfg.train.epochs if cfg.train is not None else 1
    return int(from_space) if from_space is not None else base


def min_trials(tune: TuneConfig, epochs: int) -> int:
    """The fewest trials with which ``tune.pruner`` can stop any trial (1 for ``none``).

    * ``median``: the first ``pruner_startup_trials`` trials always run to the end; the next one can be pruned.
    * ``asha``: a rung keeps the best ``1 / reduction_factor`` of the trials that reached it, so it needs
      ``reduction_factor`` trials.
    * ``hyperband``: one full round of its brackets (each an ASHA with a later first rung).
    """
    eta, low = tune.reduction_factor, tune.pruner_min_epochs
    if tune.pruner == "median":
        return tune.pruner_startup_trials + 1
    if tune.pruner == "asha":
        return eta
    if tune.pruner == "hyperband":
        brackets = math.floor(math.log(max(epochs, low) / low, eta) + 1e-9) + 1
        return sum(math.ceil(brackets * eta ** (brackets - 1 - b) / (brackets - b)) for b in range(brackets))
    return 1


def check_pruning(tune: TuneConfig, cfg: JobConfig, space: CompiledSpace, objective: bool) -> None:
    """Refuse a pruner that cannot work here, before any compute.

    Raises
    ------
    ConfigError
        A pruner with a custom objective (no epochs), with Keras under MWMS (its
        child process has no epoch hook), with trials too short to be stopped,
        or with ``max_trials`` below :func:`min_trials`.
    """
    if tune.pruner == "none":
        return
    if objective:
        raise ConfigError("tune.pruner", tune.pruner, "a custom objective reports no per-epoch metrics to prune "
                                                      "on; set tune.pruner: none, or tune the training itself")
    if cfg.train is not None and cfg.train.framework == "keras" and cfg.train.backend == "mwms":
        raise ConfigError("tune.pruner", tune.pruner, "Keras under MWMS trains in a child process without the "
                                                      "per-epoch hook pruning uses; use train.backend: gloo, or "
                                                      "tune.pruner: none")
    epochs = max_epochs(tune, cfg, space)
    if epochs <= tune.pruner_min_epochs:
        raise ConfigError("tune.pruner", tune.pruner,
                          f"trials train at most {epochs} epoch(s) and tune.pruner_min_epochs = "
                          f"{tune.pruner_min_epochs}, so no trial could be stopped early; train more epochs "
                          "(train.epochs or an epochs range in tune.space), or set tune.pruner: none")
    need = min_trials(tune, epochs)
    if tune.max_trials < need:
        raise ConfigError("tune.max_trials", tune.max_trials,
                          f"tune.pruner: {tune.pruner} needs at least {need} trials to stop any "
                          f"(reduction_factor {tune.reduction_factor}, pruner_startup_trials "
                          f"{tune.pruner_startup_trials}, up to {epochs} epochs); raise tune.max_trials to "
                          f"{need} or more, or set tune.pruner: none")


#: keyword arguments no config sets: the search passes them itself, or they take Python objects
_NOT_OPTIONS = {"new_ids", "domain", "trials", "seed", "weights", "constraints_func",
                "independent_sampler", "source_trials", "x0", "categorical_distance_func"}
#: where a sampler draws its first points at random, and how many by default
_STARTUP = {("hyperopt", "tpe"): ("n_startup_jobs", 20), ("optuna", "tpe"): ("n_startup_trials", None),
            ("optuna", "cmaes"): ("n_startup_trials", None)}


#: value ranges the samplers check only once they model results (mid-search): checked before any trial here
_RANGES: Dict[Tuple[str, str], Tuple[Callable[[Any], bool], str]] = {
    ("hyperopt", "prior_weight"): (lambda v: v > 0, "> 0"),
    ("hyperopt", "gamma"): (lambda v: 0 < v < 1, "in (0, 1): the share of trials TPE counts as good"),
    ("optuna", "prior_weight"): (lambda v: v > 0, "> 0"),
    ("optuna", "popsize"): (lambda v: v >= 1, ">= 1"),
    ("optuna", "sigma0"): (lambda v: v > 0, "> 0"),
    ("optuna", "restart_strategy"): (lambda v: v in ("ipop", "bipop"), "ipop or bipop"),
}
_EXAMPLE = {bool: "true", int: "5", float: "0.5", str: "ipop"}


def sampler_target(engine: str, sampler: str) -> Callable[..., Any]:
    """The function or class ``tune.sampler_options`` are passed to."""
    if engine == "hyperopt":
        from hyperopt import rand, tpe

        return tpe.suggest if sampler == "tpe" else rand.suggest
    from optuna import samplers

    return {"tpe": samplers.TPESampler, "random": samplers.RandomSampler,
            "cmaes": samplers.CmaEsSampler}[sampler]


def sampler_options(engine: str, sampler: str) -> Dict[str, Tuple[type, ...]]:
    """``{option: the value types it takes}`` for ``tune.sampler_options`` of this engine and sampler."""
    out: Dict[str, Tuple[type, ...]] = {}
    for name, param in inspect.signature(sampler_target(engine, sampler)).parameters.items():
        if name in _NOT_OPTIONS or (engine == "optuna" and name == "gamma") or param.default is param.empty:
            continue
        hint = str(param.annotation) if param.annotation is not param.empty else type(param.default).__name__
        kinds = tuple(t for t in (bool, int, float, str) if t.__name__ in hint.replace("|", " ").split())
        if kinds:
            out[name] = kinds + ((int,) if float in kinds and int not in kinds else ())
    return out


def startup_trials(tune: TuneConfig) -> int:
    """The trials the sampler draws at random before it models the results (Optuna's default: a third of
    ``max_trials``, between 2 and 10)."""
    key, default = _STARTUP.get((tune.engine, tune.effective_sampler), ("", None))
    if key in tune.sampler_options:
        return int(tune.sampler_options[key])
    if default is not None:
        return default
    if (tune.engine, tune.effective_sampler) in _STARTUP:
        return max(2, min(10, tune.max_trials // 3))
    return tune.max_trials


def check_sampler(tune: TuneConfig, space: CompiledSpace) -> None:
    """Refuse ``tune.sampler_options`` the sampler has no use for, and CMA-ES over fewer than two numeric keys.

    CMA-ES falls back to TPE for choices (logged); a TPE search whose random
    start covers all of ``max_trials`` is logged, with the option that shortens it.

    Raises
    ------
    ConfigError
        An option the sampler does not take (the valid names), or a value of the wrong type.
    """
    valid = sampler_options(tune.engine, tune.effective_sampler)
    for key, value in tune.sampler_options.items():
        where = f"{tune.engine.capitalize()}'s {tune.effective_sampler} sampler"
        if key not in valid:
            fix = (f"{where} takes no option '{key}'; its options are: {', '.join(sorted(valid))}" if valid
                   else f"{where} takes no options; remove tune.sampler_options")
            raise ConfigError(f"tune.sampler_options.{key}", value,
                              fix + ("; the search seeds it from train.seed" if key == "seed" else ""))
        if not isinstance(value, valid[key]) or (isinstance(value, bool) and bool not in valid[key]):
            raise ConfigError(f"tune.sampler_options.{key}", value,
                              f"{where} takes {' or '.join(t.__name__ for t in valid[key])} for '{key}', e.g. "
                              f"{{{key}: {_EXAMPLE[valid[key][0]]}}}")
        if isinstance(value, int) and key.startswith("n_") and value < (0 if "startup" in key else 1):
            raise ConfigError(f"tune.sampler_options.{key}", value,
                              f"must be >= {0 if 'startup' in key else 1}")
        bound = _RANGES.get((tune.engine, key))
        if bound is not None and not bound[0](value):
            raise ConfigError(f"tune.sampler_options.{key}", value, f"must be {bound[1]}")
    if tune.engine == "optuna" and tune.sampler_options:
        try:  # what only the sampler itself checks (e.g. group without multivariate)
            OptunaEngine._sampler(tune, 0)
        except (TypeError, ValueError) as e:
            raise ConfigError("tune.sampler_options", tune.sampler_options,
                              f"Optuna's {tune.effective_sampler} sampler refuses them: {e}") from None
    if tune.effective_sampler != "cmaes":
        return
    numeric = space.numeric_labels()
    if len(numeric) < 2:
        raise ConfigError("tune.sampler", "cmaes",
                          f"CMA-ES models two or more numeric keys (uniform, loguniform, quniform, qloguniform, "
                          f"int) outside choices and groups; this space has {len(numeric)} "
                          f"({', '.join(numeric) or 'none'}); use tune.sampler: tpe")
    other = space.categorical_labels()
    if other:
        log.warning("tune.sampler: cmaes models %s; CMA-ES cannot use %s (choices, groups and keys only some "
                    "branches set): Optuna's TPE samples those", ", ".join(numeric), ", ".join(other))


def warn_random_start(tune: TuneConfig) -> None:
    """Warn, once per search (:func:`~sparktrain.tune.search.run_search`; the job's preflight only checks), when
    the sampler's random start covers the whole budget: the search is then a random search."""
    key = _STARTUP.get((tune.engine, tune.effective_sampler), ("", None))[0]
    if key and tune.max_trials > 2 and startup_trials(tune) >= tune.max_trials:
        log.warning("tune.sampler: %s draws its first %d trials at random and tune.max_trials is %d, so this "
                    "search is a random search; to let it model results sooner set tune.sampler_options: "
                    "{%s: %d}", tune.effective_sampler, startup_trials(tune), tune.max_trials, key,
                    max(2, tune.max_trials // 3))


def study_name(cfg: JobConfig, dataset_path: Optional[str]) -> str:
    """``tune.study``, else ``<job name>-<hash of what defines the search>``.

    The hash covers the space, metric, sampler, pruner and its settings, the
    mode, the ``train:`` section and the dataset path (its committed
    generation: a new preprocess starts a new study): rerunning ``tune`` on
    the same dataset continues its study, a changed search starts a new one.
    """
    tune: TuneConfig = cfg.tune  # type: ignore[assignment]
    if tune.study:
        return tune.study
    from sparktrain._internal.typed_build import to_dict

    defining = {"space": tune.space, "metric": tune.metric, "sampler": tune.effective_sampler,
                "pruner": tune.pruner, "pruner_min_epochs": tune.pruner_min_epochs,
                "reduction_factor": tune.reduction_factor, "pruner_startup_trials": tune.pruner_startup_trials,
                "mode": tune.mode, "train": to_dict(cfg.train), "dataset": os.fspath(dataset_path or "")}
    if tune.sampler_options:  # only when set: the names of studies from before the option stay the same
        defining["sampler_options"] = tune.sampler_options
    digest = hashlib.sha256(json.dumps(defining, sort_keys=True, default=str).encode()).hexdigest()[:10]
    return f"{cfg.name}-{digest}"


def _local_store(cfg: JobConfig) -> str:
    """``train.store`` as a local path (``file://`` cut)."""
    store = cfg.train.store if cfg.train is not None else "work/store"
    return store[len("file://"):] if store.startswith("file://") else store


def check_storage(cfg: JobConfig, tracking_uri: Optional[str] = None) -> None:
    """Refuse where an Optuna study cannot be kept, without opening it (``check_search`` runs this before any stage).

    Raises
    ------
    ConfigError
        On ``tune.storage``: left out while ``train.store`` is a URI (the default
        journal file needs a local or mounted path), or the MLflow tracking database.
    """
    tune: TuneConfig = cfg.tune  # type: ignore[assignment]
    if tune is None or tune.engine != "optuna":
        return
    url = tune.storage
    if url is None:
        store = _local_store(cfg)
        if "://" in store:
            raise ConfigError("tune.storage", None,
                              f"train.store is {mask_value(store)!r}, and Optuna's journal file needs a local or "
                              "mounted path; set tune.storage to a database URL (postgresql://..., sqlite:///...) "
                              "or a local .journal path")
    elif "://" in url and not url.startswith("file://"):
        used = {u for u in (tracking_uri, cfg.tracking.uri if cfg.tracking.enabled else None) if u}
        if url in used:
            raise ConfigError("tune.storage", mask_value(url),
                              "this is the MLflow tracking database; Optuna and MLflow both keep an alembic_version "
                              "table and cannot share one: give Optuna its own database, or leave tune.storage out "
                              "(a journal file under train.store)")
        if url.startswith("sqlite:///"):
            _check_existing(url, url[len("sqlite:///"):], b"SQLite format 3\x00", "an SQLite database")
    else:
        path = url[len("file://"):] if url.startswith("file://") else url
        _check_existing(url, path, b'{"op_code"', "an Optuna journal (one JSON record a line)")


def _check_existing(url: str, path: str, head: bytes, what: str) -> None:
    """Refuse a ``tune.storage`` that names a folder, or a file that is not ``what`` (its first bytes are not
    ``head``): Optuna would fail on it with a raw parse error, or write its records into a file of the user's."""
    import os

    fix = ("; name a new file (a .journal path, or a sqlite:/// database of its own) or a database URL: sparktrain "
           "writes a study only into a file Optuna made")
    if os.path.isdir(path):
        raise ConfigError("tune.storage", mask_value(url), f"'{path}' is a folder, not a file{fix}")
    try:
        with open(path, "rb") as fh:
            first = fh.read(len(head))
    except FileNotFoundError:
        return  # a new study: Optuna makes the file
    except OSError as exc:
        raise ConfigError("tune.storage", mask_value(url), f"'{path}' cannot be read ({exc}){fix}") from exc
    if first and not first.startswith(head):
        raise ConfigError("tune.storage", mask_value(url), f"'{path}' is not {what}{fix}")


def _budget_spent(tune: TuneConfig, name: str, where: str, counted: int, cut: int) -> ConfigError:
    """The refusal of a search whose study already holds ``tune.max_trials`` trials that count."""
    kept = f"{cut} cut off by an interrupt or a killed search, which do not count, and " if cut else ""
    return ConfigError("tune.max_trials", tune.max_trials,
                       f"study '{name}' ({where}) already holds {kept}{counted} finished, pruned or failed trials; "
                       f"raise tune.max_trials to run more, or name a new study with tune.study")


def check_budget(cfg: JobConfig, dataset_path: Optional[str], tracking_uri: Optional[str] = None) -> None:
    """Refuse a search whose stored study has no trials left to run, before Spark starts and any MLflow run exists.

    Reads the study only where it already exists (a journal file that is
    there, a database that holds the study); takes no lease and changes
    nothing.  A study it cannot read is left to the search itself, which
    reports it.  Trials still RUNNING count as cut off, as the search will.

    Raises
    ------
    ConfigError
        On ``tune.max_trials``, as :class:`OptunaEngine` would after Spark started.
    """
    tune: Optional[TuneConfig] = cfg.tune
    if tune is None or tune.engine != "optuna":
        return
    from optuna.trial import TrialState

    name = study_name(cfg, dataset_path)
    journal = _journal_path(cfg, name)
    if journal is not None and not os.path.isfile(journal):
        return
    try:
        storage, where = study_storage(cfg, name, tracking_uri)
        trials = storage.get_all_trials(storage.get_study_id_from_name(name), deepcopy=False)
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - no study yet, or one the search will report on itself
        log.debug("tune budget preflight skipped for study '%s': %s", name, exc)
        return
    cut = sum(1 for t in trials if t.state == TrialState.RUNNING or _cut_off(t))  # the search fails RUNNING ones
    if len(trials) - cut >= tune.max_trials:
        raise _budget_spent(tune, name, mask_value(where), len(trials) - cut, cut)


def _journal_path(cfg: JobConfig, name: str) -> Optional[str]:
    """The journal file study ``name`` is kept in (``tune.storage``, else under ``train.store``), or None when
    ``tune.storage`` is a database URL."""
    url = cfg.tune.storage if cfg.tune is not None else None
    if url is None:
        return os.path.join(os.path.abspath(_local_store(cfg)), STUDIES_DIR, f"{name}.journal")
    if "://" in url and not url.startswith("file://"):
        return None
    return os.path.abspath(url[len("file://"):] if url.startswith("file://") else url)


def study_storage(cfg: JobConfig, name: str, tracking_uri: Optional[str] = None) -> Tuple[Any, str]:
    """``(Optuna storage, where it is)`` for study ``name``.

    ``tune.storage`` may be a database URL (``sqlite:///work/optuna.db``,
    ``postgresql://...``: Optuna's RDB storage) or a journal file path;
    without it the journal is ``<train.store>/_studies/<name>.journal``.

    Raises
    ------
    ConfigError
        For the MLflow tracking database (both keep an ``alembic_version``
        table, so they cannot share one), or a store that is not a local path.
    """
    import optuna

    check_storage(cfg, tracking_uri)
    path = _journal_path(cfg, name)
    if path is None:
        url = str(cfg.tune.storage)  # type: ignore[union-attr]
        try:
            return optuna.storages.RDBStorage(url), url
        except ImportError as exc:  # SQLAlchemy found no driver for the URL's dialect
            raise ConfigError("tune.storage", mask_value(url),
                              f"no database driver for it is installed ({exc}); install one into this Python "
                              "(e.g. psycopg2-binary for postgresql://, pymysql for mysql+pymysql://), or leave "
                              "tune.storage out (a journal file under train.store)") from None
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    os.makedirs(os.path.dirname(path), exist_ok=True)
    return JournalStorage(JournalFileBackend(path)), path


class OptunaEngine(Engine):
    """An Optuna study driven by ask-and-tell on the driver; it persists in its storage.

    Parameters
    ----------
    space : CompiledSpace
        Sampled define-by-run (:meth:`CompiledSpace.suggest`).
    cfg : JobConfig
        Its ``tune:`` section (sampler, pruner, study, storage) and ``train:`` (epochs, store).
    goal : {"min", "max"}
        The study's direction.
    seed : int
        Seeds the sampler (offset by the trials a continued study holds, so a
        restart does not replay the first session's suggestions).
    dataset_path : str, optional
        Part of the default study name.
    tracking_uri : str, optional
        Refused as ``tune.storage`` (see :func:`study_storage`).
    run_id_of : callable, optional
        Trial number -> its run folder in ``train.store``, kept as the trial's user attribute
        ``store_run`` (a continued search finds an earlier best trial's model there).

    Raises
    ------
    ConfigError
        When the stored study has the other direction, or already holds ``tune.max_trials`` trials.
    """

    name = "optuna"

    def __init__(self, space: CompiledSpace, cfg: JobConfig, goal: str, seed: int = 0,
                 dataset_path: Optional[str] = None, tracking_uri: Optional[str] = None,
                 run_id_of: Optional[Callable[[int], Optional[str]]] = None) -> None:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)  # the loop logs every trial itself
        tune: TuneConfig = cfg.tune  # type: ignore[assignment]
        self.space, self.tune, self.run_id_of = space, tune, run_id_of
        self.study_name = study_name(cfg, dataset_path)
        storage, where = study_storage(cfg, self.study_name, tracking_uri)
        self.where = mask_value(where)  # for messages and the search's settings: a database URL's password stays out
        direction: Literal["minimize", "maximize"] = "minimize" if goal == "min" else "maximize"
        from sparktrain.data.lease import Lease

        journal = None if isinstance(storage, optuna.storages.RDBStorage) else where
        # one search at a time: a lease file beside the journal, or the database study's own attribute (below)
        self.lease: Any = Lease(lease_target(cfg, self.study_name, journal), "tune.study").acquire() \
            if journal else None
        try:
            existing = self._existing(storage, self.study_name)
            self.epochs = max_epochs(tune, cfg, space)
            self.study = optuna.create_study(
                storage=storage, study_name=self.study_name, direction=direction, load_if_exists=True,
                sampler=self._sampler(tune, seed + existing), pruner=self._pruner(tune, self.epochs))
            if journal is None:
                self.lease = DatabaseLease(self.study, self.where).acquire()
            if self.study.direction.name.lower() != direction:
                raise ConfigError("tune.study", self.study_name,
                                  f"the stored study {self.where} {self.study.direction.name.lower()}s, this search "
                                  f"{direction}s {tune.metric}; name a new study (tune.study)")
            check_same_search(self.study, cfg, dataset_path, self.where)
            self._init_rest(tune)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Let go of the study's lease (the search is over)."""
        if self.lease is not None:
            self.lease.release()
            self.lease = None

    def _init_rest(self, tune: TuneConfig) -> None:
        import optuna

        self._close_stale()
        trials = self.study.get_trials(deepcopy=False)
        cut = [t for t in trials if _cut_off(t)]
        self.previous = len(trials) - len(cut)  # what an interrupt or a dead driver cut off is run again
        if self.previous >= tune.max_trials:
            raise _budget_spent(tune, self.study_name, self.where, self.previous, len(cut))
        self.prunes = tune.pruner != "none"
        if trials:
            done = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
            best = self.study.best_value if done else None
            log.info("continuing Optuna study '%s' (%s): %d trials so far (%d complete%s%s); %d more to run",
                     self.study_name, self.where, self.previous, len(done),
                     "" if best is None else f", best {tune.metric} = {best:.5g}",
                     f"; {len(cut)} cut off, run again" if cut else "", tune.max_trials - self.previous)
        else:
            log.info("new Optuna study '%s' in %s", self.study_name, self.where)

    @staticmethod
    def _existing(storage: Any, name: str) -> int:
        try:
            study_id = storage.get_study_id_from_name(name)
        except KeyError:
            return 0
        return len(storage.get_all_trials(study_id, deepcopy=False))

    def _close_stale(self) -> None:
        """Trials left RUNNING by a search that died are told FAIL (their process is gone); they have no error
        of their own, so :func:`_cut_off` does not count them against ``max_trials``."""
        from optuna.trial import TrialState

        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            log.warning("study '%s': trial %d was left running by an earlier search; recording it as failed",
                        self.study_name, t.number + 1)
            self.study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)

    @staticmethod
    def _sampler(tune: TuneConfig, seed: int) -> Any:
        from optuna import samplers

        startup, options = startup_trials(tune), dict(tune.sampler_options)
        if tune.effective_sampler == "random":
            return samplers.RandomSampler(seed=seed)
        if tune.effective_sampler == "cmaes":
            options = {"n_startup_trials": startup, "warn_independent_sampling": False, **options}
            return samplers.CmaEsSampler(seed=seed, **options, independent_sampler=samplers.TPESampler(
                seed=seed, n_startup_trials=startup))
        return samplers.TPESampler(seed=seed, **{"n_startup_trials": startup, **options})

    @staticmethod
    def _pruner(tune: TuneConfig, epochs: int) -> Any:
        from optuna import pruners

        low = tune.pruner_min_epochs
        if tune.pruner == "median":  # steps are epochs done (1-based): the first prunable step is low
            return pruners.MedianPruner(n_startup_trials=tune.pruner_startup_trials, n_warmup_steps=low)
        if tune.pruner == "asha":
            return pruners.SuccessiveHalvingPruner(min_resource=low, reduction_factor=tune.reduction_factor)
        if tune.pruner == "hyperband":
            return pruners.HyperbandPruner(min_resource=low, max_resource=max(epochs, low),
                                           reduction_factor=tune.reduction_factor)
        return pruners.NopPruner()

    def ask(self) -> Optional[Tuple[int, Any, Dict[str, Any]]]:
        trial = self.study.ask()
        try:
            params = self.space.suggest(trial)
        except BaseException as exc:
            from optuna.trial import TrialState

            trial.set_user_attr("error", f"the space could not be sampled: {type(exc).__name__}: {exc}"[:1000])
            self.study.tell(trial, state=TrialState.FAIL)
            raise
        trial.set_user_attr("train_params", json.dumps(params, default=list))
        run = self.run_id_of(trial.number + 1) if self.run_id_of is not None else None
        if run:
            trial.set_user_attr(STORE_RUN_ATTR, run)
        return trial.number + 1, trial, params

    def report(self, handle: Any, epoch: int, value: float) -> bool:
        if not math.isfinite(value):
            return True  # diverged: nothing to gain from more epochs
        handle.report(float(value), step=epoch + 1)
        return bool(handle.should_prune())

    def record_curve(self, handle: Any, values: Dict[int, float]) -> None:
        """Kept as the trial's intermediate values: a later search of the study that prunes compares with them."""
        for epoch, value in sorted(values.items()):
            if math.isfinite(value):
                handle.report(float(value), step=epoch + 1)

    def tell(self, handle: Any, status: str, metric: Optional[float], error: Optional[str] = None) -> None:
        from optuna.trial import TrialState

        if status == FINISHED and metric is not None:
            self.study.tell(handle, float(metric))
        elif status == PRUNED:
            self.study.tell(handle, state=TrialState.PRUNED)
        else:
            if error:
                handle.set_user_attr("error", error[:1000])
            self.study.tell(handle, state=TrialState.FAIL)

    def settings(self) -> Dict[str, Any]:
        tune = self.tune
        out: Dict[str, Any] = {"engine": self.name, "sampler": tune.effective_sampler, "pruner": tune.pruner,
                               "study": self.study_name, "storage": self.where}
        if tune.sampler_options:
            out["sampler_options"] = dict(tune.sampler_options)
        if tune.pruner != "none":
            out.update(pruner_min_epochs=tune.pruner_min_epochs)
            if tune.pruner in ("asha", "hyperband"):
                out.update(reduction_factor=tune.reduction_factor)
            if tune.pruner == "median":
                out.update(pruner_startup_trials=tune.pruner_startup_trials)
        return out


def make_engine(space: CompiledSpace, cfg: JobConfig, goal: str, seed: int, dataset_path: Optional[str],
                tracking_uri: Optional[str] = None,
                run_id_of: Optional[Callable[[int], Optional[str]]] = None) -> Engine:
    """The engine ``tune.engine`` names (``run_id_of``: see :class:`OptunaEngine`)."""
    tune: TuneConfig = cfg.tune  # type: ignore[assignment]
    if tune.engine == "optuna":
        return OptunaEngine(space, cfg, goal, seed=seed, dataset_path=dataset_path, tracking_uri=tracking_uri,
                            run_id_of=run_id_of)
    return HyperoptEngine(space, goal, algo=tune.effective_sampler, seed=seed, options=tune.sampler_options)


__all__ = ["Engine", "HyperoptEngine", "OptunaEngine", "check_budget", "check_pruning", "check_sampler", "make_engine",
           "sampler_options", "startup_trials",
           "max_epochs", "min_trials", "study_name", "study_storage", "STUDIES_DIR", "STORE_RUN_ATTR"]
