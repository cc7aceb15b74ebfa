"""What experiments/finetune_cpu.yaml fine-tunes with, made from this machine alone:

- `tokenizer.json`: byte-level tokens as a Hugging Face tokenizer (id = byte value, the tokens
  the quickstart model was trained on, so an export of it and this tokenizer belong together);
- `docstrings.jsonl`: the docstrings of the standard library's modules, classes and functions
  (read with `ast`, nothing imported), one record per docstring: prose, where the quickstart
  learnt code.

    .venv/bin/python -m workloads.demo_data runs/finetune-data
"""

from __future__ import annotations

import argparse
import ast
import json
from pathlib import Path

from workloads.corpus import stdlib_source_files


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map, which byte-level tokenizers use for their vocabulary."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def byte_level_tokenizer():
    """A `tokenizers` Tokenizer whose token ids are the UTF-8 bytes of the text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tokenizer = Tokenizer(models.BPE(vocab={c: b for b, c in bytes_to_unicode().items()}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def train_bpe_tokenizer(texts: list[str], vocab_size: int):
    """A byte-level BPE tokenizer trained on `texts`, with an <|endoftext|> token (tests, benchmarks)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer


def stdlib_docstrings(limit: int | None = None) -> list[str]:
    """Docstrings of the standard library (in the corpus's file order), longer than 40 characters."""
    texts: list[str] = []
    for path in stdlib_source_files()[1]:
        try:
            tree = ast.parse(path.read_bytes())
        except (SyntaxError, ValueError):  # test data files that are not valid Python on purpose
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) > 40:
                    texts.append(doc)
                    if limit is not None and len(texts) >= limit:
                        return texts
    return texts


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="directory to write tokenizer.json and docstrings.jsonl into")
    out = Path(parser.parse_args(argv).out)
    out.mkdir(parents=True, exist_ok=True)
    byte_level_tokenizer().save(str(out / "tokenizer.json"))
    docs = stdlib_docstrings()
    (out / "docstrings.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    print(f"wrote {out / 'tokenizer.json'} (byte-level) and {out / 'docstrings.jsonl'} ({len(docs)} docstrings)")


if __name__ == "__main__":
    main()
