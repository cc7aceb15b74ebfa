"""Sample-exact, resumable access to a token file.

A *sample* is a window of seq_len + 1 tokens (inputs and shifted targets); sample i of the
train file starts at token i * seq_len. Samples are visited in a fresh random order each
epoch, fixed by (seed, epoch). The whole data position is one integer: how many samples have
been consumed. A step takes the next GBS samples of that sequence, whatever the GBS, so a
change of GBS between steps neither skips nor repeats a sample, and resuming from a saved
position continues the exact sequence.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from workloads.corpus import num_windows


class TokenWindows:
    """Fixed-length windows over a flat token file (memory-mapped, never fully loaded)."""

    def __init__(self, path: str | Path, dtype: str, seq_len: int):
        self.path = Path(path)
        self.tokens = np.memmap(self.path, dtype=dtype, mode="r")
        self.seq_len = seq_len
        self.num_samples = num_windows(len(self.tokens), seq_len)
        if self.num_samples < 1:
            raise ValueError(
                f"{self.path}: {len(self.tokens)} tokens are fewer than one sample of seq_len + 1 = {seq_len + 1}"
            )

    def window(self, index: int) -> np.ndarray:
        start = index * self.seq_len
        return np.asarray(self.tokens[start : start + self.seq_len + 1], dtype=np.int64)

    def batch(self, indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets), each (len(indices), seq_len) int64."""
        rows = (
            np.stack([self.window(int(i)) for i in indices])
            if len(indices)
            else np.zeros((0, self.seq_len + 1), np.int64)
        )
        data = torch.from_numpy(rows)
        return data[:, :-1], data[:, 1:]


class SampleOrder:
    """The k-th sample to consume, for any k: epoch k // n in a permutation seeded by (seed, epoch)."""

    def __init__(self, num_samples: int, seed: int):
        self.num_samples = num_samples
        self.seed = seed
        self._epoch = -1
        self._perm = np.empty(0, dtype=np.int64)

    def _permutation(self, epoch: int) -> np.ndarray:
        if epoch != self._epoch:
            self._perm = np.random.default_rng([self.seed, epoch]).permutation(self.num_samples)
            self._epoch = epoch
        return self._perm

    def indices(self, start: int, count: int) -> np.ndarray:
        """Sample indices for consumption positions start .. start + count - 1 (may cross epochs)."""
        out = np.empty(count, dtype=np.int64)
        done = 0
        while done < count:
            pos = start + done
            epoch, offset = divmod(pos, self.num_samples)
            take = min(count - done, self.num_samples - offset)
            out[done : done + take] = self._permutation(epoch)[offset : offset + take]
            done += take
        return out


@dataclass(frozen=True)
class ReplicaBatch:
    """What one data-parallel replica computes for one step."""

    sample_indices: np.ndarray  # this replica's samples, in micro-batch order
    microbatches: list[np.ndarray]  # m arrays of mbs indices each


def replica_batch(global_indices: np.ndarray, dp_rank: int, dp: int, mbs: int) -> ReplicaBatch:
    """Split one step's GBS samples: replica r takes the r-th contiguous block, cut into
    micro-batches of `mbs`. Every sample of the step goes to exactly one replica."""
    gbs = len(global_indices)
    if gbs % (dp * mbs):
        raise ValueError(f"GBS {gbs} is not divisible by dp x mbs = {dp} x {mbs}")
    per_replica = gbs // dp
    mine = global_indices[dp_rank * per_replica : (dp_rank + 1) * per_replica]
    return ReplicaBatch(mine, [mine[i : i + mbs] for i in range(0, per_replica, mbs)])


class TrainStream:
    """The train data position: `samples_consumed` plus the order it indexes."""

    def __init__(self, windows: TokenWindows, seed: int, samples_consumed: int = 0):
        self.windows = windows
        self.order = SampleOrder(windows.num_samples, seed)
        self.samples_consumed = samples_consumed

    def next_global_batch(self, gbs: int) -> np.ndarray:
        indices = self.order.indices(self.samples_consumed, gbs)
        self.samples_consumed += gbs
        return indices

    def state_dict(self) -> dict:
        return {
            "samples_consumed": self.samples_consumed,
            "seed": self.order.seed,
            "num_samples": self.windows.num_samples,
        }

    def load_state_dict(self, state: dict) -> None:
        if state["num_samples"] != self.windows.num_samples or state["seed"] != self.order.seed:
            raise ValueError(
                f"data position was saved for {state['num_samples']} samples / seed {state['seed']}, "
                f"this dataset has {self.windows.num_samples} / seed {self.order.seed}"
            )
        self.samples_consumed = int(state["samples_consumed"])


def validation_indices(windows: TokenWindows, count: int) -> np.ndarray:
    """The fixed held-out set: the first `count` windows of the validation file."""
    if count > windows.num_samples:
        raise ValueError(f"eval.val_samples: {count} exceeds the {windows.num_samples} samples of the validation split")
    return np.arange(count, dtype=np.int64)
