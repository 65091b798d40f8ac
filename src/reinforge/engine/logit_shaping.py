"""What a request asks of sampling beyond temperature and truncation: penalties, logit bias, a grammar.

One `LogitShaper` per sequence that needs it (most need none, and pay nothing). It edits a copy of
the sequence's logits before the sampler draws from them, so the recorded logprob (the behaviour
policy's) includes them; the trainer's policy does not, and truncated importance sampling corrects
for the difference (see `sampling.py`).

Grammars are matched by llguidance (a maintained Rust library that computes token masks in
microseconds and handles tokenisation ambiguity itself), built once per tokenizer.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from reinforge.errors import InvalidRequestError
from reinforge.inference.contract import SamplingParams


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-to-unicode table, inverted: how byte-level BPE spells raw bytes as characters."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def token_bytes(tokenizer: PreTrainedTokenizerBase) -> tuple[list[bytes], list[int]]:
    """Each token id's bytes, and the ids of special tokens (which grammars never match as text).

    Added tokens that are not special (`<tool_call>`, whole-word merges) are ordinary text here:
    llguidance's own Hugging Face loader treats every added token as special, which would forbid the
    very tokens a model uses to write a tool call.
    """
    vocab: dict[str, int] = tokenizer.get_vocab()
    size = max(vocab.values()) + 1
    pieces: list[bytes] = [b""] * size
    decoder = _byte_decoder()
    added = {tok.content: tok.special for tok in tokenizer.added_tokens_decoder.values()}
    byte_level = all(ch in decoder for piece in vocab if piece not in added for ch in piece)
    special: list[int] = []
    for piece, token_id in vocab.items():
        if piece in added:
            pieces[token_id] = piece.encode()
            if added[piece]:
                special.append(token_id)
        elif byte_level and all(ch in decoder for ch in piece):
            pieces[token_id] = bytes(decoder[ch] for ch in piece)
        elif piece.startswith("<0x") and piece.endswith(">") and len(piece) == 6:  # sentencepiece bytes
            pieces[token_id] = bytes([int(piece[3:5], 16)])
        else:
            pieces[token_id] = piece.replace("\u2581", " ").encode()
    return pieces, sorted(special)


class _TokenizerView:
    """The tokenizer as llguidance's `TokenizerWrapper` protocol wants it (tokens as bytes)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokens, self.special_token_ids = token_bytes(tokenizer)
        self.eos_token_id = tokenizer.eos_token_id
        self.bos_token_id = tokenizer.bos_token_id
        self._tokenizer = tokenizer
        self.is_tokenizer_wrapper = True

    def __call__(self, text: str | bytes) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return list(self._tokenizer(text, add_special_tokens=False)["input_ids"])


class GrammarCompiler:
    """Grammar matchers for one tokenizer; the llguidance tokenizer is built on first use."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, stop_ids: frozenset[int]) -> None:
        self._tokenizer = tokenizer
        self._stop_ids = sorted(stop_ids)
        self._ll: Any = None
        self._lock = threading.Lock()

    def _ll_tokenizer(self) -> Any:
        with self._lock:
            if self._ll is None:
                import llguidance

                self._ll = llguidance.LLTokenizer(
                    llguidance.TokenizerWrapper(_TokenizerView(self._tokenizer)),
                    eos_token=self._stop_ids or None,
                )
            return self._ll

    @property
    def vocab_size(self) -> int:
        return int(self._ll_tokenizer().vocab_size)

    def matcher(self, grammar: str) -> Any:
        """A fresh matcher for `grammar`, or InvalidRequestError saying what is wrong with it."""
        import llguidance

        try:
            compiled = llguidance.LLMatcher.grammar_from_lark(grammar)
        except ValueError as exc:
            raise InvalidRequestError(f"the output constraint is not a valid grammar: {exc}") from None
        matcher = llguidance.LLMatcher(self._ll_tokenizer(), compiled)
        if matcher.is_error():
            raise InvalidRequestError(f"the output constraint can't be compiled: {matcher.get_error()}")
        return matcher


class LogitShaper:
    """One sequence's penalties, bias and grammar state."""

    def __init__(self, sampling: SamplingParams, grammars: GrammarCompiler | None) -> None:
        self.presence = sampling.presence_penalty
        self.frequency = sampling.frequency_penalty
        self.bias = dict(sampling.logit_bias)
        self.counts: Counter[int] = Counter()
        self.matcher: Any = None
        self._mask: torch.Tensor | None = None
        self._bias_rows: tuple[tuple[object, ...], torch.Tensor, torch.Tensor] | None = None
        self._vocab = 0
        if sampling.grammar is not None:
            if grammars is None:
                raise InvalidRequestError("this engine has no tokenizer to constrain output with")
            self.matcher = grammars.matcher(sampling.grammar)
            self._vocab = grammars.vocab_size

    def shape(self, logits: torch.Tensor) -> None:
        """Edit one row of logits in place before sampling."""
        if self.bias:
            logits.index_add_(0, *self._bias_for(logits))
        if self.counts and (self.presence or self.frequency):
            ids = torch.tensor(list(self.counts), device=logits.device)
            counts = torch.tensor(list(self.counts.values()), device=logits.device, dtype=logits.dtype)
            logits.index_add_(0, ids, -(self.frequency * counts + self.presence))
        if self.matcher is not None:
            self._apply_grammar(logits)

    def _bias_for(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The bias's token ids inside this vocabulary and their values, built once per sequence (a
        step shapes every row, and building them per row per step cost more than the step's argmax)."""
        key = (logits.device, logits.dtype, logits.shape[0])
        if self._bias_rows is None or self._bias_rows[0] != key:
            ids = torch.tensor(list(self.bias), device=logits.device)
            inside = ids < logits.shape[0]
            values = torch.tensor(list(self.bias.values()), device=logits.device, dtype=logits.dtype)
            self._bias_rows = (key, ids[inside], values[inside])
        return self._bias_rows[1], self._bias_rows[2]

    def _apply_grammar(self, logits: torch.Tensor) -> None:
        import llguidance.torch as ll_torch

        vocab = min(self._vocab, logits.shape[0])
        if self._mask is None:
            self._mask = ll_torch.allocate_token_bitmask(1, vocab)
        ll_torch.fill_next_token_bitmask(self.matcher, self._mask, 0)
        allowed = self._mask.to(logits.device)
        ll_torch.apply_token_bitmask_inplace(logits[:vocab].unsqueeze(0), allowed)
        if logits.shape[0] > vocab:  # padded embedding rows are no tokens of the tokenizer
            logits[vocab:] = float("-inf")

    def advance(self, token: int) -> bool:
        """Take the sampled token; True when the grammar is complete (the sequence should stop)."""
        self.counts[token] += 1
        if self.matcher is None:
            return False
        self.matcher.consume_token(token)
        return bool(self.matcher.is_stopped())
