"""The dataset zoo's raw files: datasets bundled in installed packages, written as CSV or Parquet.

Shared by ``tests/test_zoo.py`` and ``bench/zoo.py``; nothing here is part of the
library.  The data ship inside installed packages: scikit-learn's
(``sklearn/datasets/data``) and ``dmba``'s (the data of *Data Mining for
Business Analytics*, ``dmba/csvFiles``, pinned in
``python/requirements-data.lock``), so nothing is downloaded.  Each dataset is written
the way such data arrive, so each one takes a different path through the
product, with one config per dataset under ``conf/examples/``:

======== ============== ===================================================
dataset  file           label and quirks
======== ============== ===================================================
iris     CSV            ``species`` as names (setosa...), ``NA`` nulls in
                        features and in two labels, no key column
wine     Parquet        ``cultivar`` as the integers 1, 2, 3, key ``id``
cancer   Parquet        ``malignant`` as a boolean, no key column
diabetes CSV, ``;``     ``progression`` (regression; whole numbers in the CSV, so
                        Spark infers an integer and the config sets
                        ``train.task: regression``), key ``id``
autos    Parquet        ``newsgroup`` (rec.autos or sci.electronics) from the
                        post's text ``article`` (subject and body; the headers,
                        which name the newsgroup, are cut), key ``id``: a
                        ``text`` feature (dmba's ``AutoAndElectronics.zip``)
catalog  Parquet        ``housewares`` (bought from that division, a boolean)
                        from ``divisions`` (the other divisions the customer
                        bought from, ``|``-joined): a ``set`` feature (dmba's
                        ``CatalogCrossSell``), key ``customer``
======== ============== ===================================================
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, List, NamedTuple

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "conf" / "examples"


class ZooDataset(NamedTuple):
    name: str            # conf/examples/<name>.yaml, and the registered model's name (zoo-<name>)
    loader: str          # sklearn.datasets.load_<loader>
    file: str            # raw file name under the data root
    label: str
    task: str            # binary, multiclass or regression
    metric: str          # the test metric the bench reports and the goal applies to
    goal: float          # the bench's goal for ``metric``
    score_options: Dict[str, str]  # `sparktrain score --option` for the raw file


ZOO: Dict[str, ZooDataset] = {d.name: d for d in [
    ZooDataset("iris", "iris", "iris.csv", "species", "multiclass", "test_accuracy", 0.90, {"nullValue": "NA"}),
    ZooDataset("wine", "wine", "wine.parquet", "cultivar", "multiclass", "test_accuracy", 0.90, {}),
    ZooDataset("breast_cancer", "breast_cancer", "breast_cancer.parquet", "malignant", "binary",
               "test_accuracy", 0.93, {}),
    ZooDataset("diabetes", "diabetes", "diabetes.csv", "progression", "regression", "test_r2", 0.35,
               {"sep": ";"}),
    ZooDataset("autos", "dmba:AutoAndElectronics.zip", "autos.parquet", "newsgroup", "binary", "test_accuracy",
               0.90, {}),
    ZooDataset("catalog", "dmba:CatalogCrossSell", "catalog.parquet", "housewares", "binary", "test_accuracy",
               0.65, {}),
]}
#: dmba datasets: the raw columns each one's file holds besides the key and the label
DMBA_COLUMNS = {"autos": ["article"], "catalog": ["divisions"]}


def column_name(feature: str) -> str:
    """sklearn's feature name as an identifier: ``sepal length (cm)`` -> ``sepal_length_cm``."""
    return re.sub(r"[^0-9a-zA-Z]+", "_", str(feature)).strip("_").lower()


def feature_columns(name: str) -> List[str]:
    """The raw feature columns of dataset ``name`` (as the raw file and its config name them)."""
    from sklearn import datasets

    if name in DMBA_COLUMNS:
        return list(DMBA_COLUMNS[name])
    bunch = getattr(datasets, f"load_{ZOO[name].loader}")()
    return [column_name(f) for f in bunch.feature_names]


def _dmba_frame(name: str):
    """autos and catalog from dmba's bundled files."""
    import zipfile

    import numpy as np
    import pandas as pd
    from importlib.resources import files

    spec = ZOO[name]
    data = files("dmba").joinpath("csvFiles")
    if name == "autos":
        rows = []
        with zipfile.ZipFile(str(data.joinpath("AutoAndElectronics.zip"))) as z:
            for entry in sorted(n for n in z.namelist() if not n.endswith("/")):
                post = z.read(entry).decode("latin-1")
                head, _, body = post.partition("\n\n")  # the headers name the newsgroup: keep the subject only
                subject = next((h[len("Subject:"):].strip() for h in head.splitlines() if h.startswith("Subject:")),
                               "")
                rows.append((subject + "\n" + body, entry.split("/")[-2]))
        df = pd.DataFrame(rows, columns=["article", spec.label])
        df.insert(0, "id", np.arange(1, len(df) + 1, dtype="int64"))
        return df
    raw = pd.read_csv(str(data.joinpath("CatalogCrossSell.csv.gz")))
    others = [c for c in raw.columns if c.endswith("Division") and c != "Housewares Division"]
    names = [c[:-len(" Division")].lower() for c in others]
    bought = raw[others].to_numpy() == 1
    return pd.DataFrame({"customer": raw["Customer Number"].astype("int64"),
                         "divisions": ["|".join(n for n, b in zip(names, row) if b) for row in bought],
                         spec.label: raw["Housewares Division"].to_numpy() == 1})


def frame(name: str):
    """Dataset ``name`` as a pandas DataFrame, exactly as its raw file holds it (``None`` = null)."""
    import numpy as np
    import pandas as pd
    from sklearn import datasets

    spec = ZOO[name]
    if name in DMBA_COLUMNS:
        return _dmba_frame(name)
    # diabetes in its raw units (age in years, sex 1/2, ...), not sklearn's pre-scaled copy
    bunch = getattr(datasets, f"load_{spec.loader}")(**({"scaled": False} if name == "diabetes" else {}))
    df = pd.DataFrame(bunch.data, columns=[column_name(f) for f in bunch.feature_names])
    target = np.asarray(bunch.target)
    if name == "iris":
        df[spec.label] = [str(bunch.target_names[t]) for t in target]
        # nulls as they come in CSV exports: every 7th row loses one feature (a different one each
        # time), and two rows lose their label (the job drops them and logs the count)
        df = df.astype(object)
        for i in range(0, len(df), 7):
            df.iat[i, (i // 7) % 4] = None
        df.loc[[5, 77], spec.label] = None
    elif name == "wine":
        df.insert(0, "id", np.arange(1, len(df) + 1, dtype="int64"))
        df[spec.label] = (target + 1).astype("int32")          # cultivars 1, 2, 3
    elif name == "breast_cancer":
        df[spec.label] = target == 0                             # sklearn: 0 = malignant, 1 = benign
    elif name == "diabetes":
        df.insert(0, "id", np.arange(1, len(df) + 1, dtype="int64"))
        df[spec.label] = target.astype("float64")
    return df


def write(name: str, root: Path) -> Path:
    """Write dataset ``name``'s raw file under ``root`` (once) and return its path."""
    spec = ZOO[name]
    path = Path(root) / spec.file
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    df = frame(name)
    tmp = path.with_name(path.name + ".tmp")
    if spec.file.endswith(".csv"):
        sep = spec.score_options.get("sep", ",")
        df.to_csv(tmp, sep=sep, index=False, na_rep="NA", float_format="%.6g")
    else:
        df.to_parquet(tmp, index=False)
    tmp.rename(path)
    return path


def config(name: str) -> Path:
    """``conf/examples/<name>.yaml``."""
    return EXAMPLES / f"{name}.yaml"


def main() -> None:
    """``python bench/zoo_data.py [NAME ...] [--root work/zoo/raw]``: write the raw files."""
    import argparse

    p = argparse.ArgumentParser(description="Write the dataset zoo's raw files (data bundled in installed packages).")
    p.add_argument("names", nargs="*", default=[], metavar="NAME",
                   help=f"datasets to write (default all: {', '.join(ZOO)})")
    p.add_argument("--root", default="work/zoo/raw", help="folder for the raw files (default work/zoo/raw)")
    args = p.parse_args()
    unknown = [n for n in args.names if n not in ZOO]
    if unknown:
        p.error(f"unknown dataset {unknown[0]!r}; choose from {', '.join(ZOO)}")
    for name in args.names or list(ZOO):
        print(write(name, Path(args.root)))


if __name__ == "__main__":
    main()
