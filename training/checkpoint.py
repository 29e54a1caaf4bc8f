"""Checkpoint folders (training's output): config.json, model.safetensors, metrics.json.

A checkpoint is written into a temporary sibling folder and renamed into place, so a reader sees the
previous checkpoint or the complete new one, never a half-written folder.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from veil.atomic import atomic_dir

CONFIG_FILE, WEIGHTS_FILE, METRICS_FILE = "config.json", "model.safetensors", "metrics.json"


def save_checkpoint(out_dir: str | Path, config: dict[str, Any], state_dict: dict[str, torch.Tensor],
                    metrics: dict[str, Any]) -> Path:
    """Write the three files of a checkpoint atomically (as a whole folder)."""
    out_dir = Path(out_dir)
    with atomic_dir(out_dir) as tmp:
        tensors = {k: v.detach().contiguous().cpu() for k, v in state_dict.items()}
        save_file(tensors, str(tmp / WEIGHTS_FILE))
        (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True))
        (tmp / METRICS_FILE).write_text(json.dumps(metrics, indent=2, sort_keys=True))
    return out_dir


def load_checkpoint(path: str | Path) -> tuple[dict[str, Any], dict[str, torch.Tensor], dict[str, Any]]:
    """(config, state_dict, metrics) of a checkpoint folder; a clear error names a missing file."""
    path = Path(path)
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if not (path / name).is_file():
            raise FileNotFoundError(f"checkpoint {str(path)!r}: expected {name}, not found")
    config = json.loads((path / CONFIG_FILE).read_text())
    metrics = json.loads((path / METRICS_FILE).read_text()) if (path / METRICS_FILE).is_file() else {}
    return config, load_file(str(path / WEIGHTS_FILE)), metrics


def checkpoint_hash(path: str | Path) -> str:
    """SHA-256 over config.json and model.safetensors: what export records as the model's source."""
    digest = hashlib.sha256()
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        digest.update((Path(path) / name).read_bytes())
    return digest.hexdigest()
