"""The data side of the multi-hop retrieval example: a fictional world, its corpus, search and reward.

Put ``examples/rag`` on ``sys.path`` and ``import rag_data``.
"""

from __future__ import annotations

from .corpus import Document, default_documents, document_for, world_documents
from .reward import answer_f1, extract_answer, format_score, normalize_answer, rag_reward
from .search import CACHE_ENV, Fts5UnavailableError, SearchIndex, default_index, fts_query, search
from .tasks import TEMPLATES, RagTask, corpus_text, generate_tasks, task_pool, train_tasks, val_tasks
from .world import SPLITS, Split, World, WorldPart, default_world, generate_world

__all__ = [
    "CACHE_ENV",
    "SPLITS",
    "TEMPLATES",
    "Document",
    "Fts5UnavailableError",
    "RagTask",
    "SearchIndex",
    "Split",
    "World",
    "WorldPart",
    "answer_f1",
    "corpus_text",
    "default_documents",
    "default_index",
    "default_world",
    "document_for",
    "extract_answer",
    "format_score",
    "fts_query",
    "generate_tasks",
    "generate_world",
    "normalize_answer",
    "rag_reward",
    "search",
    "task_pool",
    "train_tasks",
    "val_tasks",
    "world_documents",
]
