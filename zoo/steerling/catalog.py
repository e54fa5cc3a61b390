"""The concept catalog: names, descriptions and groups of a model's concepts, to find a concept
id before steering or explaining.

The release ships its catalog as a parquet table (`concept_labels.parquet`, steerling/concepts.py
in steerling 0.2.0); here a catalog is a labels file, CSV or parquet (parquet needs pandas or
pyarrow), with one row per concept and the columns

    concept_id     int, the concept's index in its head (required)
    name           short label (required; the release's file calls it concept_name)
    description    free text (the release's: concept_description)
    head           known | unknown (default known)
    group_id       int or empty (the release's: public_group_id); group_name
    is_steerable, is_tone, is_alignment, is_demographic
                   flags: true/false, 1/0, yes/no (empty = false)

    >>> cat = ConceptCatalog.load("tests/fixtures/steerling_concepts.csv")   # doctest: +SKIP
    >>> cat.resolve("legal reasoning")                                       # doctest: +SKIP
    3
    >>> [c.name for c in cat.search("court")]                                # doctest: +SKIP

A CSV file is read strictly (`read_csv`): UTF-8 (a byte that is not is reported at its line and
column), fields separated by commas, quoted with `"` (`""` inside a quoted field), every row
as many fields as the header, a field at most `MAX_FIELD` characters, the file at most
`MAX_FILE_BYTES`. A short or long row, a quote never closed or followed by text, an oversized
field, a line break in a field other than `description`, an empty `concept_id` or `name`, an id
or a name (in one head) given twice: each is a `CatalogError` naming the file, the line and
column, the row and the column's name. Nothing is guessed (no concept named 'None').

Lookups: `get(id)` (a `Concept`), `search(text)` (every word of text, case-insensitive, in the
name or the description; name matches rank first), `group(group_id)` (the group's concepts),
`group_of(id)` (the ids of a concept's group, itself first — the release's `group`),
`resolve(name_or_id)` (exact name, else an id; an unknown name is a `CatalogError` with the
nearest names; `lookup` gives the `Concept` itself). Ids are per head: lookups take `head=`; without it an id both heads list means
the known concept (the one steering and --intervene take).
"""

from __future__ import annotations

import difflib
import math
import numbers
import os
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from penrose.errors import PenroseError
from penrose_zoo.validate import is_invisible

__all__ = ["Concept", "ConceptCatalog", "CatalogError", "COLUMNS"]

COLUMNS = ("concept_id", "name", "description", "head", "group_id", "group_name",
           "is_steerable", "is_tone", "is_alignment", "is_demographic")
FLAGS = ("is_steerable", "is_tone", "is_alignment", "is_demographic")
REQUIRED = ("concept_id", "name")
#: the release parquet's column names for ours
ALIASES = {"concept_name": "name", "concept_description": "description", "public_group_id": "group_id"}
HEADS = ("known", "unknown")
MAX_FIELD = 65536  # characters in one CSV field
MAX_FILE_BYTES = 256 << 20  # a catalog file (the release's ~135k concepts take ~20 MB)
MAX_ID = 2**31 - 1  # a concept or group id (an index into a head)


class CatalogError(PenroseError, LookupError):
    """A catalog file that cannot be read, or a concept that is not in it."""


@dataclass(frozen=True)
class Concept:
    """One row of the catalog."""

    concept_id: int
    name: str
    description: str = ""
    head: str = "known"
    group_id: int | None = None
    group_name: str | None = None
    is_steerable: bool = False
    is_tone: bool = False
    is_alignment: bool = False
    is_demographic: bool = False

    def __repr__(self) -> str:
        return f"Concept(id={self.concept_id}, name={self.name!r}, head={self.head!r})"


def _missing(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v)) or (isinstance(v, str) and not v.strip())


def _flag(v, col: str, where: str) -> bool:
    if _missing(v):
        return False
    if isinstance(v, bool) or type(v).__name__ == "bool_":
        return bool(v)
    if isinstance(v, (int, float)) and v in (0, 1):
        return bool(v)
    s = str(v).strip().lower()
    if s in ("true", "t", "1", "yes", "y"):
        return True
    if s in ("false", "f", "0", "no", "n"):
        return False
    raise CatalogError(f"{where}: {col} is {v!r}; expected true/false, 1/0 or yes/no")


def _int(v, col: str, where: str) -> int:
    """A whole number from 0 to MAX_ID: digits read exactly (never through a float, which rounds
    ids past 2⁵³), a float only when it is whole (a parquet column with gaps is float64)."""
    value = None
    if isinstance(v, str):
        t = v.strip()
        if re.fullmatch(r"\+?[0-9]+", t):
            value = int(t)
        elif re.fullmatch(r"\+?[0-9]+\.0*", t):  # "3.0", as a spreadsheet writes it
            value = int(t.split(".")[0])
    elif isinstance(v, bool) or type(v).__name__ == "bool_":
        value = None
    elif isinstance(v, numbers.Integral):
        value = int(v)
    elif isinstance(v, numbers.Real) and math.isfinite(f := float(v)) and f.is_integer() and abs(f) <= 2**53:
        value = int(f)
    if value is None or not 0 <= value <= MAX_ID:
        raise CatalogError(f"{where}: {col} is {v!r}; expected a whole number from 0 to {MAX_ID:,}")
    return value


def _text(v, col: str, where: str) -> str:
    """A name: NFC-normalised (the same name in NFC and NFD is one name), stripped, something
    visible (not only zero-width or format characters), no control character."""
    text = unicodedata.normalize("NFC", str(v)).strip()
    if is_invisible(text):
        raise CatalogError(f"{where}: {col} is {v!r}, which shows nothing; every concept needs a visible {col.replace('_', ' ')}")
    bad = next((ch for ch in text if unicodedata.category(ch) == "Cc"), None)
    if bad is not None:
        raise CatalogError(f"{where}: {col} {v!r} holds the control character {bad!r}")
    return text


def _concept(row: dict, where: str) -> Concept:
    row = {ALIASES.get(k, k): v for k, v in row.items()}
    for col in REQUIRED:
        if _missing(row.get(col)):
            raise CatalogError(f"{where}: {col} is empty; every concept needs a {col.replace('_', ' ')}")
    head = "known" if _missing(row.get("head")) else unicodedata.normalize("NFC", str(row["head"])).strip().lower()
    if head not in HEADS:
        raise CatalogError(f"{where}: head is {row['head']!r}; expected known or unknown")
    gid = row.get("group_id")
    gname = row.get("group_name")
    return Concept(
        concept_id=_int(row["concept_id"], "concept_id", where),
        name=_text(row["name"], "name", where),
        description="" if _missing(row.get("description")) else unicodedata.normalize("NFC", str(row["description"])).strip(),
        head=head,
        group_id=None if _missing(gid) else _int(gid, "group_id", where),
        group_name=None if _missing(gname) else _text(gname, "group_name", where),
        **{f: _flag(row.get(f), f, where) for f in FLAGS},
    )


def _read_rows(path: Path) -> tuple[list[str], Iterable[tuple[str, dict]]]:
    """(column names, (where, row) pairs) of a CSV or parquet file."""
    if path.suffix.lower() in (".parquet", ".pq"):
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise CatalogError(f"{path}: {size:,} bytes, over the limit of {MAX_FILE_BYTES:,} for a catalog")
        try:
            try:
                import pandas

                records = pandas.read_parquet(path).to_dict("records")
            except ImportError:
                try:
                    import pyarrow.parquet
                except ImportError:
                    raise CatalogError(f"{path}: reading parquet needs pyarrow (pandas reads parquet through it, "
                                       "and it is not installed); install it, or give the catalog as CSV") from None
                records = pyarrow.parquet.read_table(path).to_pylist()
        except CatalogError:
            raise
        except Exception as e:  # noqa: BLE001 - pyarrow's ArrowInvalid, OSError, ...: a damaged file
            raise CatalogError(f"{path}: not a readable parquet file ({type(e).__name__}: {e})") from None
        cols = list(records[0]) if records else []
        return cols, ((f"{path}: row {i + 1}", r) for i, r in enumerate(records))
    header, records = read_csv(path)
    return header, ((where, dict(zip(header, fields))) for where, fields in records)


def read_csv(path: Path) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """(header, [(where, fields)]) of a CSV file read strictly (see the module doc); `where` is
    "file:line: row N". Every malformed row is a CatalogError naming file, line, column and row."""
    from penrose.io import read_text

    try:
        text = read_text(path, max_bytes=MAX_FILE_BYTES)
    except PenroseError as e:
        where = f"{path}:{e.span.line}:{e.span.col}" if e.span.line else str(path)
        raise CatalogError(f"{where}: cannot read the catalog: {e.message}") from None
    rows = _csv_rows(text.removeprefix("\ufeff"), str(path))
    if not rows:
        return [], []
    (hline, header) = rows[0]
    header = [h.strip() for h in header]
    seen: dict[str, int] = {}
    for i, h in enumerate(header):
        if h in seen:
            raise CatalogError(f"{path}:{hline}: the header names column {h!r} twice (columns {seen[h] + 1} and {i + 1})")
        seen[h] = i
    out = []
    for n, (line, fields) in enumerate(rows[1:], start=1):
        if fields == [""]:
            continue  # a blank line
        for col, value in zip(header, fields):
            if ("\n" in value or "\r" in value) and ALIASES.get(col, col) != "description":
                raise CatalogError(f"{path}:{line}: row {n}, column {col!r} holds a line break (a quote never closed "
                                   "on an earlier line?); only a description may span lines")
        if len(fields) != len(header):
            cols = ", ".join(header[len(fields):]) if len(fields) < len(header) else f"{len(fields) - len(header)} extra"
            raise CatalogError(f"{path}:{line}: row {n} has {len(fields)} field(s), the header {len(header)} "
                               f"({'missing: ' + cols if len(fields) < len(header) else cols}); "
                               "a row gives every column, empty where there is nothing")
        out.append((f"{path}:{line}: row {n}", fields))
    return header, out


def _csv_rows(text: str, name: str) -> list[tuple[int, list[str]]]:
    """[(line of the row's start, fields)]: RFC 4180 with positions in every error."""
    rows: list[tuple[int, list[str]]] = []
    i, n, line, col0 = 0, len(text), 1, 0  # col0: index where the current line starts
    fields: list[str] = []
    start_line = 1
    while i <= n:
        # one field
        if i < n and text[i] == '"':
            qline, qcol = line, i - col0 + 1
            i += 1
            parts = []
            while True:
                j = text.find('"', i)
                if j < 0:
                    raise CatalogError(f"{name}:{qline}:{qcol}: row {len(rows)} (column {len(fields) + 1}): a quote opened "
                                       "here is never closed")
                parts.append(text[i:j])
                if j + 1 < n and text[j + 1] == '"':
                    parts.append('"')
                    i = j + 2
                    continue
                i = j + 1
                break
            value = "".join(parts)
            for k, ch in enumerate(value):  # keep line numbers right across quoted line breaks
                if ch == "\n" or (ch == "\r" and (k + 1 == len(value) or value[k + 1] != "\n")):
                    line += 1
            if "\n" in value or "\r" in value:
                col0 = i - (len(value) - max(value.rfind("\n"), value.rfind("\r")) - 1) - 2
            if i < n and text[i] not in ",\r\n":
                raise CatalogError(f"{name}:{line}:{i - col0 + 1}: row {len(rows)} (column {len(fields) + 1}): text after "
                                   "the closing quote of a field (a quote inside a quoted field is written \"\")")
        else:
            j = i
            while j < n and text[j] not in ',\r\n':
                j += 1
            value = text[i:j]
            if '"' in value:
                raise CatalogError(f"{name}:{line}:{i - col0 + 1 + value.index(chr(34))}: row {len(rows)} (column "
                                   f"{len(fields) + 1}): a quote inside an unquoted field; quote the field and write it \"\"")
            i = j
        if len(value) > MAX_FIELD:
            raise CatalogError(f"{name}:{line}: row {len(rows)} (column {len(fields) + 1}): a field of {len(value):,} "
                               f"characters, over the limit of {MAX_FIELD:,}")
        if "\x00" in value:
            raise CatalogError(f"{name}:{line}: row {len(rows)} (column {len(fields) + 1}): a NUL character")
        fields.append(value)
        if i >= n:
            if fields != [""] or rows:
                rows.append((start_line, fields))
            break
        ch = text[i]
        if ch == ",":
            i += 1
            if i == n:  # a trailing comma: one more, empty field
                fields.append("")
                rows.append((start_line, fields))
                break
            continue
        # a line end
        i += 2 if text.startswith("\r\n", i) else 1
        rows.append((start_line, fields))
        line += 1
        col0 = i
        start_line = line
        fields = []
        if i == n:
            break
    return rows


class ConceptCatalog:
    """Lookup and search over a concept label table (see the module doc)."""

    def __init__(self, concepts: Iterable[Concept], source: str = "<catalog>"):
        self.source = source
        self._rows: list[Concept] = sorted(concepts, key=lambda c: (HEADS.index(c.head), c.concept_id))
        self._by_key: dict[tuple[str, int], Concept] = {}
        self._by_name: dict[str, list[Concept]] = {}
        for c in self._rows:
            if (c.head, c.concept_id) in self._by_key:
                raise CatalogError(f"{source}: {c.head} concept id {c.concept_id} appears twice")
            self._by_key[(c.head, c.concept_id)] = c
            self._by_name.setdefault(c.name, []).append(c)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "ConceptCatalog":
        """Read a CSV (or .parquet) labels file."""
        path = Path(path)
        if not path.is_file():
            raise CatalogError(f"no catalog file {str(path)!r}")
        cols, rows = _read_rows(path)
        have = {ALIASES.get(c, c) for c in cols}
        missing = [c for c in REQUIRED if c not in have]
        if missing:
            raise CatalogError(f"{path}: the catalog has no column {', '.join(missing)} (columns: {', '.join(cols) or 'none'}; "
                               f"expected {', '.join(COLUMNS)})")
        concepts: list[Concept] = []
        ids: dict[tuple, str] = {}
        names: dict[tuple, str] = {}
        for where, r in rows:
            c = _concept(r, where)
            for seen, key, what in ((ids, (c.head, c.concept_id), f"{c.head} concept id {c.concept_id}"),
                                    (names, (c.head, c.name), f"{c.head} concept name {c.name!r}")):
                if key in seen:
                    raise CatalogError(f"{where}: {what} appears twice (first at {seen[key]})")
                seen[key] = where
            concepts.append(c)
        return cls(concepts, str(path))

    # --- lookups -------------------------------------------------------------------------------

    def _candidates(self, concept_id: int, head: str | None) -> list[Concept]:
        heads = HEADS if head is None else (head,)
        return [self._by_key[(h, concept_id)] for h in heads if (h, concept_id) in self._by_key]

    def get(self, concept_id: int, head: str | None = None) -> Concept:
        """The concept with this id in `head`; without head, the known concept when both heads
        list the id (ids are per head), else the unknown one."""
        found = self._candidates(int(concept_id), head)
        if not found:
            where = f" {head}" if head else ""
            raise CatalogError(f"no{where} concept with id {concept_id} in {self.source}")
        return found[0]  # both heads list the id: the known one (HEADS order)

    def search(self, text: str, *, head: str | None = None, steerable_only: bool = False,
               limit: int | None = None) -> list[Concept]:
        """Concepts whose name or description holds every word of `text` (case-insensitive
        substrings). Order: exact name, then name holds every word, then description only;
        by id within each."""
        terms = text.lower().split()
        if not terms:
            return []
        scored = []
        for c in self._rows:
            if (head is not None and c.head != head) or (steerable_only and not c.is_steerable):
                continue
            name, desc = c.name.lower(), c.description.lower()
            if not all(t in name or t in desc for t in terms):
                continue
            rank = 0 if name == " ".join(terms) else 1 if all(t in name for t in terms) else 2
            scored.append((rank, c))
        hits = [c for _, c in sorted(scored, key=lambda rc: rc[0])]  # stable: id order within a rank
        return hits if limit is None else hits[:limit]

    def group(self, group_id: int) -> list[Concept]:
        """The concepts of group `group_id`, in id order (empty for an unknown group)."""
        return [c for c in self._rows if c.group_id == int(group_id)]

    def group_of(self, concept_id: int, head: str | None = None) -> list[int]:
        """Ids of the concepts in this concept's group, the concept first (the release's
        ConceptCatalog.group); just [concept_id] when it has no group."""
        focal = self.get(concept_id, head)
        if focal.group_id is None:
            return [focal.concept_id]
        return [focal.concept_id] + [c.concept_id for c in self.group(focal.group_id)
                                     if c.concept_id != focal.concept_id and c.head == focal.head]

    def resolve(self, name_or_id, head: str | None = None) -> int:
        """The id of a concept given by exact name, else by id (an int or a string of digits).
        CatalogError for an unknown name (with the nearest names), an ambiguous name (with
        its ids) or an id that is not in the catalog."""
        return self.lookup(name_or_id, head).concept_id

    def lookup(self, name_or_id, head: str | None = None) -> Concept:
        """The concept `resolve` finds (its head included)."""
        if isinstance(name_or_id, int) and not isinstance(name_or_id, bool):
            return self.get(name_or_id, head)
        key = unicodedata.normalize("NFC", str(name_or_id)).strip()
        named = [c for c in self._by_name.get(key, []) if head is None or c.head == head]
        if len(named) == 1:
            return named[0]
        if len(named) > 1:
            raise CatalogError(f"concept name {key!r} is ambiguous in {self.source}: ids "
                               f"{', '.join(f'{c.concept_id} ({c.head})' for c in named)}; give the id")
        if key.isascii() and key.isdigit():
            return self.get(int(key), head)
        names = [c.name for c in self._rows if head is None or c.head == head]
        lower = {n.lower(): n for n in names}
        close = [n for n in names if key.lower() in n.lower()]  # names holding it, then similar names
        close += [lower[n] for n in difflib.get_close_matches(key.lower(), list(lower), n=5) if lower[n] not in close]
        close = close[:5]
        hint = f"; did you mean {', '.join(repr(n) for n in close)}?" if close else ""
        raise CatalogError(f"unknown concept {key!r}: no concept of that name in {self.source}{hint}")

    # --- the collection --------------------------------------------------------------------------

    @property
    def concepts(self) -> tuple[Concept, ...]:
        return tuple(self._rows)

    def __len__(self) -> int:
        return len(self._rows)

    def __iter__(self) -> Iterator[Concept]:
        return iter(self._rows)

    def __contains__(self, concept_id) -> bool:
        try:
            return bool(self._candidates(int(concept_id), None))
        except (TypeError, ValueError):
            return False

    def __getitem__(self, concept_id: int) -> Concept:
        return self.get(concept_id)

    def __repr__(self) -> str:
        return f"ConceptCatalog({len(self)} concepts from {self.source})"
