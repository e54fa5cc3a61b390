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
