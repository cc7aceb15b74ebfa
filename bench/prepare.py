"""Throughput of `copus prepare` on the standard-library corpus: every stdlib .py file as one
jsonl record, through a byte-level BPE tokenizer trained here on stdlib docstrings, with 1
process and with every core (the same files each time, checked by fingerprint).

    .venv/bin/python bench/prepare.py [--vocab 8192]
    .venv/bin/python bench/prepare.py --smoke      # 20 files, vocabulary 512

The last line reads `same token files: True`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `bench` run from the repository root

from smoke import parse_args  # noqa: E402

from workloads.corpus import stdlib_source_files  # noqa: E402
from workloads.demo_data import stdlib_docstrings, train_bpe_tokenizer  # noqa: E402
from workloads.prepare import build_tokenized  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int, default=8192, help="BPE vocabulary (default %(default)s)")
    parser.add_argument("--files", type=int, default=None, help="only the first N stdlib files (default: all)")
    args = parse_args(parser, {"vocab": 512, "files": 20}, argv)
    with tempfile.TemporaryDirectory(prefix="copus-bench-prepare-") as tmp:
        root = Path(tmp)
        files = stdlib_source_files()[1][: args.files]
        corpus = root / "stdlib.jsonl"
        with open(corpus, "w") as fh:
            for path in files:
                fh.write(json.dumps({"text": path.read_text(errors="replace")}) + "\n")
        train_bpe_tokenizer(stdlib_docstrings(300 if args.smoke else 3000), args.vocab).save(
            str(root / "tokenizer.json")
        )
        print(f"corpus: {len(files)} stdlib files, {corpus.stat().st_size / 1e6:.1f} MB; BPE vocabulary {args.vocab}")
        fingerprints = set()
        for workers in sorted({1, os.cpu_count() or 1}):
            report = build_tokenized(
                "jsonl",
                str(corpus),
                None,
                "text",
                str(root / "tokenizer.json"),
                args.vocab,
                0.01,
                root / f"cache{workers}",
                workers,
            )
            fingerprints.add(report.files.fingerprint)
            print(
                f"{workers} process(es): {report.tokens:,} tokens in {report.seconds:.1f} s = "
                f"{report.tokens / report.seconds:,.0f} tokens/s"
            )
        print("same token files:", len(fingerprints) == 1)


if __name__ == "__main__":
    main()
