"""What the hostile-input tests feed the CLI: small Hugging Face model directories (numpy, no
transformers), run folders with real or fake checkpoints, output folders whose JSON files say
what a run or a comparison left, and one way to call `copus` in this process that tells a
refusal (exit 2, one line) from a crash (any other exception: a traceback)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import traceback
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from copus.cli import main
from workloads.corpus import file_digest

VOCAB = 512
CHECKPOINT_NAMES = ("checkpoint_2026-01-01_00-00-00.000001", "checkpoint_2026-01-01_00-05-00.000001")


@dataclass
class Outcome:
    code: int | None  # None: the command raised (`error` holds the traceback)
    out: str
    err: str
    error: str = ""

    def one_line_refusal(self) -> bool:
        """Exit 2 with exactly one line on stderr (argparse's own usage errors aside)."""
        lines = self.err.splitlines()
        return self.code == 2 and (len(lines) == 1 and lines[0].startswith("copus: ") or "usage: copus" in self.err)


def invoke(argv: list[str]) -> Outcome:
    """`copus ARGV` in this process: its exit code and what it printed."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exit_:  # argparse refusing the command line
            code = exit_.code if isinstance(exit_.code, int) else 2
        except BaseException:  # noqa: BLE001 - a crash is what the tests look for
            return Outcome(None, out.getvalue(), err.getvalue(), traceback.format_exc())
    return Outcome(code, out.getvalue(), err.getvalue())


def write_experiment(path: Path, mapping: dict) -> Path:
    path.write_text(yaml.safe_dump(mapping))
    return path


def write_hf_dir(directory: Path, vocab: int = VOCAB, config: dict | None = None, escape: bool = False) -> Path:
    """A Llama-shaped model directory (zeros), its config.json patched by `config`; `escape`
    writes an index whose weight_map sends one tensor outside the directory."""
    from safetensors.numpy import save_file

    from workloads.flavours import ModelFlavour
    from workloads.hf_config import config_from_flavour, hf_name, parameter_shapes

    directory.mkdir(parents=True, exist_ok=True)
    flavour = ModelFlavour(
        "x", dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=96, vocab_size=vocab, max_seq_len=256
    )
    raw = {**config_from_flavour(flavour), **(config or {})}
    (directory / "config.json").write_text(json.dumps(raw))
    tensors = {hf_name(k): np.zeros(v, np.float32) for k, v in parameter_shapes(flavour).items()}
    if not escape:
        save_file(tensors, str(directory / "model.safetensors"))
        return directory
    save_file(tensors, str(directory / "model-1.safetensors"))
    weight_map = {name: "model-1.safetensors" for name in tensors} | {"lm_head.weight": "../../../etc/passwd"}
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return directory


def fake_checkpoint(where: Path, step: int) -> Path:
    """A checkpoint's layout with a manifest that verifies (no model tensors: export refuses it)."""
    where.mkdir(parents=True, exist_ok=True)
    (where / "__0_0.distcp").write_bytes(f"weights of step {step}".encode())
    (where / "trainer_state.json").write_text(json.dumps({"step": step}))
    files = {n: {"size": (where / n).stat().st_size, "sha256": file_digest(where / n)} for n in ("__0_0.distcp",)}
    (where / "manifest_rank0.json").write_text(json.dumps({"rank": 0, "world_size": 1, "files": files}))
    (where / "COMPLETE").write_text(json.dumps({"step": step, "world_size": 1}))
    return where


def real_run(root: Path, token_cache: Path) -> Path:
    """An output directory holding two real checkpoints (steps 2 and 4) of the debug model,
    trained in this process, laid out as Ray Train keeps them."""
    from copus.train.local import run_local
    from copus.train.worker_plan import StopRule
    from tests.train.loop_helpers import small_plan

    plan = small_plan(token_cache, stop=StopRule(max_steps=4), checkpoint_every_steps=2)
    run_local(plan, root / "ck")
    train = root / "run" / "ray" / "train"
    train.mkdir(parents=True)
    for name, step in zip(CHECKPOINT_NAMES, ("step2", "step4")):
        shutil.copytree(root / "ck" / step, train / name)
    shutil.rmtree(root / "ck")
    return root / "run"


def pointer_files(directory: Path, tracking_uri: str) -> Path:
    """An output folder whose summary.json points at an MLflow run that `tracking_uri` lacks."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "summary.json").write_text(
        json.dumps({"mlflow_tracking_uri": tracking_uri, "mlflow_run_id": "0123456789abcdef0123456789abcdef"})
    )
    return directory


def tree_digest(root: Path) -> dict[str, str]:
    """Every entry under `root` and what it holds (a file's digest, a link's target, "dir"): what
    a command that only reads must leave as it was."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames + dirnames:
            path = Path(dirpath) / name
            key = str(path.relative_to(root))
            if path.is_symlink():
                found[key] = f"link:{os.readlink(path)}"
            else:
                found[key] = "dir" if path.is_dir() else file_digest(path)
    return found
