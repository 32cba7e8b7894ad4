"""The default Keras network and the input/output conventions shared with scoring."""

from __future__ import annotations

from typing import Any, List, Optional

import numpy as np

from sparktrain.train._executor.spec import InputSpec, ModelSpec, bag_dim

_TOKEN_BAG: Any = None


def split_inputs(x_num: Any, x_cat: Any, inputs: Optional[InputSpec] = None) -> List[Any]:
    """Model inputs as a list: numerics ``[B, n]``, one ``[B, 1]`` index per categorical, then one ``[B, length]``
    block of ids per bag (``inputs.bags``; without ``inputs`` every integer column is a categorical)."""
    n_cat = len(inputs.categorical) if inputs is not None else x_cat.shape[1]
    out = [x_num, *(x_cat[:, i:i + 1] for i in range(n_cat))]
    start = n_cat
    for _, length, _, _ in (inputs.bags if inputs is not None else ()):
        out.append(x_cat[:, start:start + length])
        start += length
    return out


def token_bag_layer() -> Any:
    """The ``TokenBag`` Keras layer class (registered for ``keras.models.load_model``; built once per process).

    ``TokenBag(rows, dim, mode)`` embeds ``[B, L]`` ids and pools them over
    ``L`` with id 0 (padding) masked out: the ``mean`` (an
    ``Embedding(mask_zero=True)`` + masked ``GlobalAveragePooling1D``, except
    that a row of padding only gives zeros, not NaN) or the ``sum``, like
    torch's ``nn.EmbeddingBag(padding_idx=0)``.
    """
    global _TOKEN_BAG
    if _TOKEN_BAG is not None:
        return _TOKEN_BAG
    import keras
    from keras import ops

    @keras.saving.register_keras_serializable(package="sparktrain")
    class TokenBag(keras.layers.Layer):
        def __init__(self, rows: int, dim: int, mode: str = "mean", **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.rows, self.dim, self.mode = int(rows), int(dim), str(mode)

        def build(self, input_shape: Any) -> None:
            self.table = self.add_weight(name="embeddings", shape=(self.rows, self.dim),
                                         initializer=keras.initializers.RandomUniform(-0.05, 0.05))

        def call(self, ids: Any) -> Any:
            ids = ops.cast(ids, "int32")
            emb = ops.take(ops.cast(self.table, self.compute_dtype), ids, axis=0)
            mask = ops.expand_dims(ops.cast(ops.not_equal(ids, 0), emb.dtype), -1)
            total = ops.sum(emb * mask, axis=1)
            if self.mode == "mean":
                total = total / ops.maximum(ops.sum(mask, axis=1), ops.cast(1, emb.dtype))
            return total

        def get_config(self) -> dict:
            return {**super().get_config(), "rows": self.rows, "dim": self.dim, "mode": self.mode}

    _TOKEN_BAG = TokenBag
    return TokenBag


def to_prediction_np(logits: np.ndarray, task: str) -> np.ndarray:
    if task == "binary":
        return (1.0 / (1.0 + np.exp(-logits.reshape(-1).astype(np.float64))))
    if task == "multiclass":
        z = logits.astype(np.float64)
        z = np.exp(z - z.max(axis=1, keepdims=True))
        return z / z.sum(axis=1, keepdims=True)
    return logits.reshape(-1).astype(np.float64)


def build_default_model(inputs: InputSpec, model: ModelSpec):
    """Embeddings for categorical indices, pooled bags of ids (:func:`token_bag_layer`), numerics (and float
    blocks) -> MLP -> logits (functional API)."""
    import keras

    num_in = keras.Input(shape=(inputs.numeric_width,), dtype="float32", name="numeric")
    parts = [num_in]
    cat_ins = []
    for col, card in inputs.categorical:
        inp = keras.Input(shape=(1,), dtype="int64", name=f"cat_{col}")
        cat_ins.append(inp)
        emb = keras.layers.Embedding(card, min(model.embedding_dim, card), name=f"emb_{col}")(inp)
        parts.append(keras.layers.Flatten()(emb))
    bag_ins = []
    for col, length, rows, mode in inputs.bags:
        inp = keras.Input(shape=(length,), dtype="int64", name=f"bag_{col}")
        bag_ins.append(inp)
        parts.append(token_bag_layer()(rows, bag_dim(model, rows), mode, name=f"bag_emb_{col}")(inp))
    x = keras.layers.Concatenate()(parts) if len(parts) > 1 else num_in
    for i, units in enumerate(model.hidden_units):
        x = keras.layers.Dense(units, activation="relu", name=f"dense_{i}")(x)
        if model.dropout > 0:
            x = keras.layers.Dropout(model.dropout)(x)
    out = inputs.num_classes if inputs.task == "multiclass" else 1
    logits = keras.layers.Dense(out, name="logits", dtype="float32")(x)  # float32 under mixed precision
    return keras.Model(inputs=[num_in, *cat_ins, *bag_ins], outputs=logits, name="sparktrain_tabular")


def make_loss(task: str):
    import keras
    if task == "binary":
        return keras.losses.BinaryCrossentropy(from_logits=True, reduction="none")
    if task == "multiclass":
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    return keras.losses.MeanSquaredError(reduction="none")
