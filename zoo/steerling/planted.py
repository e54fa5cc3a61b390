"""A planted-concept corpus: text whose concepts are known exactly, to test Steerling's concept
training, steering and attribution against answers fixed in advance (`penrose steerling planted`,
then `penrose steerling train --data DIR` and `penrose steerling known-answer`).

Generated from a seed in well under a second, no downloads. Every word is a pseudo-word made of
consonant-vowel syllables (so no concept has a prior meaning a pretrained tokenizer or model could
bring), in three kinds:

  concept words    each planted concept has its own lexicon of `words_per_concept` words; with
                   `shared_words` > 0 concept i also lends its last words to concept i + 1
                   (vocabulary overlap: a shared word alone does not say which concept is there);
  pattern concept  with `pattern_concept` the last planted concept is expressed by a pattern, not
                   a word list: a run of 2-4 numbers ("7 31 5"), each from 1..99;
  filler           determiners ("ta", "ro"), filler verbs and filler nouns, never a concept's.

Grammar. A concept sentence is `DET W VERB DET W .` with W from the concept's lexicon (the
pattern concept: `DET NOUN VERB NUMBERS .`); a filler sentence is `DET N VERB DET N .` with
filler nouns. A chunk is 1-2 sentences per concept it carries plus `filler_sentences` (a range)
filler sentences, in shuffled order, joined by spaces.

Which concepts a chunk carries. A first concept is drawn by frequency (every concept weight 1,
the `rare` last lexical concepts weight `rare_weight`); with probability `co_occur` the partner of
an even concept 2k is concept 2k + 1 (and back), so pairs co-occur; with probability
`extra_concept` one more concept is drawn; at most `max_concepts`. The `withheld` last concepts
(lexical ones, after the pattern concept) are planted in the text like any other but never labelled: they are the structure the unknown concepts should find. Every chunk
carries at least one labelled concept (a chunk carrying only withheld concepts also gets a
labelled one), since the training corpus keeps labelled chunks only.

Labels. Chunk-level and positive-only, exactly as the training code takes real data
(penrose_zoo.steerling.lm_data): `write_planted` writes one fortune-style category file per
labelled concept, entries separated by `%` lines, a chunk appearing in the file of each of its
labelled concepts; `load_concept_corpus(DIR)` then gives each chunk all its labels. The truth
(all concepts, withheld ones included, and the character span of every word or number that
expresses a concept) goes to DIR/.planted.json (hidden, so the corpus reader skips it);
`token_concept_labels` turns spans into per-token (b, t, n) labels for packed rows.

    >>> from penrose_zoo.steerling.planted import PlantedConfig, generate_planted
    >>> corpus = generate_planted(PlantedConfig(n_chunks=50, seed=1))
    >>> len(corpus.chunks), corpus.labelled_names[:2]
    (50, ('alpha', 'beta'))
    >>> all(set(c.labels) <= set(corpus.labelled_names) for c in corpus.chunks)
    True
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
from dataclasses import dataclass, field
from pathlib import Path

import torch

__all__ = ["CONCEPT_NAMES", "PlantedConfig", "PlantedChunk", "PlantedCorpus", "generate_planted", "write_planted",
           "load_planted", "MANIFEST", "chunk_token_labels", "packed_token_labels", "text_concept_rates"]

MANIFEST = ".planted.json"
FORMAT = "penrose-planted-corpus"
CONCEPT_NAMES = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda",
                 "mu", "nu", "xi", "omicron", "pi", "rho", "sigma", "tau", "upsilon", "phi", "chi", "psi", "omega")
_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"
DETERMINERS = ("ta", "ro", "ne")
#: pseudo-words of 2 or 3 consonant-vowel syllables; a corpus may use a quarter of them (new ones
#: are drawn at random until they differ from those taken, which stays quick below that)
MAX_WORDS = ((len(_CONSONANTS) * len(_VOWELS)) ** 2 + (len(_CONSONANTS) * len(_VOWELS)) ** 3) // 4
MAX_CHUNKS = 1_000_000


@dataclass(frozen=True)
class PlantedConfig:
    """The generator's knobs (module doc). Concept i is named CONCEPT_NAMES[i]."""

    n_concepts: int = 8            # planted concepts, withheld and pattern ones included
    words_per_concept: int = 6
    shared_words: int = 1          # words concept i shares with concept i + 1 (vocabulary overlap)
    pattern_concept: bool = True   # the last labelled concept is numbers, not words
    withheld: int = 1              # the last concepts: in the text, never labelled
    rare: int = 1                  # rare lexical concepts (just before the pattern concept)
    rare_weight: float = 0.25      # their draw weight (others 1)
    co_occur: float = 0.5          # P(partner of concept 2k is 2k + 1 and back)
    extra_concept: float = 0.3     # P(one more random concept)
    max_concepts: int = 3
    filler_sentences: tuple[int, int] = (1, 3)   # inclusive range per chunk
    filler_nouns: int = 24
    filler_verbs: int = 8
    n_chunks: int = 4000
    seed: int = 0

    def __post_init__(self):
        from penrose.errors import PenroseArgumentError
        from penrose_zoo.validate import flag, number, whole

        whole(self.n_concepts, "n_concepts", low=2, high=len(CONCEPT_NAMES))
        pattern = flag(self.pattern_concept, "pattern_concept")
        lexical = self.n_concepts - (1 if pattern else 0)
        whole(self.withheld, "withheld", low=0)
        if self.withheld >= lexical:
            raise PenroseArgumentError(f"withheld={self.withheld} must leave at least one labelled concept "
                                       f"(n_concepts={self.n_concepts})")
        whole(self.words_per_concept, "words_per_concept", low=2)
        whole(self.shared_words, "shared_words", low=0, high=self.words_per_concept - 1)
        whole(self.rare, "rare", low=0, high=lexical - self.withheld)
        number(self.rare_weight, "rare_weight", low=0, low_open=True)
        for name in ("filler_nouns", "filler_verbs", "max_concepts"):
            whole(getattr(self, name), name, low=1)
        whole(self.n_chunks, "n_chunks", low=1, high=MAX_CHUNKS)
        whole(self.seed, "seed", low=0)
        for name in ("co_occur", "extra_concept"):
            number(getattr(self, name), name, low=0.0, high=1.0)
        span = self.filler_sentences
        if not (isinstance(span, tuple) and len(span) == 2 and all(isinstance(v, int) and not isinstance(v, bool)
                                                                    for v in span) and 0 <= span[0] <= span[1]):
            raise PenroseArgumentError(f"filler_sentences must be a range (lo, hi) with 0 <= lo <= hi, got {span!r}")
        words = self.filler_nouns + self.filler_verbs + lexical * self.words_per_concept
        if words > MAX_WORDS:  # the generator would draw pseudo-words for ever
            raise PenroseArgumentError(f"{words:,} distinct words are needed ({lexical} concepts x words_per_concept="
                                       f"{self.words_per_concept}, and the filler); the generator makes at most "
                                       f"{MAX_WORDS:,}: lower words_per_concept to "
                                       f"{max((MAX_WORDS - self.filler_nouns - self.filler_verbs) // lexical, 2):,} or less")

    @property
    def names(self) -> tuple[str, ...]:
        return CONCEPT_NAMES[: self.n_concepts]

    @property
    def withheld_names(self) -> tuple[str, ...]:
        return self.names[self.n_concepts - self.withheld:] if self.withheld else ()

    @property
    def pattern_name(self) -> str | None:
        """The pattern (numbers) concept: the last labelled one."""
        return self.names[self.n_concepts - self.withheld - 1] if self.pattern_concept else None


@dataclass(frozen=True)
class PlantedChunk:
    """text; concepts: every planted concept (names, sorted by id); labels: the labelled ones;
    spans: (start, end, concept name) character spans of the words or numbers expressing a concept."""

    text: str
    concepts: tuple[str, ...]
    labels: tuple[str, ...]
    spans: tuple[tuple[int, int, str], ...]


@dataclass(frozen=True)
class PlantedCorpus:
    config: PlantedConfig
    lexicon: dict[str, tuple[str, ...]]      # concept -> its words (the pattern concept: ())
    filler: dict[str, tuple[str, ...]]       # 'det', 'noun', 'verb'
    chunks: tuple[PlantedChunk, ...] = field(repr=False)

    @property
    def names(self) -> tuple[str, ...]:
        return self.config.names

    @property
    def labelled_names(self) -> tuple[str, ...]:
        return tuple(n for n in self.names if n not in self.config.withheld_names)

    def by_text(self) -> dict[str, PlantedChunk]:
        return {c.text: c for c in self.chunks}


def _words(rng: random.Random, n: int, taken: set[str]) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        w = "".join(rng.choice(_CONSONANTS) + rng.choice(_VOWELS) for _ in range(rng.choice((2, 3))))
        if w not in taken:
            taken.add(w)
            out.append(w)
    return out


def _lexicon(cfg: PlantedConfig, rng: random.Random) -> tuple[dict, dict]:
    taken: set[str] = set(DETERMINERS)
    filler = {"det": DETERMINERS, "noun": tuple(_words(rng, cfg.filler_nouns, taken)),
              "verb": tuple(_words(rng, cfg.filler_verbs, taken))}
    own = {n: _words(rng, cfg.words_per_concept - (cfg.shared_words if i else 0), taken)
           for i, n in enumerate(cfg.names) if n != cfg.pattern_name}
    lexicon: dict[str, tuple[str, ...]] = {}
    lexical = [n for n in cfg.names if n != cfg.pattern_name]
    for i, n in enumerate(lexical):
        borrowed = own[lexical[i - 1]][-cfg.shared_words:] if i and cfg.shared_words else []
        lexicon[n] = tuple(own[n] + borrowed)
    if cfg.pattern_name:
        lexicon[cfg.pattern_name] = ()
    return {n: lexicon[n] for n in cfg.names}, filler


def _draw_concepts(cfg: PlantedConfig, rng: random.Random) -> list[int]:
    n = cfg.n_concepts
    lexical = [i for i, name in enumerate(cfg.names) if name != cfg.pattern_name]
    rare = set(lexical[len(lexical) - cfg.withheld - cfg.rare: len(lexical) - cfg.withheld]) if cfg.rare else set()
    weights = [cfg.rare_weight if i in rare else 1.0 for i in range(n)]
    first = rng.choices(range(n), weights)[0]
    chosen = [first]
    partner = first ^ 1
    if partner < n and rng.random() < cfg.co_occur:
        chosen.append(partner)
    if rng.random() < cfg.extra_concept:
        c = rng.choices(range(n), weights)[0]
        if c not in chosen:
            chosen.append(c)
    chosen = chosen[: cfg.max_concepts]
    if all(i >= n - cfg.withheld for i in chosen):  # only withheld concepts: add (or swap in) a labelled one
        extra = rng.randrange(n - cfg.withheld)
        chosen = chosen + [extra] if len(chosen) < cfg.max_concepts else chosen[:-1] + [extra]
    return sorted(set(chosen))


def _sentence(rng: random.Random, cfg, lexicon, filler, concept: str | None) -> list[tuple[str, str | None]]:
    """Words of one sentence with the concept each expresses (None: filler)."""
    def det():
        return rng.choice(filler["det"]), None

    verb = (rng.choice(filler["verb"]), None)
    if concept is None:
        return [det(), (rng.choice(filler["noun"]), None), verb, det(), (rng.choice(filler["noun"]), None)]
    if concept == cfg.pattern_name:
        nums = [(str(rng.randint(1, 99)), concept) for _ in range(rng.randint(2, 4))]
        return [det(), (rng.choice(filler["noun"]), None), verb, *nums]
    w = lexicon[concept]
    return [det(), (rng.choice(w), concept), verb, det(), (rng.choice(w), concept)]


def generate_planted(cfg: PlantedConfig | None = None) -> PlantedCorpus:
    """The corpus of `cfg` (deterministic in cfg.seed); distinct chunk texts."""
    cfg = cfg or PlantedConfig()
    rng = random.Random(cfg.seed)
    lexicon, filler = _lexicon(cfg, rng)
    names, withheld = cfg.names, set(cfg.withheld_names)
    chunks: list[PlantedChunk] = []
    seen: set[str] = set()
    attempts = 0
    while len(chunks) < cfg.n_chunks:
        attempts += 1
        if attempts > 50 * cfg.n_chunks:
            raise ValueError(f"could not draw {cfg.n_chunks} distinct chunks; lower n_chunks or add words")
        ids = _draw_concepts(cfg, rng)
        plan: list[str | None] = [names[i] for i in ids for _ in range(rng.randint(1, 2))]
        plan += [None] * rng.randint(*cfg.filler_sentences)
        rng.shuffle(plan)
        pieces: list[str] = []
        spans: list[tuple[int, int, str]] = []
        pos = 0
        for concept in plan:
            for word, c in _sentence(rng, cfg, lexicon, filler, concept):
                if pieces:
                    pieces.append(" ")
                    pos += 1
                if c is not None:
                    spans.append((pos, pos + len(word), c))
                pieces.append(word)
                pos += len(word)
            pieces.append(".")
            pos += 1
        text = "".join(pieces)
        if text in seen:
            continue
        seen.add(text)
        concepts = tuple(names[i] for i in ids)
        chunks.append(PlantedChunk(text, concepts, tuple(c for c in concepts if c not in withheld), tuple(spans)))
    return PlantedCorpus(cfg, lexicon, filler, tuple(chunks))


def write_planted(corpus: PlantedCorpus, directory: str | os.PathLike, *, replace: bool = False) -> Path:
    """One category file per labelled concept (entries separated by `%` lines; a chunk in the file
    of each of its labels) and the truth in DIR/.planted.json. The folder must be new or empty;
    with `replace`, a planted corpus already there (a folder holding .planted.json and its
    category files, nothing else) is replaced. The folder is written whole, then put in place
    (`penrose.io.atomic_write_folder`): never half a corpus."""
    from penrose.errors import PenroseError
    from penrose.io import atomic_write_folder

    out = Path(directory)
    if replace and out.is_dir() and any(out.iterdir()):
        if not (out / MANIFEST).is_file():
            raise PenroseError(f"{out} holds no planted corpus ({MANIFEST}): it is not replaced; give a new or empty folder")
        others = sorted(p.name for p in out.iterdir() if p.name != MANIFEST and not (p.is_file() and p.name in CONCEPT_NAMES))
        if others:
            raise PenroseError(f"{out} holds files a planted corpus does not ({', '.join(others[:5])}): it is not replaced")

    def write(tmp: Path) -> None:
        for name in corpus.labelled_names:
            entries = [c.text for c in corpus.chunks if name in c.labels]
            (tmp / name).write_text("\n%\n".join(entries) + "\n", encoding="utf-8")
        manifest = {"format": FORMAT, "config": dataclasses.asdict(corpus.config),
                    "lexicon": {k: list(v) for k, v in corpus.lexicon.items()},
                    "filler": {k: list(v) for k, v in corpus.filler.items()},
                    "chunks": [{"text": c.text, "concepts": list(c.concepts), "labels": list(c.labels),
                                "spans": [list(s) for s in c.spans]} for c in corpus.chunks]}
        (tmp / MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")

    return atomic_write_folder(out, write, replace=replace, hint="give a new folder, or replace the planted corpus there (--force, replace=True)")


def load_planted(directory: str | os.PathLike) -> PlantedCorpus:
    """The corpus written by write_planted (its DIR/.planted.json), read as untrusted input
    (penrose.io.read_json's limits; every field of its type, the config checked as PlantedConfig
    checks it, every span inside its chunk's text and naming a planted concept): a PenroseError
    naming the file and the field otherwise."""
    from penrose.errors import PenroseError
    from penrose.io import read_json

    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise PenroseError(f"{path}: no planted-corpus manifest (write one with `penrose steerling planted --out DIR`)")
    m = read_json(path, max_bytes=1 << 30)
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise PenroseError(f"{path}: not a planted-corpus manifest (format {m.get('format') if isinstance(m, dict) else m!r})")
    field = "config"
    try:
        conf = dict(m["config"])
        unknown = sorted(set(conf) - {f.name for f in dataclasses.fields(PlantedConfig)})
        if unknown:
            raise ValueError(f"unknown field(s) {', '.join(unknown)}")
        if "filler_sentences" in conf:
            conf["filler_sentences"] = tuple(conf["filler_sentences"])
        config = PlantedConfig(**conf)
        words: dict[str, dict[str, tuple[str, ...]]] = {}
        for field in ("lexicon", "filler"):
            words[field] = {str(k): tuple(_strings(v)) for k, v in dict(m[field]).items()}
        chunks = []
        field = "chunks"
        for i, c in enumerate(m["chunks"]):
            field = f"chunks[{i}]"
            text = c["text"]
            if not isinstance(text, str):
                raise ValueError("'text' is not a string")
            spans = tuple((a, b, n) for a, b, n in c["spans"])
            for a, b, n in spans:
                if type(a) is not int or type(b) is not int or not 0 <= a < b <= len(text) or n not in config.names:
                    raise ValueError(f"span {[a, b, n]} is not inside its text of {len(text)} characters, or names no "
                                     "planted concept")
            concepts, labels = tuple(_strings(c["concepts"])), tuple(_strings(c["labels"]))
            if not set(concepts + labels) <= set(config.names):
                raise ValueError("a concept or label is not a planted concept")
            chunks.append(PlantedChunk(text, concepts, labels, spans))
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        detail = f"missing {e}" if isinstance(e, KeyError) else str(e).removeprefix("error: ")
        raise PenroseError(f"{path}: field {field!r}: {detail}") from None
    return PlantedCorpus(config, words["lexicon"], words["filler"], tuple(chunks))


def _strings(value) -> list[str]:
    """A JSON list of strings, or a ValueError."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"expected a list of strings, got {str(value)[:60]!r}")
    return value


def chunk_token_labels(chunk: PlantedChunk, offsets: list[tuple[int, int]], names) -> torch.Tensor:
    """(len(offsets), n) 0/1: token i (its character span offsets[i]) overlaps a span of concept
    names[j]. For the byte tokenizer offsets are (i, i + 1) over the ASCII text."""
    index = {n: j for j, n in enumerate(names)}
    out = torch.zeros(len(offsets), len(names))
    for i, (a, b) in enumerate(offsets):
        for s, e, c in chunk.spans:
            if c in index and a < e and s < b:
                out[i, index[c]] = 1.0
    return out


def packed_token_labels(packed, corpus: PlantedCorpus, names) -> torch.Tensor:
    """(N, T, n) per-token planted labels of PackedData rows made with the byte tokenizer (a chunk's
    tokens are its ASCII characters then <|eoc|>): 1 where the token lies in a span of concept
    names[j]. `names` may include withheld concepts (ids beyond the labelled ones)."""
    truth = corpus.by_text()
    N, T = packed.input_ids.shape
    out = torch.zeros(N, T, len(names))
    cidx = packed.chunk_index
    done: dict[int, int] = {}  # characters of each chunk already placed (a long chunk spans rows)
    for r in range(N):
        t = 0
        while t < T:
            c = int(cidx[r, t])
            if c < 0:
                t += 1
                continue
            start = t
            while t < T and int(cidx[r, t]) == c:
                t += 1
            chunk = truth.get(packed.texts[c])
            first = done.get(c, 0)
            done[c] = first + (t - start)
            if chunk is None:
                continue
            n = max(min(t - start, len(chunk.text) - first), 0)  # the <|eoc|> token carries no span
            out[r, start:start + n] = chunk_token_labels(chunk, [(first + i, first + i + 1) for i in range(n)], names)
    return out


def text_concept_rates(text: str, corpus: PlantedCorpus) -> dict[str, float]:
    """Per planted concept, the fraction of the text's words that express it (its lexicon; the
    pattern concept: numbers). A shared word counts for both concepts that own it."""
    words = [w.strip(".,") for w in text.split()]
    words = [w for w in words if w]
    if not words:
        return {n: 0.0 for n in corpus.names}
    rates = {}
    for n in corpus.names:
        if n == corpus.config.pattern_name:
            hits = sum(w.isdigit() for w in words)
        else:
            lex = set(corpus.lexicon[n])
            hits = sum(w in lex for w in words)
        rates[n] = hits / len(words)
    return rates
