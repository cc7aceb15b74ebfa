"""`copus prepare`: a local text corpus (txt, jsonl, parquet) to token files, on all cores.

The corpus is cut into work units that need no reading to find: byte ranges of txt and jsonl
files (a unit owns the lines that start in its range) and row groups of parquet files. A pool
of processes tokenizes the units, each written as its own token shard (atomically: a shard
that exists is complete). Running again after an interruption tokenizes only the units
without a shard. When every shard is there, they are joined in corpus order into the train
and validation token files that training memory-maps (`workloads.corpus` format, the same
cache entry `copus run` looks for), and the shards are removed.

Documents: a jsonl line or a parquet row is one document; a txt file is one document (its
units end at line breaks). Each document is followed by the end-of-document token
(`workloads.tokenizer`); empty documents are left out.
"""

from __future__ import annotations

import glob
import multiprocessing
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from workloads.corpus import DatasetError, TokenFiles, cache_key, file_digest, held_out, read_cached, write_token_files
from workloads.flavours import BYTE_VOCAB
from workloads.tokenizer import TextEncoder, tokenizer_file

UNIT_BYTES = 4 << 20  # text per work unit: small enough to spread over cores and to lose little when stopped


@dataclass(frozen=True)
class Unit:
    split: str  # "train" or "val"
    index: int  # position in the split: shards are joined in this order
    path: str
    kind: str
    start: int  # txt/jsonl: byte range [start, stop); parquet: row group start
    stop: int
    size: int  # bytes, for the progress bar
    last_of_file: bool

    @property
    def shard_name(self) -> str:
        return f"{self.split}-{self.index:06d}.bin"


def source_files(path: str, kind: str) -> list[Path]:
    """The files a dataset path names: a file, a directory's *.<kind> files (recursively), or a
    glob pattern's files; sorted."""
    p = Path(path).expanduser()
    if p.is_file():
        return [p.resolve()]
    if p.is_dir():
        return sorted(f.resolve() for f in p.rglob(f"*.{kind}") if f.is_file())
    return sorted(Path(f).resolve() for f in glob.glob(str(p), recursive=True) if Path(f).is_file())


def _units_of_file(split: str, first_index: int, path: Path, kind: str) -> list[Unit]:
    if kind == "parquet":
        import pyarrow.parquet as pq

        try:
            meta = pq.ParquetFile(path).metadata
        except Exception as err:  # ArrowInvalid and friends: the message names the problem
            raise DatasetError(f"{path}: not a readable parquet file ({err})") from None
        n = meta.num_row_groups
        kept = [g for g in range(n) if meta.row_group(g).num_rows]  # a row group without rows has no text
        return [
            Unit(split, first_index + i, str(path), kind, g, g + 1, meta.row_group(g).total_byte_size, g == n - 1)
            for i, g in enumerate(kept)
        ]
    size = path.stat().st_size
    starts = list(range(0, size, UNIT_BYTES)) or [0]
    return [
        Unit(
            split,
            first_index + i,
            str(path),
            kind,
            s,
            min(s + UNIT_BYTES, size),
            min(UNIT_BYTES, size - s),
            i == len(starts) - 1,
        )
        for i, s in enumerate(starts)
    ]


def plan_units(split: str, files: list[Path], kind: str) -> list[Unit]:
    units: list[Unit] = []
    for path in files:
        units += _units_of_file(split, len(units), path, kind)
    return units


def _line_block(path: str, start: int, stop: int) -> bytes:
    """The lines that start in [start, stop) of a file."""
    with open(path, "rb") as fh:
        if start > 0:
            fh.seek(start - 1)
            fh.readline()  # the end of a line that started in the previous unit (or just its newline)
        begin = fh.tell()
        if begin >= stop:
            return b""
        data = fh.read(stop - begin)
        if data and not data.endswith(b"\n"):
            data += fh.readline()
        return data


def _texts(table, column: str, path: str) -> list[str]:
    import pyarrow as pa

    if column not in table.column_names:
        raise DatasetError(f"{path}: no field {column!r} (workload.dataset.text_field)")
    values = table.column(column)
    if not (pa.types.is_string(values.type) or pa.types.is_large_string(values.type)) or values.null_count:
        raise DatasetError(f"{path}: field {column!r} is not a string in every record (workload.dataset.text_field)")
    return [t for t in values.to_pylist() if t]


def read_documents(unit: Unit, text_field: str) -> list[str]:
    if unit.kind == "parquet":
        import pyarrow.parquet as pq

        return _texts(pq.ParquetFile(unit.path).read_row_group(unit.start, columns=None), text_field, unit.path)
    block = _line_block(unit.path, unit.start, unit.stop)
    if unit.kind == "txt":
        return [block.decode("utf-8", errors="replace")] if block else []
    if not block.strip():
        return []
    import pyarrow as pa
    import pyarrow.json as pj

    try:
        table = pj.read_json(pa.BufferReader(block))
    except pa.ArrowInvalid as err:
        raise DatasetError(f"{unit.path}: not valid JSON lines after byte {unit.start} ({err})") from None
    return _texts(table, text_field, unit.path)


_worker: dict = {}  # per process: the encoder and settings, set once by the pool's initializer


def _init_pool_worker(*args) -> None:
    # One process per core: the tokenizer's own thread pool would only compete with them.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _init_worker(*args)


def _init_worker(tokenizer: str | None, dtype: str, text_field: str, shard_dir: str) -> None:
    _worker.update(encoder=TextEncoder(tokenizer, dtype), text_field=text_field, shard_dir=Path(shard_dir))


def tokenize_unit(unit: Unit) -> tuple[int, int]:
    """Tokenize one unit into its shard; returns (tokens, bytes of text)."""
    docs = read_documents(unit, _worker["text_field"])
    encoder: TextEncoder = _worker["encoder"]
    if unit.kind == "txt":  # a txt file is one document: the separator follows its last unit only
        tokens = np.concatenate([encoder.encode(docs, separate=False), encoder.end_of_document(unit.last_of_file)])
    else:
        tokens = encoder.encode(docs)
    path = _worker["shard_dir"] / unit.shard_name
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tokens.tofile(tmp)
    os.replace(tmp, path)
    return int(tokens.size), unit.size


def _tokenize_all(
    pending: list[Unit], worker_args: tuple, workers: int, progress: bool, done_bytes: int, total_bytes: int
) -> int:
    """Tokenize the units without a shard yet, in `workers` processes; returns the tokens made."""
    from tqdm import tqdm

    made = 0
    started = time.perf_counter()
    with tqdm(
        total=total_bytes,
        initial=done_bytes,
        unit="B",
        unit_scale=True,
        desc="copus prepare",
        disable=not progress,
        smoothing=0.1,
    ) as bar:

        def advance(result: tuple[int, int]) -> None:
            nonlocal made
            made += result[0]
            bar.update(result[1])
            bar.set_postfix_str(f"{made / max(time.perf_counter() - started, 1e-9):,.0f} tokens/s")

        if workers == 1:
            _init_worker(*worker_args)
            for unit in pending:
                advance(tokenize_unit(unit))
        else:
            # spawn: a fork would copy this process's tokenizer thread pool (a known deadlock).
            context = multiprocessing.get_context("spawn")
            with context.Pool(workers, initializer=_init_pool_worker, initargs=worker_args) as pool:
                for result in pool.imap_unordered(tokenize_unit, pending):
                    advance(result)
    return made


def _pieces(shards: list[Path], dtype: str, start: int, stop: int):
    """Tokens [start, stop) of the shards joined in order, as arrays."""
    at = 0
    for shard in shards:
        tokens = np.fromfile(shard, dtype=dtype)
        lo, hi = max(start - at, 0), min(stop - at, tokens.size)
        if lo < hi:
            yield tokens[lo:hi]
        at += tokens.size


def _join(
    out_dir: Path, train: list[Path], val: list[Path], dtype: str, val_fraction: float, description: str, source: str
) -> TokenFiles:
    itemsize = np.dtype(dtype).itemsize
    n_train = sum(p.stat().st_size for p in train) // itemsize
    if val:
        n_val = sum(p.stat().st_size for p in val) // itemsize
        return write_token_files(
            out_dir, _pieces(train, dtype, 0, n_train), _pieces(val, dtype, 0, n_val), dtype, description, source
        )
    cut = n_train - held_out(n_train, val_fraction)
    return write_token_files(
        out_dir, _pieces(train, dtype, 0, cut), _pieces(train, dtype, cut, n_train), dtype, description, source
    )


def _join_shards(out_dir: Path, units: list[Unit], dtype: str, val_fraction: float, description: str, source: str):
    """The shards joined into the token files, then removed: joined, or refused (no text at all),
    they are of no more use either way."""
    shard_dir = out_dir / "shards"
    try:
        return _join(
            out_dir,
            [shard_dir / u.shard_name for u in units if u.split == "train"],
            [shard_dir / u.shard_name for u in units if u.split == "val"],
            dtype,
            val_fraction,
            description,
            source,
        )
    finally:
        shutil.rmtree(shard_dir, ignore_errors=True)


def _refuse_empty(units: list[Unit], path: str, val_path: str | None) -> None:
    """A split whose files hold no bytes (no rows) is refused before anything is tokenized; one
    whose text makes no token is refused when the token files are joined."""
    for split, name, source in (("train", "train", path), ("val", "validation", val_path)):
        if source and not any(u.size for u in units if u.split == split):
            raise DatasetError(f"{source}: no text: the {name} split has 0 tokens (an empty file?)")


@dataclass
class PrepareReport:
    files: TokenFiles
    tokens: int  # tokenized by this call (0 when the cache already held the result)
    seconds: float
    workers: int
    resumed_units: int  # units whose shard an earlier, interrupted call had written


def _tokenized_key(
    kind: str,
    train_files: list,
    val_files: list,
    text_field: str,
    tokenizer: str | None,
    dtype: str,
    val_fraction: float,
) -> str:
    """What the token files depend on: the source files' contents, the text field, the tokenizer's
    file, the token dtype, the split and the unit size."""
    tok_digest = file_digest(tokenizer_file(tokenizer)) if tokenizer else "bytes"
    return cache_key(
        "tokenized",
        kind,
        [file_digest(p) for p in train_files + val_files],
        len(train_files),
        text_field,
        tok_digest,
        dtype,
        val_fraction,
        UNIT_BYTES,
    )


def build_tokenized(
    kind: str,
    path: str,
    val_path: str | None,
    text_field: str,
    tokenizer: str | None,
    vocab_size: int,
    val_fraction: float,
    cache: Path,
    workers: int | None = None,
    progress: bool = False,
) -> PrepareReport:
    """Token files of a text corpus: built, resumed where an earlier call stopped, or found in
    the cache."""
    t0 = time.perf_counter()
    dtype = "uint16" if vocab_size <= 1 << 16 else "uint32"
    if tokenizer is None and vocab_size < BYTE_VOCAB:
        raise DatasetError(f"{path}: byte-level text needs a vocabulary of at least {BYTE_VOCAB} (workload.model)")
    train_files, val_files = source_files(path, kind), source_files(val_path, kind) if val_path else []
    if not train_files or (val_path and not val_files):
        raise DatasetError(f"{path if not train_files else val_path}: no {kind} file found")
    out_dir = (
        cache / "tokenized" / _tokenized_key(kind, train_files, val_files, text_field, tokenizer, dtype, val_fraction)
    )
    workers = max(1, workers or os.cpu_count() or 1)
    cached = read_cached(out_dir)
    if cached:
        return PrepareReport(cached, 0, time.perf_counter() - t0, workers, 0)
    units = plan_units("train", train_files, kind) + plan_units("val", val_files, kind)
    _refuse_empty(units, path, val_path)
    shard_dir = out_dir / "shards"
    shard_dir.mkdir(parents=True, exist_ok=True)
    pending = [u for u in units if not (shard_dir / u.shard_name).is_file()]
    done_bytes = sum(u.size for u in units if u not in pending)
    workers = min(workers, max(1, len(pending)))  # no more processes than units
    made = _tokenize_all(
        pending,
        (tokenizer and str(tokenizer_file(tokenizer)), dtype, text_field, str(shard_dir)),
        workers,
        progress,
        done_bytes,
        sum(u.size for u in units),
    )
    description = f"{kind} {path} ({len(train_files)} files), {tokenizer or 'byte-level'} tokens" + (
        f", validation {val_path}" if val_path else f", last {val_fraction:.1%} held out"
    )
    files = _join_shards(out_dir, units, dtype, val_fraction, description, str(path))
    return PrepareReport(files, made, time.perf_counter() - t0, workers, len(units) - len(pending))
