"""One MLflow model holding the fitted feature transforms and the network.

The pyfunc model (:class:`SparktrainModel`) takes **raw** rows: its signature
lists the columns the features read, with their raw types, and
``predict(pandas_df)`` applies :func:`sparktrain.serve.local.transform_local`
(numpy/pyarrow from the fitted statistics in ``features.json``), then the
network, through the same predictor the Spark Transformer uses.  The model's
artifacts:

``network/model.bin``   the serialized network (``_DistributedModel.model_bytes``)
``network/spec.json``   framework, :class:`InputSpec`, history
``features/features.json``  the fitted transforms
``pipeline_model/``     the fitted Spark ``PipelineModel`` (for Spark-side scoring,
                        :func:`load_spark_model`)

The ``sparktrain`` package travels with the model (``code_paths``), so
``mlflow models serve --env-manager local`` and ``spark_udf`` need nothing
but the pinned dependencies.

Signature types: a numeric feature's column is ``double`` (pass floats; NaN or
null is missing), a categorical or crossed column keeps its raw type
(``string``, ``long``, ``boolean``, ``double``), a datetime column is
``datetime`` (naive values are read in ``features.json``'s ``timezone``), a
vector column ``array(double)``, a text column ``string`` and a set column
``array(string)`` (or ``string`` with a delimiter).  A model with a vector,
text or set feature, or a datetime ``format``, is scored by its Spark pipeline
(``sparktrain score``, :func:`load_spark_model`); its pyfunc ``predict``
refuses the rows with an error that says so.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import warnings
from typing import Any, Dict, List, Optional, Tuple

import pandas as pd
import pyarrow.fs as pafs
from mlflow.pyfunc import PythonModel

from sparktrain.data import _fs

log = logging.getLogger(__name__)

NETWORK = "network"
FEATURES = "features"
PIPELINE = "pipeline_model"

_SPARK_TO_MLFLOW = {"string": "string", "boolean": "boolean", "tinyint": "long", "smallint": "long",
                    "int": "long", "bigint": "long", "float": "double", "double": "double",
                    "timestamp": "datetime", "timestamp_ntz": "datetime", "date": "datetime"}
#: MLflow column type -> the Spark type :func:`sparktrain.serve.scoring.score_path` casts to.
MLFLOW_TO_SPARK = {"string": "string", "boolean": "boolean", "long": "bigint", "integer": "int",
                   "double": "double", "float": "float", "datetime": "timestamp", "binary": "binary"}


def raw_columns(meta: Dict[str, Any]) -> List[Tuple[str, str]]:
    """``[(raw column, MLflow type)]`` the features read, in first-use order (see the module docstring)."""
    out: Dict[str, str] = {}

    def add(col: str, spark_type: Optional[str], kind: str) -> None:
        if kind == "vector":
            t = "array<double>"
        elif kind == "set" and str(spark_type or "").startswith("array"):
            t = "array<string>"
        elif kind == "numeric":
            t = "double"
        elif kind == "datetime":
            t = "datetime"
        elif kind == "boolean":
            t = "boolean"
        else:
            t = _SPARK_TO_MLFLOW.get(str(spark_type or "string").lower(), "string")
            if str(spark_type or "").startswith("decimal"):
                t = "double"
        if col not in out or (kind in ("categorical", "crossed") and out[col] == "double"):
            out[col] = t

    for f in meta["features"]:
        if f["type"] == "crossed":
            for col, st in zip(f["columns"], f.get("source_dtypes") or [None] * len(f["columns"])):
                add(col, st, "crossed")
        else:
            add(f["source"], f.get("source_dtype"), f["type"])
    return list(out.items())


def output_columns(task: str, prediction_type: str = "double") -> List[Tuple[str, str]]:
    """``[(column, Spark SQL type)]`` that ``predict`` returns for ``task``.

    ``prediction_type`` is ``string`` for a string label (the class names), else ``double``.
    """
    if task == "binary":
        return [("prediction", prediction_type), ("probability", "double")]
    if task == "multiclass":
        return [("prediction", prediction_type), ("probability", "array<double>")]
    return [("prediction", "double")]


def model_signature(meta: Dict[str, Any], inputs: Any):
    """The :class:`~mlflow.models.ModelSignature` on the raw input columns."""
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, DataType, Schema
    from mlflow.types.schema import Array

    def col_type(t: str) -> Any:
        if t.startswith("array<"):
            return Array(DataType[t[len("array<"):-1]])
        return DataType[t]

    cols: List[Any] = [ColSpec(col_type(t), name) for name, t in raw_columns(meta)]
    outs: List[Any] = [ColSpec(Array(DataType.double) if t.startswith("array") else DataType[t], n)
                       for n, t in output_columns(inputs.task, inputs.prediction_type)]
    return ModelSignature(inputs=Schema(cols), outputs=Schema(outs))


def predict_frame(df: Any, meta: Dict[str, Any], framework: str, model_bytes: bytes, inputs: Any):
    """Raw pandas rows -> ``prediction`` (and ``probability``) as a pandas DataFrame."""
    import pandas as pd

    from sparktrain.serve.local import transform_local
    from sparktrain.train.worker import predict_arrays, to_outputs

    if not isinstance(df, pd.DataFrame):
        df = pd.DataFrame(df)
    tz = meta.get("timezone") or "UTC"
    if tz != "UTC":  # naive timestamps mean wall time in the training session's time zone, as in Spark
        df = df.copy()
        for col in df.columns:
            if pd.api.types.is_datetime64_dtype(df[col]) and getattr(df[col].dt, "tz", None) is None:
                df[col] = df[col].dt.tz_localize(tz, ambiguous="NaT", nonexistent="NaT")
    arrays = transform_local(df, meta)
    out = to_outputs(predict_arrays(framework, model_bytes, inputs, arrays), inputs)
    frame = pd.DataFrame({"prediction": out["prediction"]}, index=df.index)  # one row out per row in, same labels
    if inputs.task == "binary":
        frame["probability"] = out["probability"]
    elif inputs.task == "multiclass":
        frame["probability"] = list(out["probability"])  # type: ignore[call-overload]
    return frame


class SparktrainModel(PythonModel):
    """MLflow pyfunc: raw rows in, ``prediction``/``probability`` out (see the module docstring)."""

    def load_context(self, context: Any) -> None:
        from sparktrain.train.worker import InputSpec

        net = context.artifacts[NETWORK]
        with open(os.path.join(net, "model.bin"), "rb") as fh:
            self.model_bytes = fh.read()
        with open(os.path.join(net, "spec.json")) as fh:
            spec = json.load(fh)
        self.framework = spec["framework"]
        self.inputs = InputSpec.from_dict(spec["inputs"])
        with open(os.path.join(context.artifacts[FEATURES], "features.json")) as fh:
            self.meta = json.load(fh)

    # pd.DataFrame is a hint MLflow infers no schema from: the logged signature stays in charge.
    def predict(self, context: Any, model_input: pd.DataFrame,
                params: Optional[Dict[str, Any]] = None) -> pd.DataFrame:
        """Raw pandas rows -> ``prediction`` (and ``probability``)."""
        return predict_frame(model_input, self.meta, self.framework, self.model_bytes, self.inputs)


def write_bundle(model: Any, dataset_root: str, folder: str) -> Dict[str, str]:
    """Write the model's artifacts under ``folder``; returns the pyfunc ``artifacts`` mapping.

    ``dataset_root`` may be a committed output: its generation's ``features.json`` and pipeline are used.
    """
    from sparktrain.data.commit import resolve

    dataset_root = resolve(dataset_root)
    net = os.path.join(folder, NETWORK)
    os.makedirs(net)
    with open(os.path.join(net, "model.bin"), "wb") as fh:
        fh.write(model.model_bytes)
    with open(os.path.join(net, "spec.json"), "w") as fh:
        json.dump({"framework": model.framework, "inputs": model.inputs.to_dict(), "history": model.history,
                   "label": model.getLabelCol()}, fh, indent=1)
    feats = os.path.join(folder, FEATURES)
    os.makedirs(feats)
    with open(os.path.join(feats, "features.json"), "wb") as fh:  # the dataset may be a URI (s3://...)
        fh.write(_fs.read_bytes(_fs.join(dataset_root, "features.json"), "features.json"))
    artifacts = {NETWORK: net, FEATURES: feats}
    pipeline = _fs.join(dataset_root, PIPELINE)
    if _fs.kind(pipeline) == pafs.FileType.Directory:
        _fs.copy_to_local(pipeline, os.path.join(folder, PIPELINE))
        artifacts[PIPELINE] = os.path.join(folder, PIPELINE)
    else:
        log.warning("no fitted pipeline at %s: the model will score with features.json only", pipeline)
    return artifacts


def _package_copy(folder: str) -> str:
    """A clean copy of the ``sparktrain`` package (no caches, no listener jars) to ship as ``code_paths``.

    Also when the package is imported from a zip: a wheel passed with ``spark-submit --py-files``.
    """
    import sparktrain

    src = os.path.dirname(os.path.abspath(sparktrain.__file__))
    dst = os.path.join(folder, "sparktrain")
    if os.path.isdir(src):
        shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "jars"))
        return dst
    import zipfile

    archive = src
    while archive and not os.path.isfile(archive):
        archive = os.path.dirname(archive)
    inner = os.path.relpath(src, archive).replace(os.sep, "/") + "/"
    with zipfile.ZipFile(archive) as zf:
        for name in zf.namelist():
            rel = name[len(inner):]
            if name.startswith(inner) and rel and not name.endswith("/") and \
                    not rel.startswith("jars/") and "__pycache__" not in rel and not rel.endswith(".pyc"):
                target = os.path.join(dst, *rel.split("/"))
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with zf.open(name) as f_in, open(target, "wb") as f_out:
                    shutil.copyfileobj(f_in, f_out)
    return dst


def pip_requirements(framework: str) -> List[str]:
    """Pinned requirements for serving (the versions installed now)."""
    from sparktrain.track.params import framework_versions

    v = framework_versions()
    names = ["mlflow", "pyarrow", "pandas", "numpy"] + (["torch"] if framework == "torch" else ["tensorflow"])
    out = []
    for n in names:
        if n in v:
            out.append(f"{'tensorflow-cpu' if n == 'tensorflow' else n}=={v[n]}")
    return out


def log_pyfunc_model(model: Any, dataset_root: str, run_id: str, input_example: Any = None,
                     name: str = "model", metadata: Optional[Dict[str, Any]] = None,
                     params: Optional[Dict[str, Any]] = None, client: Any = None):
    """Log the pyfunc model to run ``run_id`` (in that run's experiment); returns MLflow's ``ModelInfo``.

    The model is logged "from code" (:mod:`sparktrain.serve._model_code`), not
    pickled, with the ``sparktrain`` package as ``code_paths``.
    """
    import mlflow
    from mlflow.models import Model

    client = client or mlflow.MlflowClient()
    experiment_id = client.get_run(run_id).info.experiment_id
    # Created first so the model lands in the run's experiment, not the process's active one.
    logged = mlflow.initialize_logged_model(name=name, source_run_id=run_id, experiment_id=experiment_id,
                                            params={k: str(v) for k, v in (params or {}).items()},
                                            tags={"sparktrain.framework": model.framework})
    from sparktrain.data.commit import resolve

    meta = json.loads(_fs.read_bytes(_fs.join(resolve(dataset_root), "features.json"), "features.json"))
    from sparktrain.serve.local import needs_spark

    if input_example is not None and needs_spark(meta):
        # MLflow checks an input example by predicting it outside Spark, which such a model refuses ("Got error"
        # in every log): the signature alone records the raw columns
        log.info("logging the model without an input example: a feature of it is applied by Spark only")
        input_example = None
    entry = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_model_code.py")
    with tempfile.TemporaryDirectory(prefix="sparktrain-model-") as tmp:
        artifacts = write_bundle(model, dataset_root, os.path.join(tmp, "bundle"))
        code = _package_copy(os.path.join(tmp, "code"))
        if not os.path.isfile(entry):  # the package is a zip (spark-submit --py-files): the copy's file
            entry = os.path.join(code, "serve", "_model_code.py")
        with warnings.catch_warnings():  # sparktrain says itself why there is no example: not MLflow's colours too
            if input_example is None:
                warnings.filterwarnings("ignore", message=".*input example was not provided", category=UserWarning)
            return Model.log(artifact_path=None, name=name, flavor=mlflow.pyfunc, run_id=run_id,
                             model_id=logged.model_id, python_model=entry, artifacts=artifacts,
                             code_paths=[code], signature=model_signature(meta, model.inputs),
                             input_example=input_example, pip_requirements=pip_requirements(model.framework),
                             metadata={"sparktrain": {"framework": model.framework, "task": model.inputs.task,
                                                      "label": model.getLabelCol(), **(metadata or {})}})


def load_spark_model(model_uri: str, dst_path: Optional[str] = None, tracking_uri: Optional[str] = None):
    """The model at ``model_uri`` as a Spark ``PipelineModel``: fitted feature stages + the network.

    ``transform`` takes raw rows and returns every input column with its raw
    value and type (ids, the label, anything else) followed by the network's
    outputs (``prediction``, and ``probability``/``rawPrediction`` for a
    classifier), entirely in Spark (the JVM runs the feature stages).  It is a
    plain ``PipelineModel`` (:func:`sparktrain.serve.spark_model.raw_scoring_model`),
    usable as a stage of a larger ``Pipeline``; ``save`` then
    ``PipelineModel.load`` gives it back with the same behaviour.

    Parameters
    ----------
    model_uri : str
        ``models:/NAME@champion``, ``models:/NAME/3``, ``models:/NAME`` (its latest version), ``runs:/...`` or
        a path; checked as :func:`sparktrain.track.lookup.resolve_model` checks it.
    dst_path : str, optional
        Where to download the model (default: a temporary folder).
    tracking_uri : str, optional
        The MLflow store, as :func:`sparktrain.track.lookup.use_store` chooses it (by default MLflow's
        process-wide URI when set, else the one ``sparktrain score`` reads, ``sqlite:///work/mlflow.db``).

    Returns
    -------
    PipelineModel
        Its ``transform`` raises :class:`~sparktrain.errors.MissingColumnError`
        for a frame that lacks a column the model reads,
        :class:`~sparktrain.errors.DuplicateColumnError` for two columns of one
        name, :class:`~sparktrain.errors.ColumnClashError` for one that already
        has a column the model adds (a scored frame), and
        :class:`~sparktrain.errors.SchemaError` for a number where the model
        read text, before any Spark job; it reads each input as the model was
        trained on it (:func:`sparktrain.serve.spark_model.read_as`).
    """
    from mlflow.artifacts import download_artifacts

    from sparktrain.track.lookup import resolve_model, use_store

    local = download_artifacts(artifact_uri=resolve_model(model_uri, use_store(model_uri, tracking_uri)),
                               dst_path=dst_path)
    return spark_model_from(local, model_uri)


def spark_model_from(local: str, model_uri: str = ""):
    """:func:`load_spark_model` of a model already downloaded to the folder ``local``."""
    from pyspark.ml import PipelineModel

    from sparktrain.serve.spark_model import raw_scoring_model
    from sparktrain.train.worker import InputSpec
    from sparktrain.train.model import KerasModel, TorchModel

    root = os.path.join(local, "artifacts")
    pipeline = os.path.join(root, PIPELINE)
    if not os.path.isdir(pipeline):
        from sparktrain.errors import TrackingError
        raise TrackingError(f"model {model_uri or local} has no fitted Spark pipeline ({PIPELINE}/); "
                            f"score it with mlflow.pyfunc.spark_udf instead")
    with open(os.path.join(root, NETWORK, "spec.json")) as fh:
        spec = json.load(fh)
    with open(os.path.join(root, NETWORK, "model.bin"), "rb") as fh:
        model_bytes = fh.read()
    cls = TorchModel if spec["framework"] == "torch" else KerasModel
    net = cls(framework=spec["framework"], model_bytes=model_bytes, inputs=InputSpec.from_dict(spec["inputs"]),
              history=spec.get("history", []))
    net._set(labelCol=spec.get("label", "label"))
    with open(os.path.join(root, FEATURES, "features.json")) as fh:
        columns = raw_columns(json.load(fh))
    return raw_scoring_model(PipelineModel.load(pipeline), net, [c for c, _ in columns], model_uri,
                             types={c: spark_type(t) for c, t in columns})


def spark_type(mlflow_type: str) -> str:
    """The Spark SQL type of a signature's MLflow type string (``long`` -> ``bigint``, ``array(double)``...)."""
    t = mlflow_type.lower().replace("<", "(").replace(">", ")")
    if t.startswith("array"):
        inner = t[t.index("(") + 1:t.rindex(")")] if "(" in t else "double"
        return f"array<{MLFLOW_TO_SPARK.get(inner, inner)}>"
    return MLFLOW_TO_SPARK.get(t, "string")
