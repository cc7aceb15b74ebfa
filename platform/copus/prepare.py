"""`copus prepare`: the experiment's dataset to token files before training, with figures.

`copus run` builds the same token files itself when they are missing (the same cache entry);
preparing first uses every core with a progress bar, and can be stopped and restarted.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from copus.config import ExperimentConfig
from workloads.corpus import default_cache_dir
from workloads.datasets import needs_tokenizing, prepare_dataset
from workloads.prepare import build_tokenized


def prepare_experiment_data(cfg: ExperimentConfig, workers: int | None, progress: bool) -> dict:
    ds, tokenizer = cfg.workload.dataset, cfg.workload.tokenizer
    vocab = cfg.flavour().vocab_size
    t0 = time.perf_counter()
    if needs_tokenizing(ds.kind, ds.path, ds.val_path, tokenizer):
        cache = Path(ds.cache_dir).expanduser() if ds.cache_dir else default_cache_dir()
        report = build_tokenized(
            ds.kind, ds.path, ds.val_path, ds.text_field, tokenizer, vocab, ds.val_fraction, cache, workers, progress
        )
        files, made, used, resumed = report.files, report.tokens, report.workers, report.resumed_units
    else:  # built-in or pre-tokenised data: one process, nothing to spread
        files = prepare_dataset(
            ds.kind, ds.path, ds.val_path, ds.text_field, ds.dtype, ds.val_fraction, vocab, ds.cache_dir
        )
        made, used, resumed = None, 1, 0
    seconds = time.perf_counter() - t0
    meta = json.loads((files.train.parent / "meta.json").read_text())
    # made: tokens built by this call, 0 when the cache held them, None when not counted (built here
    # in one process, or found: the byte-level single-file builders do not say which).
    rate = (
        f", {made / seconds:,.0f} tokens/s on {used} processes" if made else " (already prepared)" if made == 0 else ""
    )
    return {
        "train": str(files.train),
        "val": str(files.val),
        "dtype": files.dtype,
        "fingerprint": files.fingerprint,
        "train_tokens": meta["train_tokens"],
        "val_tokens": meta["val_tokens"],
        "tokenized": made,
        "seconds": seconds,
        "workers": used,
        "resumed_units": resumed,
        "line": f"prepared {meta['train_tokens']:,} train and {meta['val_tokens']:,} validation tokens in "
        f"{seconds:.1f} s{rate}: {files.train.parent}",
    }
