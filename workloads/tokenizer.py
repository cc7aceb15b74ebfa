"""Tokenizers for text data: a Hugging Face `tokenizer.json` read with the `tokenizers` library,
or byte-level tokens (one token per UTF-8 byte, the built-in default) when none is given.

Documents are separated by an end-of-document token: the tokenizer's own (the first of the
usual names it defines), or NUL (0) for byte-level tokens, as in the built-in corpus.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np

TOKENIZER_FILE = "tokenizer.json"
# End-of-document tokens of common tokenizers (GPT-2/Qwen, Llama 2, Llama 3, Gemma).
END_OF_DOCUMENT = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>")
BYTE_SEPARATOR = 0


class TokenizerError(ValueError):
    """A tokenizer problem, phrased as one line naming the file."""


def tokenizer_file(path: str | Path) -> Path:
    """The tokenizer.json a path names (the file itself, or the one in a directory)."""
    p = Path(path).expanduser().resolve()
    if p.is_dir():
        p = p / TOKENIZER_FILE
    if not p.is_file():
        raise TokenizerError(f"{p}: not found (a tokenizer.json, or a directory holding one)")
    return p


@lru_cache(maxsize=8)
def _load(file: str, _mtime: int):
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(file)
    except Exception as err:  # the library raises plain Exceptions with a parser message
        raise TokenizerError(f"{file}: not a tokenizers tokenizer.json ({str(err).splitlines()[0]})") from None


def load_tokenizer(path: str | Path):
    file = tokenizer_file(path)
    return _load(str(file), file.stat().st_mtime_ns)


def tokenizer_vocab_size(path: str | Path) -> int:
    """One more than the largest token id the tokenizer can produce (added tokens included)."""
    vocab = load_tokenizer(path).get_vocab(with_added_tokens=True)
    return max(vocab.values()) + 1 if vocab else 0


def separator_id(tokenizer) -> int | None:
    for token in END_OF_DOCUMENT:
        token_id = tokenizer.token_to_id(token)
        if token_id is not None:
            return token_id
    return None


class TextEncoder:
    """Documents -> one flat token array, each document followed by the separator."""

    def __init__(self, tokenizer_path: str | None, dtype: str):
        self.tokenizer = load_tokenizer(tokenizer_path) if tokenizer_path else None
        self.separator = separator_id(self.tokenizer) if self.tokenizer else BYTE_SEPARATOR
        self.dtype = dtype

    def end_of_document(self, present: bool = True) -> np.ndarray:
        return np.array([self.separator] if present and self.separator is not None else [], dtype=self.dtype)

    def encode(self, documents: list[str], separate: bool = True) -> np.ndarray:
        if self.tokenizer is None:
            pieces = [np.frombuffer(d.encode("utf-8"), dtype=np.uint8) for d in documents]
        else:
            pieces = [
                np.asarray(e.ids, dtype=np.int64)
                for e in self.tokenizer.encode_batch(documents, add_special_tokens=False)
            ]
        if separate:
            tail = self.end_of_document()
            pieces = [x for piece in pieces for x in (piece, tail)]
        return np.concatenate(pieces).astype(self.dtype) if pieces else np.zeros(0, dtype=self.dtype)
