"""veil.export: trained model -> validated ONNX in a Triton / KServe model repository.

    export_uldnet(checkpoint, repo, name)            ULD-Net checkpoint (veil layers as `veil` ONNX functions)
    export_sentence_encoder("bundled:all-MiniLM-L6-v2", repo)   transformers encoder + mean pooling
    export_graph / validate_export / write_model     the pieces, for other model kinds

Every export is validated against PyTorch at shapes other than the example and fails loudly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from veil.lazy import lazy_exports

if TYPE_CHECKING:
    from .encoder import export_sentence_encoder
    from .errors import ExportError, ExportValidationError
    from .onnx_export import ExportedGraph, export_graph
    from .repository import TensorSpec, write_model
    from .uldnet import export_uldnet
    from .validate import validate_export

# public name -> the submodule that defines it, imported on first use (a CLI's --help never imports torch)
__getattr__, __dir__ = lazy_exports(__name__, {
    "export_sentence_encoder": ".encoder",
    "ExportedGraph": ".onnx_export",
    "export_graph": ".onnx_export",
    "TensorSpec": ".repository",
    "write_model": ".repository",
    "ExportError": ".errors",
    "ExportValidationError": ".errors",
    "export_uldnet": ".uldnet",
    "validate_export": ".validate",
})

__all__ = ["ExportError", "ExportValidationError", "ExportedGraph", "TensorSpec", "export_graph",
           "export_sentence_encoder", "export_uldnet", "validate_export", "write_model"]
