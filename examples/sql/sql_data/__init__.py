"""Spider-like Text-to-SQL data: SQLite databases, template questions with gold and near-miss SQL,
and the execution-match reward. Put `examples/sql` on sys.path and `import sql_data`."""

from .databases import CACHE_ENV, build_database, cache_dir, database_path
from .questions import LEVELS, TEMPLATES, Question, make_question
from .reward import QueryError, execution_match, extract_sql, has_top_level_order_by, results_match, run_query
from .schemas import (
    DOMAINS,
    HELD_OUT_DOMAIN_NAMES,
    INSTANCES_PER_DOMAIN,
    Domain,
    db_ids,
    domain_of,
    schema_text,
)
from .tasks import (
    HELD_OUT_DOMAINS,
    TRAIN_DOMAINS,
    SqlTask,
    corpus_text,
    generate_tasks,
    level_counts,
    train_tasks,
    val_tasks,
)

__all__ = [
    "CACHE_ENV",
    "DOMAINS",
    "HELD_OUT_DOMAINS",
    "HELD_OUT_DOMAIN_NAMES",
    "INSTANCES_PER_DOMAIN",
    "LEVELS",
    "TEMPLATES",
    "TRAIN_DOMAINS",
    "Domain",
    "QueryError",
    "Question",
    "SqlTask",
    "build_database",
    "cache_dir",
    "corpus_text",
    "database_path",
    "db_ids",
    "domain_of",
    "execution_match",
    "extract_sql",
    "generate_tasks",
    "has_top_level_order_by",
    "level_counts",
    "make_question",
    "results_match",
    "run_query",
    "schema_text",
    "train_tasks",
    "val_tasks",
]
