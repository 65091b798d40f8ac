"""One short document per entity, written from a few fixed sentence templates.

Fixed templates keep the documents easy for a tiny model to read: the entity to copy into the next
search always sits after the same words ("founded by", "a student of", ...). Each document names its
entity first, and every mention of another entity uses that entity's full name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from .world import Book, City, Company, Country, Person, Split, World, WorldPart, default_world

Kind = Literal["person", "company", "book", "city", "country"]


@dataclass(frozen=True)
class Document:
    title: str
    """The entity's name: the index weighs it above the text, so searching a name finds its document."""
    text: str
    kind: Kind
    split: Split


def person_text(p: Person) -> str:
    text = f"{p.name} was born in {p.born_in}."
    if p.teacher is not None:
        text += f" {p.name} was a student of {p.teacher}."
    return text + f" {p.name} works at {p.works_at}."


def company_text(c: Company) -> str:
    return f"{c.name} is a company based in {c.based_in}. It was founded by {c.founder}."


def book_text(b: Book) -> str:
    return f"{b.name} is a book written by {b.author}. The story is set in {b.set_in}."


def city_text(c: City) -> str:
    return f"{c.name} is a city in {c.country}."


def country_text(c: Country) -> str:
    return f"{c.name} is a country. Its capital is {c.capital}."


def part_documents(part: WorldPart) -> list[Document]:
    """The documents of one part of the world, in a fixed order (the index is built in this order)."""
    docs = [Document(p.name, person_text(p), "person", part.split) for p in part.people.values()]
    docs += [Document(c.name, company_text(c), "company", part.split) for c in part.companies.values()]
    docs += [Document(b.name, book_text(b), "book", part.split) for b in part.books.values()]
    docs += [Document(c.name, city_text(c), "city", part.split) for c in part.cities.values()]
    docs += [Document(c.name, country_text(c), "country", part.split) for c in part.countries.values()]
    return docs


def world_documents(world: World) -> list[Document]:
    """The whole corpus, train then held-out: one retrieval corpus, like one Wikipedia."""
    return part_documents(world.train) + part_documents(world.val)


@lru_cache(maxsize=1)
def default_documents() -> tuple[Document, ...]:
    """The documents of the default world (built once per process)."""
    return tuple(world_documents(default_world()))


@lru_cache(maxsize=1)
def _by_title() -> Mapping[str, Document]:
    return {d.title: d for d in default_documents()}


def document_for(name: str) -> Document:
    """The document of the default world's entity `name`; KeyError names the unknown entity."""
    try:
        return _by_title()[name]
    except KeyError:
        raise KeyError(f"no entity named {name!r} in the RAG world") from None
