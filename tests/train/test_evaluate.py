"""Test metrics on a split the metric is undefined on: AUC of a one-class split (probe M)."""

from __future__ import annotations

import logging


def test_a_one_class_split_has_no_auc_rather_than_a_false_zero(spark, caplog):
    """A 0.5%-positive label left the test split without a positive; Spark's evaluator said test_auc 0.0000, which
    MLflow recorded and the champion rule compared (the model looked like the worst possible)."""
    from sparktrain.train.evaluate import both_classes

    one = spark.createDataFrame([(0.0,)] * 5, "y double")
    two = spark.createDataFrame([(0.0,), (1.0,), (None,)], "y double")
    with caplog.at_level(logging.WARNING, logger="sparktrain.train.evaluate"):
        assert both_classes(one, "y", "the test split") is False
        assert both_classes(two, "y", "the test split") is True
        assert both_classes(one, "y", None) is False
    assert len(caplog.records) == 1
    text = caplog.records[0].getMessage()
    assert "the test split holds 5 row(s), all of class negative: its AUC is undefined" in text
    assert "raise split.test" in text
