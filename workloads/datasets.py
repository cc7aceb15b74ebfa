"""A dataset's token files, whatever its kind: the one entry copus calls (`copus run` through
`cluster.launch`, `copus prepare`). The built-in corpus and single byte-level files are built
by `workloads.corpus`; text through a tokenizer, parquet, and directories or patterns of files
by the parallel, restartable builder of `workloads.prepare`. (Before this module the dispatch
lived in corpus, which then had to import prepare, which imports corpus.)"""

from __future__ import annotations

from pathlib import Path

from workloads.corpus import TokenFiles, build_stdlib, build_user, default_cache_dir
from workloads.prepare import build_tokenized


def needs_tokenizing(kind: str, path: str | None, val_path: str | None, tokenizer: str | None) -> bool:
    """Whether a dataset goes through `workloads.prepare` (text through a tokenizer, parquet,
    directories or patterns of files) rather than the single-file byte-level builders here."""
    if kind in ("stdlib", "bin"):
        return False
    return (
        bool(tokenizer) or kind == "parquet" or not all(Path(p).expanduser().is_file() for p in (path, val_path) if p)
    )


def prepare_dataset(
    kind: str,
    path: str | None,
    val_path: str | None,
    text_field: str,
    dtype: str,
    val_fraction: float,
    vocab_size: int,
    cache_dir: str | None,
    tokenizer: str | None = None,
    workers: int | None = None,
    progress: bool = False,
) -> TokenFiles:
    """Build (or find in the cache) the token files of a dataset. Text through a tokenizer,
    parquet, and directories or patterns of files go through the parallel, restartable
    builder of `copus prepare` (workloads.prepare)."""
    cache = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    if kind == "stdlib":
        return build_stdlib(val_fraction, cache)
    assert path is not None
    if needs_tokenizing(kind, path, val_path, tokenizer):
        return build_tokenized(
            kind, path, val_path, text_field, tokenizer, vocab_size, val_fraction, cache, workers, progress
        ).files
    return build_user(
        kind,
        Path(path).expanduser().resolve(),
        Path(val_path).expanduser().resolve() if val_path else None,
        text_field,
        dtype,
        val_fraction,
        vocab_size,
        cache,
    )
