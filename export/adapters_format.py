"""``.onnx_adapter`` files (``onnxruntime.AdapterFormat``): writing one adapter's parameters, and one stock
ONNX Runtime run with an adapter file active (the reference the export validates against; the engine's
:class:`~veil.engine.adapters.AdapterCache` is the serving counterpart, since export never imports the engine)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

ADAPTER_VERSION = 1  # written into every .onnx_adapter (AdapterFormat.set_adapter_version)


def write_onnx_adapter(path: Path, params: dict[str, np.ndarray], model_version: int) -> None:
    """One ``.onnx_adapter`` file (ONNX Runtime's adapter format) holding ``params``."""
    fmt = ort.AdapterFormat()
    fmt.set_adapter_version(ADAPTER_VERSION)
    fmt.set_model_version(model_version)
    fmt.set_parameters({n: ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(v)) for n, v in params.items()})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fmt.export_adapter(str(tmp))
    tmp.replace(path)


def run_with_adapter(session: ort.InferenceSession, feeds: dict[str, np.ndarray], output_names: list[str],
                     adapter_path: Path | None) -> list[np.ndarray]:
    """One stock-ORT run, with the ``.onnx_adapter`` at ``adapter_path`` active (None: the base)."""
    options = ort.RunOptions()
    if adapter_path is not None:
        adapter = ort.LoraAdapter()
        adapter.Load(str(adapter_path))
        options.add_active_adapter(adapter)
    return session.run(output_names, feeds, run_options=options)
