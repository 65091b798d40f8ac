"""The reward of the multi-hop retrieval paper: 0.9 * answer token F1 + 0.1 * format.

Token F1 (SQuAD's) gives partial credit to a partly copied name ("Kalim" for "Kalim Ottar"), a denser
signal than exact match for a small model; the small format term rewards ending with exactly one
``ANSWER: ...`` line, which is what lets the answer be read at all.
"""

from __future__ import annotations

import re
import string
from collections import Counter

LABEL = "ANSWER:"
F1_WEIGHT = 0.9
FORMAT_WEIGHT = 0.1

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def extract_answer(text: str) -> str | None:
    """The text after the last ``ANSWER:`` up to the end of its line, stripped; None without a label."""
    at = text.rfind(LABEL)
    if at < 0:
        return None
    return text[at + len(LABEL) :].split("\n", 1)[0].strip()


def format_score(text: str) -> float:
    """1.0 when the reply holds exactly one ``ANSWER: <non-empty>`` with only whitespace after that line."""
    if text.count(LABEL) != 1:
        return 0.0
    rest = text.split(LABEL, 1)[1].strip()
    return 1.0 if rest and "\n" not in rest else 0.0


def normalize_answer(s: str) -> str:
    """SQuAD's normalization: lowercase, drop punctuation and articles, collapse whitespace."""
    s = s.lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", s).split())


def answer_f1(pred: str | None, gold: str) -> float:
    """SQuAD token F1 between the normalized prediction and gold; 0.0 for a missing or empty prediction."""
    if pred is None:
        return 0.0
    pred_tokens = normalize_answer(pred).split()
    gold_tokens = normalize_answer(gold).split()
    if not pred_tokens or not gold_tokens:
        return 0.0
    common = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if common == 0:
        return 0.0
    precision = common / len(pred_tokens)
    recall = common / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def rag_reward(final_text: str, gold: str) -> float:
    """0.9 * F1 of the extracted answer + 0.1 * format: the reward of one rollout's final reply."""
    return F1_WEIGHT * answer_f1(extract_answer(final_text), gold) + FORMAT_WEIGHT * format_score(final_text)
