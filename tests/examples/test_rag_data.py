"""The RAG example's data: the world, its held-out split, the FTS5 search, the tasks and the reward."""

from __future__ import annotations

import importlib
import re
import sqlite3
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "rag"))

import rag_data

search_module = importlib.import_module("rag_data.search")  # `rag_data.search` is the function


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[rag_data.SearchIndex]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(rag_data.CACHE_ENV, str(tmp_path_factory.mktemp("rag-cache")))
        idx = rag_data.SearchIndex()
        yield idx
        idx.close()


@pytest.fixture(scope="module")
def all_tasks() -> list[dict[str, Any]]:
    return rag_data.train_tasks() + rag_data.val_tasks()


# --- reward ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "gold", "expected"),
    [
        ("ANSWER: Mirosa", "Mirosa", 1.0),
        ("I searched twice.\nANSWER: Mirosa\n  \n", "Mirosa", 1.0),
        ("ANSWER: Kalim", "Kalim Ottar", 0.9 * (2 * 1.0 * 0.5 / 1.5) + 0.1),  # = 0.7
        ("ANSWER: Kalim Ottar Vunn", "Kalim Ottar", 0.9 * (2 * (2 / 3) * 1.0 / (2 / 3 + 1.0)) + 0.1),  # 0.82
        ("Kalim Ottar", "Kalim Ottar", 0.0),  # right words, no label: nothing can be read
        ("answer: Kalim Ottar", "Kalim Ottar", 0.0),  # the label is case-sensitive
        ("ANSWER: Brelta\nANSWER: Mirosa", "Mirosa", 0.9),  # the last answer counts, the format does not
        ("ANSWER: Mirosa\nI am not sure.", "Mirosa", 0.9),  # text after the answer line
        ("ANSWER: The Zorvex Labs!", "Zorvex Labs", 1.0),  # articles and punctuation ignored
        ("ANSWER: zorvex, labs.", "Zorvex Labs", 1.0),  # case too
        ("ANSWER: Brelta", "Mirosa", 0.1),  # the trap: well formatted, wrong
        ("ANSWER:", "Mirosa", 0.0),
        ("ANSWER:   \n", "Mirosa", 0.0),
        ("ANSWER: the", "The", 0.1),  # only articles: empty after normalization, F1 0
        ("", "Mirosa", 0.0),
    ],
)
def test_rag_reward_hand_worked(reply: str, gold: str, expected: float) -> None:
    assert rag_data.rag_reward(reply, gold) == pytest.approx(expected, abs=1e-9)


def test_reward_parts() -> None:
    assert rag_data.rag_reward("ANSWER: Kalim", "Kalim Ottar") == pytest.approx(0.7)
    assert rag_data.extract_answer("x\nANSWER: a\nANSWER:  Pera Vunn  \nmore") == "Pera Vunn"
    assert rag_data.extract_answer("no label here") is None
    assert rag_data.extract_answer("ANSWER:") == ""
    assert rag_data.format_score("ANSWER: Mirosa\n\n") == 1.0
    assert rag_data.format_score("ANSWER: Mirosa ANSWER: Brelta") == 0.0
    assert rag_data.format_score("Mirosa") == 0.0
    assert rag_data.answer_f1(None, "Mirosa") == 0.0
    assert rag_data.answer_f1("", "Mirosa") == 0.0
    assert rag_data.answer_f1("Mirosa Mirosa", "Mirosa") == pytest.approx(2 * 0.5 * 1.0 / 1.5)
    assert rag_data.normalize_answer("  The  Zorvex-Labs, an A ") == "zorvexlabs"


# --- world and corpus -----------------------------------------------------------------------------


def test_world_is_deterministic_and_names_never_collide() -> None:
    assert rag_data.generate_world(0) == rag_data.default_world()
    assert rag_data.generate_world(5) != rag_data.default_world()
    world = rag_data.default_world()
    names = [n for split in rag_data.SPLITS for n in world.part(split).names()]
    assert len(names) == len(set(names)) > 3000
    docs = rag_data.default_documents()
    assert [d.title for d in docs] == names  # one document per entity
    for d in docs:
        assert d.text.startswith(d.title) and len(d.text.split()) < 40 and 1 <= d.text.count(". ") + 1 <= 3


def test_held_out_names_never_reach_training(all_tasks: list[dict[str, Any]]) -> None:
    world = rag_data.default_world()
    held_out = sorted(world.val.names(), key=len, reverse=True)
    pattern = re.compile(r"\b(?:" + "|".join(map(re.escape, held_out)) + r")\b")
    train = [t for t in all_tasks if t["split"] == "train"]
    assert len(train) == 12000
    for t in train:
        text = "\n".join([t["question"], t["answer"], t["trap"], *t["chain"]])
        assert not pattern.search(text), t
        assert all(
            n in world.train.people or n in world.train.companies or n in world.train.books
            for n in t["chain"]
        )
    train_docs = [d for d in rag_data.default_documents() if d.split == "train"]
    assert len(train_docs) == len(list(world.train.names()))
    assert not any(pattern.search(d.text) for d in train_docs)
    assert not pattern.search(rag_data.corpus_text(train))
    # and the held-out questions are about held-out entities only
    val_names = set(world.val.names())
    assert all(set(t["chain"]) <= val_names for t in all_tasks if t["split"] == "val")


# --- tasks ----------------------------------------------------------------------------------------


def test_split_sizes_and_hop_mix() -> None:
    for tasks, n in ((rag_data.train_tasks(), 12000), (rag_data.val_tasks(), 256)):
        assert len(tasks) == n == len({t["question"] for t in tasks})
        hops = Counter(t["hops"] for t in tasks)
        assert hops == {2: round(0.6 * n), 3: n - round(0.6 * n)}
        assert all(len(t["chain"]) == t["hops"] for t in tasks)
        templates = Counter((t["hops"], t["template"]) for t in tasks)
        assert sum(h == 2 for h, _ in templates) >= 3 and sum(h == 3 for h, _ in templates) >= 2
        assert max(templates.values()) < 2 * min(templates.values())  # an even mix of templates
    assert not {t["question"] for t in rag_data.train_tasks()} & {t["question"] for t in rag_data.val_tasks()}
    assert rag_data.train_tasks(50, seed=3) == rag_data.train_tasks(50, seed=3)
    assert rag_data.train_tasks(50, seed=3) != rag_data.train_tasks(50, seed=4)
    assert rag_data.RagTask.model_validate(rag_data.val_tasks()[0]).as_task() == rag_data.val_tasks()[0]
    with pytest.raises(ValueError, match="3-hop"):
        rag_data.val_tasks(100_000)


def test_every_chain_is_answerable_and_the_first_document_holds_the_trap(
    index: rag_data.SearchIndex, all_tasks: list[dict[str, Any]]
) -> None:
    results: dict[str, list[str]] = {}
    for t in all_tasks:
        chain, answer, trap = t["chain"], t["answer"], t["trap"]
        docs: list[str] = []
        for hop, name in enumerate(chain):
            if name not in results:
                results[name] = index.search(name, k=2)
            own = rag_data.document_for(name).text
            assert results[name][0] == own, (name, results[name])  # the named entity's document, first
            docs.append(own)
            if hop + 1 < len(chain):
                assert chain[hop + 1] in own, t
        assert answer in docs[-1], t
        assert trap in docs[0] and trap != answer, t
        assert not any(answer in d for d in docs[:-1]), t  # no earlier document gives the answer away
        assert chain[0] in t["question"]


def test_corpus_text_holds_questions_answers_and_chain_documents() -> None:
    tasks = rag_data.val_tasks(20)
    text = rag_data.corpus_text(tasks)
    for t in tasks:
        assert t["question"] in text and t["answer"] in text
        assert all(rag_data.document_for(n).text in text for n in t["chain"])
    assert text.count(rag_data.document_for(tasks[0]["chain"][0]).text) == 1


# --- search ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "query",
    ["", "   ", "***", "AND OR NOT", "NEAR(a b)", '"', "'\"(", '"Zorvex Labs', "title:x", "a*b^c-d", "\x00",
     "über café 中文 😀", "x" * 500, "the " * 125, "_", "\u200b", "Labs " * 100],
)  # fmt: skip
def test_search_never_raises_on_odd_queries(index: rag_data.SearchIndex, query: str) -> None:
    results = index.search(query)
    assert isinstance(results, list) and len(results) <= 2 and all(isinstance(r, str) for r in results)


def test_search_basics(index: rag_data.SearchIndex) -> None:
    assert index.search("") == [] and index.search("***") == [] and index.search("AND OR NOT") == []
    company = next(iter(rag_data.default_world().train.companies.values()))
    doc = rag_data.document_for(company.name).text
    assert index.search(company.name)[0] == doc
    assert index.search(f"who founded {company.name.lower()}???", k=5)[0] == doc
    assert len(index.search(company.name, k=5)) == 5
    assert index.search(company.name, k=0) == []
    assert rag_data.fts_query('Zorvex "Labs" OR*') == '"zorvex" OR "labs" OR "or"'
    assert rag_data.fts_query("!!") is None


def test_default_search_uses_the_cache_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(rag_data.CACHE_ENV, str(tmp_path))
    rag_data.default_index.cache_clear()
    try:
        name = rag_data.val_tasks()[0]["chain"][0]
        assert rag_data.search(name)[0] == rag_data.document_for(name).text
        assert rag_data.default_index().path.parent == tmp_path
    finally:
        rag_data.default_index().close()
        rag_data.default_index.cache_clear()


def test_index_is_built_deterministically_atomically_and_once(tmp_path: Path) -> None:
    a = rag_data.SearchIndex(cache=tmp_path / "a")
    built: list[rag_data.SearchIndex] = []
    threads = [
        threading.Thread(target=lambda: built.append(rag_data.SearchIndex(cache=tmp_path / "b")))
        for _ in range(4)
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(built) == 4
    assert a.path.name == built[0].path.name
    assert a.path.read_bytes() == built[0].path.read_bytes()  # identical, byte for byte
    assert [p.name for p in (tmp_path / "b").iterdir()] == [a.path.name]  # no temporary file left
    mtime = a.path.stat().st_mtime_ns
    again = rag_data.SearchIndex(cache=tmp_path / "a")
    assert again.path.stat().st_mtime_ns == mtime  # reused, not rebuilt
    with pytest.raises(sqlite3.OperationalError):
        again._conn.execute("DELETE FROM docs")  # opened read-only
    for idx in (a, again, *built):
        idx.close()
    # a different corpus gets a different file, in the same folder
    small = rag_data.SearchIndex(documents=rag_data.default_documents()[:10], cache=tmp_path / "a")
    assert small.path != a.path and small.search(rag_data.default_documents()[0].title, k=5)
    small.close()


def test_missing_fts5_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    class NoFts5:
        def execute(self, sql: str) -> None:
            raise sqlite3.OperationalError("no such module: fts5")

        def close(self) -> None:
            pass

    monkeypatch.setattr(search_module.sqlite3, "connect", lambda *a, **k: NoFts5())
    with pytest.raises(rag_data.Fts5UnavailableError, match="FTS5"):
        search_module.check_fts5.__wrapped__()


# --- tokenizer ------------------------------------------------------------------------------------


def test_the_tokenizer_learns_pieces_from_a_world_of_other_names() -> None:
    rag_model = importlib.import_module("rag_model")
    world = rag_data.default_world()
    stand_in = "\n".join(rag_model.tokenizer_corpus())
    real_words = rag_data.world.name_words(world) - {
        *rag_data.world.COMPANY_SUFFIXES,
        *rag_data.world.BOOK_SUFFIXES,
    }
    assert not real_words & set(re.findall(r"[A-Z][a-z]+", stand_in))  # no real name word reaches it
    tok = rag_model.tokenizer()

    def pieces(names: list[str]) -> float:
        return sum(len(tok(" " + n)["input_ids"]) for n in names) / len(names)

    train_names = list(world.train.people)[:400]
    val_names = list(world.val.people)[:400]
    # a training name is not one memorised token: it is spelt from as many pieces as a held-out name
    assert pieces(train_names) > 4 and abs(pieces(train_names) - pieces(val_names)) < 0.5


def test_fresh_names_rename_every_training_name_consistently_and_never_to_a_world_name() -> None:
    rag_model = importlib.import_module("rag_model")
    world = rag_data.default_world()
    person = next(p for p in world.train.people.values() if p.teacher is not None)
    company = world.train.companies[person.works_at]
    first = person.name.split()[0]
    company_word, kind = company.name.split()
    segments = [
        f"<|user|>Where does {person.name} work?</s><|assistant|>",
        f'{{"query":"{person.name}"}}</s>',
        f"<|tool|>{person.name} works at {company.name}. {first} Labs is not a company.</s>",
        f"ANSWER: {company.name}</s>",
    ]
    import random as _random

    out = rag_model.fresh_names(segments, _random.Random(3))
    assert len(out) == 4
    every_name_word = rag_data.world.name_words(world) - {
        *rag_data.world.COMPANY_SUFFIXES,
        *rag_data.world.BOOK_SUFFIXES,
    }
    words = set(re.findall(r"[A-Z][a-z]+", " ".join(out)))
    assert not words & every_name_word  # neither the training names nor any held-out one
    new_first, new_last = re.search(r"Where does (\w+) (\w+) work", out[0]).groups()  # type: ignore[union-attr]
    new_company = re.search(r"ANSWER: (\w+) (\w+)", out[3]).groups()  # type: ignore[union-attr]
    assert new_company[1] == kind and new_company[0] not in (new_first, new_last)
    # the same word becomes the same new word everywhere in the conversation
    assert out[1] == f'{{"query":"{new_first} {new_last}"}}</s>'
    new_person = f"{new_first} {new_last}"
    assert (
        out[2]
        == f"<|tool|>{new_person} works at {new_company[0]} {kind}. {new_first} Labs is not a company.</s>"
    )
    assert rag_model.fresh_names(segments, _random.Random(3)) == out  # seeded
    assert rag_model.fresh_names(segments, _random.Random(4)) != out
    assert company_word not in " ".join(out)
