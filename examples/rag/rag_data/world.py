"""A seeded fictional world: people, companies, books, cities and countries with syllable names.

The names are invented so that no pretrained model can know the answers: the agent must search. They
are made of a few syllables so a tiny model's BPE tokenizer can copy them piece by piece.

The world has two disjoint parts, ``"train"`` and ``"val"`` (held out). Every relation of an entity
points inside its own part, and the two parts draw their name words from disjoint pools, so no
held-out name can leak into a training question, answer or document.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

Split = Literal["train", "val"]
SPLITS: tuple[Split, ...] = ("train", "val")
WORLD_SEED = 0
"""The seed of the default world: the corpus and every task are derived from it."""

_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "tr", "th")
_VOWELS = ("a", "e", "i", "o", "u")
_CODAS = ("", "", "", "n", "r", "l", "s", "x")  # mostly open syllables: easier to read and to split
COMPANY_SUFFIXES = ("Labs", "Group", "Motors", "Foods", "Mining", "Textiles")
BOOK_SUFFIXES = ("Saga", "Tales", "Songs", "Letters", "Chronicle", "Poems")
_RESERVED = frozenset(
    w.lower()
    for w in (
        *COMPANY_SUFFIXES,
        *BOOK_SUFFIXES,
        *("city", "country", "company", "book", "story", "born", "founded", "based", "student", "teacher"),
        *("works", "work", "written", "capital", "founder", "author", "answer", "search", "which", "where"),
    )
)
"""Words of four letters or more that the documents and questions use: a name spelled like one would
match every document that uses the word (shorter words cannot collide: names have 4 letters or more)."""


@dataclass(frozen=True)
class Person:
    name: str
    born_in: str
    works_at: str
    teacher: str | None
    """None for the oldest few: the teacher relation points to an older person, so it has roots."""


@dataclass(frozen=True)
class Company:
    name: str
    based_in: str
    founder: str


@dataclass(frozen=True)
class Book:
    name: str
    author: str
    set_in: str


@dataclass(frozen=True)
class City:
    name: str
    country: str


@dataclass(frozen=True)
class Country:
    name: str
    capital: str


@dataclass(frozen=True)
class PartSizes:
    """How many entities of each kind one part of the world holds."""

    people: int
    companies: int
    books: int
    cities: int
    countries: int
    first_names: int
    last_names: int


TRAIN_SIZES = PartSizes(
    people=6000, companies=2400, books=2400, cities=800, countries=40, first_names=240, last_names=240
)
"""Many distinct training names: a tiny model that sees few names memorises them as wholes; with thousands
it has to learn to copy a name piece by piece, which is what a held-out name needs."""
VAL_SIZES = PartSizes(
    people=400, companies=150, books=150, cities=60, countries=6, first_names=25, last_names=25
)


@dataclass(frozen=True)
class WorldPart:
    """The entities of one split; every relation points to an entity of the same part."""

    split: Split
    people: Mapping[str, Person]
    companies: Mapping[str, Company]
    books: Mapping[str, Book]
    cities: Mapping[str, City]
    countries: Mapping[str, Country]

    def names(self) -> Iterator[str]:
        """Every entity name of the part, in generation order."""
        for table in (self.people, self.companies, self.books, self.cities, self.countries):
            yield from table


@dataclass(frozen=True)
class World:
    train: WorldPart
    val: WorldPart

    def part(self, split: Split) -> WorldPart:
        if split == "train":
            return self.train
        if split == "val":
            return self.val
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")


def _word(rng: random.Random) -> str:
    syllables = 2 if rng.random() < 0.8 else 3
    onsets = ("", *_ONSETS) if rng.random() < 0.15 else _ONSETS  # an occasional vowel start: "Ottar"
    parts = [rng.choice(onsets) + rng.choice(_VOWELS) + rng.choice(_CODAS)]
    parts += [rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables - 1)]
    return "".join(parts).capitalize()


def fresh_word(rng: random.Random, taken: set[str], avoid: frozenset[str] = frozenset()) -> str:
    """A name word of the world's kind in neither `taken` (which is updated) nor `avoid`, and not a
    document word."""
    while True:
        word = _word(rng)
        if word in taken or word in avoid or word.lower() in _RESERVED or not 4 <= len(word) <= 9:
            continue
        taken.add(word)
        return word


def _unique_words(rng: random.Random, n: int, taken: set[str]) -> list[str]:
    """`n` fresh name words, none in `taken` (which is updated): names never collide across kinds or parts."""
    return [fresh_word(rng, taken) for _ in range(n)]


def _build_part(rng: random.Random, split: Split, sizes: PartSizes, taken: set[str]) -> WorldPart:
    if sizes.people > sizes.first_names * sizes.last_names or sizes.people < sizes.companies:
        raise ValueError(f"inconsistent sizes {sizes}: need distinct names and one founder per company")
    first = _unique_words(rng, sizes.first_names, taken)
    last = _unique_words(rng, sizes.last_names, taken)
    city_names = _unique_words(rng, sizes.cities, taken)
    country_names = _unique_words(rng, sizes.countries, taken)
    company_names = [
        f"{w} {rng.choice(COMPANY_SUFFIXES)}" for w in _unique_words(rng, sizes.companies, taken)
    ]
    book_names = [f"{w} {rng.choice(BOOK_SUFFIXES)}" for w in _unique_words(rng, sizes.books, taken)]
    people_names = [
        f"{f} {la}" for f, la in rng.sample([(f, la) for f in first for la in last], sizes.people)
    ]

    # Each country gets at least one city; its first city is its capital.
    city_country = [country_names[i % len(country_names)] for i in range(len(city_names))]
    rng.shuffle(city_country)
    cities = {c: City(c, k) for c, k in zip(city_names, city_country, strict=True)}
    countries = {k: Country(k, next(c for c in city_names if cities[c].country == k)) for k in country_names}

    # Distinct founders, each working at the company they founded; everyone else works anywhere.
    founders = rng.sample(people_names, len(company_names))
    companies = {
        c: Company(c, rng.choice(city_names), founder)
        for c, founder in zip(company_names, founders, strict=True)
    }
    employer = {founder: c for c, founder in zip(company_names, founders, strict=True)}
    oldest = max(1, len(people_names) // 40)
    people: dict[str, Person] = {}
    for i, name in enumerate(people_names):
        teacher = (
            None if i >= len(people_names) - oldest else people_names[rng.randrange(i + 1, len(people_names))]
        )
        works_at = employer.get(name) or rng.choice(company_names)
        people[name] = Person(name, rng.choice(city_names), works_at, teacher)
    books = {b: Book(b, rng.choice(people_names), rng.choice(city_names)) for b in book_names}
    return WorldPart(split, people, companies, books, cities, countries)


def generate_world(
    seed: int = WORLD_SEED,
    train_sizes: PartSizes = TRAIN_SIZES,
    val_sizes: PartSizes = VAL_SIZES,
    avoid: frozenset[str] = frozenset(),
) -> World:
    """The world for a seed: the same seed gives the same world, on every machine and Python.

    `avoid` holds name words the world must not use (another world's, to keep the two apart).
    """
    rng = random.Random(f"rag-world:{seed}")
    taken: set[str] = set(avoid)
    train = _build_part(rng, "train", train_sizes, taken)
    val = _build_part(rng, "val", val_sizes, taken)
    return World(train, val)


@lru_cache(maxsize=1)
def default_world() -> World:
    """The world the corpus, the index and the tasks share (built once per process)."""
    return generate_world()


def name_words(world: World) -> frozenset[str]:
    """Every word of every entity name of `world` (suffixes such as "Labs" included)."""
    return frozenset(w for part in (world.train, world.val) for name in part.names() for w in name.split())
