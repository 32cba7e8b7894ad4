"""The dataset zoo through the public CLI only: scikit-learn's bundled datasets, one config each.

For each dataset (``bench/zoo_data.py`` writes the raw file; nothing is
downloaded) the test runs, as a user would, in fresh processes::

    python -m sparktrain run conf/examples/<name>.yaml --master local[2] --set data.source=RAW ...
    python -m sparktrain score --model models:/<model>@champion --input RAW --output OUT [--option ...]

and checks the scored raw rows: predictions in the label's original values
(species names, cultivars 1-3, booleans) or a double for regression, and their
quality on the raw rows.  iris (string label, NA cells, null labels, no key)
also goes through ``mlflow.pyfunc.load_model(...).predict`` on pandas rows.
No column name of these datasets appears in the library: only in
``conf/examples/`` and ``bench/zoo_data.py``.

Epochs are cut with ``--set`` so the runs stay short; the metric goals are
``bench/zoo.py``'s.  All of them are marked ``slow`` (iris with torch took
~100 s of the default run's 15 minutes); the default run keeps the same
public-CLI path on a string-label CSV with nulls and no key in
``tests/test_cli.py``.  Each test starts two JVMs (run, score)
and the workers; measured on the shared 2-core machine (load 7-15, Dec 1 2026):
iris torch 196 s, iris Keras 321 s, breast_cancer 177 s, diabetes 127 s,
wine 119 s, the README table test 87 s.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import zoo_data  # bench/zoo_data.py

LIBRARY = REPO / "python" / "sparktrain"


def _env():
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               SPARK_LOCAL_IP="127.0.0.1", PYTHONPATH=str(REPO / "python"), TF_CPP_MIN_LOG_LEVEL="2")
    for key in ("PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET", "PYSPARK_SUBMIT_ARGS"):
        env.pop(key, None)
    return env


def _sparktrain(cwd, *args, timeout=900):
    proc = subprocess.run([sys.executable, "-m", "sparktrain", *[str(a) for a in args]], cwd=cwd, env=_env(),
                          capture_output=True, text=True, timeout=timeout, check=False)
    assert proc.returncode == 0, f"sparktrain {args[0]} exited {proc.returncode}:\n" + "\n".join(
        (proc.stdout + proc.stderr).splitlines()[-40:])
    return proc.stdout + proc.stderr  # the report on stdout, the log lines on stderr


@pytest.fixture(scope="module")
def raw_root(tmp_path_factory):
    return tmp_path_factory.mktemp("zoo_raw")


def run_and_score(name, raw_root, work, *overrides):
    """``sparktrain run`` then ``sparktrain score`` on the raw file.

    Returns the run's output (stdout and log), the scored rows as pandas, the tracking URI and the model name.
    """
    import pandas as pd
    import yaml

    spec = zoo_data.ZOO[name]
    raw = zoo_data.write(name, raw_root)
    uri = f"sqlite:///{work / 'mlflow.db'}"
    model_name = yaml.safe_load(zoo_data.config(name).read_text())["tracking"]["model_name"]
    out = _sparktrain(work, "run", zoo_data.config(name), "--master", "local[2]",
                      "--set", f"data.source={raw}", "--set", f"output.path={work / 'dataset'}",
                      "--set", f"train.store={work / 'store'}", "--set", f"tracking.uri={uri}",
                      "--set", f"tracking.artifact_location={work / 'artifacts'}", *overrides)
    assert f"registered '{model_name}' version 1" in out and "alias champion -> this version" in out, out
    assert "test metrics:" in out and "(Spark MLlib " in out, out
    options = [a for k, v in spec.score_options.items() for a in ("--option", f"{k}={v}")]
    scored_path = work / "scored"
    out_score = _sparktrain(work, "score", "--model", f"models:/{model_name}@champion", "--input", raw,
                            "--output", scored_path, "--tracking-uri", uri, *options)
    assert f"scored {len(zoo_data.frame(name)):,} rows" in out_score, out_score
    from sparktrain.data.manifest import committed_files

    return out, pd.concat([pd.read_parquet(f) for f in committed_files(str(scored_path))],
                          ignore_index=True), uri, model_name


def _set(key, value):
    return ("--set", f"{key}={value}")


def _check_classes(name, scored, min_accuracy):
    """Predictions are the label's original values, of the label's own type; accuracy on the raw rows."""
    spec = zoo_data.ZOO[name]
    truth = zoo_data.frame(name)[spec.label]
    assert len(scored) == len(truth)
    known = scored[spec.label].notna()
    classes = set(truth[truth.notna()])
    assert set(scored["prediction"]) <= classes, (set(scored["prediction"]), classes)
    assert len(set(scored["prediction"])) == len(classes)
    accuracy = (scored.loc[known, "prediction"] == scored.loc[known, spec.label]).mean()
    assert accuracy >= min_accuracy, accuracy
    return accuracy


# ---------------------------------------------------------------- iris: string label, NA, no key


def _check_iris(raw_root, out, scored, uri, model_name):
    import mlflow
    import pandas as pd

    assert "2 of 150 rows have a null label" in out                     # NA labels dropped, and counted
    assert "label         species (string) -> int32, multiclass, 3 classes" in out
    assert "Spark MLlib LogisticRegression" in out
    assert scored["prediction"].map(type).eq(str).all()               # species names, not indices
    assert scored["sepal_length_cm"].isna().sum() > 0                  # NA cells reached the model as nulls
    _check_classes("iris", scored, min_accuracy=0.9)
    assert {len(p) for p in scored["probability"]} == {3}

    # the registered model as a pyfunc, on pandas rows read the plain pandas way (NA -> NaN)
    previous = mlflow.get_tracking_uri(), mlflow.get_registry_uri()
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)  # models:/ resolves through the registry URI (an earlier test may have set it)
    try:
        model = mlflow.pyfunc.load_model(f"models:/{model_name}@champion")
    finally:
        mlflow.set_tracking_uri(previous[0])
        mlflow.set_registry_uri(previous[1])
    rows = pd.read_csv(raw_root / "iris.csv")
    assert rows["sepal_length_cm"].isna().sum() > 0
    predicted = model.predict(rows.drop(columns=["species"]))
    assert list(predicted["prediction"]) == list(scored["prediction"])   # pyfunc and `sparktrain score` agree
    assert set(predicted["prediction"]) == {"setosa", "versicolor", "virginica"}


@pytest.mark.slow  # 100 s: the CLI on a string-label CSV stays in the default run (tests/test_cli.py)
@pytest.mark.torch
def test_zoo_iris_torch(raw_root, tmp_path):
    """iris with torch and few epochs: string classes, NA cells and labels, no key; run, score, pyfunc."""
    out, scored, uri, model_name = run_and_score("iris", raw_root, tmp_path, *_set("train.framework", "torch"),
                                                 *_set("train.epochs", 25))
    _check_iris(raw_root, out, scored, uri, model_name)


@pytest.mark.slow
@pytest.mark.tensorflow
def test_zoo_iris_keras(raw_root, tmp_path):
    """iris as conf/examples/iris.yaml has it: Keras 3, gradients all-reduced by gloo, 2 workers."""
    out, scored, uri, model_name = run_and_score("iris", raw_root, tmp_path, *_set("train.epochs", 30))
    assert "training keras (gloo) with 2 workers" in out
    _check_iris(raw_root, out, scored, uri, model_name)


# ---------------------------------------------------------------- wine, breast_cancer, diabetes


@pytest.mark.slow
@pytest.mark.torch
def test_zoo_wine_integer_classes(raw_root, tmp_path):
    """Cultivars 1, 2, 3 (an integer label that is not 0..K-1) come back as 1, 2, 3."""
    out, scored, _, _ = run_and_score("wine", raw_root, tmp_path, *_set("train.epochs", 20))
    assert "label         cultivar (int) -> int32, multiclass, 3 classes" in out
    assert set(scored["prediction"]) == {1, 2, 3}
    _check_classes("wine", scored, min_accuracy=0.9)


@pytest.mark.slow
@pytest.mark.torch
def test_zoo_breast_cancer_boolean_label(raw_root, tmp_path):
    """A boolean label, no key: binary, predicted back as the label's values."""
    out, scored, _, _ = run_and_score("breast_cancer", raw_root, tmp_path, *_set("train.epochs", 15))
    assert "Spark MLlib LogisticRegression" in out and "test_auc" in out
    _check_classes("breast_cancer", scored, min_accuracy=0.93)


@pytest.mark.slow
@pytest.mark.torch
def test_zoo_diabetes_regression(raw_root, tmp_path):
    """An integer-valued target with train.task: regression, from a ';' CSV: a double prediction."""
    import numpy as np

    out, scored, _, _ = run_and_score("diabetes", raw_root, tmp_path, *_set("train.epochs", 40))
    assert "Spark MLlib LinearRegression" in out and "test_r2" in out
    assert str(scored["prediction"].dtype) == "float64"
    y, p = scored["progression"].to_numpy(float), scored["prediction"].to_numpy(float)
    assert np.isfinite(p).all()
    r2 = 1 - ((y - p) ** 2).sum() / ((y - y.mean()) ** 2).sum()
    assert r2 > 0.3, r2


# ---------------------------------------------------------------- autos (text), catalog (set): dmba's bundled data


@pytest.mark.slow
@pytest.mark.torch
def test_zoo_autos_text_feature(raw_root, tmp_path):
    """Newsgroup posts classified from their text alone: tokenized in Spark, a mean-pooled embedding bag."""
    out, scored, _, _ = run_and_score("autos", raw_root, tmp_path, *_set("train.epochs", 12))
    assert "label         newsgroup (string) -> int32, binary, 2 classes" in out
    assert set(scored["prediction"]) == {"rec.autos", "sci.electronics"}
    _check_classes("autos", scored, min_accuracy=0.9)


@pytest.mark.slow
@pytest.mark.torch
def test_zoo_catalog_set_feature(raw_root, tmp_path):
    """A '|'-joined set of divisions as a multi-hot embedding bag; a boolean label predicted back as booleans."""
    out, scored, _, _ = run_and_score("catalog", raw_root, tmp_path, *_set("train.epochs", 6))
    assert set(scored["prediction"]) == {True, False}
    _check_classes("catalog", scored, min_accuracy=0.64)  # the majority class is 0.606


# ---------------------------------------------------------------- no demo column in the library


def test_no_zoo_column_name_in_the_library():
    """The zoo needs no code change: none of its column names appears in python/sparktrain."""
    names = {zoo_data.ZOO[n].label for n in zoo_data.ZOO}
    for n in zoo_data.ZOO:
        names.update(c for c in zoo_data.feature_columns(n) if len(c) > 3)  # skip 'age', 'bmi', 's1', 'ash'...
    hits = []
    for path in LIBRARY.rglob("*.py"):
        text = path.read_text()
        hits += [f"{path.relative_to(REPO)}: {n}" for n in sorted(names) if n in text]
    assert not hits, hits


# ---------------------------------------------------------------- README: "Your own data"


def _readme_yaml():
    """The config block of the README's "Your own data" section."""
    import yaml

    text = (REPO / "README.md").read_text()
    section = text[text.index("## Your own data"):]
    block = section[section.index("```yaml\n") + len("```yaml\n"):]
    return yaml.safe_load(block[:block.index("```")])


@pytest.mark.slow
@pytest.mark.torch
def test_readme_own_data_config_on_a_catalog_table(spark, tmp_path):
    """The README's config and its Python snippet, on a temporary view instead of the CSV."""
    import numpy as np
    import pandas as pd

    from sparktrain.config import parse_config
    from sparktrain.job import run_job
    from sparktrain.serve.scoring import score_dataframe

    raw = _readme_yaml()
    assert raw["data"]["source"] == "data/houses.csv" and "key" not in raw["data"]
    rng = np.random.default_rng(0)
    rooms = rng.integers(1, 7, 400).astype(float)
    area = rooms * 25 + rng.normal(0, 10, 400)
    grade = np.where(area > 110, "good", np.where(area > 60, "fair", "poor"))
    rooms[::9] = np.nan
    houses = pd.DataFrame({"rooms": rooms, "area": area, "city": rng.choice(["a", "b", "c"], 400), "grade": grade})
    houses.to_csv(tmp_path / "houses.csv", index=False, na_rep="NA")
    df = spark.read.options(header=True, inferSchema=True, nullValue="NA").csv(str(tmp_path / "houses.csv"))
    assert df.where("rooms IS NULL").count() == len(range(0, 400, 9))
    df.createOrReplaceTempView("houses_tbl")

    raw["data"] = {"table": "houses_tbl", "label": "grade"}
    raw["train"].update(epochs=10, batch_size=32, learning_rate=0.01, store=str(tmp_path / "store"))
    raw["output"] = {"path": str(tmp_path / "dataset")}
    raw["tracking"] = {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "artifact_location": str(tmp_path / "art")}
    result = run_job(parse_config(raw), spark=spark)
    assert result.preprocess.features["label"]["vocabulary"] == ["fair", "good", "poor"]
    assert set(result.train.test) == {"test_accuracy"} and set(result.train.baseline) == {"test_accuracy"}
    assert result.tracking.model.name == "houses" and result.tracking.model.champion

    scored = score_dataframe(spark, spark.table("houses_tbl"), "models:/houses@champion")
    got = scored.groupBy("prediction").count().collect()
    assert {r["prediction"] for r in got} <= {"fair", "good", "poor"}
    accuracy = scored.selectExpr("avg(cast(prediction = grade as double))").first()[0]
    assert accuracy > 0.7, accuracy
