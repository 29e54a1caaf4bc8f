"""A tiny Llama-style byte-level LM trained from scratch: the workload `veil train lm` uses to compare optimizers.

Public names: the configs and presets, the bundled/own-text loaders, the byte tokenizer and the trainer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from veil.lazy import lazy_exports

if TYPE_CHECKING:
    from .config import PRESETS, LMModelConfig, LMTrainConfig
    from .data import ByteTokenizer, Corpus, load_pydoc_topics, load_text_file
    from .model import build_lm, llama_config
    from .trainer import LMResult, evaluate, load_lm, save_lm, train_lm

# public name -> the submodule that defines it, imported on first use (a CLI's --help never imports torch)
__getattr__, __dir__ = lazy_exports(__name__, {
    "PRESETS": ".config",
    "LMModelConfig": ".config",
    "LMTrainConfig": ".config",
    "ByteTokenizer": ".data",
    "Corpus": ".data",
    "load_pydoc_topics": ".data",
    "load_text_file": ".data",
    "build_lm": ".model",
    "llama_config": ".model",
    "LMResult": ".trainer",
    "evaluate": ".trainer",
    "load_lm": ".trainer",
    "save_lm": ".trainer",
    "train_lm": ".trainer",
})

__all__ = [
    "PRESETS", "ByteTokenizer", "Corpus", "LMModelConfig", "LMResult", "LMTrainConfig", "build_lm", "evaluate",
    "llama_config", "load_lm", "load_pydoc_topics", "load_text_file", "save_lm", "train_lm",
]
