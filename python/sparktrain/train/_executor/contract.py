"""What a user's model and loss factories must give, checked on a two-row batch before training.

Keras: the training loop feeds a network the list :func:`~sparktrain.train._executor.keras_model.split_inputs`
makes (the numeric block ``[B, numeric_width]``, one ``[B, 1]`` index per categorical, one ``[B, length]``
block of ids per text or set feature), calls the loss as Keras does, ``loss(y_true, y_pred)``, and exports
the network with ``model.save`` for scoring, which loads it back in safe mode.  Torch: ``net(x_num, x_cat)``
and ``loss(outputs, labels)``.  Both take the output as **logits** (``[B, 1]``; ``[B, num_classes]`` for
multiclass).  A factory that breaks one of these used to train to a wrong model without a word (a final
sigmoid applied twice, a swapped loss, the categoricals silently dropped) or to fail only at scoring;
:func:`check_factories` says which rule, with the fix.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
from typing import Any, Callable, List

import numpy as np

from sparktrain._internal.spark_compat import error_summary
from sparktrain.errors import ConfigError
from sparktrain.train._executor.spec import InputSpec

log = logging.getLogger(__name__)

MODEL = "setModelFactory"
LOSS = "setLossFactory"


def _first_line(exc: BaseException, limit: int = 300) -> str:
    """``TypeName: first line`` of ``exc``, masked (a bare ``assert`` has no message)."""
    from sparktrain._internal.secrets import mask_value

    return mask_value(error_summary(exc, limit, typed=True))


def describe_inputs(inputs: InputSpec) -> str:
    """The list a network is called with, in words."""
    parts = [f"numeric [B, {inputs.numeric_width}] (float32: {', '.join(inputs.numeric) or 'no columns'}"
             + (f"; blocks {', '.join(c for c, _ in inputs.vectors)}" if inputs.vectors else "") + ")"]
    parts += [f"'{c}' [B, 1] (int64 index < {card})" for c, card in inputs.categorical]
    parts += [f"'{c}' [B, {length}] (int64 ids < {rows})" for c, length, rows, _ in inputs.bags]
    return f"a list of {len(parts)}: " + ", ".join(parts)


def sample_batch(inputs: InputSpec) -> List[Any]:
    """Two rows of the list a network is called with (zeros: index 0 is valid for every categorical)."""
    from sparktrain.train._executor.keras_model import split_inputs

    return split_inputs(np.zeros((2, inputs.numeric_width), np.float32), np.zeros((2, inputs.cat_width), np.int64),
                        inputs)


def check_model(model: Any, inputs: InputSpec) -> None:
    """Raise :class:`ConfigError` naming ``setModelFactory`` unless ``model`` takes the input list, returns
    logits of the task's width and ends without a sigmoid/softmax.  Builds an unbuilt model (a
    ``keras.Sequential`` without ``keras.Input``) on the way, as its first call would."""
    name = getattr(model, "name", type(model).__name__)
    want = inputs.num_classes if inputs.task == "multiclass" else 1
    if not callable(model) or not hasattr(model, "trainable_variables"):
        raise ConfigError(MODEL, type(model).__name__, f"the model factory returned a {type(model).__name__}, not "
                                                       f"a Keras model; return a keras.Model that takes "
                                                       f"{describe_inputs(inputs)} and returns logits [B, {want}]")
    import keras

    batch = sample_batch(inputs)
    if isinstance(model, keras.Sequential) and not model.built:  # no keras.Input: Keras builds it on a tensor
        if len(batch) > 1:
            raise ConfigError(MODEL, name, f"the network is a keras.Sequential, which takes one input, but training "
                                           f"gives it {describe_inputs(inputs)}; Keras would silently use the first "
                                           f"only and drop the rest. Use the functional API with one keras.Input "
                                           f"per part, in that order")
        model.build((None, inputs.numeric_width))
    try:
        out = model(batch, training=False)
    except Exception as exc:  # noqa: BLE001 - the user's network: its own error, with what it is given
        raise ConfigError(MODEL, name, f"the network could not be called on what training gives it, "
                                       f"{describe_inputs(inputs)} ({_first_line(exc)}). Give it one keras.Input "
                                       f"per part, in that order") from None
    declared = _declared_inputs(model)
    parts = len(batch)
    if declared is not None and declared != parts:
        raise ConfigError(MODEL, name, f"the network declares {declared} input(s), but training gives it "
                                       f"{describe_inputs(inputs)}; Keras would silently use the first only and "
                                       f"drop the rest. Give it one keras.Input per part, in that order")
    shape = tuple(int(d) if d is not None else -1 for d in getattr(out, "shape", ()))
    if shape != (2, want):
        raise ConfigError(MODEL, name, f"the network returns shape {list(shape)} for 2 rows, but a {inputs.task} "
                                       f"model's output is logits [B, {want}]"
                                       + (f" (one per class of {inputs.num_classes})" if want > 1 else ""))
    last = _last_activation(model)  # "" for a subclassed model: its last assigned layer need not be its output
    if inputs.task in ("binary", "multiclass") and last in ("sigmoid", "softmax"):
        raise ConfigError(MODEL, name, f"the network ends in a {last} activation, but training and scoring take "
                                       f"its output as logits (the loss uses from_logits=True, and scoring applies "
                                       f"the {'sigmoid' if inputs.task == 'binary' else 'softmax'} itself), so the "
                                       f"probabilities would be squashed twice. Remove the final activation "
                                       f"(keras.layers.Dense({want}))")


def check_export(model: Any) -> None:
    """Raise :class:`ConfigError` naming ``setModelFactory`` unless the network survives what scoring does to
    it: ``model.save`` and ``keras.models.load_model`` in safe mode (a custom layer must be registered, a
    ``Lambda`` layer is refused)."""
    import keras

    from sparktrain.train._executor.keras_model import token_bag_layer

    token_bag_layer()
    with tempfile.TemporaryDirectory(prefix="sparktrain-keras-") as tmp:
        path = os.path.join(tmp, "model.keras")
        try:
            model.save(path)
            keras.models.load_model(path, compile=False)
        except Exception as exc:  # noqa: BLE001 - Keras' own reason, with the rule
            text = " ".join(str(exc).split())
            missing = re.search(r"Could not locate (?:class|function) '([^']+)'", text)
            reason = (f"custom class '{missing.group(1)}' is not registered with Keras" if missing else
                      "a Lambda layer's Python code is refused in safe mode" if "`Lambda` layer" in text else
                      _first_line(exc, 400))
            raise ConfigError(MODEL, getattr(model, "name", type(model).__name__),
                              f"the network cannot be saved and loaded back as scoring does "
                              f"(keras.models.load_model, safe mode): {reason}. Decorate each "
                              f"custom layer class with @keras.saving.register_keras_serializable() in a module "
                              f"that the executors and the scorer import (and give it get_config), and use a "
                              f"custom layer instead of keras.layers.Lambda") from None


def check_loss(per_example: Callable[[np.ndarray, np.ndarray], Any], inputs: InputSpec,
               framework: str = "keras", flat_logits: bool = False, log_probs: bool = False) -> None:
    """Raise :class:`ConfigError` naming ``setLossFactory`` unless the loss is finite, lower for right
    predictions than for wrong ones and, for classification, not negative (a loss written in the other
    framework's argument order gets its labels and logits swapped and trains to garbage).  ``per_example(y,
    logits)`` calls the loss as training does; ``flat_logits``: the network gives ``[B]``, not ``[B, 1]``;
    ``log_probs``: it ends in ``LogSoftmax`` (its loss takes log-probabilities, e.g. ``NLLLoss``)."""
    want = inputs.num_classes if inputs.task == "multiclass" else 1
    if inputs.task == "multiclass":
        y = np.array([0, 1], np.int64)
        right = np.full((2, want), -4.0, np.float32)
        right[0, 0] = right[1, 1] = 4.0
        wrong = right[::-1].copy()
    elif inputs.task == "binary":
        y = np.array([1.0, 0.0], np.float32)
        right, wrong = np.array([[4.0], [-4.0]], np.float32), np.array([[-4.0], [4.0]], np.float32)
    else:
        y = np.array([1.0, 0.0], np.float32)
        right, wrong = np.array([[1.0], [0.0]], np.float32), np.array([[0.0], [1.0]], np.float32)
    if log_probs and want > 1:
        right, wrong = (x - np.log(np.exp(x).sum(axis=1, keepdims=True)) for x in (right, wrong))
    if flat_logits and want == 1:
        right, wrong = right.reshape(2, 1)[:, 0], wrong.reshape(2, 1)[:, 0]  # type: ignore[assignment]
    call = "loss(y_true, y_pred)" if framework == "keras" else "loss(outputs, labels)"
    labels = [2, 1] if framework == "keras" and want == 1 else list(y.shape)  # Keras' y_true is [B, 1]
    try:
        good, bad = (float(np.sum(np.asarray(per_example(y, x), np.float64))) for x in (right, wrong))
    except Exception as exc:  # noqa: BLE001 - the user's loss: its own error, with how it is called
        raise ConfigError(LOSS, "the loss", f"calling the loss as training does, {call} with labels "
                                            f"{labels} ({y.dtype}) and logits {list(right.shape)}, failed: "
                                            f"{_first_line(exc)}. Make the factory return a loss taking {call[4:]}"
                                            + (" (torch: reshape the [B, 1] logits to the labels' [B], e.g. "
                                               "outputs.reshape(-1))" if framework == "torch" and want == 1
                                               and not flat_logits else "")) from None
    negative = inputs.task != "regression" and good < -1e-6  # a classification loss is never below 0
    if negative or not (np.isfinite(good) and np.isfinite(bad) and good < bad):
        other = "torch's is (outputs, labels)" if framework == "keras" else "Keras' is (y_true, y_pred)"
        broadcast = "; torch broadcasts [B, 1] against [B] to [B, B]" if framework == "torch" and want == 1 and \
            not flat_logits else ""
        raise ConfigError(LOSS, "the loss", f"the loss is {good:.4g} for right predictions and {bad:.4g} for wrong "
                                            f"ones on a {inputs.task} pair; it must be finite, lower for right "
                                            f"ones{' and not negative' if inputs.task != 'regression' else ''}. "
                                            f"Training calls it as {call}, with the network's logits: check the "
                                            f"argument order ({other}), that it takes logits, and the shapes "
                                            f"(logits {list(right.shape)}, labels {labels}{broadcast})")


def check_torch_model(net: Any, inputs: InputSpec, on_driver: bool = False) -> Any:  # (shape, final module)
    """Raise :class:`ConfigError` naming ``setModelFactory`` unless ``net(x_num, x_cat)`` runs on two rows,
    returns logits of the task's width (``[B]`` too, for one) and its output is not a sigmoid/softmax; returns
    the output's shape and the class name of the module that gave it ("" when none did), or None when the
    driver cannot run it (a forward that needs a GPU is the ranks' to check).

    The rows are on the network's device and dtype; it runs in eval mode, under its own RNG state, and is put
    back as it was (a BatchNorm's statistics and the seeded RNG are untouched).
    """
    import torch

    name = type(net).__name__
    want = inputs.num_classes if inputs.task == "multiclass" else 1
    given = (f"net(x_num [B, {inputs.numeric_width}] float32, x_cat [B, {inputs.cat_width}] int64: one index "
             f"column per categorical, then each text/set feature's ids)")
    if not isinstance(net, torch.nn.Module):
        raise ConfigError(MODEL, name, f"the model factory returned a {name}, not a torch.nn.Module; return one "
                                       f"called as {given}, returning logits [B, {want}]")
    param = next(net.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    dtype = param.dtype if param is not None and param.dtype.is_floating_point else torch.float32
    produced: List[Any] = []
    hooks = [m.register_forward_hook(lambda mod, _, out: produced.append((mod, out)))
             for m in net.modules() if not list(m.children())]
    was_training = net.training
    try:
        net.eval()
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            out = net(torch.zeros(2, inputs.numeric_width, dtype=dtype, device=device),
                      torch.zeros(2, inputs.cat_width, dtype=torch.int64, device=device))
    except Exception as exc:  # noqa: BLE001 - the user's network: its own error, with what it is given
        if on_driver and re.search(r"(?i)cuda|device|gpu", str(exc)):
            log.warning("%s: the network's forward needs a device this driver lacks (%s); its checks are left to "
                        "the executors", MODEL, _first_line(exc))
            return None
        raise ConfigError(MODEL, name, f"the network could not be called as training calls it, {given} "
                                       f"({_first_line(exc)})") from None
    finally:
        net.train(was_training)
        for hook in hooks:
            hook.remove()
    shape = tuple(getattr(out, "shape", ()))
    if shape != (2, want) and not (want == 1 and shape == (2,)):
        raise ConfigError(MODEL, name, f"the network returns {list(shape) if shape else type(out).__name__} for 2 "
                                       f"rows, but a {inputs.task} model's output is logits [B, {want}]")
    def gave(o: Any) -> bool:  # the output itself, or a view of it (a squeeze, a reshape)
        return o is out or (torch.is_tensor(o) and torch.is_tensor(out) and o.numel() == out.numel() and
                            o.numel() > 0 and o.data_ptr() == out.data_ptr())

    final = next((type(mod).__name__ for mod, o in reversed(produced) if gave(o)), "")  # what gave the output
    if inputs.task in ("binary", "multiclass") and final in ("Sigmoid", "Softmax"):
        raise ConfigError(MODEL, name, f"the network ends in {final}, but training and scoring take its output as "
                                       f"logits (the loss works on logits, and scoring applies the "
                                       f"{'sigmoid' if inputs.task == 'binary' else 'softmax'} itself), so the "
                                       f"probabilities would be squashed twice. Remove the final {final}")
    return shape, final


def torch_loss(loss: Any) -> Any:
    """The user's torch loss as the loop calls it: one value per row (``reduction="none"``) counts as their mean,
    like Keras' side takes a mean or per-row loss alike."""
    def mean_loss(outputs: Any, labels: Any) -> Any:
        out = loss(outputs, labels)
        return out.mean() if getattr(out, "ndim", 0) else out

    return mean_loss


def check_factories(inputs: Any, model_spec: Any, model_factory: Any, loss_factory: Any,
                    framework: str = "keras") -> None:
    """Build what the factories give on this process and check each rule (Keras: :func:`check_model`,
    :func:`check_export`; torch: :func:`check_torch_model`; both :func:`check_loss`); ``model_factory`` and
    ``loss_factory`` are callables or None.

    A factory that raises here (it may need what only an executor has: a GPU, a file) is not refused: one
    log line says so and the ranks, which check the network too, build it.
    """
    if framework == "torch":
        import torch

        net = _built(model_factory, (inputs, model_spec), MODEL) if model_factory else None
        ran = (check_torch_model(net, inputs, on_driver=True) if net is not None else None) or ((), "")
        made = _built(loss_factory, (), LOSS) if loss_factory else None
        if made is not None:
            loss = torch_loss(_callable_loss(made, "a function or torch.nn module taking (outputs, labels)"))
            check_loss(lambda y, x: loss(torch.from_numpy(x), torch.from_numpy(y)), inputs, "torch",
                       flat_logits=ran[0] == (2,), log_probs=ran[1] == "LogSoftmax")
        return
    import keras
    import tensorflow as tf

    for gpu in tf.config.list_physical_devices("GPU"):  # the check must not reserve the GPUs the ranks need
        try:
            tf.config.experimental.set_memory_growth(gpu, True)
        except (RuntimeError, ValueError):  # TensorFlow already started on this process: as it is
            pass
    with tf.device("/CPU:0"):
        model = _built(model_factory, (inputs, model_spec), MODEL) if model_factory else None
        if model is not None:
            check_model(model, inputs)
            check_export(model)
        made = _built(loss_factory, (), LOSS) if loss_factory else None
        if made is not None:
            loss = _callable_loss(made, "a function or keras.losses.Loss taking (y_true, y_pred)")
            _check_from_logits(loss, inputs.task)
            tensor = keras.ops.convert_to_tensor
            check_loss(lambda y, x: per_example_loss(loss, inputs.task, tensor(y), tensor(x)), inputs)
    del model  # no keras.backend.clear_session(): it would reset the user's global policy and seeds


def _built(factory: Any, args: tuple, setter: str) -> Any:
    """``factory(*args)``, or None (logged, masked) when it raises on this process."""
    try:
        return factory(*args)
    except Exception as exc:  # noqa: BLE001 - the user's factory: the ranks build it and report its error
        from sparktrain._internal.secrets import mask_value

        log.warning("%s: the factory raised on the driver (%s); its checks are left to the executors, which "
                    "build it for training", setter, mask_value(_first_line(exc)))
        return None


def _callable_loss(loss: Any, wanted: str) -> Any:
    if not callable(loss):
        raise ConfigError(LOSS, type(loss).__name__, f"the loss factory returned a {type(loss).__name__}, not a "
                                                     f"loss; return {wanted}")
    return loss


def per_example_loss(loss: Any, task: str, y: Any, logits: Any) -> Any:
    """``loss(y_true, y_pred)`` as the training loop calls it: labels ``[B]`` (``[B, 1]`` unless multiclass)."""
    if task == "multiclass":
        return loss(y, logits)
    import keras

    return loss(keras.ops.reshape(y, (-1, 1)), logits)


def _check_from_logits(loss: Any, task: str) -> None:
    """A Keras classification loss built with ``from_logits=False`` reads the logits as probabilities (clipped
    to [1e-7, 1 - 1e-7]: no gradient past them): refused, naming the fix."""
    try:
        config = loss.get_config() if hasattr(loss, "get_config") else {}
    except Exception:  # noqa: BLE001 - a loss without a config: nothing to read
        return
    if task in ("binary", "multiclass") and isinstance(config, dict) and config.get("from_logits") is False:
        raise ConfigError(LOSS, type(loss).__name__, "the loss is built with from_logits=False, but the network "
                                                     "returns logits (scoring applies the sigmoid/softmax itself); "
                                                     "build it with from_logits=True")


def _declared_inputs(model: Any) -> Any:
    try:
        declared = model.inputs
    except (AttributeError, ValueError):
        return None
    return len(declared) if isinstance(declared, (list, tuple)) else 1 if declared is not None else None


def _last_activation(model: Any) -> str:
    """The activation of the layer that gives a Sequential or functional model's output; "" otherwise."""
    import keras

    if not (isinstance(model, keras.Sequential) or type(model).__name__ == "Functional"):
        return ""
    layers = getattr(model, "layers", None) or []
    activation = getattr(layers[-1], "activation", None) if layers else None
    return str(getattr(activation, "__name__", "") or "")
