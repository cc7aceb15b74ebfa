"""The compute of one reference training step on one core of this machine: what an emulated
cluster's link rate is scaled by, so that the data-parallel all-reduce weighs against compute
as it did on the machine the rate was chosen on (docs/emulated-cluster.md, "The link rate").

The reference step is one rank's share of the all-data-parallel layout at the reference GBS,
as bench/link_rate.py defines the ratio's compute: GBS / world samples in one micro-batch,
forward, backward and an AdamW step, on one thread, no communication. The figure is the
median of several steps after warm-up ones.

    .venv/bin/python -m copus.train.reference_step EXPERIMENT.yaml   # prints seconds; ~5 s
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from copus.train.parallel_model import token_loss
from workloads.flavours import ModelFlavour
from workloads.llama import build_model

WARMUP_STEPS = 3
TIMED_STEPS = 15


def reference_step_s(flavour: ModelFlavour, seq_len: int, samples: int, steps: int = TIMED_STEPS) -> float:
    """Median seconds of one training step of `samples` sequences on one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _median_step(flavour, seq_len, samples, steps)
    finally:
        torch.set_num_threads(threads)


def _median_step(flavour: ModelFlavour, seq_len: int, samples: int, steps: int) -> float:
    model = build_model(flavour, seq_len, seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, flavour.vocab_size, (samples, seq_len + 1), generator=gen)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    times = []
    for i in range(WARMUP_STEPS + steps):
        t0 = time.perf_counter()
        logits = model(inputs)
        token_loss(logits, targets).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if i >= WARMUP_STEPS:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    from copus.cluster.emulate_link import reference_shape
    from copus.config import ConfigError, load_config

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m copus.train.reference_step EXPERIMENT.yaml", file=sys.stderr)
        return 2
    try:
        cfg = load_config(args[0])
    except ConfigError as err:
        print(f"copus: {err}", file=sys.stderr)
        return 2
    flavour, seq_len, samples = reference_shape(cfg)
    print(f"{reference_step_s(flavour, seq_len, samples):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
