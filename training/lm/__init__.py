"""A tiny Llama-style byte-level LM trained from scratch: the workload `veil train lm` uses to compare optimizers.

Public names: the configs and presets, the bundled/own-text loaders, the byte tokenizer and the trainer.
"""

from .config import PRESETS, LMModelConfig, LMTrainConfig
from .data import ByteTokenizer, Corpus, load_pydoc_topics, load_text_file
from .model import build_lm, llama_config
from .trainer import LMResult, evaluate, load_lm, save_lm, train_lm

__all__ = [
    "PRESETS", "ByteTokenizer", "Corpus", "LMModelConfig", "LMResult", "LMTrainConfig", "build_lm", "evaluate",
    "llama_config", "load_lm", "load_pydoc_topics", "load_text_file", "save_lm", "train_lm",
]
