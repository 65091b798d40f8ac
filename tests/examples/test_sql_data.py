"""The Text-to-SQL example's data: databases, questions with gold and wrong SQL, splits, the reward."""

from __future__ import annotations

import multiprocessing
import re
import sqlite3
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "sql"))

import sql_data


@pytest.fixture(scope="module", autouse=True)
def _cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Every database of this module is built in a fresh folder, never in the repo's cache."""
    folder = tmp_path_factory.mktemp("sql-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(sql_data.CACHE_ENV, str(folder))
        yield folder


@pytest.fixture(scope="module")
def train() -> list[dict[str, Any]]:
    return sql_data.train_tasks(2000)


@pytest.fixture(scope="module")
def val() -> list[dict[str, Any]]:
    return sql_data.val_tasks(256)


def _words(text: str) -> set[str]:
    return set(re.findall(r"\w+", text.lower()))


def test_gold_runs_and_every_wrong_query_scores_zero(
    train: list[dict[str, Any]], val: list[dict[str, Any]]
) -> None:
    for task in train + val:
        path = sql_data.database_path(task["db_id"])
        gold = sql_data.run_query(path, task["gold_sql"])
        assert gold and gold != [(0,)], task
        assert sql_data.execution_match(path, task["gold_sql"], task["gold_sql"]) == 1.0, task
        assert 2 <= len(task["wrong_sql"]) <= 4, task
        for wrong in task["wrong_sql"]:
            sql_data.run_query(path, wrong)  # raises if it does not run
            assert sql_data.execution_match(path, wrong, task["gold_sql"]) == 0.0, (task, wrong)


def test_tasks_are_well_formed_and_in_canonical_style(train: list[dict[str, Any]]) -> None:
    assert len(train) == 2000 and len({(t["db_id"], t["question"]) for t in train}) == 2000
    task = sql_data.SqlTask.model_validate(train[0])
    assert task.as_task() == train[0] and set(train[0]) == {
        "task_id",
        "db_id",
        "schema",
        "question",
        "gold_sql",
        "difficulty",
        "wrong_sql",
    }
    for t in train:
        assert t["schema"] == sql_data.schema_text(t["db_id"])
        for sql in [t["gold_sql"], *t["wrong_sql"]]:
            assert sql.startswith("SELECT ") and "  " not in sql and not sql.endswith(";")
            assert not re.search(r"\b(select|from|where|order by|group by|join)\b", sql), sql
        # A quoted value of the SQL is quoted the same way in the question, so the model can copy it.
        for value in re.findall(r"'[^']*'", t["gold_sql"]):
            assert value in t["question"], t


def test_held_out_domains_never_appear_in_training(
    train: list[dict[str, Any]], val: list[dict[str, Any]]
) -> None:
    assert len(sql_data.TRAIN_DOMAINS) >= 20 and len(sql_data.HELD_OUT_DOMAINS) >= 6
    assert not set(sql_data.TRAIN_DOMAINS) & set(sql_data.HELD_OUT_DOMAINS)
    held_dbs = {db for d in sql_data.HELD_OUT_DOMAINS for db in sql_data.db_ids(d)}
    held_names = set(sql_data.HELD_OUT_DOMAINS) | {
        t.name for d in sql_data.HELD_OUT_DOMAINS for t in sql_data.DOMAINS[d].tables
    }
    for task in train:
        assert task["db_id"] not in held_dbs
        text = " ".join([task["schema"], task["question"], task["gold_sql"], *task["wrong_sql"]])
        assert not _words(text) & held_names, task
    assert {t["db_id"] for t in val} <= held_dbs


def test_levels_are_balanced_in_both_splits(train: list[dict[str, Any]], val: list[dict[str, Any]]) -> None:
    for tasks in (train, val):
        counts = sql_data.level_counts(tasks)
        assert set(counts) == {1, 2, 3, 4, 5}
        assert min(counts.values()) >= 0.9 * max(counts.values()) > 0


def test_generation_is_deterministic_and_cached() -> None:
    a = sql_data.val_tasks(40, seed=3)
    assert a == sql_data.val_tasks(40, seed=3) and a != sql_data.val_tasks(40, seed=4)
    started = time.perf_counter()
    sql_data.val_tasks(40, seed=3)
    assert time.perf_counter() - started < 0.05


def test_corpus_text_holds_schemas_questions_and_sql(val: list[dict[str, Any]]) -> None:
    corpus = sql_data.corpus_text(val[:20])
    for t in val[:20]:
        assert t["schema"] in corpus and t["question"] in corpus and t["gold_sql"] in corpus
        assert all(w in corpus for w in t["wrong_sql"])


def _dump(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    conn = sqlite3.connect(path)
    try:
        tables = [
            r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        ]
        return {t: conn.execute(f"SELECT * FROM {t} ORDER BY 1").fetchall() for t in tables}
    finally:
        conn.close()


def test_databases_are_deterministic_with_valid_foreign_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dumps = []
    for name in ("a", "b"):
        monkeypatch.setenv(sql_data.CACHE_ENV, str(tmp_path / name))
        dumps.append(
            {db: _dump(sql_data.build_database(db)) for db in ["concert_singer_0", "library_2", "bakery_1"]}
        )
        assert sql_data.build_database("library_2").parent == tmp_path / name
    assert dumps[0] == dumps[1]
    assert dumps[0]["concert_singer_0"] != _dump(sql_data.build_database("concert_singer_1"))
    for name in sql_data.DOMAINS:
        path = sql_data.build_database(f"{name}_0")
        conn = sqlite3.connect(path)
        try:
            assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
            ddl = " ".join(r[0] for r in conn.execute("SELECT sql FROM sqlite_master WHERE type = 'table'"))
            assert "REFERENCES" in ddl
            for table in sql_data.DOMAINS[name].tables:
                (count,) = conn.execute(f"SELECT COUNT(*) FROM {table.name}").fetchone()
                assert 10 <= count <= 40, (name, table.name, count)
        finally:
            conn.close()
    assert not list((tmp_path / "a").glob("*.tmp"))  # the atomic write left no temporary file behind
    with pytest.raises(KeyError):
        sql_data.build_database("nonexistent_0")


def test_concurrent_builds_of_one_database_agree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(sql_data.CACHE_ENV, str(tmp_path))
    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(max_workers=4, mp_context=context) as pool:
        paths = list(pool.map(sql_data.build_database, ["movies_3"] * 8))
    assert len(set(paths)) == 1 and [p.name for p in tmp_path.iterdir()] == [paths[0].name]
    assert _dump(paths[0])["movie"]


def test_execution_match_compares_order_only_when_gold_sorts() -> None:
    path = sql_data.database_path("concert_singer_0")
    gold_sorted = "SELECT name FROM singer ORDER BY age DESC"
    assert sql_data.execution_match(path, "SELECT name FROM singer ORDER BY age DESC", gold_sorted) == 1.0
    assert sql_data.execution_match(path, "SELECT name FROM singer ORDER BY age ASC", gold_sorted) == 0.0
    gold_set = "SELECT name FROM singer"
    assert sql_data.execution_match(path, "SELECT name FROM singer ORDER BY age ASC", gold_set) == 1.0
    # A multiset, not a set: duplicate rows count.
    assert (
        sql_data.execution_match(path, "SELECT DISTINCT country FROM singer", "SELECT country FROM singer")
        == 0.0
    )
    assert sql_data.execution_match(path, "select   name from singer;", gold_set) == 1.0


def test_execution_match_refuses_writes_and_errors() -> None:
    path = sql_data.database_path("pets_0")
    before = _dump(path)
    gold = "SELECT COUNT(*) FROM pet"
    for bad in [
        "DELETE FROM pet",
        "DROP TABLE pet",
        "SELECT COUNT(*) FROM pet; DROP TABLE pet",
        "WITH x AS (SELECT 1) DELETE FROM pet",
        "ATTACH DATABASE ':memory:' AS other",
        "PRAGMA table_info(pet)",
        "SELEC COUNT(*) FROM pet",
        "SELECT COUNT(*) FROM no_such_table",
        "",
    ]:
        assert sql_data.execution_match(path, bad, gold) == 0.0, bad
    assert _dump(path) == before


def test_execution_match_aborts_a_runaway_query() -> None:
    path = sql_data.database_path("pets_0")
    runaway = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT COUNT(*) FROM r"
    started = time.perf_counter()
    assert sql_data.execution_match(path, runaway, "SELECT COUNT(*) FROM pet", timeout_s=0.2) == 0.0
    assert time.perf_counter() - started < 2.0
    cross = "SELECT COUNT(*) FROM pet, pet AS b, pet AS c, pet AS d, pet AS e, pet AS f"
    assert sql_data.execution_match(path, cross, "SELECT COUNT(*) FROM pet", timeout_s=0.2) == 0.0
    assert time.perf_counter() - started < 3.0


@pytest.mark.parametrize(
    ("reply", "sql"),
    [
        ("SELECT name FROM singer", "SELECT name FROM singer"),
        ("SQL: SELECT name FROM singer;", "SELECT name FROM singer"),
        ("```sql\nSELECT name FROM singer;\n```\nThis lists names.", "SELECT name FROM singer"),
        ("Here it is:\n```\nSELECT a FROM t\n```", "SELECT a FROM t"),
        (
            "SELECT name FROM singer WHERE country = 'a;b'; DROP TABLE singer",
            "SELECT name FROM singer WHERE country = 'a;b'",
        ),
        ("  SELECT 1  \n\nExplanation: one", "SELECT 1"),
        ("sql: SELECT 1", "SELECT 1"),
    ],
)
def test_extract_sql(reply: str, sql: str) -> None:
    assert sql_data.extract_sql(reply) == sql


def test_fresh_names_rename_tables_and_columns_consistently_and_leave_the_rest() -> None:
    import random

    import sql_model

    task = next(t for t in sql_data.train_tasks() if "JOIN" in t["gold_sql"] and "'" in t["gold_sql"])
    segments = [
        f"Schema: {task['schema']}\nQ: {task['question']}\nSQL: ",
        task["gold_sql"] + "</s>",
        "\nRows: [('Ines Kim', 3)]\nFix:",
    ]
    out = sql_model.fresh_names(segments, random.Random(0))
    assert len(out) == 3 and out != segments
    words = sql_model.name_words()
    lowercase = set(re.findall(r"(?<![A-Za-z0-9])[a-z]+(?![A-Za-z0-9])", " ".join(out)))
    assert not lowercase & words  # no table or column word of any schema, training or held out
    assert re.search(r"\w+_id, name", out[0])  # the words every schema shares stay
    # SQL keywords, aliases and quoted values are untouched
    for kept in re.findall(r"\b(?:SELECT|FROM|JOIN|WHERE|AS|ON|T1|T2)\b|'[^']*'", task["gold_sql"]):
        assert kept in out[1]
    assert "'Ines Kim'" in out[2]
    # one word, one new word: the query's names are the schema's renamed names
    renamed_tables = re.findall(r"(?:FROM|JOIN) (\w+)", out[1])
    schema_tables = re.findall(r"(?:^|\| )(\w+)\(", out[0].split("\n")[0].removeprefix("Schema: "))
    assert renamed_tables and set(renamed_tables) <= set(schema_tables)
    assert sql_model.fresh_names(segments, random.Random(0)) == out


def test_fresh_names_are_half_training_spelling_half_scrambled_and_never_a_schema_word() -> None:
    import random

    import sql_model

    held_out = sql_model.name_words() - sql_model.training_name_words()
    assert {"mountain", "height"} <= held_out  # the letter model never sees a held-out word
    rng = random.Random(0)
    out = sql_model.fresh_names(["mountain(height) and pet(age)"], rng)[0]
    invented = re.findall(r"[a-z]+", out)
    assert len(invented) == 5 and invented[2] == "and"
    assert not set(invented) & sql_model.name_words()
    corpus = "\n".join(sql_model.tokenizer_corpus())
    assert not set(re.findall(r"[a-z]+", corpus)) & held_out
    words = [sql_model._invented(random.Random(i), sql_model.name_words()) for i in range(300)]
    assert all(3 <= len(w) <= 10 and w.isalpha() for w in words)
    assert len(set(words)) > 200  # varied, not a handful of favourites
    letters = set("".join(words))
    assert len(letters) >= 22  # English spelling, not a fixed syllable inventory

    def triples(word: str) -> set[str]:
        padded = "^^" + word + "$"
        return {padded[i : i + 3] for i in range(len(padded) - 2)}

    seen = set().union(*map(triples, sql_model.training_name_words()))

    def surprising(word: str) -> bool:  # spelt with a letter triple no training name has
        return not triples(word) <= seen

    assert not any(map(surprising, words))  # the letter model only follows the training words
    assert sum(map(surprising, held_out)) > 0.8 * len(held_out)  # which held-out English names do not
    scrambled = [sql_model._scrambled(random.Random(i), sql_model.name_words()) for i in range(300)]
    assert all(3 <= len(w) <= 12 and w.isalpha() and w not in sql_model.name_words() for w in scrambled)
    assert len(set(scrambled)) > 280 and sum(map(surprising, scrambled)) > 200
    renamed = [sql_model.fresh_names(["mountain"], random.Random(i))[0] for i in range(400)]
    assert 120 < sum(map(surprising, renamed)) < 200  # about half the fresh names are scrambled


def test_every_name_a_held_out_query_needs_is_spelt_alike_in_its_prompt(val: list[dict[str, Any]]) -> None:
    """Copying is exact: each table or column name of a held-out gold query appears in the writer's
    prompt as the same token pieces, whether the query writes it after a space, `(` or `T1.`."""
    import sql_model
    from sql_agent import writer_prompt

    tok = sql_model.tokenizer()

    def ids(text: str) -> list[int]:
        return list(tok(text, add_special_tokens=False)["input_ids"])

    checked = 0
    for task in val:
        prompt = " " + " ".join(map(str, ids(writer_prompt(task["schema"], task["question"])))) + " "
        for word in set(re.findall(r"(?<![A-Za-z0-9'])[a-z]+(?:_[a-z]+)*", task["gold_sql"])):
            assert " " + " ".join(map(str, ids(word))) + " " in prompt, (word, task["gold_sql"])
            checked += 1
    assert checked > 3 * len(val)
