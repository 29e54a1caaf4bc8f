"""PAVE specs beside exported models: ``<repo>/<model>/pave.json`` (``pave/<adapter>.json`` for adapters), listed in
``veil.json`` (``pave_spec`` / ``pave_specs``) so the served model metadata names them; ``POST /v2/recommend``
ranks them (docs/recommend.md).

The spec of a ``veil finetune`` run is fitted on the run's own predictions over a probe set of its task's training
inputs (:func:`veil.training.pave.model_spec`), on the base the run was fine-tuned from.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from veil.pave import ADAPTER_SPEC_DIR, SPEC_FILE, PaveVector

from veil.atomic import write_atomic
from veil.config import ConfigError

DEFAULT_PROBE_SIZE = 128


def spec_settings(text: str | None) -> tuple[Any, int]:
    """``--spec [JSON]`` -> (PaveConfig, probe size): a JSON object (inline or a file) of PaveConfig fields plus
    ``probe_size``; empty for the defaults."""
    from veil.training.pave import PaveConfig

    data: dict[str, Any] = {}
    if text:
        path = Path(text)
        raw = path.read_text() if not text.lstrip().startswith("{") and path.is_file() else text
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"--spec: expected a JSON object (inline or a file), received {text[:80]!r} ({exc.msg})") from None
        if not isinstance(data, dict):
            raise ConfigError(f"--spec: expected a JSON object, received {type(data).__name__}")
    probe = data.pop("probe_size", DEFAULT_PROBE_SIZE)
    if isinstance(probe, bool) or not isinstance(probe, int) or probe < 1:
        raise ConfigError(f"--spec.probe_size: expected an int >= 1, received {probe!r}")
    return PaveConfig.from_dict(data), probe


def _summary(spec: PaveVector, file: str) -> dict[str, Any]:
    ident = spec.identity
    return {"file": file, "kind": spec.kind, "identity_hash": spec.identity_hash, "dim": spec.dim,
            "base": ident["base"], "base_sha256": ident["base_sha256"], "projection_seed": ident["projection_seed"],
            "rank": ident["rank"], "fit": spec.fit.get("targets")}


def write_spec(repo: str | Path, name: str, spec: PaveVector, adapter: str | None = None) -> dict[str, Any]:
    """Write ``spec`` beside ``<repo>/<name>/veil.json`` and list it there; returns the listing entry.

    The spec file is written first (atomically), then veil.json (atomically): a reader never sees a listing whose
    file is missing.

    Raises:
        FileNotFoundError: the model was not exported (no veil.json).
        ValueError: ``spec`` is not a model spec, or the adapter id is not one path component.
    """
    folder = Path(repo) / name
    manifest_path = folder / "veil.json"
    if not manifest_path.is_file():
        raise FileNotFoundError(f"{manifest_path}: expected an exported model (veil export first), received no veil.json")
    if spec.kind != "model":
        raise ValueError(f"spec.kind: expected 'model', received {spec.kind!r}")
    if adapter is not None and (not adapter or "/" in adapter or adapter.startswith(".")):
        raise ValueError(f"adapter: expected one path component, received {adapter!r}")
    rel = SPEC_FILE if adapter is None else f"{ADAPTER_SPEC_DIR}/{adapter}.json"
    write_atomic(folder / rel, spec.to_json())
    manifest = json.loads(manifest_path.read_text())
    entry = _summary(spec, rel)
    if adapter is None:
        manifest["pave_spec"] = entry
    else:
        manifest.setdefault("pave_specs", {})[adapter] = entry
    write_atomic(manifest_path, json.dumps(manifest, indent=2, sort_keys=True, default=str))
    return entry


def run_spec(run: str | Path, config: Any, probe_size: int = DEFAULT_PROBE_SIZE, base: str | None = None) -> PaveVector:
    """The PAVE spec of a ``veil finetune`` text run: its predictions on ``probe_size`` of its task's training inputs.

    Raises:
        ValueError: the run is not a text-classification run of the ``veil finetune`` tasks, or its base is not the
            one the spec base is loaded from.
    """
    from veil.training.adapters.data import TASKS, make_task
    from veil.training.adapters.finetune import BUNDLED_MINILM, MINILM_HUB_ID, load_encoder
    from veil.training.pave import SpecBase, classifier_predictor, model_spec

    from .finetuned import load_run, read_json

    run = Path(run)
    settings = read_json(run / "finetune.json", "run")
    task = settings.get("task")
    if task not in TASKS:
        raise ValueError(f"--spec: expected a text run of the tasks {sorted(TASKS)}, received task {task!r}")
    adapter = read_json(run / "adapter_config.json", "run")
    source = base or adapter.get("base_model_name_or_path") or BUNDLED_MINILM
    source = BUNDLED_MINILM if source == MINILM_HUB_ID else source
    model, _, _ = load_run(run, source)
    if source == BUNDLED_MINILM:
        spec_base = SpecBase.bundled(config)
    else:
        encoder, tokenizer = load_encoder(source)
        spec_base = SpecBase(Path(source).name, encoder, tokenizer, config)
    data = make_task(task, (settings.get("train_size", 384), settings.get("val_size", 120),
                            settings.get("test_size", 240)), settings.get("seed", 0))
    probe = data.train.texts[:probe_size]
    return model_spec(spec_base, classifier_predictor(model, spec_base.tokenizer, config.max_length), probe)
