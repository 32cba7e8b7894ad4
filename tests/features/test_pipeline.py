"""The compiled Pipeline on real flights rows: fitted values, persistence, nesting, and the Spark-free twin."""

from __future__ import annotations

import datetime as dt
import json
import math
import zlib

import numpy as np
import pyarrow.parquet as pq
import pytest
from sparktrain.features.spec import parse_features

KEY, LABEL = "flight_id", "late"

SPEC = [
    {"name": "carrier", "type": "categorical"},
    {"name": "dest", "type": "categorical", "min_frequency": 20},
    {"name": "manufacturer", "type": "categorical", "max_vocab": 5},
    {"name": "tailnum", "type": "categorical", "hash_buckets": 97},
    {"name": "engines_cat", "column": "engines", "type": "categorical"},
    {"name": "carrier_x_origin", "type": "crossed", "columns": ["carrier", "origin"], "hash_buckets": 31},
    {"name": "sched_departure", "type": "datetime",
     "parts": ["hour", "day_of_week", "month", "day_of_month", "minute"]},
    {"name": "dep_text", "column": "dep_str", "type": "datetime", "parts": ["hour", "month"], "cyclical": False},
    {"name": "dep_delay", "type": "numeric", "impute": "median", "clip": [-60, 600], "log1p": True, "buckets": 5},
    {"name": "distance", "type": "numeric", "log1p": True, "scale": "minmax"},
    {"name": "temp", "type": "numeric"},
    {"name": "wind_gust", "type": "numeric", "impute": "constant", "impute_value": 3.5, "scale": "none"},
    {"name": "seats_n", "column": "seats_str", "type": "numeric", "impute": "median", "clip": [0, 400]},
    {"name": "multi_engine", "type": "boolean"},
]

RAW_COLS = ["flight_id", "late", "carrier", "dest", "manufacturer", "tailnum", "engines", "origin",
            "sched_departure", "dep_str", "dep_delay", "distance", "temp", "wind_gust", "seats_str", "multi_engine"]


def _odd_rows(schema):
    """Rows the fit never saw: unseen values, nulls, NaN/inf, unparsable text, out-of-clip values."""
    ts = dt.datetime(2024, 2, 29, 23, 59, tzinfo=dt.timezone.utc)
    base = {c: None for c in RAW_COLS}
    rows = [
        dict(base, flight_id="odd-1", late=True, carrier="ZZ", dest="XXX", manufacturer="ACME", tailnum="N0NE",
             engines=7, origin="JFK", sched_departure=ts, dep_str="2024-02-29 23:59:00", dep_delay=float("nan"),
             distance=1e6, temp=float("inf"), wind_gust=-float("inf"), seats_str="abc", multi_engine=True),
        dict(base, flight_id="odd-2", late=False),  # every feature null
        dict(base, flight_id="odd-3", late=None, carrier="UA", origin=None, dep_delay=-1e4, distance=0.0,
             temp=-40.0, wind_gust=12.0, seats_str=" 150 ", multi_engine=False, engines=2),
    ]
    return [tuple(r[f.name] for f in schema.fields) for r in rows]


@pytest.fixture(scope="module")
def specs():
    return parse_features(SPEC)


@pytest.fixture(scope="module")
def raw_train(flights_sample):
    return flights_sample.selectExpr(
        *[c for c in RAW_COLS if c not in ("dep_str", "seats_str", "multi_engine")],
        "date_format(sched_departure, 'yyyy-MM-dd HH:mm:ss') AS dep_str", "CAST(seats AS STRING) AS seats_str",
        "engines > 1 AS multi_engine").select(*RAW_COLS)


@pytest.fixture(scope="module")
def raw_path(spark, raw_train, tmp_path_factory):
    """The sample plus the odd rows, as a Parquet file that both Spark and pyarrow read."""
    path = str(tmp_path_factory.mktemp("raw") / "raw.parquet")
    odd = spark.createDataFrame(_odd_rows(raw_train.schema), raw_train.schema)
    raw_train.unionByName(odd).coalesce(1).write.parquet(path)
    return path


@pytest.fixture(scope="module")
def model(raw_train, specs):
    from sparktrain.features.compile import compile_pipeline

    return compile_pipeline(specs, key=KEY, label=LABEL).fit(raw_train)


@pytest.fixture(scope="module")
def meta(model, specs, raw_train):
    from sparktrain.features import metadata as md
    from sparktrain.features.compile import plan_features

    types = {f.name: f.dataType.simpleString() for f in raw_train.schema.fields}
    built = md.build_metadata(plan_features(specs, KEY, LABEL), md.fitted_values(model), schema=types)
    return json.loads(md.dumps(built))  # exactly what a scorer reads back


@pytest.fixture(scope="module")
def spark_out(spark, model, raw_path, tmp_path_factory):
    """The Spark transform of the raw file, read back with pyarrow, sorted by key."""
    path = str(tmp_path_factory.mktemp("out") / "out.parquet")
    model.transform(spark.read.parquet(raw_path)).coalesce(1).write.parquet(path)
    return pq.read_table(path).sort_by(KEY)


def test_output_schema_is_flat_float32_and_int32(spark_out, meta):
    types = {f.name: str(f.type) for f in spark_out.schema}
    assert types.pop(KEY) == "string" and types.pop(LABEL) == "float"
    assert {n for n, t in types.items() if t == "float"} == set(meta["float_columns"])
    assert {n for n, t in types.items() if t == "int32"} == set(meta["int_columns"])
    assert meta["int_columns"][:5] == ["carrier", "dest", "manufacturer", "tailnum", "engines_cat"]
    assert "dep_delay_bucket" in meta["int_columns"] and "sched_departure_minute_cos" in meta["float_columns"]
    for col in spark_out.column_names:  # imputed: no nulls anywhere but the label
        if col != LABEL:
            assert spark_out.column(col).null_count == 0, col


def test_local_transform_equals_spark_within_1e6(spark_out, raw_path, meta):
    from sparktrain.serve.local import transform_local

    raw = pq.read_table(raw_path).sort_by(KEY)
    local = transform_local(raw, meta)
    assert list(local) == spark_out.column_names
    for name in spark_out.column_names:
        theirs = spark_out.column(name).to_numpy(zero_copy_only=False)
        ours = local[name]
        if name == KEY:
            assert list(ours) == list(theirs)
        elif name == LABEL:
            np.testing.assert_array_equal(np.nan_to_num(ours, nan=-1), np.nan_to_num(theirs.astype(np.float32), nan=-1))
        else:
            assert ours.dtype == theirs.dtype, name
            np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-6, err_msg=name)
    # and from pandas, as an MLflow pyfunc receives it
    pdf = transform_local(raw.to_pandas(), meta, as_pandas=True)
    np.testing.assert_allclose(pdf["distance"].to_numpy(), local["distance"], rtol=1e-6, atol=1e-6)


def test_odd_rows_get_reserved_indices_and_imputed_values(spark_out, meta):
    feats = {f["name"]: f for f in meta["features"]}
    rows = {k: i for i, k in enumerate(spark_out.column(KEY).to_pylist())}
    col = {n: spark_out.column(n).to_pylist() for n in spark_out.column_names}
    odd1, odd2, odd3 = rows["odd-1"], rows["odd-2"], rows["odd-3"]
    for name in ("carrier", "dest", "manufacturer", "engines_cat"):
        assert col[name][odd1] == feats[name]["reserved_index"] == col[name][odd2]
    assert col["carrier"][odd3] == feats["carrier"]["vocabulary"].index("UA")
    assert col["tailnum"][odd2] == zlib.crc32(b"") % 97 == 0
    assert col["tailnum"][odd1] == zlib.crc32(b"N0NE") % 97
    assert col["carrier_x_origin"][odd1] == zlib.crc32(b"ZZ\x01JFK") % 31
    assert col["carrier_x_origin"][odd3] == zlib.crc32(b"UA\x01") % 31
    # 2024-02-29 23:59 UTC is a Thursday; parts are 0-based, null -> period
    assert [col[f"sched_departure_{p}"][odd1] for p in ("hour", "day_of_week", "month", "day_of_month", "minute")] \
        == [23, 3, 1, 28, 59]
    assert [col["dep_text_hour"][odd1], col["dep_text_month"][odd1]] == [23, 1]
    assert [col[f"sched_departure_{p}"][odd2] for p in ("hour", "day_of_week", "month")] == [24, 7, 12]
    assert col["sched_departure_hour_sin"][odd2] == 0.0 and col["sched_departure_hour_cos"][odd2] == 0.0
    assert col["sched_departure_hour_sin"][odd1] == pytest.approx(math.sin(2 * math.pi * 23 / 24), abs=1e-6)
    # numeric: NaN and inf imputed, clip then log1p then scale
    dd = feats["dep_delay"]
    assert col["dep_delay"][odd1] == pytest.approx((dd["impute"]["value"] - dd["scale"]["mean"]) / dd["scale"]["std"],
                                                   abs=1e-6)
    assert col["dep_delay"][odd3] == pytest.approx((-math.log1p(60) - dd["scale"]["mean"]) / dd["scale"]["std"],
                                                   abs=1e-6)
    temp = feats["temp"]["scale"]
    assert col["temp"][odd1] == pytest.approx(0.0, abs=1e-6)  # inf -> missing -> mean -> 0 after standardizing
    assert col["wind_gust"][odd1] == 3.5 and col["wind_gust"][odd3] == 12.0  # constant impute, no scaling
    assert col["temp"][odd3] == pytest.approx((-40.0 - temp["mean"]) / temp["std"], abs=1e-5)
    assert col["seats_n"][odd3] != col["seats_n"][odd1]  # " 150 " parses, "abc" is imputed
    assert col["multi_engine"][odd1] == 1.0 and col["multi_engine"][odd2] == 0.0


def test_fitted_values_match_independent_spark_aggregates(raw_train, meta):
    from pyspark.sql import functions as F

    feats = {f["name"]: f for f in meta["features"]}
    top = (raw_train.where("carrier IS NOT NULL").groupBy("carrier").count()
           .orderBy(F.desc("count"), F.asc("carrier")).collect())
    assert feats["carrier"]["vocabulary"] == [r["carrier"] for r in top]
    assert feats["carrier"]["num_indices"] == len(top) + 1
    dest = raw_train.groupBy("dest").count().where("count >= 20 AND dest IS NOT NULL")
    assert feats["dest"]["vocab_size"] == dest.count()
    assert feats["manufacturer"]["vocab_size"] == 5
    assert feats["engines_cat"]["vocabulary"][0] == "2"  # int source, indexed by its text
    stats = raw_train.selectExpr("avg(temp) m", "stddev_samp(temp) s",
                                 "min(log1p(distance)) lo", "max(log1p(distance)) hi").first()
    assert feats["temp"]["scale"]["mean"] == pytest.approx(stats["m"], rel=1e-9)
    assert feats["temp"]["impute"]["value"] == pytest.approx(stats["m"], rel=1e-9)
    assert feats["distance"]["scale"]["min"] == pytest.approx(stats["lo"], rel=1e-9)
    assert feats["distance"]["scale"]["range"] == pytest.approx(stats["hi"] - stats["lo"], rel=1e-9)
    # Imputer's median is approxQuantile's (relativeError 0.001): check it by rank, in the clipped log1p space
    med = feats["dep_delay"]["impute"]["value"]
    x = "sign(least(greatest(dep_delay, -60), 600)) * log1p(abs(least(greatest(dep_delay, -60), 600)))"
    ranks = raw_train.where("dep_delay IS NOT NULL").selectExpr(
        f"avg(CAST({x} < {med!r} AS DOUBLE)) below", f"avg(CAST({x} <= {med!r} AS DOUBLE)) upto").first()
    assert ranks["below"] <= 0.5 + 1e-3 and ranks["upto"] >= 0.5 - 1e-3
    splits = feats["dep_delay"]["buckets"]["splits"]
    assert splits[0] == -math.inf and splits[-1] == math.inf and splits == sorted(splits)
    by_col = {c["name"]: c for c in meta["columns"]}
    assert by_col["dep_delay_bucket"]["cardinality"] == len(splits)
    assert by_col["sched_departure_month"]["cardinality"] == 13
    assert meta["label"] == {"column": LABEL, "source_dtype": "boolean", "dtype": "float32", "task": "binary"}
    assert meta["task"] == "binary" and meta["key"] == KEY


def test_save_load_in_another_session_transforms_identically(spark, model, raw_path, tmp_path):
    from pyspark.ml import Pipeline, PipelineModel
    from sparktrain.features.compile import compile_pipeline

    model.write().overwrite().save(str(tmp_path / "model"))
    other = spark.newSession()
    loaded = PipelineModel.load(str(tmp_path / "model"))
    raw_other = other.read.parquet(raw_path)
    a = model.transform(spark.read.parquet(raw_path))
    b = loaded.transform(raw_other)
    assert a.schema == b.schema
    assert a.exceptAll(b).count() == 0 and b.exceptAll(a).count() == 0
    # the unfitted pipeline round-trips too
    pipe = compile_pipeline(parse_features(SPEC), key=KEY, label=LABEL)
    pipe.write().overwrite().save(str(tmp_path / "pipe"))
    again = Pipeline.load(str(tmp_path / "pipe"))
    assert [type(s).__name__ for s in again.getStages()] == [type(s).__name__ for s in pipe.getStages()]
    assert [type(s).__name__ for s in pipe.getStages()] == [
        "SQLTransformer", "Imputer", "Imputer", "StringIndexer", "VocabularyIndexer", "QuantileDiscretizer",
        "ColumnScaler", "FlatFeatureAssembler"]


def test_nests_in_a_users_pipeline_with_a_model_and_round_trips(spark, raw_train, model, meta, tmp_path):
    from pyspark.ml import Pipeline, PipelineModel
    from pyspark.ml.classification import LogisticRegression
    from pyspark.ml.feature import SQLTransformer, VectorAssembler

    user = Pipeline(stages=[
        SQLTransformer(statement=f"SELECT * FROM __THIS__ WHERE {LABEL} IS NOT NULL"),
        model,  # the fitted feature PipelineModel, as one stage
        VectorAssembler(inputCols=meta["float_columns"] + ["carrier"], outputCol="vec"),
        LogisticRegression(featuresCol="vec", labelCol=LABEL, maxIter=5),
    ])
    fitted = user.fit(raw_train)
    scored = fitted.transform(raw_train)
    assert {"prediction", "carrier", "dep_delay_bucket"} <= set(scored.columns)
    fitted.write().overwrite().save(str(tmp_path / "user"))
    reloaded = PipelineModel.load(str(tmp_path / "user"))
    a = scored.select(KEY, "probability")
    b = reloaded.transform(raw_train).select(KEY, "probability")
    assert a.exceptAll(b).count() == 0
    acc = scored.selectExpr(f"avg(CAST(prediction = {LABEL} AS DOUBLE)) a").first()["a"]
    assert acc > 0.7  # dep_delay alone predicts lateness well


def test_keep_input_cols_reaches_the_assembler(specs):
    from sparktrain.features.compile import compile_pipeline

    assert compile_pipeline(specs, keep_input_cols=True).getStages()[-1].getKeepInputCols() is True
    assert compile_pipeline(specs).getStages()[-1].getKeepInputCols() is False


def test_fit_pipeline_fits_what_pipeline_fit_fits(raw_train, specs, meta):
    from sparktrain.features import metadata as md
    from sparktrain.features.compile import (
        compile_pipeline,
        fit_pipeline,
        plan_features,
    )

    types = {f.name: f.dataType.simpleString() for f in raw_train.schema.fields}
    model = fit_pipeline(compile_pipeline(specs, key=KEY, label=LABEL, types=types), raw_train)
    again = md.build_metadata(plan_features(specs, KEY, LABEL), md.fitted_values(model), schema=types)
    assert json.loads(md.dumps(again)) == meta


def test_fit_features_fits_what_pipeline_fit_fits_in_two_waves(raw_train, specs):
    from pyspark.sql import functions as F
    from sparktrain.errors import DataError
    from sparktrain.features import metadata as md
    from sparktrain.features.compile import compile_pipeline, plan_features
    from sparktrain.features.fit import fit_features

    types = {f.name: f.dataType.simpleString() for f in raw_train.schema.fields}
    plan = plan_features(specs, KEY, LABEL, types=types)
    pipe = compile_pipeline(specs, key=KEY, label=LABEL, types=types)
    train = "pmod(xxhash64(flight_id), 4) != 0"  # the sample is hash(flight_id) % 20 = 0
    seen = []
    result = fit_features(pipe, raw_train, plan, train=train, extra=[F.count(F.lit(1)).alias("rows")],
                          check=seen.append)
    expected = pipe.fit(raw_train.where(train))
    assert seen == [{"rows": raw_train.count()}] and result.values == seen[0]
    got, want = md.fitted_values(result.model), md.fitted_values(expected)
    assert got["labels"] == want["labels"] and got["splits"] == want["splits"]
    assert got["impute"] == pytest.approx(want["impute"], rel=1e-12)
    assert result.fitted["impute"] == got["impute"]  # known without reading surrogateDF back
    assert got["scale"].keys() == want["scale"].keys()
    for col, (method, offset, scale) in want["scale"].items():
        assert got["scale"][col][0] == method
        assert got["scale"][col][1:] == pytest.approx((offset, scale), rel=1e-9), col
    a = result.model.transform(raw_train).drop(LABEL)
    b = expected.transform(raw_train).drop(LABEL).select([F.col(c).alias(f"b_{c}") for c in a.columns])
    diffs = a.join(b, a[KEY] == b[f"b_{KEY}"]).select(
        [F.max(F.abs(F.col(c) - F.col(f"b_{c}"))).alias(c) for c in a.columns if c != KEY]).first()
    assert max(diffs) < 1e-6
    with pytest.raises(DataError, match="stop here"):
        fit_features(pipe, raw_train, plan, extra=[F.count(F.lit(1)).alias("rows")],
                     check=lambda values: (_ for _ in ()).throw(DataError("stop here")))


def test_save_pipeline_model_writes_what_pipeline_model_save_writes(spark, model, raw_path, tmp_path):
    import glob
    import os

    from pyspark.ml import PipelineModel
    from sparktrain.features.persist import save_pipeline_model

    sc = spark.sparkContext
    sc.setJobGroup("sparktrain-save-test", "save_pipeline_model")
    try:
        save_pipeline_model(model, str(tmp_path / "ours"))
    finally:
        sc.setJobGroup("", "")  # the next test's jobs are not counted
    assert list(sc.statusTracker().getJobIdsForGroup("sparktrain-save-test")) == []  # plain files, no job
    model.write().save(str(tmp_path / "spark"))

    def layout(root):  # the folders holding data (Spark names its part files with a uuid)
        return sorted(os.path.relpath(d, root) for d, _, files in os.walk(root)
                      if any(not f.startswith((".", "_")) for f in files))

    assert layout(tmp_path / "ours") == layout(tmp_path / "spark")
    for folder in layout(tmp_path / "spark"):
        ours = [f for f in glob.glob(str(tmp_path / "ours" / folder / "*")) if not os.path.basename(f).startswith("_")]
        theirs = [f for f in glob.glob(str(tmp_path / "spark" / folder / "*"))
                  if not os.path.basename(f).startswith(("_", "."))]
        assert len(ours) == len(theirs) == 1, folder
        if folder.endswith("metadata"):  # the same JSON, but for when it was written
            a, b = (json.loads(open(f).read()) for f in (ours[0], theirs[0]))
            assert a.pop("timestamp") > 0 and b.pop("timestamp") > 0
            assert a == b, folder
        else:  # a JVM model's data: the same schema (names, types, nullability) and values
            a, b = pq.read_table(ours[0]), pq.read_table(theirs[0])
            assert a.schema.remove_metadata() == b.schema.remove_metadata(), folder
            assert a.to_pylist() == b.to_pylist(), folder
    assert {os.path.basename(os.path.dirname(p)).split("_")[1] for p in glob.glob(
        str(tmp_path / "ours" / "stages" / "*" / "data"))} >= {"Imputer", "StringIndexer"}  # both JVM writers covered
    loaded = PipelineModel.load(str(tmp_path / "ours"))
    assert [s.uid for s in loaded.stages] == [s.uid for s in model.stages]
    raw = spark.read.parquet(raw_path)
    a, b = model.transform(raw), loaded.transform(raw)
    assert a.exceptAll(b).count() == 0 and b.exceptAll(a).count() == 0
    with pytest.raises(FileExistsError, match="already exists"):
        save_pipeline_model(model, str(tmp_path / "ours"))


def test_fit_features_falls_back_to_stage_by_stage_for_other_pipelines(raw_train, specs):
    from pyspark.ml import Pipeline
    from pyspark.ml.feature import SQLTransformer
    from pyspark.sql import functions as F
    from sparktrain.features import metadata as md
    from sparktrain.features.compile import compile_pipeline, plan_features
    from sparktrain.features.fit import fit_features

    types = {f.name: f.dataType.simpleString() for f in raw_train.schema.fields}
    plan = plan_features(specs, KEY, LABEL, types=types)
    compiled = compile_pipeline(specs, key=KEY, label=LABEL, types=types)
    extended = Pipeline(stages=[*compiled.getStages(), SQLTransformer(statement="SELECT * FROM __THIS__")])
    seen = []
    result = fit_features(extended, raw_train, plan, extra=[F.count(F.lit(1)).alias("rows")], check=seen.append)
    assert seen == [{"rows": raw_train.count()}] and len(result.model.stages) == len(extended.getStages())
    fused = fit_features(compiled, raw_train, plan)
    assert result.fitted["labels"] == fused.fitted["labels"] == md.fitted_values(result.model)["labels"]
    assert result.fitted["impute"] == pytest.approx(fused.fitted["impute"], rel=1e-12)


def test_fit_features_names_the_column_with_nothing_to_fit_on(raw_train):
    from sparktrain.errors import DataError
    from sparktrain.features.compile import compile_pipeline, plan_features
    from sparktrain.features.fit import fit_features

    specs = parse_features([{"name": "temp", "type": "numeric"}, {"name": "distance", "type": "numeric"}])
    types = {f.name: f.dataType.simpleString() for f in raw_train.schema.fields}
    plan = plan_features(specs, KEY, LABEL, types=types)
    pipe = compile_pipeline(specs, key=KEY, label=LABEL, types=types)
    with pytest.raises(DataError, match=r"column 'temp' \(feature 'temp'\) has no usable value in the \d+ rows "
                                        r"the features are fitted on .* use impute: constant"):
        fit_features(pipe, raw_train, plan, train="temp IS NULL")  # present elsewhere, null in every fit row
    with pytest.raises(DataError, match=r"no rows to fit the features on: the predicate 'distance < 0' selects "
                                        r"none"):
        fit_features(pipe, raw_train, plan, train="distance < 0")


def test_fit_features_constant_column_with_nulls_scales_like_pipeline_fit(spark):
    from sparktrain.features import metadata as md
    from sparktrain.features.compile import compile_pipeline, plan_features
    from sparktrain.features.fit import fit_features

    specs = parse_features([{"name": "x", "type": "numeric", "impute": "median", "scale": "standard"},
                            {"name": "y", "type": "numeric", "impute": "mean", "scale": "standard"},
                            {"name": "z", "type": "numeric", "impute": "median", "scale": "minmax"}])
    # three 0.1s: avg gives 0.10000000000000002, the median 0.1; the imputed column is constant
    df = spark.createDataFrame([(0.1, 1.0, 5.0), (0.1, 2.0, 5.0), (0.1, None, None), (None, 4.0, 5.0)],
                               "x double, y double, z double")
    plan = plan_features(specs, types={"x": "double", "y": "double", "z": "double"})
    pipe = compile_pipeline(specs, types={"x": "double", "y": "double", "z": "double"})
    got = fit_features(pipe, df, plan).fitted["scale"]
    want = md.fitted_values(pipe.fit(df))["scale"]
    assert got.keys() == want.keys()
    for col, (method, offset, scale) in want.items():
        assert got[col][0] == method and got[col][1:] == pytest.approx((offset, scale), rel=1e-12), col
    assert got[plan.internal("x", "imp")][2] == 1.0 and got[plan.internal("z", "imp")][2] == 1.0


def test_transform_local_scores_a_float_id_above_2_53_as_unseen_with_a_warning():
    """Probe M: pandas turns an integer column with a null into float64; 2**60, 2**60+1 and 2**60+7 are then one
    double, and every id took the first id's (valid) category.  A float that cannot name one integer is unseen."""
    import numpy as np
    import pandas as pd

    from sparktrain.serve.local import transform_local

    ids = [2 ** 60 + 7, 2 ** 60, 2 ** 60 + 1]
    meta = {"key": None, "label": None, "float_columns": [], "int_columns": ["bigid_ix"],
            "features": [{"name": "bigid_ix", "source": "bigid", "type": "categorical", "encoding": "vocabulary",
                          "source_dtype": "bigint", "vocabulary": [str(i) for i in ids] + ["12"]}]}
    exact = transform_local(pd.DataFrame({"bigid": pd.array(ids + [12, None], dtype="Int64")}), meta)
    assert exact["bigid_ix"].tolist() == [0, 1, 2, 3, 4]  # as trained; a null is the unseen index
    with pytest.warns(UserWarning, match=r"column 'bigid' was trained as integers, but 3 value\(s\) arrived as "
                                         r"floats above 2\*\*53"):
        floats = transform_local(pd.DataFrame({"bigid": [float(i) for i in ids] + [12.0, np.nan]}), meta)
    assert floats["bigid_ix"].tolist() == [4, 4, 4, 3, 4]  # 12.0 is still category 12
