"""Hostile concept catalogs (docs/security.md): every malformed CSV row is a CatalogError naming
the file, the line (and column where there is one) and the row; never a `_csv.Error` traceback,
never a concept named 'None', never a row swallowed into another's field."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from penrose_zoo.steerling.catalog import MAX_FIELD, CatalogError, ConceptCatalog

ROOT = Path(__file__).resolve().parents[2]
HEADER = "concept_id,name,description,head,group_id,group_name,is_steerable,is_tone,is_alignment,is_demographic\n"
GOOD = "0,cats,Domestic cats,known,1,animals,true,false,false,false\n"


def _load(tmp_path, body, name="c.csv"):
    p = tmp_path / name
    p.write_bytes(body if isinstance(body, bytes) else body.encode("utf-8"))
    return ConceptCatalog.load(p)


@pytest.mark.parametrize("body, message", [
    (HEADER + GOOD + "1\n", r"c.csv:3: row 2 has 1 field\(s\), the header 10 \(missing: name, description"),
    (HEADER + GOOD + "1,dogs\n", r"c.csv:3: row 2 has 2 field\(s\)"),
    (HEADER + GOOD + "1,dogs,,known,,,,,,,extra\n", r"c.csv:3: row 2 has 11 field\(s\), the header 10 \(1 extra\)"),
    (HEADER + '1,"dogs,barks,known,,,,,,\n' + GOOD, r"c.csv:2:3: row 1 \(column 2\): a quote opened here is never closed"),
    (HEADER + '1,"dogs,barks,known,,,,,,\n2,sea,"The ocean",known,,,,,,\n',
     r"c.csv:3:\d+: row 1 \(column 2\): text after the closing quote"),
    (HEADER + '1,"dogs,barks,known,,,,,,\n2,sea,",known,,,,,,\n', r"c.csv:2: row 1, column 'name' holds a line break"),
    (HEADER + '1,do"gs,,known,,,,,,\n', r"c.csv:2:5: row 1 \(column 2\): a quote inside an unquoted field"),
    (HEADER + "1," + "x" * 200_000 + ",,known,,,,,,\n", rf"c.csv:2: row 1 \(column 2\): a field of 200,000 characters, over the limit of {MAX_FIELD:,}"),
    (HEADER + GOOD + "0,dogs,,known,,,,,,\n", r"c.csv:3: row 2: known concept id 0 appears twice \(first at .*c.csv:2: row 1\)"),
    (HEADER + GOOD + "1,cats,,known,,,,,,\n", r"c.csv:3: row 2: known concept name 'cats' appears twice"),
    (HEADER + GOOD + "1,,,known,,,,,,\n", r"c.csv:3: row 2: name is empty; every concept needs a name"),
    (HEADER + GOOD + ",dogs,,known,,,,,,\n", r"c.csv:3: row 2: concept_id is empty"),
    (HEADER + "1,None\x00,,known,,,,,,\n", r"c.csv:2: row 1 \(column 2\): a NUL character"),
    ("concept_id,name,name\n0,a,b\n", r"the header names column 'name' twice"),
])
def test_malformed_rows(tmp_path, body, message):
    with pytest.raises(CatalogError, match=message):
        _load(tmp_path, body)


def test_non_utf8_bytes_are_positioned(tmp_path):
    with pytest.raises(CatalogError, match=r"c.csv:3:4: cannot read the catalog: .*not UTF-8"):
        _load(tmp_path, (HEADER + GOOD).encode() + b"1,d\xffgs,,known,,,,,,\n")


def test_a_row_holding_only_an_id_is_not_a_concept_named_none(tmp_path):
    with pytest.raises(CatalogError, match="row 2 has 1 field"):
        _load(tmp_path, HEADER + GOOD + "7\n")


def test_the_same_name_in_both_heads_and_quoted_descriptions_over_lines_are_fine(tmp_path):
    cat = _load(tmp_path, HEADER + GOOD + '0,cats,"Cats,\nover two lines ""quoted""",unknown,,,,,,\r\n'
                + "2,sea,,known,,,,,,\n\n")
    assert [c.name for c in cat] == ["cats", "sea", "cats"]
    assert cat.get(0, head="unknown").description == 'Cats,\nover two lines "quoted"'
    assert cat.lookup("sea").concept_id == 2


def test_line_numbers_count_quoted_line_breaks(tmp_path):
    body = HEADER + '0,cats,"a\nb\nc",known,,,,,,\n1,dogs,,known,,,,,,\n2\n'
    with pytest.raises(CatalogError, match=r"c.csv:6: row 3 has 1 field"):
        _load(tmp_path, body)


def test_the_cli_reports_a_bad_catalog_without_a_traceback(tmp_path):
    p = tmp_path / "c.csv"
    p.write_text(HEADER + "1," + "x" * 200_000 + ",,known,,,,,,\n")
    run = subprocess.run([sys.executable, "-m", "penrose.cli", "steerling", "concepts", "--catalog", str(p), "--search", "x"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "Traceback" not in run.stderr and "_csv.Error" not in run.stderr
    assert "over the limit" in run.stderr


@pytest.mark.parametrize("body, message", [
    # issue 37: each of these was read as a concept
    (HEADER + "1,\u200b,,known,,,,,,\n", r"c.csv:2: row 1: name is '\\u200b', which shows nothing"),  # a zero-width space
    (HEADER + "1,\u200b\u2060\ufeff ,,known,,,,,,\n", r"row 1: name is .*, which shows nothing"),
    (HEADER + "1,caf\u00e9,,known,,,,,,\n2,cafe\u0301,,known,,,,,,\n",
     r"c.csv:3: row 2: known concept name 'café' appears twice"),  # NFC and NFD spellings: one name
    (HEADER + "9007199254740993,big,,known,,,,,,\n", r"concept_id is '9007199254740993'; expected a whole number from 0 to 2,147,483,647"),
    (HEADER + "-1,neg,,known,,,,,,\n", r"concept_id is '-1'; expected a whole number from 0 to"),
    (HEADER + "1,ok,,known,-3,,,,,\n", r"group_id is '-3'; expected a whole number"),
    (HEADER + "1,cats\x1b]0;owned\x07,,known,,,,,,\n", r"name 'cats\\x1b\]0;owned\\x07' holds the control character '\\x1b'"),
    (HEADER + "1,cats,,known,2,grp\x1b[2K,,,,\n", r"group_name 'grp\\x1b\[2K' holds the control character"),
    (HEADER + "1.5,cats,,known,,,,,,\n", r"concept_id is '1.5'; expected a whole number"),
])
def test_hostile_names_and_ids(tmp_path, body, message):
    with pytest.raises(CatalogError, match=message):
        _load(tmp_path, body)


def test_ids_are_read_exactly_and_names_normalised(tmp_path):
    cat = _load(tmp_path, HEADER + "2147483647,top,,known,,,,,,\n3.0,three,,known,,,,,,\n4,cafe\u0301,,known,,,,,,\n")
    assert [c.concept_id for c in cat] == [3, 4, 2147483647]  # never through a float (2**53 + 1 rounded)
    assert cat.lookup("cafe\u0301").concept_id == 4 and cat.lookup("caf\u00e9").name == "caf\u00e9"


def test_a_damaged_parquet_file_is_a_catalog_error(tmp_path):
    p = tmp_path / "c.parquet"
    p.write_bytes(b"PAR1" + b"\x00" * 64)  # (without a parquet engine: the error says what to install)
    with pytest.raises(CatalogError, match=r"c.parquet: (not a readable parquet file|reading parquet needs)"):
        ConceptCatalog.load(p)


@pytest.mark.parametrize("value, message", [
    (True, "concept_id is True; expected a whole number"),  # a boolean column is not an id column
    (float(2**53 + 2), "concept_id is 9007199254740994.0; expected a whole number from 0 to"),
    (float("nan"), "concept_id is empty"),
    (-2, "concept_id is -2; expected a whole number from 0 to"),
])
def test_typed_values_as_parquet_gives_them(value, message):
    from penrose_zoo.steerling.catalog import _concept

    with pytest.raises(CatalogError, match=message):
        _concept({"concept_id": value, "name": "a"}, "c.parquet: row 1")
    assert _concept({"concept_id": 7.0, "name": "a", "is_steerable": True}, "w").concept_id == 7
