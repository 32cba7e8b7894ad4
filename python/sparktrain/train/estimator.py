"""Spark ML Estimators that train Keras or PyTorch models across executors.

Flow of :meth:`_fit` (after xgboost.spark): :meth:`plan` resolves the input to a
materialized dataset, the model inputs, the worker spec and the run (a new
one per ``fit`` unless ``runId`` is set); the driver preflight runs; one
barrier stage of ``numWorkers`` tasks trains; then the Model gets the run id
and ``_copyValues``.  ``fit`` is a pure function of (params, data), so
CrossValidator and TrainValidationSplit work unchanged.
"""

from __future__ import annotations

import logging
import os
import warnings
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from pyspark import keyword_only
from pyspark.ml import Estimator
from pyspark.ml.util import DefaultParamsReadable, DefaultParamsReader, DefaultParamsWritable, DefaultParamsWriter

from sparktrain._internal.secrets import mask_strings
from sparktrain.errors import ConfigError, RunMismatchError, SchemaError, TrainingError
from sparktrain.train import plan as plan_mod
from sparktrain.train import preflight
from sparktrain.settings import PARAM_OF, check_together, resolve_backend
from sparktrain.train._executor.spec import InputSpec, WorkerSpec, group_specs
from sparktrain.train.frame import FrameInputs, describe as describe_inputs, invalid_row, resolve as resolve_frame
from sparktrain.train.inputs import column_stats, exists, infer_inputs, merge_stats
from sparktrain.train.launcher import LaunchResult, launch
from sparktrain.train.model import KerasModel, TorchModel, _DistributedModel
from sparktrain.train.params import _DistributedParams, attach_setters
from sparktrain.train.plan import TrainingPlan
from sparktrain.train.progress import TrainingCallback

log = logging.getLogger(__name__)


def _known_params(fn: Callable) -> Callable:
    """Refuse a keyword that is no Param with a :class:`ConfigError` naming it and the Param meant (a YAML key
    such as ``learning_rate`` for ``learningRate``, or a near miss), where Python would raise a bare
    ``TypeError``."""
    import difflib
    import functools
    import inspect

    names = [n for n in inspect.signature(fn).parameters if n != "self"]

    @functools.wraps(fn)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        for key in kwargs:
            if key not in names:
                meant = PARAM_OF.get(key) or next(iter(difflib.get_close_matches(key, names, n=1)), None)
                hint = (f"the Param is {meant}" + (f" ('{key}' is its YAML key under train:)" if key in PARAM_OF
                                                   else "") if meant else "see explainParams() for the Params")
                raise ConfigError(key, kwargs[key], f"{type(self).__name__} has no Param '{key}': {hint}",
                                  kind="parameter")
        return fn(self, *args, **kwargs)
    return wrapper


class _DistributedEstimator(Estimator, _DistributedParams, DefaultParamsReadable, DefaultParamsWritable):
    """What both estimators share.

    The keyword-only signatures of ``__init__`` and ``setParams`` are written
    out for IDEs; ``tests/test_settings.py`` holds them to
    :mod:`sparktrain.settings`.  Every setting also has a generated
    ``getX``/``setX``.
    """

    _framework = ""
    _model_cls: type = _DistributedModel

    @_known_params
    @keyword_only
    def __init__(self, *, numWorkers: Optional[int] = None, backend: Optional[str] = None,
                 gpusPerWorker: Optional[int] = None, epochs: Optional[int] = None, batchSize: Optional[int] = None,
                 accumulateSteps: Optional[int] = None, learningRate: Optional[float] = None,
                 precision: Optional[str] = None, seed: Optional[int] = None, shuffleBuffer: Optional[int] = None,
                 hiddenUnits: Optional[List[int]] = None, embeddingDim: Optional[int] = None,
                 dropout: Optional[float] = None, checkpointEverySteps: Optional[int] = None,
                 checkpointEverySeconds: Optional[float] = None, keepCheckpoints: Optional[int] = None,
                 stallTimeout: Optional[float] = None, elastic: Optional[bool] = None,
                 minWorkers: Optional[int] = None, elasticBatch: Optional[str] = None,
                 logEverySteps: Optional[int] = None, logEverySeconds: Optional[float] = None,
                 task: Optional[str] = None, store: Optional[str] = None, validationFraction: Optional[float] = None,
                 runId: Optional[str] = None, labelCol: Optional[str] = None, numericCols: Optional[List[str]] = None,
                 categoricalCols: Optional[List[str]] = None, excludeCols: Optional[List[str]] = None,
                 predictionCol: Optional[str] = None, probabilityCol: Optional[str] = None,
                 featuresCol: Optional[str] = None, rawPredictionCol: Optional[str] = None,
                 handleInvalid: Optional[str] = None) -> None:
        super().__init__()
        self.callbacks: List[TrainingCallback] = []
        self.show_progress = True
        self.last_launch: Optional[LaunchResult] = None
        self._model_factory: Optional[Callable] = None
        self._loss_factory: Optional[Callable] = None
        self._optimizer_factory: Optional[Callable] = None
        self._unrestored: Dict[str, str] = {}  # {kind: qualname} of factories a loaded save dropped
        self._set(**self._input_kwargs)  # type: ignore[attr-defined]

    @_known_params
    @keyword_only
    def setParams(self, *, numWorkers: Optional[int] = None, backend: Optional[str] = None,
                  gpusPerWorker: Optional[int] = None, epochs: Optional[int] = None, batchSize: Optional[int] = None,
                  accumulateSteps: Optional[int] = None, learningRate: Optional[float] = None,
                  precision: Optional[str] = None, seed: Optional[int] = None, shuffleBuffer: Optional[int] = None,
                  hiddenUnits: Optional[List[int]] = None, embeddingDim: Optional[int] = None,
                  dropout: Optional[float] = None, checkpointEverySteps: Optional[int] = None,
                  checkpointEverySeconds: Optional[float] = None, keepCheckpoints: Optional[int] = None,
                  stallTimeout: Optional[float] = None, elastic: Optional[bool] = None,
                  minWorkers: Optional[int] = None, elasticBatch: Optional[str] = None,
                  logEverySteps: Optional[int] = None, logEverySeconds: Optional[float] = None,
                  task: Optional[str] = None, store: Optional[str] = None, validationFraction: Optional[float] = None,
                  runId: Optional[str] = None, labelCol: Optional[str] = None, numericCols: Optional[List[str]] = None,
                  categoricalCols: Optional[List[str]] = None, excludeCols: Optional[List[str]] = None,
                  predictionCol: Optional[str] = None, probabilityCol: Optional[str] = None,
                  featuresCol: Optional[str] = None, rawPredictionCol: Optional[str] = None,
                  handleInvalid: Optional[str] = None) -> "_DistributedEstimator":
        """Set any of the constructor's params; returns self."""
        return self._set(**self._input_kwargs)  # type: ignore[attr-defined]

    def setRunId(self, value: str) -> "_DistributedEstimator":
        """Resume (or name) this run; unset, every ``fit`` is a new run."""
        return self._set(runId=value)

    def setLabelCol(self, value: str) -> "_DistributedEstimator":
        return self._set(labelCol=value)

    def setNumericCols(self, value: List[str]) -> "_DistributedEstimator":
        return self._set(numericCols=value)

    def setCategoricalCols(self, value: List[str]) -> "_DistributedEstimator":
        return self._set(categoricalCols=value)

    def setExcludeCols(self, value: List[str]) -> "_DistributedEstimator":
        return self._set(excludeCols=value)

    def setPredictionCol(self, value: str) -> "_DistributedEstimator":
        return self._set(predictionCol=value)

    def setProbabilityCol(self, value: str) -> "_DistributedEstimator":
        return self._set(probabilityCol=value)

    def setFeaturesCol(self, value: str) -> "_DistributedEstimator":
        """Train on this vector or fixed-length numeric array column (e.g. a VectorAssembler's output)."""
        return self._set(featuresCol=value)

    def setRawPredictionCol(self, value: str) -> "_DistributedEstimator":
        return self._set(rawPredictionCol=value)

    def write(self) -> Any:
        """Spark ML's writer (also what a Pipeline, CrossValidator or TrainValidationSplit holding this estimator
        saves).  Params are written masked (a store URI's password stays out).  Factories are code, not Params:
        a warning names each one that is dropped, and the metadata records it, so that the loaded estimator
        refuses to fit until it is set again (:meth:`_check_factories_restored`)."""
        dropped = {name: _qualname(fn) for name, fn in self._factories().items() if fn is not None}
        if dropped:
            names = ", ".join(f"{n} factory {q}" for n, q in dropped.items())
            warnings.warn(f"saving {type(self).__name__} without its {names}: factories are code, not Params, "
                          "and are not persisted; call setModelFactory/setLossFactory/setOptimizerFactory again "
                          "after load()", UserWarning, stacklevel=2)
        return _EstimatorWriter(self, {**self._unrestored, **dropped})

    @classmethod
    def read(cls) -> Any:
        return _EstimatorReader(cls)

    def copy(self, extra: Any = None) -> "_DistributedEstimator":
        """Spark ML's copy; the record of factories a loaded save dropped is the copy's own (a factory set on
        the copy must not clear the original's)."""
        that = super().copy(extra)
        that._unrestored = dict(self._unrestored)
        return that

    def _factories(self) -> Dict[str, Optional[Callable]]:
        return {"model": self._model_factory, "loss": self._loss_factory, "optimizer": self._optimizer_factory}

    def _check_factories_restored(self) -> None:
        """Refuse to fit an estimator loaded from a save that dropped a factory, until each is set again (or
        cleared with ``setXFactory(None)``): fitting it would train the default network, silently."""
        if self._unrestored:
            setters = {"model": "setModelFactory", "loss": "setLossFactory", "optimizer": "setOptimizerFactory"}
            kind, name = next(iter(self._unrestored.items()))
            raise ConfigError(setters[kind], name,
                              f"this {type(self).__name__} was saved with the {kind} factory {name}, which is code "
                              f"and was not persisted; without it fit() would train the default "
                              f"{'network' if kind == 'model' else kind}. Fix: call "
                              f"{setters[kind]}({name.rsplit('.', 1)[-1]}) "
                              f"again after load(), or {setters[kind]}(None) to fit with the default",
                              kind="parameter")

    def setCallbacks(self, callbacks: Sequence[TrainingCallback]) -> "_DistributedEstimator":
        """Objects with ``on_step``/``on_epoch`` that receive live metrics (not persisted)."""
        self.callbacks = list(callbacks)
        return self

    def setModelFactory(self, fn: Callable) -> "_DistributedEstimator":
        """``fn(inputs: InputSpec, model: ModelSpec)`` returning the network (not persisted).

        The network is called with the numeric block ``[B, numeric_width]`` and the ``[B, cat_width]``
        integer block (torch: ``net(x_num, x_cat)``; Keras: one list, ``[numeric, one [B, 1] index per
        categorical, one [B, length] block per text/set feature]``) and returns **logits**: ``[B, 1]``, or
        ``[B, num_classes]`` for multiclass, with no final sigmoid/softmax (the loss and scoring apply it).
        It is checked on two rows before training (docs/training.md, "A network of your own"); a Keras one
        must also save and load back (custom layers registered with
        ``@keras.saving.register_keras_serializable()``).
        """
        self._unrestored.pop("model", None)
        self._model_factory = _factory(fn, "setModelFactory", 2, "fn(inputs, model_spec) returning the network")
        return self

    def setLossFactory(self, fn: Callable) -> "_DistributedEstimator":
        """``fn()`` returning the loss (not persisted): torch ``loss(outputs, labels)``, Keras ``loss(y_true,
        y_pred)`` as Keras calls it; a mean over the batch or one value per row.

        ``outputs``/``y_pred`` are the logits; labels are float (binary, regression: ``[B]`` for torch, whose
        logits are ``[B, 1]``; ``[B, 1]`` for Keras) or int64 class indices ``[B]`` (multiclass).
        """
        usage = "fn() returning the loss, e.g. lambda: " + (
            "keras.losses.BinaryCrossentropy(from_logits=True)" if self._framework == "keras"
            else "lambda outputs, labels: F.binary_cross_entropy_with_logits(outputs.reshape(-1), labels)")
        self._unrestored.pop("loss", None)
        self._loss_factory = _factory(fn, "setLossFactory", 0, usage)
        return self

    def setOptimizerFactory(self, fn: Callable) -> "_DistributedEstimator":
        """Torch: ``fn(parameters, lr)``; Keras: ``fn(lr)`` returning an optimizer (not persisted)."""
        self._unrestored.pop("optimizer", None)
        if self._framework == "keras":
            self._optimizer_factory = _factory(fn, "setOptimizerFactory", 1, "fn(lr) returning a Keras optimizer, "
                                                                              "e.g. lambda lr: keras.optimizers."
                                                                              "SGD(lr, momentum=0.9)")
        else:
            self._optimizer_factory = _factory(fn, "setOptimizerFactory", 2, "fn(parameters, lr) returning a torch "
                                                                              "optimizer, e.g. lambda p, lr: torch."
                                                                              "optim.SGD(p, lr, momentum=0.9)")
        return self

    # -- planning -------------------------------------------------------------------------------------------

    def plan(self, dataset: Any, run_id: Optional[str] = None) -> TrainingPlan:
        """Resolve ``(params, dataset)`` into a :class:`~sparktrain.train.plan.TrainingPlan` on the driver.

        ``dataset`` is a materialized dataset (path or URI with ``train/``,
        optionally ``validation/`` and ``features.json``; or an object with a
        ``path``), a single Parquet split, or a DataFrame.  A DataFrame is
        checked (label present, learnable, finite), fingerprinted by content
        and written under the run's folder in the store.  Raises before any
        barrier stage: on bad input, and on a ``runId`` whose run was other
        data or params.  Nothing but that DataFrame write happens here.
        ``run_id`` (given by ``fit``, which claimed it) overrides the param.
        """
        explicit = self.isSet(self.runId)
        run_id = run_id or (self.getRunId() if explicit else plan_mod.new_run_id())
        store = self._store_uri()
        self._check_store(dataset)
        stored = plan_mod.existing_run(store, run_id, explicit)
        try:
            return self._plan(dataset, run_id, store, stored)
        except BaseException:
            if stored is None:
                plan_mod.discard(store, run_id)  # a DataFrame written for this new run, nothing else
            raise

    def _check_store(self, dataset: Any) -> None:
        """Refuse a store that is a file, overlaps the dataset or cannot be written (before anything is written)."""
        from sparktrain._internal.secrets import MASK
        from sparktrain.data.guard import check_store_location

        if MASK in self.getStore():  # loaded from a save, which writes no secret
            raise ConfigError("store", self.getStore(),
                              f"its credentials are masked ({MASK}): a saved estimator, Pipeline or CrossValidator "
                              f"never writes a secret, so a loaded one has none. Fix: setStore(...) again with the "
                              f"credentials, or give them to the filesystem another way (AWS_ACCESS_KEY_ID and "
                              f"AWS_SECRET_ACCESS_KEY, an instance profile)", kind="parameter")
        root = getattr(dataset, "path", dataset)
        check_store_location(self._store_uri(), "store",
                             dataset=os.fspath(root) if isinstance(root, (str, os.PathLike)) else None)

    def _plan(self, dataset: Any, run_id: str, store: str, stored: Optional[Dict[str, Any]]) -> TrainingPlan:
        label = self.getLabelCol()
        root = getattr(dataset, "path", dataset)
        if isinstance(root, (str, os.PathLike)):
            root = os.fspath(root).rstrip("/")
            train_path, val_path, meta = plan_mod.split_paths(root)
            data_fp: Dict[str, Any] = plan_mod.path_fingerprint(train_path, val_path)
            binary01, from_frame, unused = None, False, ()  # type: Optional[bool], bool, Sequence[str]
            features = self.getFeaturesCol()
            named = self._named_inputs()
            vectors: Optional[Dict[str, Optional[int]]] = {features: None} if features else None
        else:  # the label decided as preprocess decides it: its entry stands in for features.json's
            train_path, val_path, data_fp, label_entry, frame = self._dataframe_input(dataset, store, run_id, stored)
            root, meta = plan_mod.run_uri(store, run_id, "data"), {"label": label_entry}
            binary01, from_frame, unused = data_fp["dataframe"].get("label_is_01"), True, frame.unused
            widths = data_fp["dataframe"].get("widths") or {}
            vectors = {c: widths[c] for c in frame.vectors}
            infer_cat = not self.isDefined(self.categoricalCols) and self.getFeaturesCol() is None
            named = (list(frame.numeric), None if infer_cat else list(frame.categorical))
        stats = column_stats(train_path)  # footers only, read once for the task and the inputs
        if val_path is not None:  # an index only the validation split holds still gets an embedding row
            stats = merge_stats(stats, column_stats(val_path))
        if self.getTask() == "auto" and not (meta or {}).get("task"):
            if binary01 is None and plan_mod.float_01_range(stats, label):
                binary01 = plan_mod.float_label_is_01(_session_for(dataset), train_path, label)
            if binary01:  # Spark ML's convention: 0.0/1.0 double labels are two classes
                meta = dict(meta or {}, task="binary")
        exclude = [*self.getExcludeCols(), *((meta or {}).get("exclude") or [])]
        inputs = infer_inputs(train_path, label, numeric=named[0], categorical=named[1], task=self.getTask(),
                              exclude=exclude, meta=meta, stats=stats, vectors=vectors)
        spec = self._worker_spec(train_path, val_path, inputs, run_id, store)
        factories = {name: _qualname(fn) for name, fn in (("model", self._model_factory),
                                                          ("loss", self._loss_factory),
                                                          ("optimizer", self._optimizer_factory))}
        fp = plan_mod.fingerprint(data_fp, inputs, spec, factories)
        if stored is not None:
            plan_mod.check_same(run_id, stored, fp)
        return TrainingPlan(run_id=run_id, resume=stored is not None, dataset=root, train_path=train_path,
                            val_path=val_path, inputs=inputs, spec=spec, fingerprint=fp,
                            features=None if from_frame else meta, unused=tuple(unused))

    def _named_inputs(self) -> Tuple[Optional[List[str]], Optional[List[str]]]:
        """``(numericCols, categoricalCols)`` as given; with ``featuresCol`` set, an unset one is empty."""
        features = self.getFeaturesCol() is not None
        numeric = self.getNumericCols() if self.isDefined(self.numericCols) else ([] if features else None)
        categorical = self.getCategoricalCols() if self.isDefined(self.categoricalCols) else \
            ([] if features else None)
        return numeric, categorical

    def model_from_plan(self, plan: TrainingPlan, model_bytes: bytes,
                        history: Sequence[Dict[str, float]]) -> _DistributedModel:
        """The fitted Model for ``plan``'s trained network (as ``fit`` returns it)."""
        model = self._model_cls(framework=self._framework, model_bytes=model_bytes, inputs=plan.inputs,
                                history=list(history))
        self._copyValues(model)  # the training Params too: bestModel.getLearningRate() after a CrossValidator
        model._set(runId=plan.run_id, numericCols=list(plan.inputs.numeric),
                   categoricalCols=[c for c, _ in plan.inputs.categorical])
        model._resetUid(self.uid)  # Spark ML's convention: a model takes its estimator's uid
        return model

    def _fit(self, dataset: Any) -> _DistributedModel:
        from sparktrain.data.run_store import RunStore

        self._check_factories_restored()
        explicit = self.isSet(self.runId)
        run_id = self.getRunId() if explicit else plan_mod.new_run_id()
        self._check_store(dataset)  # before the claim writes the run's lease: a file or read-only store is named
        with RunStore(self._store_uri(), run_id).claim():  # one job per run (sparktrain.data.lease)
            if not isinstance(dataset, str):
                return self._fit_claimed(dataset, run_id)
            if "://" not in dataset:  # the ranks' working directory is the executor's, not this process's
                dataset = os.path.abspath(dataset)
            from sparktrain.data.commit import reading

            with reading(dataset) as generation:  # a dataset committed again meanwhile: this fit keeps its own
                return self._fit_claimed(generation, run_id)

    def _fit_claimed(self, dataset: Any, run_id: str) -> _DistributedModel:
        t0 = time.perf_counter()
        spark = _session_for(dataset)
        plan = self.plan(dataset, run_id=run_id)
        result = _finished(plan) if plan.resume else None
        if result is not None:  # nothing to train: no preflight, no barrier stage
            log.info("run %s already trained %d epoch(s) (epochs=%d): its saved model is returned without "
                     "training", plan.run_id, len(result.history), plan.spec.optim.epochs)
        else:
            result = self._launch(spark, plan, t0)
        self.last_launch = result
        if plan_mod.ensure_recorded(plan):
            from sparktrain.data.run_store import RunStore

            warnings.warn(f"run {plan.run_id}'s run.json vanished from the store during the fit (was its folder "
                          f"{RunStore(plan.spec.store, plan.run_id).uri()} deleted or cleaned up by another job?): "
                          f"the checkpoints and events written before that are lost. run.json was written again, "
                          f"so fitting with runId={plan.run_id!r} still resumes, from the checkpoints written "
                          f"since", UserWarning, stacklevel=4)
        _check_finite(result.history, plan.run_id, self.getLearningRate())
        _warn_past_epochs(result.history, plan.run_id, plan.spec.optim.epochs)
        _warn_unlearned(result.history, plan.run_id, self.getBatchSize(), self.getLearningRate())
        model = self.model_from_plan(plan, result.model_bytes, result.history)
        model.launch = result
        return model

    def _store_uri(self) -> str:
        store = self.getStore()
        return store if "://" in store else os.path.abspath(store)

    def checked_settings(self) -> Dict[str, Any]:
        """Every setting by ``train:`` key, after the rules between settings (the YAML path runs the same ones).

        ``backend`` comes back resolved (``auto`` is ``gloo`` for Keras, ``ddp`` for torch).
        """
        values = self.settings()
        if self._framework == "keras" and values["backend"] == "horovod":
            preflight.check_framework("keras", "horovod")  # explains why horovod+keras is refused
        check_together(values, self._framework, lambda key: PARAM_OF[key], kind="parameter")
        values["backend"] = resolve_backend(self._framework, values["backend"])
        return values

    def _worker_spec(self, train_path: str, val_path: Optional[str], inputs: InputSpec, run_id: str,
                     store: str) -> WorkerSpec:
        import cloudpickle

        values = self.checked_settings()

        def pickled(fn: Optional[Callable]) -> Optional[bytes]:
            if fn is None:
                return None
            try:
                return cloudpickle.dumps(fn)
            except Exception as exc:
                raise preflight.PreflightError(
                    f"the factory {getattr(fn, '__name__', fn)!r} cannot be pickled for the executors: {exc}. "
                    "Model/loss/optimizer factories must be plain functions or classes that do not capture "
                    "a SparkSession, DataFrame, lock or open file.") from exc

        return WorkerSpec(
            framework=self._framework, inputs=inputs, train_path=train_path, val_path=val_path, store=store,
            run_id=run_id, **group_specs(values),
            model_factory=pickled(self._model_factory), loss_factory=pickled(self._loss_factory),
            optimizer_factory=pickled(self._optimizer_factory),
            env={k: v for k, v in os.environ.items() if k.startswith("SPARKTRAIN_")}, python=sys.executable)

    def _check_output_names(self, frame: FrameInputs) -> None:
        """Refuse an input named like a column the model adds: it could not score the DataFrame it was fitted on
        (a previous model's ``prediction`` left in the DataFrame, typically)."""
        outputs = {p: self.getOrDefault(p) for p in ("predictionCol", "probabilityCol", "rawPredictionCol")}
        for column in (*frame.numeric, *frame.categorical, *frame.vectors):
            param = next((p for p, name in outputs.items() if name and name == column), None)
            if param is not None:
                raise SchemaError(f"column '{column}' of the DataFrame passed to fit() would be an input, but the "
                                  f"model adds a column of that name ({param}), so it could not score this "
                                  f"DataFrame. Fix: leave it out with excludeCols=['{column}'] (an earlier model's "
                                  f"output?), or set {param} to another name")

    def _launch(self, spark: Any, plan: Any, t0: float) -> LaunchResult:
        """Preflight, record and train ``plan`` (``t0``: when fit started, for the planning time)."""
        try:
            preflight.run_all(spark, plan.spec)
            plan_mod.record_run(plan)
        except BaseException:
            if not plan.resume:
                plan_mod.discard(plan.spec.store, plan.run_id)
            raise
        _warn_one_step(plan.train_path, plan.spec)
        log.info("training %s (%s) with %d workers, %s run %s, task %s; inputs: %s", self._framework,
                 plan.spec.backend, plan.spec.num_workers, "resuming" if plan.resume else "new", plan.run_id,
                 plan.inputs.task, describe_inputs(plan.inputs, plan.unused))
        planned = time.perf_counter() - t0
        try:
            result = launch(spark, plan.spec, self.callbacks, show_bar=self.show_progress)
        except TrainingError as exc:  # the run to resume, in the message and on the error
            exc.name_run(plan.run_id, _saved_checkpoints(plan.spec.store, plan.run_id))
            raise
        result.plan_s = planned
        return result

    def _dataframe_input(self, df: Any, store: str, run_id: str, stored: Optional[Dict[str, Any]]
                         ) -> Tuple[str, Optional[str], Dict[str, Any], Dict[str, Any], FrameInputs]:
        """Check, fingerprint and (unless this run already holds it) materialize a DataFrame input.

        Each column is an input or refused (:mod:`sparktrain.train.frame`), from the schema, before any
        job.  The label goes through preprocess's policy (:func:`~sparktrain.train.plan.dataframe_label`):
        the same types accepted, the same errors, a string label indexed.  The inputs are converted in
        Spark (vectors to ``array<float>``, booleans to 0/1...) and the float blocks' lengths checked in
        the fingerprint's job.  Returns ``(train, validation or None, data fingerprint, the label's
        features.json-style entry, the columns' use)``.
        """
        label = self.getLabelCol()
        plan_mod.check_label(df, label)
        from sparktrain._internal.spark_compat import check_spark_path

        # the DataFrame is written to the store with Spark: a scheme Spark has no filesystem for fails now
        check_spark_path(df.sparkSession, store, "store", "the store, where fit(DataFrame) writes the DataFrame "
                                                          "with Spark (or fit a dataset path: pyarrow reads it)")
        frame = resolve_frame(df.schema, label, features_col=self.getFeaturesCol(),
                              numeric=self.getNumericCols() if self.isDefined(self.numericCols) else None,
                              categorical=self.getCategoricalCols() if self.isDefined(self.categoricalCols) else None,
                              exclude=self.getExcludeCols())
        self._check_output_names(frame)
        decision = plan_mod.dataframe_label(df, label, self.getTask())
        frac = self.getValidationFraction()
        df = frame.frame(df, label)
        handle = self.getHandleInvalid()
        content = plan_mod.dataframe_fingerprint(df, label, blocks=frame.vectors, numeric=frame.numeric,
                                                 categorical=frame.categorical, handle_invalid=handle)
        large = content.pop("large_inputs", {})
        if large and self._model_factory is None:  # a network of the user's own may scale its inputs itself
            _warn_large_inputs(large)
        data_fp = {"dataframe": content, "validation_fraction": frac}
        if handle != "error":  # which rows are trained on; left out of the default's fingerprint (older runs)
            data_fp["handle_invalid"] = handle
        entry = plan_mod.label_meta(decision)
        from sparktrain.data.run_store import RunStore

        run = RunStore(store, run_id)
        if stored is not None:
            changes = plan_mod.diff(stored.get("fingerprint", {}).get("data", {}), mask_strings(data_fp), "data.")
            if changes:  # refuse before writing anything
                raise RunMismatchError(run_id, changes)
            from sparktrain.data.commit import resolve

            train = resolve(run.data_uri("train"))  # inside the data folder's committed generation
            if exists(train):
                log.info("run %s: the DataFrame matches the run's data; reusing %s", run_id, run.data_uri())
                val = resolve(run.data_uri("validation"))
                return train, (val if exists(val) else None), data_fp, entry, frame
        train_path, val_path = plan_mod.materialize_dataframe(
            df, run.data_uri(), label, frac, content["null_labels"], seed=self.getOrDefault(self.seed),
            labels=decision.encoding.labels,
            invalid=invalid_row(frame.numeric, frame.categorical, frame.vectors) if handle != "error" else None,
            invalid_rows=content.get("invalid_rows", 0), invalid_cols=content.get("invalid"))
        return train_path, val_path, data_fp, entry, frame


def _finished(plan: Any) -> Optional[LaunchResult]:
    """The saved model of a resumed run that already trained ``epochs`` or more, for the same inputs and
    framework; None when there is training to do (or no complete saved model)."""
    import json

    from sparktrain.data.run_store import RunStore

    try:
        model_bytes, written = RunStore(plan.spec.store, plan.run_id).read_network()
    except Exception:  # noqa: BLE001 - none saved (or unreadable): the launch trains or resumes
        return None
    history = list(written.get("history") or [])
    same = (written.get("framework") == plan.spec.framework
            and written.get("inputs") == json.loads(json.dumps(plan.spec.inputs.to_dict())))
    if not same or len(history) < plan.spec.optim.epochs:
        return None
    return LaunchResult(history=history, model_bytes=model_bytes, param_digests={}, attempts=0, seconds=0.0)


def _warn_past_epochs(history: Sequence[Dict[str, float]], run_id: str, epochs: int) -> None:
    """Warn when a resumed run had already trained more epochs than asked for (its model is returned as is).

    ``epochs`` is not part of a run's fingerprint (more epochs continue the run), so fewer is no
    :class:`~sparktrain.errors.RunMismatchError`; but the model returned is not the one asked for.
    """
    if len(history) > epochs:
        asked = f"{epochs} epoch" + ("" if epochs == 1 else "s")
        warnings.warn(f"run {run_id!r} had already trained {len(history)} epochs, more than epochs={epochs}: fit "
                      f"returned its {len(history)}-epoch model, not trained back to {asked}. To train {asked} "
                      f"afresh, fit with a new runId (or unset runId: every fit() is then a new run)", UserWarning,
                      stacklevel=4)


def _warn_unlearned(history: Sequence[Dict[str, float]], run_id: str, batch_size: int, learning_rate: float
                    ) -> None:
    """Warn when a binary model's last epoch ranks worse than chance (AUC below 0.5): it has not learned yet."""
    last = dict(history[-1]) if history else {}
    key = "val_auc" if "val_auc" in last else "train_auc"
    auc = last.get(key)
    if auc is None or not auc == auc or auc >= 0.5:
        return
    n = len(history)
    warnings.warn(f"the model of run {run_id!r} ranks worse than chance after {n} epoch{'s' if n != 1 else ''} "
                  f"({key} {auc:.3f}): it has not learned the label yet. On a small or imbalanced table that is "
                  f"usually too few optimizer steps: raise epochs, or learningRate (now {learning_rate:g}), or "
                  f"lower batchSize (now {batch_size}); fit again with runId={run_id!r} and more epochs to go on "
                  f"from this model", UserWarning, stacklevel=4)


def _warn_large_inputs(large: Dict[str, float]) -> None:
    """Warn that inputs far from unit scale reach the default network as they are (it does not standardize)."""
    named = ", ".join(f"'{c}' ({v:,.4g})" for c, v in sorted(large.items(), key=lambda kv: -kv[1]))
    warnings.warn(f"input column(s) {named} (root mean square) reach the network unscaled; the default network "
                  f"trains poorly on inputs far from unit scale, and may end worse than predicting the most common "
                  f"class. Fix: standardize them in the Pipeline before the estimator (VectorAssembler, then "
                  f"StandardScaler(withMean=True, withStd=True) into featuresCol), or rescale them in Spark (a log, "
                  f"a division)", UserWarning, stacklevel=5)


def _check_finite(history: Sequence[Dict[str, float]], run_id: str, learning_rate: float) -> None:
    """Refuse a network whose last epoch's loss is NaN or infinite: it would score every row the same."""
    import math

    last = dict(history[-1]) if history else {}
    bad = {k: v for k, v in last.items() if k in ("train_loss", "val_loss") and not math.isfinite(float(v))}
    if bad:
        seen = ", ".join(f"{k} = {v}" for k, v in bad.items())
        raise TrainingError(f"the network diverged in run {run_id}: {seen} after epoch {len(history)}, so its "
                            f"weights are not usable and no model is returned. Fix: lower learningRate (now "
                            f"{learning_rate:g}), scale the inputs (StandardScaler), or train in fp32 (precision)")


def _session_for(dataset: Any):
    from pyspark.sql import SparkSession

    session = getattr(dataset, "sparkSession", None)
    return session if session is not None else SparkSession.active()


def _factory(fn: Any, setter: str, arity: int, usage: str) -> Optional[Callable]:
    """``fn`` when it can be called with ``arity`` positional arguments (None clears the factory); else a
    :class:`ConfigError` naming the setter, what it got and ``usage`` (a name such as ``"adam"``, or an
    optimizer or loss object where a function that makes one is wanted)."""
    import inspect

    if fn is None:
        return None
    what = f"{type(fn).__name__} {fn!r}" if isinstance(fn, (str, int, float)) else f"a {type(fn).__name__} object"
    if not callable(fn):
        raise ConfigError(setter, fn if isinstance(fn, str) else type(fn).__name__,
                          f"got {what}, not a function; pass {usage}", kind="parameter")
    if _framework_object(fn):  # a network, loss or optimizer itself: callable, but not what makes one
        raise ConfigError(setter, type(fn).__name__, f"got {what}: the object itself, where a function that makes "
                                                     f"one is wanted; pass {usage}", kind="parameter")
    try:
        inspect.signature(fn).bind(*([None] * arity))
    except TypeError:
        raise ConfigError(setter, _qualname(fn) or type(fn).__name__,
                          f"it cannot be called as the trainer calls it ({arity} argument(s)); pass {usage}"
                          + (f" (got {what}: the object itself, where a function that makes one is wanted)"
                             if not inspect.isfunction(fn) and not inspect.ismethod(fn) else ""),
                          kind="parameter") from None
    except ValueError:  # a builtin without a signature: called as it is
        pass
    return fn


def _framework_object(fn: Any) -> bool:
    """Whether ``fn`` is an instance of a torch module or a Keras layer, model, loss or optimizer (checked
    through the frameworks already imported: none is imported for it)."""
    import inspect
    import sys

    if inspect.isclass(fn):
        return False
    bases = []
    torch = sys.modules.get("torch")
    if torch is not None:
        bases.append(torch.nn.Module)
    keras = sys.modules.get("keras")
    if keras is not None:
        bases += [keras.layers.Layer, keras.losses.Loss, keras.optimizers.Optimizer]
    return any(isinstance(fn, b) for b in bases)


def _qualname(fn: Optional[Callable]) -> Optional[str]:
    if fn is None:
        return None
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"


class TorchEstimator(_DistributedEstimator):
    """Train a PyTorch network data-parallel across Spark executors (DDP or Horovod).

    Examples
    --------
    >>> est = TorchEstimator(numWorkers=2, epochs=3, labelCol="label", store="work/store")  # doctest: +SKIP
    >>> model = est.fit("work/job/dataset")          # a materialized dataset   # doctest: +SKIP
    >>> model.transform(test_df).select("prediction", "probability").show(3)          # doctest: +SKIP

    In a Spark ML pipeline, on a ``VectorAssembler``'s output:

    >>> Pipeline(stages=[assembler, TorchEstimator(featuresCol="features")]).fit(df)  # doctest: +SKIP
    """

    _framework = "torch"
    _model_cls = TorchModel


class KerasEstimator(_DistributedEstimator):
    """Train a Keras 3 (TensorFlow) network across executors, gradients all-reduced by gloo.

    A custom training loop sums each step's gradients over the ranks with
    gloo (``backend='gloo'``, default) or runs under
    MultiWorkerMirroredStrategy (``backend='mwms'``; ``model.fit`` under MWMS
    fails with Keras 3, keras-team/keras#20585).  Horovod is refused: with
    Keras 3 its DistributedOptimizer silently does not average gradients.

    Examples
    --------
    >>> est = KerasEstimator(numWorkers=2, epochs=2, labelCol="label")  # doctest: +SKIP
    >>> model = est.fit("work/job/dataset")                          # doctest: +SKIP
    """

    _framework = "keras"
    _model_cls = KerasModel


attach_setters(_DistributedEstimator)


def _saved_checkpoints(store: str, run_id: str) -> Optional[int]:
    """How many checkpoints run ``run_id`` holds in ``store`` (``None`` when the store cannot say)."""
    from sparktrain.data.run_store import RunStore

    try:
        return len(RunStore(store, run_id).checkpoints())
    except Exception:  # noqa: BLE001 - a store that does not answer: the message stays the general one
        return None


class _EstimatorWriter(DefaultParamsWriter):
    """Spark ML's params writer, with the values masked and the dropped factories recorded."""

    def __init__(self, instance: _DistributedEstimator, dropped: Dict[str, Optional[str]]) -> None:
        super().__init__(instance)
        self.dropped = dropped

    def saveImpl(self, path: str) -> None:
        params = mask_strings({p.name: v for p, v in self.instance._paramMap.items()})
        extra = {"droppedFactories": self.dropped} if self.dropped else None
        DefaultParamsWriter.saveMetadata(self.instance, path, self.sparkSession, extraMetadata=extra,
                                         paramMap=params)


class _EstimatorReader(DefaultParamsReader):
    """Spark ML's params reader; keeps the record of the factories the save dropped."""

    def load(self, path: str) -> Any:
        from sparktrain.data import _fs
        from sparktrain.train.model import read_metadata

        instance = super().load(path)
        try:  # through Spark, where the save wrote it (HDFS as the default filesystem, dbfs:, s3a: credentials)
            meta = DefaultParamsReader.loadMetadata(path, self.sparkSession)
        except Exception:  # noqa: BLE001 - a Spark line whose reader takes a SparkContext only: pyarrow reads it
            meta = read_metadata(*_fs.resolve(path)) or {}
        instance._unrestored = {k: str(v) for k, v in (meta.get("droppedFactories") or {}).items()}
        return instance


def _warn_one_step(train_path: str, spec: WorkerSpec) -> None:
    """Warn when one optimizer step (accumulateSteps x batchSize x numWorkers rows) holds more rows than the
    training split: every epoch is then a single step of all its rows, which is rarely what was meant."""
    from sparktrain.data.manifest import read_manifest

    optim = spec.optim
    if optim.accumulate_steps <= 1:
        return
    try:
        rows = int((read_manifest(train_path) or {}).get("num_rows") or 0)
    except Exception:  # noqa: BLE001 - advice only: a manifest that cannot be read says nothing
        return
    step = optim.accumulate_steps * optim.batch_size * spec.num_workers
    if rows and step > rows:
        log.warning("one optimizer step is accumulateSteps %d x batchSize %d x numWorkers %d = %s rows, more than "
                    "the training split's %s: each epoch is a single optimizer step over all its rows. Lower "
                    "accumulateSteps (train.accumulate_steps) or batchSize for more steps per epoch",
                    optim.accumulate_steps, optim.batch_size, spec.num_workers, f"{step:,}", f"{rows:,}")
