"""What a user's Keras factories must give, checked before training (probe P: each of these trained to a wrong
model without a word, or failed only at scoring).  Real Keras, on two rows; the end-to-end fit is below."""

from __future__ import annotations

import pytest

from sparktrain.errors import ConfigError
from sparktrain.train._executor.spec import InputSpec, ModelSpec

pytestmark = pytest.mark.tensorflow

BINARY = InputSpec(numeric=("a", "b"), categorical=(("city", 5),), label="y", task="binary")
NUMERIC = InputSpec(numeric=("a", "b"), categorical=(), label="y", task="binary")
THREE = InputSpec(numeric=("a", "b"), categorical=(), label="y", task="multiclass", num_classes=3)


def _functional(inputs: InputSpec, activation=None, units: int = 1):
    import keras

    num = keras.Input(shape=(inputs.numeric_width,))
    cats = [keras.Input(shape=(1,), dtype="int64") for _ in inputs.categorical]
    parts = [num, *(keras.layers.Flatten()(keras.layers.Embedding(card, 2)(c))
                    for c, (_, card) in zip(cats, inputs.categorical))]
    x = keras.layers.Concatenate()(parts) if len(parts) > 1 else num
    return keras.Model([num, *cats], keras.layers.Dense(units, activation=activation)(x))


def _check(model_factory=None, loss_factory=None, inputs: InputSpec = BINARY) -> None:
    from sparktrain.train._executor.contract import check_factories

    check_factories(inputs, ModelSpec(), model_factory, loss_factory)


def test_a_network_that_follows_the_rules_passes_and_an_unbuilt_sequential_is_built():
    import keras

    _check(lambda i, m: _functional(i))
    _check(lambda i, m: _functional(i, units=3), inputs=THREE)
    _check(lambda i, m: keras.Sequential([keras.layers.Dense(4, activation="relu"), keras.layers.Dense(1)]),
           inputs=NUMERIC)  # no keras.Input: built on the first call, as Keras does (it failed on the weights sync)
    _check(lambda i, m: _functional(i, activation="sigmoid"), inputs=InputSpec(("a",), (), "y", "regression"))


@pytest.mark.parametrize("factory, inputs, words", [
    (lambda i, m: _functional(i, activation="sigmoid"), BINARY,
     "the network ends in a sigmoid activation, but training and scoring take its output as logits"),
    (lambda i, m: _functional(i, activation="softmax", units=3), THREE, "ends in a softmax activation"),
    (lambda i, m: _functional(i, units=2), BINARY, "returns shape [2, 2] for 2 rows, but a binary model's output "
                                                   "is logits [B, 1]"),
    (lambda i, m: _functional(NUMERIC), BINARY, "the network could not be called on what training gives it, a list "
                                                "of 2: numeric [B, 2] (float32: a, b), 'city' [B, 1] (int64 index "
                                                "< 5)"),
    (lambda i, m: __import__("keras").Sequential([__import__("keras").Input(shape=(2,)),
                                                  __import__("keras").layers.Dense(1)]), BINARY,
     "the network declares 1 input(s), but training gives it a list of 2"),
    (lambda i, m: "net", BINARY, "the model factory returned a str, not a Keras model"),
])
def test_a_network_that_breaks_a_rule_is_refused_naming_it(factory, inputs, words):
    with pytest.raises(ConfigError) as info:
        _check(factory, inputs=inputs)
    assert "parameter 'setModelFactory'" in str(info.value) and words in str(info.value), str(info.value)


def test_a_network_that_cannot_load_back_for_scoring_is_refused_before_training():
    import keras

    class Scale(keras.layers.Layer):  # not registered: load_model cannot find it
        def call(self, x):
            return x * 2.0

    def custom(inputs, model):
        x = keras.Input(shape=(inputs.numeric_width,))
        return keras.Model(x, keras.layers.Dense(1)(Scale()(x)))

    def lam(inputs, model):
        x = keras.Input(shape=(inputs.numeric_width,))
        return keras.Model(x, keras.layers.Dense(1)(keras.layers.Lambda(lambda t: t * 2.0)(x)))

    for factory, words in ((custom, "Scale"), (lam, "Lambda")):
        with pytest.raises(ConfigError) as info:
            _check(factory, inputs=NUMERIC)
        text = str(info.value)
        assert "cannot be saved and loaded back as scoring does" in text and words in text, text
        assert "@keras.saving.register_keras_serializable()" in text


def test_a_loss_in_torch_order_or_on_probabilities_is_refused_and_a_mean_loss_is_taken():
    import keras

    def swapped():
        def loss(outputs, labels):  # torch's order, which setLossFactory's docstring used to give Keras users too
            return keras.ops.reshape(keras.ops.binary_crossentropy(labels, outputs, from_logits=True), [-1])
        return loss

    with pytest.raises(ConfigError, match=r"the loss is .* for right predictions and .* for wrong ones on a binary "
                                          r"pair; .*check the argument order"):
        _check(loss_factory=swapped)
    with pytest.raises(ConfigError, match="built with from_logits=False, but the network returns logits"):
        _check(loss_factory=lambda: keras.losses.BinaryCrossentropy())
    _check(loss_factory=lambda: keras.losses.BinaryCrossentropy(from_logits=True))  # a mean: taken as one per row
    _check(loss_factory=lambda: keras.losses.BinaryCrossentropy(from_logits=True, reduction="none"))
    _check(loss_factory=lambda: keras.losses.SparseCategoricalCrossentropy(from_logits=True), inputs=THREE)
    _check(loss_factory=lambda: keras.losses.Huber(), inputs=InputSpec(("a",), (), "y", "regression"))


def test_a_factory_that_cannot_run_on_the_driver_is_left_to_the_executors(caplog):
    """A factory may need what only an executor has (a GPU, a file): raising on the driver is no refusal, and
    its message is masked (the secret sweep's fit still fails on the rank, as a TrainingError)."""
    import logging

    def needs_a_gpu(inputs, model):
        raise RuntimeError("no CUDA device; token=abc123")

    with caplog.at_level(logging.WARNING, logger="sparktrain.train._executor.contract"):
        _check(needs_a_gpu, lambda: (_ for _ in ()).throw(OSError("no /mnt/executor-only/loss.py")))
    assert "setModelFactory: the factory raised on the driver (RuntimeError: no CUDA device; token=***)" in caplog.text
    assert "setLossFactory: the factory raised on the driver (OSError:" in caplog.text and "abc123" not in caplog.text


def test_the_factory_setters_refuse_what_is_not_a_factory():
    import keras

    from sparktrain.train.estimator import KerasEstimator, TorchEstimator

    est = KerasEstimator()
    with pytest.raises(ConfigError, match=r"parameter 'setOptimizerFactory' = 'adam': got str 'adam', not a "
                                          r"function; pass fn\(lr\) returning a Keras optimizer"):
        est.setOptimizerFactory("adam")
    with pytest.raises(ConfigError, match=r"setOptimizerFactory.*got a Adam object"):
        est.setOptimizerFactory(keras.optimizers.Adam(0.01))
    with pytest.raises(ConfigError, match=r"setLossFactory.*got a BinaryCrossentropy object: the object itself, "
                                          r"where a function that makes one is wanted"):
        est.setLossFactory(keras.losses.BinaryCrossentropy(from_logits=True))
    with pytest.raises(ConfigError, match=r"setModelFactory.*2 argument"):
        est.setModelFactory(lambda inputs: None)
    est.setOptimizerFactory(lambda lr: keras.optimizers.SGD(lr)).setOptimizerFactory(keras.optimizers.Adam)
    assert est._optimizer_factory is keras.optimizers.Adam  # a class that takes lr is a factory
    with pytest.raises(ConfigError, match=r"fn\(parameters, lr\) returning a torch optimizer"):
        TorchEstimator().setOptimizerFactory(lambda lr: None)


def _net(inputs, model):  # module level: cloudpickled by reference to this test module on the executors
    import keras

    num = keras.Input(shape=(inputs.numeric_width,), name="numeric")
    cats = [keras.Input(shape=(1,), dtype="int64", name=f"cat_{c}") for c, _ in inputs.categorical]
    parts = [num, *(keras.layers.Flatten()(keras.layers.Embedding(card, 3)(i))
                    for i, (_, card) in zip(cats, inputs.categorical))]
    x = keras.layers.Dense(8, activation="relu")(keras.layers.Concatenate()(parts) if len(parts) > 1 else num)
    return keras.Model([num, *cats], keras.layers.Dense(1)(x))


@pytest.mark.slow
def test_custom_keras_factories_end_to_end_a_mean_loss_trains_like_a_per_row_one(spark, tmp_path):
    """Probe P: a Keras loss with its default (mean) reduction was divided by the global batch again: losses ~100x
    too small in MLflow and tuning, and SGD barely learned (AUC 0.53 against 0.81).  It now trains exactly as the
    same loss with reduction='none'; and a network with a final sigmoid is refused before any Spark job."""
    import keras
    from pyspark.sql import functions as F

    from sparktrain.train.estimator import KerasEstimator

    df = spark.range(1600).select((F.rand(1) * 2 - 1).alias("x"), (F.rand(2) * 4).cast("int").alias("city"))
    df = df.withColumn("label", F.when(F.col("x") + F.col("city") * 0.3 > 0.4, "yes").otherwise("no"))

    def fit(reduction: str):
        est = KerasEstimator(numWorkers=2, epochs=2, batchSize=32, learningRate=0.1, labelCol="label", seed=3,
                             store=str(tmp_path / reduction))
        est.setModelFactory(_net).setOptimizerFactory(lambda lr: keras.optimizers.SGD(lr, momentum=0.9))
        est.setLossFactory(lambda: keras.losses.BinaryCrossentropy(from_logits=True, reduction=reduction))
        est.show_progress = False
        return est.fit(df)

    mean, per_row = fit("sum_over_batch_size"), fit("none")
    assert [h["train_loss"] for h in mean.history] == pytest.approx([h["train_loss"] for h in per_row.history],
                                                                     rel=1e-3)
    assert 0.05 < mean.history[-1]["val_loss"] < 0.6  # a cross-entropy, not one divided by the batch again
    assert mean.history[-1]["val_auc"] > 0.9
    scored = mean.transform(df.limit(200)).select("probability").collect()
    assert len({round(float(r.probability), 3) for r in scored}) > 20  # the positive class

    bad = KerasEstimator(numWorkers=2, epochs=1, labelCol="label", store=str(tmp_path / "bad"))
    bad.setModelFactory(lambda i, m: keras.Sequential([keras.Input(shape=(i.numeric_width,)),
                                                       keras.layers.Dense(1, activation="sigmoid")]))
    with pytest.raises(ConfigError, match="declares 1 input"):  # the categorical 'city' would have been dropped
        bad.fit(df)
    assert not any((tmp_path / "bad").glob("*/checkpoints/*.ckpt"))


@pytest.mark.torch
def test_torch_factories_are_checked_alike():
    """The same rules for torch: logits of the task's width, no final Sigmoid/Softmax, a loss in torch's
    (outputs, labels) order; a loss per row counts as its mean (a torch loss had to be a mean, a Keras one
    per row)."""
    import torch
    from torch import nn

    from sparktrain.train._executor.contract import check_factories, torch_loss

    class Net(nn.Module):
        def __init__(self, inputs, final=None, out=1):
            super().__init__()
            self.emb = nn.Embedding(5, 2)
            self.head = nn.Sequential(nn.Linear(inputs.numeric_width + 2, 4), nn.ReLU(), nn.Linear(4, out),
                                      *([final] if final is not None else []))

        def forward(self, x_num, x_cat):
            return self.head(torch.cat([x_num, self.emb(x_cat[:, 0])], dim=1))

    def check(model=None, loss=None, inputs=BINARY):
        check_factories(inputs, ModelSpec(), model, loss, "torch")

    bce = nn.functional.binary_cross_entropy_with_logits
    check(lambda i, m: Net(i), lambda: lambda outputs, labels: bce(outputs.reshape(-1), labels))
    with pytest.raises(ConfigError, match=r"labels \[2\] \(float32\) and logits \[2, 1\], failed: ValueError: Target "
                                          r"size .* reshape the \[B, 1\] logits to the labels' \[B\]"):
        check(loss=lambda: nn.BCEWithLogitsLoss())  # as it fails at training's first step
    with pytest.raises(ConfigError, match=r"the network ends in Sigmoid, but training and scoring take its output "
                                          r"as logits.*Remove the final Sigmoid"):
        check(lambda i, m: Net(i, nn.Sigmoid()))
    with pytest.raises(ConfigError, match=r"returns \[2, 3\] for 2 rows, but a binary model's output is "
                                          r"logits \[B, 1\]"):
        check(lambda i, m: Net(i, out=3))
    with pytest.raises(ConfigError, match=r"could not be called as training calls it, net\(x_num \[B, 2\] float32, "
                                          r"x_cat \[B, 1\] int64"):
        check(lambda i, m: nn.Linear(7, 1))

    def keras_order():
        bce = nn.BCEWithLogitsLoss()
        return lambda y, outputs: bce(outputs.reshape(-1), y.reshape(-1).float())

    with pytest.raises(ConfigError, match=r"lower for right ones and not negative.*Training calls it as "
                                          r"loss\(outputs, labels\)|calling the loss as training does"):
        check(loss=keras_order)
    with pytest.raises(ConfigError, match=r"broadcasts \[B, 1\] against \[B\] to \[B, B\]"):
        check(loss=lambda: nn.MSELoss(), inputs=InputSpec(("a",), (), "y", "regression"))  # a silent wrong loss
    per_row = torch_loss(nn.BCEWithLogitsLoss(reduction="none"))
    logits, y = torch.tensor([[2.0], [-1.0]]), torch.tensor([[1.0], [0.0]])
    assert float(per_row(logits, y)) == pytest.approx(float(nn.BCEWithLogitsLoss()(logits, y)))
    with pytest.raises(ConfigError, match="setModelFactory.*2 argument"):
        __import__("sparktrain.train.estimator", fromlist=["TorchEstimator"]).TorchEstimator().setModelFactory(
            lambda inputs: None)


class _TorchNet:  # built on the executors from this module: a factory by reference
    @staticmethod
    def make(inputs, model):
        import torch
        from torch import nn

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = nn.ModuleList(nn.Embedding(card, 3) for _, card in inputs.categorical)
                self.head = nn.Sequential(nn.Linear(inputs.numeric_width + 3 * len(self.emb), 8), nn.ReLU(),
                                          nn.Linear(8, 1))

            def forward(self, x_num, x_cat):
                parts = [x_num, *(e(x_cat[:, i]) for i, e in enumerate(self.emb))]
                return self.head(torch.cat(parts, dim=1))

        return Net()


@pytest.mark.slow
@pytest.mark.torch
def test_custom_torch_factories_end_to_end_a_per_row_loss_trains_like_a_mean(spark, tmp_path):
    """A torch loss with reduction='none' failed at the first step (float() of a [B] tensor); it now counts as
    its mean, so it trains exactly as reduction='mean'."""
    import torch
    from pyspark.sql import functions as F

    from sparktrain.train.estimator import TorchEstimator

    df = spark.range(1600).select((F.rand(1) * 2 - 1).alias("x"), (F.rand(2) * 4).cast("int").alias("city"))
    df = df.withColumn("label", F.when(F.col("x") + F.col("city") * 0.3 > 0.4, "yes").otherwise("no"))

    def fit(reduction: str):
        est = TorchEstimator(numWorkers=2, epochs=2, batchSize=32, learningRate=0.05, labelCol="label", seed=3,
                             store=str(tmp_path / reduction))
        bce = torch.nn.BCEWithLogitsLoss(reduction=reduction)
        est.setModelFactory(_TorchNet.make).setLossFactory(lambda: lambda out, y: bce(out.reshape(-1), y))
        est.setOptimizerFactory(lambda params, lr: torch.optim.SGD(params, lr, momentum=0.9))
        est.show_progress = False
        return est.fit(df)

    mean, per_row = fit("mean"), fit("none")
    assert [h["train_loss"] for h in mean.history] == pytest.approx([h["train_loss"] for h in per_row.history],
                                                                     rel=1e-3)
    assert mean.history[-1]["val_auc"] > 0.9
    assert mean.transform(df.limit(50)).where("prediction = 'yes'").count() > 0


def test_what_the_rules_must_not_refuse_keras():
    """Review: the checks refused valid networks and losses, and reset the user's global Keras state."""
    import keras

    @keras.saving.register_keras_serializable(package="tests")
    class Gated(keras.Model):  # subclassed: its last *assigned* layer is a sigmoid gate, its output logits
        def __init__(self, **kw):
            super().__init__(**kw)
            self.head = keras.layers.Dense(1)
            self.gate = keras.layers.Dense(2, activation="sigmoid")

        def call(self, parts):
            return self.head(parts[0] * self.gate(parts[0]))

    def rank_aware(y_true, y_pred):  # written against the tensor API, as training calls it
        assert len(y_pred.shape) == 2
        return keras.ops.binary_crossentropy(y_true, y_pred, from_logits=True)[:, 0]

    policy = keras.mixed_precision.global_policy().name
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        _check(lambda i, m: Gated(), rank_aware, inputs=NUMERIC)
        assert keras.mixed_precision.global_policy().name == "mixed_bfloat16"  # no clear_session
    finally:
        keras.mixed_precision.set_global_policy(policy)

    def bare_assert(inputs, model):
        x = keras.Input(shape=(inputs.numeric_width,))
        return keras.Model(x, keras.layers.Dense(1)(keras.layers.Lambda(lambda t: t)(x)))

    def failing_loss():
        def loss(y_true, y_pred):
            raise AssertionError()
        return loss

    with pytest.raises(ConfigError, match=r"calling the loss as training does, loss\(y_true, y_pred\) with labels "
                                          r"\[2, 1\].*AssertionError"):  # a bare assert: no IndexError
        _check(loss_factory=failing_loss, inputs=NUMERIC)


@pytest.mark.torch
def test_what_the_rules_must_not_refuse_torch():
    """Review: a [B] network with BCEWithLogitsLoss, a sigmoid kept for predict_proba, LogSoftmax + NLLLoss; and
    the check leaves BatchNorm statistics and the RNG as they were."""
    import torch
    from torch import nn

    from sparktrain.train._executor.contract import check_factories, check_torch_model

    class Flat(nn.Module):
        def __init__(self, out=1, final=None):
            super().__init__()
            self.bn = nn.BatchNorm1d(2)
            self.lin = nn.Linear(2, out)
            self.final = final
            self.sigmoid = nn.Sigmoid()  # for a predict_proba helper, not in forward

        def forward(self, x_num, x_cat):
            z = self.lin(self.bn(x_num))
            z = self.final(z) if self.final is not None else z
            return z.squeeze(-1) if z.shape[-1] == 1 else z

        def predict_proba(self, x_num, x_cat):
            return self.sigmoid(self.forward(x_num, x_cat))

    check_factories(NUMERIC, ModelSpec(), lambda i, m: Flat(), lambda: nn.BCEWithLogitsLoss(), "torch")
    check_factories(THREE, ModelSpec(), lambda i, m: Flat(3, nn.LogSoftmax(dim=1)), lambda: nn.NLLLoss(), "torch")
    with pytest.raises(ConfigError, match="ends in Sigmoid"):
        check_factories(NUMERIC, ModelSpec(), lambda i, m: Flat(1, nn.Sigmoid()), None, "torch")
    net = Flat()
    net.train()
    state = torch.random.get_rng_state()
    check_torch_model(net, NUMERIC)
    assert net.training and int(net.bn.num_batches_tracked) == 0 and torch.equal(state, torch.random.get_rng_state())

    from sparktrain.train.estimator import TorchEstimator

    with pytest.raises(ConfigError, match=r"setLossFactory.*got a BCEWithLogitsLoss object: the object itself"):
        TorchEstimator().setLossFactory(nn.BCEWithLogitsLoss())
    with pytest.raises(ConfigError, match=r"setModelFactory.*got a Flat object: the object itself"):
        TorchEstimator().setModelFactory(Flat())

    def asserting(inputs, model):
        class Net(nn.Module):
            def forward(self, x_num, x_cat):
                assert x_num.shape[1] == 99
        return Net()

    with pytest.raises(ConfigError, match=r"could not be called as training calls it.*\(AssertionError"):
        check_factories(NUMERIC, ModelSpec(), asserting, None, "torch")


@pytest.mark.tensorflow
def test_a_keras_sum_loss_trains_as_the_batch_mean():
    """Review: reduction="sum" gives the batch's total; each row counts its share of it (it was taken as a mean
    and copied to every row: gradients B times too large)."""
    import keras
    import numpy as np
    import tensorflow as tf

    from sparktrain.train._executor.keras_worker import _reduction

    y, logits = tf.constant(np.array([1.0, 0.0, 1.0, 1.0], np.float32)), tf.constant([[2.0], [-1.0], [0.5], [3.0]])
    per_row = keras.losses.BinaryCrossentropy(from_logits=True, reduction="none")(tf.reshape(y, [-1, 1]), logits)
    for reduction in ("sum", "sum_over_batch_size", "none"):
        loss = keras.losses.BinaryCrossentropy(from_logits=True, reduction=reduction)
        adapter = type("A", (), {})()
        adapter.tf, adapter.task, adapter.loss_obj = tf, "binary", loss
        adapter._summed = _reduction(loss) == "sum"
        from sparktrain.train._executor.keras_worker import KerasAdapter

        per = KerasAdapter.per_example_loss(adapter, y, logits)
        assert float(tf.reduce_sum(per)) == pytest.approx(float(tf.reduce_sum(per_row)), rel=1e-6), reduction
