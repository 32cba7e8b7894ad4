"""Load a trained network once per Python worker and score numpy batches with it.

Shared by the Spark Transformer (``mapInArrow``) and the MLflow pyfunc model,
so the two paths run the same code.  Imports nothing from the driver side.
"""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
import threading
from typing import Callable, Dict, Optional

import numpy as np

from sparktrain.train._executor.spec import InputSpec, ModelSpec

Predictor = Callable[[np.ndarray, np.ndarray], np.ndarray]
_CACHE: Dict[str, Predictor] = {}  # network digest -> its logits function
_LOCK = threading.Lock()


def to_outputs(out: np.ndarray, inputs: InputSpec, decode: bool = True,
               raw: Optional[np.ndarray] = None) -> Dict[str, object]:
    """Network output -> ``{"prediction": ..., "probability": ...}`` columns as numpy arrays.

    Binary: ``probability`` is the probability of class index 1; multiclass: one
    probability per class index (rows of a 2-D array).  With ``decode`` and a
    label vocabulary (``inputs.classes``), ``prediction`` holds the original
    label value of the predicted class (a string, or the number as a double);
    otherwise the class index as a double.  Regression: the value.  With
    ``raw`` (the network's logits, :func:`get_predictor` with ``raw=True``) a
    classifier also gets ``rawPrediction``: the logit of class 1 (binary, a
    margin as Spark's ``BinaryClassificationEvaluator`` reads it) or one logit
    per class (multiclass).
    """
    if inputs.task == "regression":
        return {"prediction": np.asarray(out, dtype=np.float64).reshape(-1)}
    if inputs.task == "binary":
        prob = np.asarray(out, dtype=np.float64).reshape(-1)
        idx = (prob > 0.5).astype(np.int64)
    else:
        prob = np.asarray(out, dtype=np.float64)
        idx = np.argmax(prob, axis=1)
    if decode and inputs.classes:
        values = np.asarray(inputs.classes, dtype=object)[idx]
        pred = values.astype(str) if inputs.prediction_type == "string" else values.astype(np.float64)
    else:
        pred = idx.astype(np.float64)
    result: Dict[str, object] = {"prediction": pred, "probability": prob}
    if raw is not None:
        margins = np.asarray(raw, dtype=np.float64)
        result["rawPrediction"] = margins.reshape(-1) if inputs.task == "binary" else margins
    return result


def digest(model_bytes: bytes) -> str:
    return hashlib.sha256(model_bytes).hexdigest()


def get_predictor(framework: str, model_bytes: bytes, inputs: InputSpec, key: str = "",
                  raw: bool = False) -> Predictor:
    """A cached predictor: the network is loaded at most once per process for the same model bytes.

    It returns probabilities (binary: of class 1; multiclass: per class) or
    values; with ``raw``, the network's logits (``[B, 1]`` or ``[B, K]``, float64).
    """
    key = key or digest(model_bytes)
    with _LOCK:
        logits = _CACHE.get(key)
        if logits is None:
            logits = _load(framework, model_bytes, inputs)
            _CACHE[key] = logits
    if raw:
        return logits
    from sparktrain.train._executor.keras_model import to_prediction_np

    def predict(x_num: np.ndarray, x_cat: np.ndarray) -> np.ndarray:
        return to_prediction_np(logits(x_num, x_cat), inputs.task)

    return predict


def _load(framework: str, model_bytes: bytes, inputs: InputSpec) -> Predictor:
    if framework == "torch":
        return _load_torch(model_bytes, inputs)
    return _load_keras(model_bytes, inputs)


def _load_torch(model_bytes: bytes, inputs: InputSpec) -> Predictor:
    import torch

    from sparktrain.train._executor.torch_worker import make_model

    # tensors, numbers, strings and bytes only; a custom model factory (cloudpickled bytes) is the one part that
    # unpickles code: see docs/security.md
    blob = torch.load(io.BytesIO(model_bytes), map_location="cpu", weights_only=True)
    model = make_model(InputSpec.from_dict(blob["inputs"]), ModelSpec.from_dict(blob["model"]), blob["factory"])
    model.load_state_dict(blob["state_dict"])
    model.eval()

    def predict(x_num: np.ndarray, x_cat: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            logits = model(torch.from_numpy(x_num), torch.from_numpy(x_cat))
            return logits.detach().float().numpy().astype(np.float64)

    return predict


def _load_keras(model_bytes: bytes, inputs: InputSpec) -> Predictor:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras

    from sparktrain.train._executor.keras_model import split_inputs, token_bag_layer

    token_bag_layer()  # registered before load_model reads a network with bags
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.keras")
        with open(path, "wb") as fh:
            fh.write(model_bytes)
        model = keras.models.load_model(path, compile=False)

    def predict(x_num: np.ndarray, x_cat: np.ndarray) -> np.ndarray:
        out = model(split_inputs(x_num, x_cat, inputs), training=False)
        return np.asarray(out, dtype=np.float64)

    return predict
