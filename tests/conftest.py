"""Shared fixtures: a tiny experiment mapping and a session-wide token cache."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def token_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("copus-cache")


@pytest.fixture
def base_mapping(tmp_path, token_cache) -> dict:
    """A small valid experiment (2 data-parallel CPU workers) as a raw YAML mapping."""
    return copy.deepcopy(
        {
            "name": "test",
            "workload": {"model": "debug", "seq_len": 32, "dataset": {"kind": "stdlib", "cache_dir": str(token_cache)}},
            "optimizer": {"lr": 3e-3, "reference_gbs": 8},
            "batch": {"gbs": 8, "mbs": 2},
            "parallel": {"dp": 2, "tp": 1, "pp": 1},
            "stop": {"max_steps": 6},
            "eval": {"every_steps": 3, "val_samples": 8},
            "checkpoint": {"every_steps": 3},
            "cluster": {"num_workers": 2},
            "tracking": {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "experiment": "tests"},
            "output_dir": str(tmp_path / "out"),
        }
    )
