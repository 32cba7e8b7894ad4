"""The ``sparktrain`` command line.

The same job runs from the console script and through ``spark-submit``::

    sparktrain run conf/job.yaml --master local[2] --set train.epochs=2
    spark-submit --jars "$(python -m sparktrain.jvm)" "$(python -m sparktrain.jvm --entry)" conf/job.yaml
    # (a bare CONFIG means `run`; from a checkout the script is python/sparktrain/__main__.py)
"""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
import textwrap
from typing import Dict, List, Optional, Sequence

from sparktrain import __version__
from sparktrain.errors import TRIAL_RUN_ID, ConfigError, RunMismatchError, SparktrainError, TrainingError

log = logging.getLogger("sparktrain")

_EPILOG = """examples:
  sparktrain run conf/job.yaml                           # the whole job: features, training, MLflow
  sparktrain run conf/job.yaml --set train.epochs=1      # override any key
  spark-submit --jars "$(python -m sparktrain.jvm)" "$(python -m sparktrain.jvm --entry)" conf/job.yaml
                                                         # the same job (a bare CONFIG means run)
  sparktrain profile conf/job.yaml --master local[2]     # rows, label classes or moments, null counts
  sparktrain preprocess conf/job.yaml                    # features only, written to Parquet
  sparktrain preprocess conf/job.yaml --set data.source=other.csv  # any key, e.g. another input
  sparktrain tune conf/job.yaml                          # hyperparameter search (needs a tune: section)
  sparktrain score --model models:/my-job@champion --input raw.parquet --output scored.parquet
  sparktrain score --model models:/my-job@champion --table sales.new_orders --output scored.parquet
  sparktrain mlflow-server                               # MLflow UI/server on 127.0.0.1:5000
"""


def _add_job_args(p: argparse.ArgumentParser) -> None:
    cmd = p.prog.split()[-1]
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.description = textwrap.fill(p.description or "", 79)
    p.epilog = (f"examples:\n  sparktrain {cmd} conf/job.yaml\n"
                f"  sparktrain {cmd} conf/job.yaml --master local[2] --set data.label=price --set train.epochs=1\n"
                f"  spark-submit --master local[2] --jars \"$(python -m sparktrain.jvm)\" "
                f"\"$(python -m sparktrain.jvm --entry)\" {cmd} conf/job.yaml\n"
                f"  (python -m sparktrain.jvm: the listener jar for --jars; --entry: the script spark-submit runs)\n")
    p.add_argument("config", help="job config YAML, e.g. conf/job.yaml")
    p.add_argument("--master", help="Spark master URL (default: config spark.master, else local[*]); "
                                     "ignored when a SparkSession is already active (spark-submit, notebooks)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help="override a config key, value parsed as YAML (repeatable), e.g. --set train.epochs=2")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for docs and tests)."""
    parser = argparse.ArgumentParser(
        prog="sparktrain",
        description="Data-parallel deep learning on Spark: preprocess features out of core, stream Parquet "
                    "into Keras/PyTorch, train across executors in barrier mode, search with Hyperopt, "
                    "track and register in MLflow, score as a Spark Transformer.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"sparktrain {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("run", help="run the whole job in a config (profile, features, train, tune, track)",
                       description="Run every stage the config defines: load and profile the data, "
                                   "preprocess features to Parquet, train across executors, tune when a "
                                   "tune: section exists, and record it all in MLflow.")
    _add_job_args(p)
    p = sub.add_parser("profile", help="load the data and print rows, label classes or moments, null counts",
                       description="Load data.source, data.table or data.query and print a one-pass profile: "
                                   "rows, per-class counts of a class label or mean/std/min/max of a float "
                                   "label, and null counts per column.")
    _add_job_args(p)
    p = sub.add_parser("preprocess", help="fit the feature pipeline and write train/validation/test Parquet",
                       description="Compile features: into a Spark ML Pipeline, fit it on the train split "
                                   "and materialize all splits to output.path atomically, with a manifest "
                                   "and features.json.")
    _add_job_args(p)
    p = sub.add_parser("train", help="train on an already materialized dataset (output.path)",
                       description="Train the train: section's model in a Spark barrier stage.")
    _add_job_args(p)
    p.add_argument("--resume", metavar="RUN_ID", default=None,
                   help="resume a failed or stopped training run from its last checkpoint in train.store (the "
                        "run id its error printed); the same config, overrides and dataset")
    p = sub.add_parser("tune", help="search hyperparameters with Hyperopt or Optuna (needs a tune: section)",
                       description="Run the tune: section's search: single-task trials "
                                   "(mode: single) or distributed trials (mode: distributed); with "
                                   "engine: optuna, pruned by pruner: and continued when rerun.")
    _add_job_args(p)

    p = sub.add_parser("score", help="score raw rows (any data: format, a table or a query) with a registered "
                                      "model, write Parquet",
                       description="Load an MLflow model (e.g. models:/NAME@champion) and score raw rows "
                                   "in Spark; the model carries its own feature pipeline. The input is read "
                                   "as data: reads it: by default with the format and reader options the model "
                                   "was trained with.")
    p.add_argument("--model", required=True, help="MLflow model URI, e.g. models:/my-job@champion")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--input", help="raw input: a file or folder (parquet, csv, json or orc)")
    src.add_argument("--table", help="raw input: a catalog table or view, e.g. sales.orders")
    src.add_argument("--query", help="raw input: Spark SQL over the catalog's tables and views")
    p.add_argument("--output", required=True, help="where to write the scored Parquet")
    p.add_argument("--format", choices=["parquet", "csv", "json", "orc"],
                   help="input format (default: the model's data.format, else by extension)")
    p.add_argument("--option", action="append", default=[], dest="options", metavar="KEY=VALUE",
                   help="a Spark reader option for the input, over the model's data.options, e.g. "
                        "--option nullValue=NA --option sep=';' (CSV: header=true, inferSchema=true unless given)")
    p.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (default: sqlite:///work/mlflow.db)")
    p.add_argument("--master", help="Spark master URL (default local[*])")

    p = sub.add_parser("register", help="log and register a model kept in the store (after a tracking outage)",
                       description="Finish the MLflow tracking of a trained model that the training store kept "
                                   "when the tracking server was down: metrics, plots, the model, its registry "
                                   "version and the alias rules, into the run the job had started.")
    p.add_argument("--from-store", required=True, dest="from_store", metavar="RUN_DIR",
                   help="the run folder the failed job printed, e.g. work/store/<run id>")
    p.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (default: the job config's)")
    p.add_argument("--master", help="Spark master URL (default local[*])")

    p = sub.add_parser("mlflow-server", help="start a real MLflow tracking server on 127.0.0.1",
                       description="Start `mlflow server` bound to 127.0.0.1 with a sqlite backend and an "
                                   "artifact root under work/. Open the printed URL for the UI.")
    p.add_argument("--port", type=int, default=5000)
    p.add_argument("--backend-store-uri", default="sqlite:///work/mlflow.db")
    p.add_argument("--artifacts-destination", default="work/mlartifacts")
    return parser


def _options(items: List[str]) -> Dict[str, str]:
    """``["k=v", ...]`` -> ``{k: v}`` (a ConfigError names a malformed one)."""
    from sparktrain.errors import ConfigError

    out: Dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError("--option", item, "use KEY=VALUE, e.g. --option nullValue=NA")
        out[key.strip()] = value
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Console-script entry point. Returns the process exit code."""
    parser = build_parser()
    argv = list(argv) if argv is not None else sys.argv[1:]
    if argv and argv[0].endswith((".yaml", ".yml")):  # `sparktrain conf/job.yaml` means `run`
        argv = ["run", *argv]
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    from sparktrain._internal.log_masking import install_log_masking

    install_log_masking()  # every handler basicConfig made: sparktrain's records and every library's
    for noisy in ("py4j", "urllib3", "alembic", "matplotlib", "hyperopt", "mlflow.store", "git"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return _dispatch(args)
    except SparktrainError as exc:
        from sparktrain._internal.secrets import mask_value

        text = mask_value(str(exc))  # an error may quote a URI or a config value
        log.debug("%s: %s", type(exc).__name__, text)  # the error once on stderr, not also as a log record
        print(f"error: {text}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # the stages cancel their Spark jobs on the way out; one line, not a traceback
        print(f"interrupted: sparktrain {args.command} stopped by Ctrl-C", file=sys.stderr)
        return 130


def _dispatch(args: argparse.Namespace) -> int:
    from sparktrain import job

    if args.command == "mlflow-server":
        from sparktrain.track.server import serve_forever
        return serve_forever(port=args.port, backend_store_uri=args.backend_store_uri,
                             artifacts_destination=args.artifacts_destination)
    if args.command == "register":
        return job.register_command(args.from_store, tracking_uri=args.tracking_uri, master=args.master)
    if args.command == "score":
        return job.score_command(model_uri=args.model, input_path=args.input, output_path=args.output,
                                 fmt=args.format, tracking_uri=args.tracking_uri, master=args.master,
                                 options=_options(args.options), table=args.table, query=args.query)
    from sparktrain.config import load_config
    cfg = load_config(args.config, overrides=args.overrides)  # validated before any Spark work
    stages: List[str] = {
        "run": ["profile", "preprocess", "train", "tune"],
        "profile": ["profile"],
        "preprocess": ["preprocess"],
        "train": ["train"],
        "tune": ["tune"],
    }[args.command]
    resume = getattr(args, "resume", None)
    try:
        job.run_job(cfg, stages=stages, master=args.master, resume=resume)
    except RunMismatchError as exc:  # the Python API's wording (runId, fit()) says nothing to a shell user
        if resume is None:
            raise
        raise ConfigError("--resume", resume, f"run {resume} was trained on other data or settings "
                                              f"({'; '.join(exc.changes)}): resume it with its own --set values "
                                              f"and dataset, or drop --resume to train a new run") from None
    except TrainingError as exc:  # how to resume it from the command line
        if exc.run_id and args.command in ("run", "train") and not TRIAL_RUN_ID.fullmatch(exc.run_id):
            sets = "".join(f" --set {shlex.quote(o)}" for o in args.overrides)
            text = str(exc.args[0] if exc.args else exc)  # the API's "fit again with runId=" means the CLI line
            text = text.replace(f"fit again with runId={exc.run_id!r}", "run the resume: command below")
            exc.args = (f"{text}\nresume: sparktrain train {shlex.quote(args.config)}{sets} --resume {exc.run_id}",)
        raise
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
