"""Every kind of input a Spark ETL user has: files with reader options, catalog tables, SQL; and their errors."""

from __future__ import annotations

import pytest
from sparktrain.config import DataConfig, parse_config
from sparktrain.errors import ConfigError, DatasetNotFoundError

ROWS = [(1, "Lima", 10.5, "good"), (2, "Oslo", None, "fair"), (3, None, 7.25, "good"), (4, "Rome", 3.0, None)]
SCHEMA = "id long, city string, price double, grade string"


@pytest.fixture(scope="module")
def houses(spark):
    return spark.createDataFrame(ROWS, SCHEMA)


def _same(df, expected):
    got = df.select(*expected.columns)
    assert got.exceptAll(expected).count() == 0 and expected.exceptAll(got).count() == 0


def test_csv_with_na_nulls_and_a_semicolon_through_data_options(spark, tmp_path, houses):
    from sparktrain.features.load import load_input

    path = tmp_path / "houses.csv"
    lines = ["id;city;price;grade"] + [";".join("NA" if v is None else str(v) for v in r) for r in ROWS]
    path.write_text("\n".join(lines) + "\n")
    df = load_input(spark, DataConfig(source=str(path), format="csv", options={"delimiter": ";", "nullValue": "NA"}))
    # header and inferSchema are CSV's defaults: names from the header, numbers as numbers, NA as null
    assert df.dtypes == [("id", "int"), ("city", "string"), ("price", "double"), ("grade", "string")]
    _same(df, houses.selectExpr("CAST(id AS INT) AS id", "city", "price", "grade"))
    # the user's options win over the defaults
    raw = load_input(spark, DataConfig(source=str(path), format="csv", options={"sep": ";", "inferSchema": False}))
    assert dict(raw.dtypes)["price"] == "string" and raw.where("price = 'NA'").count() == 1


def test_a_tab_separated_file_read_as_csv_names_the_separator(spark, tmp_path, houses):
    """Read with CSV's comma, a TSV is one column named by its whole header: the error says which separator."""
    from sparktrain.errors import MissingColumnError
    from sparktrain.features.load import load_input
    from sparktrain.features.spec import parse_feature
    from sparktrain.features.validate import check_schema

    path = tmp_path / "houses.tsv"
    path.write_text("id\tcity\tprice\tgrade\n" + "".join(f"{r[0]}\t{r[1]}\t{r[2]}\t{r[3]}\n" for r in ROWS))
    df = load_input(spark, DataConfig(source=str(path), format="csv"))
    with pytest.raises(MissingColumnError) as info:
        check_schema(df.schema, [parse_feature({"name": "price", "type": "numeric"}, "features[0]")], label="grade")
    assert "Column 'id\\tcity\\tprice\\tgrade' holds it between '\\t': the file's separator is probably '\\t' " \
           "(CSV reader option sep, e.g. --option sep='\\t' or data.options: {sep: '\\t'})" in str(info.value)
    fixed = load_input(spark, DataConfig(source=str(path), format="csv", options={"sep": "\\t"}))  # as YAML gives it
    types = check_schema(fixed.schema, [parse_feature({"name": "grade", "type": "categorical"}, "features[0]")],
                         label="grade")
    assert list(types) == ["id", "city", "price", "grade"]


def test_a_duplicate_csv_header_and_a_macos_header_say_why_the_column_is_missing(spark, tmp_path):
    """Probe M: Spark renames a header name given twice to name + position (x1, x2), and a macOS export writes
    'é' as 'e' + accent (NFD): both gave a bare "not in the input" or a "did you mean" showing the same name."""
    import unicodedata

    from sparktrain.errors import MissingColumnError
    from sparktrain.features.load import load_input
    from sparktrain.features.spec import parse_feature
    from sparktrain.features.validate import check_schema

    nfd = unicodedata.normalize("NFD", "catégorie")
    path = tmp_path / "dup.csv"
    path.write_text(f"id,x,x,{nfd},label\n1,2.0,3.0,a,0\n2,4.0,5.0,b,1\n", encoding="utf-8")
    df = load_input(spark, DataConfig(source=str(path), format="csv"))
    assert df.columns == ["id", "x1", "x2", nfd, "label"]  # Spark's own renaming, which the hint explains
    with pytest.raises(MissingColumnError) as dup:
        check_schema(df.schema, [parse_feature({"name": "x", "type": "numeric"}, "features[0]")], label="label")
    assert "The input's header holds 'x' more than once: Spark's CSV reader renamed the copies x1, x2 " \
           "(name + column position)" in str(dup.value)
    own = MissingColumnError("sensor", ["sensor1", "sensor2", "label"], "the input")  # the data's own names
    assert "more than once" not in str(own) and "Did you mean 'sensor2'?" in str(own)
    with pytest.raises(MissingColumnError) as form:
        check_schema(df.schema, [parse_feature({"name": "catégorie", "type": "categorical"}, "features[0]")],
                     label="label")
    assert "has the same letters in another Unicode form (not NFC: e.g. NFD" in str(form.value)
    assert "Did you mean" not in str(form.value)


def test_a_latin1_csv_read_as_utf8_warns_with_the_encoding_option(spark, tmp_path, caplog):
    """Probe M: a Latin-1 file read as UTF-8 gave categories 'Orl\ufffdans', 'K\ufffdln' with no word (letters that
    differ only there collapse into one category)."""
    import logging

    from sparktrain.features.load import load_input
    from sparktrain.features.materialize import _warn_lookalike_categories

    path = tmp_path / "cities.csv"
    path.write_bytes("city,y\nOrléans,1\nKöln,0\nLyon,1\n".encode("latin-1"))
    read = sorted(r.city for r in load_input(spark, DataConfig(source=str(path), format="csv")).collect())
    assert read == ["K\ufffdln", "Lyon", "Orl\ufffdans"]  # Spark's UTF-8 decoder, as a user gets it
    with caplog.at_level(logging.WARNING, logger="sparktrain.features.materialize"):
        _warn_lookalike_categories([{"name": "city_ix", "source": "city", "type": "categorical", "vocabulary": read}])
    assert "feature 'city_ix' (column 'city') has 2 categories holding U+FFFD" in caplog.text
    assert "data.options: {encoding: ISO-8859-1}" in caplog.text
    fixed = load_input(spark, DataConfig(source=str(path), format="csv", options={"encoding": "ISO-8859-1"}))
    assert sorted(r.city for r in fixed.collect()) == ["Köln", "Lyon", "Orléans"]  # the fix the warning names


def test_a_csv_with_doubled_quotes_warns_with_the_escape_option(spark, tmp_path, caplog):
    """Probe M: pandas, Excel and Python's csv double the quotes inside a quoted field (RFC 4180); Spark's reader
    (escape: a backslash) kept the raw text, outer quotes included, as a category, with no word."""
    import csv
    import logging

    from sparktrain.features.load import load_input
    from sparktrain.features.materialize import _warn_lookalike_categories

    path = tmp_path / "quotes.csv"
    with open(path, "w", newline="") as fh:
        csv.writer(fh).writerows([["note", "y"], ['say "hi"', 1], ["plain", 0]])
    read = sorted(r.note for r in load_input(spark, DataConfig(source=str(path), format="csv")).collect())
    assert read == ['"say ""hi"""', "plain"]
    with caplog.at_level(logging.WARNING, logger="sparktrain.features.materialize"):
        _warn_lookalike_categories([{"name": "note", "source": "note", "type": "categorical", "vocabulary": read}])
    said = " ".join(r.getMessage() for r in caplog.records)  # not caplog.text: a JSON log format escapes quotes
    assert "feature 'note' (column 'note') has categories that keep a CSV's quoting" in said
    assert "data.options: {escape: '\"'}" in said
    fixed = load_input(spark, DataConfig(source=str(path), format="csv", options={"escape": '"'}))
    assert sorted(r.note for r in fixed.collect()) == ["plain", 'say "hi"']  # the fix the warning names


@pytest.mark.parametrize("fmt", ["json", "orc", "parquet"])
def test_json_orc_and_parquet_files(spark, tmp_path, houses, fmt):
    from sparktrain.features.load import load_input

    houses.write.format(fmt).save(str(tmp_path / fmt))
    df = load_input(spark, DataConfig(source=str(tmp_path / fmt), format=fmt))  # type: ignore[arg-type]
    _same(df, houses)


def test_a_catalog_table_and_a_query_through_materialize(spark, tmp_path, houses):
    from sparktrain.features.materialize import materialize

    houses.write.mode("overwrite").saveAsTable("houses_tbl")
    spark.createDataFrame([("Lima", "PE"), ("Oslo", "NO"), ("Rome", "IT")], "city string, country string") \
        .createOrReplaceTempView("cities_view")
    features = [{"name": "city", "type": "categorical"}, {"name": "price", "type": "numeric", "impute": "median"}]
    table = parse_config({"name": "t", "data": {"table": "houses_tbl", "label": "grade", "key": "id"},
                          "features": features, "output": {"path": str(tmp_path / "t")}})
    result = materialize(spark, table)
    assert sum(result.row_counts.values()) == 3  # the null grade is dropped
    assert result.features["dataset"]["source"] == "table houses_tbl"
    assert result.features["label"]["vocabulary"] == ["fair", "good"]

    query = ("SELECT h.id, c.country, h.price, h.grade FROM houses_tbl h JOIN cities_view c ON h.city = c.city "
             "WHERE h.grade IS NOT NULL")
    cfg = parse_config({"name": "q", "data": {"query": query, "label": "grade", "key": "id"},
                        "features": [{"name": "country", "type": "categorical"},
                                     {"name": "price", "type": "numeric", "impute": "median"}],
                        "output": {"path": str(tmp_path / "q")}})
    result = materialize(spark, cfg)
    assert sum(result.row_counts.values()) == 2  # ids 1 and 2: id 3 has no city, id 4 no grade
    assert result.features["dataset"]["source"].startswith("query SELECT h.id, c.country")


def test_a_missing_table_lists_the_catalogs_tables_and_writes_nothing(spark, tmp_path, houses):
    from sparktrain.features.materialize import materialize

    houses.write.mode("overwrite").saveAsTable("houses_listed")
    houses.createOrReplaceTempView("houses_view")
    cfg = parse_config({"data": {"table": "houses_lsited", "label": "grade"},
                        "features": [{"name": "price", "type": "numeric"}], "output": {"path": str(tmp_path / "o")}})
    with pytest.raises(ConfigError) as info:
        materialize(spark, cfg)
    msg = str(info.value)
    assert msg.startswith("config key 'data.table' = 'houses_lsited': no such table or view in the catalog "
                          "(tables and views: ")
    assert "default.houses_listed" in msg and "houses_view" in msg and "df.write.saveAsTable" in msg
    assert list(tmp_path.iterdir()) == []


def test_query_errors_name_data_query_and_the_tables(spark, houses):
    from sparktrain.features.load import load_input

    houses.createOrReplaceTempView("houses_q")
    with pytest.raises(ConfigError) as info:
        load_input(spark, DataConfig(query="SELECT * FROM no_such_thing"))
    msg = str(info.value)
    assert msg.startswith("config key 'data.query' = 'SELECT * FROM no_such_thing': Spark cannot run it: "
                          "[TABLE_OR_VIEW_NOT_FOUND]")
    assert "Tables and views the query can use: " in msg and "houses_q" in msg


def test_reader_errors_carry_the_config_key(spark, tmp_path):
    from sparktrain.features.load import load_input

    (tmp_path / "a.csv").write_text("a;b\n1;2\n")
    with pytest.raises(ConfigError, match=(r"config key 'data.options' = \{'sep': ''\}: Spark cannot read '.*a.csv' "
                                           r"as csv: Delimiter cannot be empty. Fix data.format or data.options$")):
        load_input(spark, DataConfig(source=str(tmp_path / "a.csv"), format="csv", options={"sep": ""}))
    with pytest.raises(ConfigError, match=r"config key 'data.options' = \{'encoding': 'nope'\}: .*charset"):
        load_input(spark, DataConfig(source=str(tmp_path / "a.csv"), format="csv", options={"encoding": "nope"}))
    with pytest.raises(DatasetNotFoundError, match=r"data.source '.*nope.parquet' does not exist. Fix the path"):
        load_input(spark, DataConfig(source=str(tmp_path / "nope.parquet")))
    # a Java failure (py4j): Spark's own reason, not "An error occurred while calling o54.parquet"
    with pytest.raises(ConfigError) as info:
        load_input(spark, DataConfig(source=str(tmp_path / "a.csv"), format="parquet")).count()
    assert str(info.value).startswith(f"config key 'data.source' = '{tmp_path / 'a.csv'}': Spark cannot read "
                                      f"'{tmp_path / 'a.csv'}' as parquet: SparkException: "
                                      f"[FAILED_READ_FILE.CANNOT_READ_FILE_FOOTER] Encountered error while reading "
                                      f"file file:{tmp_path / 'a.csv'}")


def test_no_input_is_refused_before_any_job(spark):
    from sparktrain.features.load import load_input

    with pytest.raises(ConfigError, match=r"config key 'data.source' = None: no input data"):
        load_input(spark, DataConfig())


def test_error_summary_gives_sparks_reason_not_py4js_wrapper():
    from sparktrain._internal.spark_compat import error_summary

    wrapped = ("An error occurred while calling o54.load.\n: org.apache.spark.SparkException: [X.Y] bad footer.\n"
               "\tat org.apache.spark.Foo.bar(Foo.scala:1)\n")
    assert error_summary(wrapped) == "SparkException: [X.Y] bad footer"
    assert error_summary("An error occurred while calling o54.load.\n: java.io.IOException: disk") == \
        "IOException: disk"
    assert error_summary("plain first line.\nsecond") == "plain first line"
    assert error_summary("x" * 500, limit=10) == "x" * 10 + "..."
    assert error_summary(ValueError()) == "ValueError"
    # typed: the type first (the form every message quoting an exception uses); a message that starts with a
    # blank line still gives its first real line, where the old `splitlines()[0]` gave ""
    assert error_summary(OSError("\n  disk full.\nmore"), 300, typed=True) == "OSError: disk full"
    assert error_summary(KeyError(), typed=True) == "KeyError" and error_summary("text", typed=True) == "text"


def test_a_source_spark_has_no_filesystem_for_names_the_connector_not_the_format(spark):
    """data.source s3a:// (or gs://) in a Spark without the connector: the error names the missing Hadoop
    filesystem and the package to add, not 'fix data.format' (the format is not the problem)."""
    from sparktrain.errors import ConfigError
    from sparktrain.features.load import load_input
    from sparktrain.features.sections import DataConfig

    for uri, connector in (("s3a://bucket/raw/", "hadoop-aws"), ("gs://bucket/raw/", "GCS connector")):
        with pytest.raises(ConfigError) as err:
            load_input(spark, DataConfig(source=uri, format="parquet", label="y"))
        text = str(err.value)
        assert (err.value.path, err.value.value) == ("data.source", uri), text
        assert f"Spark has no Hadoop filesystem for {uri.split(':')[0]}:// URIs" in text and connector in text, text
        assert "Fix data.format" not in text and "An error occurred while calling" not in text
