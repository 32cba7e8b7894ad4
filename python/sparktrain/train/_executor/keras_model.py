"""The default Keras network and the input/output conventions shared with scoring."""

from __future__ import annotations

from typing import List

import numpy as np

from sparktrain.train._executor.spec import InputSpec, ModelSpec


def split_inputs(x_num: np.ndarray, x_cat: np.ndarray) -> List[np.ndarray]:
    """Model inputs as a list: numerics ``[B, n]`` then one ``[B, 1]`` index per categorical."""
    return [x_num, *(x_cat[:, i:i + 1] for i in range(x_cat.shape[1]))]


def to_prediction_np(logits: np.ndarray, task: str) -> np.ndarray:
    if task == "binary":
        return (1.0 / (1.0 + np.exp(-logits.reshape(-1).astype(np.float64))))
    if task == "multiclass":
        z = logits.astype(np.float64)
        z = np.exp(z - z.max(axis=1, keepdims=True))
        return z / z.sum(axis=1, keepdims=True)
    return logits.reshape(-1).astype(np.float64)


def build_default_model(inputs: InputSpec, model: ModelSpec):
    """Embeddings for categorical indices + numerics (and float blocks) -> MLP -> logits (functional API)."""
    import keras

    num_in = keras.Input(shape=(inputs.numeric_width,), dtype="float32", name="numeric")
    parts = [num_in]
    cat_ins = []
    for col, card in inputs.categorical:
        inp = keras.Input(shape=(1,), dtype="int64", name=f"cat_{col}")
        cat_ins.append(inp)
        emb = keras.layers.Embedding(card, min(model.embedding_dim, card), name=f"emb_{col}")(inp)
        parts.append(keras.layers.Flatten()(emb))
    x = keras.layers.Concatenate()(parts) if len(parts) > 1 else num_in
    for i, units in enumerate(model.hidden_units):
        x = keras.layers.Dense(units, activation="relu", name=f"dense_{i}")(x)
        if model.dropout > 0:
            x = keras.layers.Dropout(model.dropout)(x)
    out = inputs.num_classes if inputs.task == "multiclass" else 1
    logits = keras.layers.Dense(out, name="logits", dtype="float32")(x)  # float32 under mixed precision
    return keras.Model(inputs=[num_in, *cat_ins], outputs=logits, name="sparktrain_tabular")


def make_loss(task: str):
    import keras
    if task == "binary":
        return keras.losses.BinaryCrossentropy(from_logits=True, reduction="none")
    if task == "multiclass":
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    return keras.losses.MeanSquaredError(reduction="none")
