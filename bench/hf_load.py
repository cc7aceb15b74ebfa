"""Memory of loading a sharded Hugging Face checkpoint per rank, against the whole model's size.

Saves a random ~44 M-parameter Llama (175 MB in float32) with transformers' save_pretrained in
20 MB shards, then builds it under a few layouts on local gloo ranks (workload.init_from's path:
cut to the stage, sharded over tp, each shard read with get_slice) and prints, per rank: the
parameter bytes it holds (exactly what it reads from the files) and how much its peak
resident memory grew while loading.

    .venv/bin/python bench/hf_load.py            # needs transformers (the test extra)
    .venv/bin/python bench/hf_load.py --smoke    # a ~1 M-parameter model, layouts (1,1,1) and (1,1,2)

The last line reads `layout dpD-tpT-ppP: per rank held ... MB (= bytes read), peak RSS growth ...`
for the last layout.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `bench` run from the repository root

import psutil  # noqa: E402
import torch  # noqa: E402
from smoke import parse_args  # noqa: E402

from copus.parallel.dims import ParallelDims  # noqa: E402
from copus.parallel.redistribute import local_tensor  # noqa: E402
from copus.train.local import run_on_gloo_ranks  # noqa: E402
from copus.train.parallel_model import ParallelModel  # noqa: E402
from workloads.hf_config import flavour_from_config  # noqa: E402

FULL = {"hidden_size": 512, "num_hidden_layers": 8, "intermediate_size": 1536, "vocab_size": 16000}
SMOKE = {"hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 512}


def save_model(directory: Path, sizes: dict) -> int:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(num_attention_heads=8, num_key_value_heads=4, tie_word_embeddings=False, **sizes)
    model = LlamaForCausalLM(config)
    model.save_pretrained(directory, max_shard_size="20MB")
    return sum(p.numel() * p.element_size() for p in model.parameters())


class PeakRSS:
    """The highest resident set size seen while the block runs (sampled every 2 ms: the lifetime
    peak of the process, ru_maxrss, is usually set earlier, by imports), in all and without
    file-backed pages (the safetensors files are memory-mapped: the pages a slice touches count
    as resident while the file is open, but they are page cache, not memory the rank allocates)."""

    def __enter__(self) -> "PeakRSS":
        self.process, self.peak, self.peak_anon, self._stop = psutil.Process(), 0, 0, threading.Event()
        info = self.process.memory_info()
        self.before, self.before_anon = info.rss, info.rss - info.shared
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self._update()
            time.sleep(0.002)

    def _update(self) -> None:
        info = self.process.memory_info()
        self.peak, self.peak_anon = max(self.peak, info.rss), max(self.peak_anon, info.rss - info.shared)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._update()


def load_on_rank(layout: tuple, directory: str) -> dict:
    t = time.perf_counter()
    with PeakRSS() as rss:
        model = ParallelModel(
            flavour_from_config(directory), 128, 0, ParallelDims(*layout), torch.device("cpu"), init_from=directory
        )
    seconds = time.perf_counter() - t
    held = sum(local_tensor(p).numel() * local_tensor(p).element_size() for p in model.module.parameters())
    grown, grown_anon = rss.peak - rss.before, rss.peak_anon - rss.before_anon
    model.close()
    # The loader reads exactly the box of each parameter a rank holds: held = bytes read.
    return {"held": held, "peak_growth": grown, "peak_growth_anon": grown_anon, "seconds": seconds}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layouts", default="1,1,1;1,2,2;2,2,2", help="dp,tp,pp;... (default: %(default)s)")
    args = parse_args(parser, {"layouts": "1,1,1;1,1,2"}, argv)
    with tempfile.TemporaryDirectory(prefix="copus-hf-load-") as tmp:
        whole = save_model(Path(tmp), SMOKE if args.smoke else FULL)
        shards = len(list(Path(tmp).glob("*.safetensors")))
        print(f"model: {whole / 1e6:.1f} MB of float32 parameters in {shards} safetensors shards")
        for text in args.layouts.split(";"):
            layout = tuple(int(x) for x in text.split(","))
            ranks = run_on_gloo_ranks(layout[0] * layout[1] * layout[2], load_on_rank, layout, tmp)
            worst, anon = max(r["peak_growth"] for r in ranks), max(r["peak_growth_anon"] for r in ranks)
            print(
                f"layout dp{layout[0]}-tp{layout[1]}-pp{layout[2]}: per rank held "
                f"{max(r['held'] for r in ranks) / 1e6:.1f} MB (= bytes read), "
                f"peak RSS growth {worst / 1e6:.1f} MB ({worst / whole:.0%} of the whole model; "
                f"{anon / 1e6:.1f} MB = {anon / whole:.0%} without mapped file pages), "
                f"load {max(r['seconds'] for r in ranks):.2f} s"
            )


if __name__ == "__main__":
    main()
