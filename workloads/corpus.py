"""Datasets as token files: the built-in corpus (the Python standard library's source, present
on every machine without a download) and a user's own `.txt`, `.jsonl` or pre-tokenised `.bin`.

Every dataset becomes two flat token files, train and validation, plus a metadata file with a
fingerprint of the tokens, so runs on different machines can be told apart or matched. Files
are written to a temporary name and renamed, so a crash or a concurrent builder never leaves a
torn file behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np

from workloads.flavours import BYTE_VOCAB

# Byte-level tokens: one token per byte. Documents are joined with a NUL byte, which never
# occurs in source text, as an end-of-document marker.
DOC_SEPARATOR = b"\x00"
CORPUS_VERSION = 1  # bump when the way tokens are built changes


class DatasetError(ValueError):
    """A dataset problem, phrased as one line naming the field or file."""


@dataclass(frozen=True)
class TokenFiles:
    train: Path
    val: Path
    dtype: str
    fingerprint: str  # sha256 of the train and validation tokens
    description: str  # what the corpus was made of, for humans and MLflow

    def as_dict(self) -> dict:
        return {
            "train": str(self.train),
            "val": str(self.val),
            "dtype": self.dtype,
            "fingerprint": self.fingerprint,
            "description": self.description,
        }


def default_cache_dir() -> Path:
    return Path(os.environ.get("COPUS_CACHE", Path.home() / ".cache" / "copus"))


def stdlib_source_files() -> tuple[Path, list[Path]]:
    """The standard library's .py files in a fixed order. site-packages and dist-packages
    (third-party code that differs from machine to machine) are left out."""
    root = Path(sysconfig.get_paths()["stdlib"]).resolve()
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("site-packages", "dist-packages", "__pycache__"))
        files.extend(Path(dirpath) / name for name in sorted(filenames) if name.endswith(".py"))
    return root, sorted(files, key=lambda p: p.relative_to(root).as_posix())


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _write_stream(path: Path, chunks: Iterable[np.ndarray], digest) -> int:
    """Write token arrays one after another to `path` (atomically); returns the token count."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    count = 0
    with open(tmp, "wb") as fh:
        for chunk in chunks:
            data = np.ascontiguousarray(chunk).tobytes()
            digest.update(data)
            fh.write(data)
            count += chunk.size
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return count


def write_token_files(
    out_dir: Path,
    train: Iterable[np.ndarray],
    val: Iterable[np.ndarray],
    dtype: str,
    description: str,
    source: str = "dataset",
) -> TokenFiles:
    """The train and validation token files (each given as a sequence of arrays, so a corpus
    larger than memory streams through) and their metadata. A split without a token is refused
    (DatasetError naming `source`) and leaves no cache entry: no run could train on it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    train_tokens = _write_stream(out_dir / "train.bin", train, digest)
    val_tokens = _write_stream(out_dir / "val.bin", val, digest)
    if not train_tokens or not val_tokens:
        for name in ("train.bin", "val.bin"):
            (out_dir / name).unlink(missing_ok=True)
        split = "train" if not train_tokens else "validation"
        raise DatasetError(f"{source}: no text: the {split} split has 0 tokens (an empty file?)")
    meta = {
        "version": CORPUS_VERSION,
        "dtype": dtype,
        "fingerprint": digest.hexdigest(),
        "description": description,
        "train_tokens": train_tokens,
        "val_tokens": val_tokens,
    }
    # meta.json last: its presence marks the cache entry complete.
    _atomic_write_bytes(out_dir / "meta.json", json.dumps(meta, indent=2).encode())
    return read_cached(out_dir)


def _write_split(out_dir: Path, train: np.ndarray, val: np.ndarray, description: str, source: str) -> TokenFiles:
    return write_token_files(out_dir, [train], [val], str(train.dtype), description, source)


def read_cached(out_dir: Path) -> TokenFiles | None:
    """The cache entry in `out_dir`, or None when there is none to use: absent, or damaged or
    empty (it is then built again)."""
    meta_path = out_dir / "meta.json"
    if not meta_path.is_file():
        return None
    try:
        meta = json.loads(meta_path.read_text())
        files = TokenFiles(
            out_dir / "train.bin", out_dir / "val.bin", meta["dtype"], meta["fingerprint"], meta["description"]
        )
        usable = meta["train_tokens"] > 0 and meta["val_tokens"] > 0 and files.train.is_file() and files.val.is_file()
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
        return None
    return files if usable else None


def held_out(n_tokens: int, val_fraction: float) -> int:
    """How many tokens at the end of a corpus without a validation file are held out."""
    return max(1, int(n_tokens * val_fraction))


def _split_tail(tokens: np.ndarray, val_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    n_val = held_out(len(tokens), val_fraction)
    return tokens[:-n_val], tokens[-n_val:]


def cache_key(*parts: object) -> str:
    return hashlib.sha256(json.dumps([CORPUS_VERSION, *parts], default=str).encode()).hexdigest()[:16]


def build_stdlib(val_fraction: float, cache_dir: Path) -> TokenFiles:
    root, files = stdlib_source_files()
    listing = [(p.relative_to(root).as_posix(), p.stat().st_size) for p in files]
    out_dir = cache_dir / "stdlib" / cache_key(sys.version, listing, val_fraction)
    cached = read_cached(out_dir)
    if cached:
        return cached
    data = DOC_SEPARATOR.join(p.read_bytes() for p in files)
    tokens = np.frombuffer(data, dtype=np.uint8).astype(np.uint16)
    train, val = _split_tail(tokens, val_fraction)
    desc = (
        f"Python {sys.version.split()[0]} standard library .py files under {root} "
        f"(site-packages excluded), {len(files)} files, {len(data) / 1e6:.1f} MB, byte tokens"
    )
    return _write_split(out_dir, train, val, desc, str(root))


def _text_documents(path: Path, kind: str, text_field: str) -> list[bytes]:
    if kind == "txt":
        return [path.read_bytes()]
    docs = []
    with open(path, "rb") as fh:
        for line_no, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise DatasetError(f"{path}:{line_no}: not valid JSON ({err.msg})") from None
            except UnicodeDecodeError as err:
                raise DatasetError(f"{path}:{line_no}: not UTF-8 text ({err.reason} at byte {err.start})") from None
            if not isinstance(record, dict) or not isinstance(record.get(text_field), str):
                raise DatasetError(f"{path}:{line_no}: no string field {text_field!r} (workload.dataset.text_field)")
            docs.append(record[text_field].encode("utf-8"))
    return docs


def _tokens_of_text_file(path: Path, kind: str, text_field: str) -> np.ndarray:
    data = DOC_SEPARATOR.join(_text_documents(path, kind, text_field))
    return np.frombuffer(data, dtype=np.uint8).astype(np.uint16)


def _tokens_of_bin(path: Path, dtype: str, vocab_size: int) -> np.ndarray:
    itemsize = np.dtype(dtype).itemsize
    if path.stat().st_size % itemsize:
        raise DatasetError(
            f"{path}: size {path.stat().st_size} is not a multiple of {itemsize} bytes (workload.dataset.dtype: {dtype})"
        )
    tokens = np.fromfile(path, dtype=dtype)
    if tokens.size and int(tokens.max()) >= vocab_size:
        raise DatasetError(f"{path}: token id {int(tokens.max())} is outside the model's vocabulary of {vocab_size}")
    return tokens


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def build_user(
    kind: str,
    path: Path,
    val_path: Path | None,
    text_field: str,
    dtype: str,
    val_fraction: float,
    vocab_size: int,
    cache_dir: Path,
) -> TokenFiles:
    sources = [path] + ([val_path] if val_path else [])
    if kind != "bin" and vocab_size < BYTE_VOCAB:  # before the cache: an entry says nothing of the model
        raise DatasetError(f"{path}: byte-level text needs a vocabulary of at least {BYTE_VOCAB} (workload.model)")
    # The vocabulary is part of a token file's key: its ids were checked against it.
    vocab = vocab_size if kind == "bin" else BYTE_VOCAB
    out_dir = (
        cache_dir / "user" / cache_key(kind, [file_digest(p) for p in sources], text_field, dtype, val_fraction, vocab)
    )
    cached = read_cached(out_dir)
    if cached:
        return cached

    def load(p: Path) -> np.ndarray:
        if kind == "bin":
            return _tokens_of_bin(p, dtype, vocab_size)
        return _tokens_of_text_file(p, kind, text_field)

    tokens = load(path)
    if val_path:
        train, val = tokens, load(val_path)
    else:
        train, val = _split_tail(tokens, val_fraction)
    desc = f"{kind} file {path}" + (
        f" with validation file {val_path}" if val_path else f", last {val_fraction:.1%} held out"
    )
    return _write_split(out_dir, train, val, desc, str(val_path if train.size and val_path else path))


def num_windows(n_tokens: int, seq_len: int) -> int:
    """How many samples of seq_len + 1 tokens (consecutive samples share one token) fit."""
    return max(0, (n_tokens - 1) // seq_len)


def file_windows(path: str | Path, dtype: str, seq_len: int) -> int:
    """How many samples of seq_len + 1 tokens a token file holds, read off its size."""
    return num_windows(os.path.getsize(path) // np.dtype(dtype).itemsize, seq_len)
