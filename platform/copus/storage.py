"""Where COPUS keeps files under an output directory, and how it writes them.

Used by every layer that writes run files (the driver, comparisons, calibration, export), so it
imports neither torch nor ray.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

RAY_STORAGE = "ray"  # Ray Train's storage_path under the output directory (checkpoints, results)
RAY_RUN_NAME = "train"


def ray_storage(output_dir: Path) -> Path:
    return output_dir / RAY_STORAGE


def write_json_atomic(path: Path, data) -> None:
    """Write JSON so that a crash leaves the previous file or the new one, never half of one."""
    tmp = path.parent / f".{path.name}.tmp"
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)
