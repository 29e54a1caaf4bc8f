"""Loading a ``veil finetune`` text adapter in ``peft``: the exact base, and the model card that names it.

A text adapter adapts a :class:`~veil.training.adapters.finetune.MeanPoolClassifier` (encoder ``bert``, head
``classifier`` on the masked mean of the tokens). Its keys are those of ``BertForSequenceClassification``, so that
class (and ``AutoPeftModelForSequenceClassification``) loads it without a warning, yet computes another function:
the head then reads the CLS pooler, not the mean. :func:`peft_base` rebuilds the right base::

    base, tokenizer = peft_base("runs/lora-sentiment")
    model = peft.PeftModel.from_pretrained(base, "runs/lora-sentiment")
    logits = model(**tokenizer(["the film was not good."], return_tensors="pt")).logits
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .checkpoint import CONFIG_NAME, WEIGHTS_NAME
from .finetune_config import BUNDLED_MINILM, MINILM_HUB_ID

HEAD_KEY = "base_model.model.classifier.weight"  # the saved head (modules_to_save) of a text adapter
README = "README.md"


def encoder_source(name: str | None) -> str:
    """What :func:`~veil.training.adapters.finetune.load_encoder` loads for a checkpoint's
    ``base_model_name_or_path`` (the bundled MiniLM for its hub id or for None)."""
    return BUNDLED_MINILM if name in (None, MINILM_HUB_ID) else name


def peft_base(adapter: str | Path, model: str | None = None) -> tuple[Any, Any]:
    """The base ``peft.PeftModel.from_pretrained(base, adapter)`` needs for a veil text adapter, and its tokenizer.

    Args:
        adapter: a PEFT-layout folder whose head is a ``MeanPoolClassifier``'s ``classifier`` in
            ``modules_to_save`` (a ``veil finetune`` text run, its ``as_lora/``, or what ``peft`` saved over this base).
        model: the encoder (``bundled:all-MiniLM-L6-v2`` or a transformers folder); default: the checkpoint's
            ``base_model_name_or_path``.

    Returns:
        (``MeanPoolClassifier`` with a head sized like the saved one, in eval mode; the encoder's tokenizer).

    Raises:
        ValueError: the folder holds no PEFT checkpoint, or no ``classifier`` head.
    """
    from safetensors import safe_open

    from .finetune import build_classifier

    folder = Path(adapter)
    for name in (CONFIG_NAME, WEIGHTS_NAME):
        if not (folder / name).is_file():
            raise ValueError(f"peft_base: expected {folder / name} (PEFT layout), it is missing")
    config = json.loads((folder / CONFIG_NAME).read_text())
    with safe_open(str(folder / WEIGHTS_NAME), framework="pt") as weights:
        if HEAD_KEY not in set(weights.keys()):
            raise ValueError(f"peft_base: expected the head {HEAD_KEY!r} (modules_to_save ['classifier']) in "
                             f"{folder / WEIGHTS_NAME}, received none: the adapter is not over a MeanPoolClassifier")
        num_labels = weights.get_slice(HEAD_KEY).get_shape()[0]
    base, tokenizer = build_classifier(model or encoder_source(config.get("base_model_name_or_path")), num_labels,
                                       seed=0)  # the head is the adapter's: its init does not matter
    return base.eval(), tokenizer


PEFT_FOLDERS = {"lora": "RUN", "psoft": "RUN/as_lora", "e2lora": "RUN/as_lora"}  # method -> its PEFT LoRA folder


def model_card(method: str, task: str, labels: list[str], base: str) -> str | None:
    """The README.md of a text run: which base to load its LoRA onto, in ``peft``, and which not (None for the
    methods whose checkpoints only veil reads: mtLoRA, LoRA-Mixer)."""
    lora = PEFT_FOLDERS.get(method)
    if lora is None:
        return None
    return f"""---
library_name: peft
base_model: {base}
tags: [veil, mean-pool-classifier]
---
# veil finetune --method {method} --task {task}

Labels: {", ".join(labels)}. RUN is this folder; its PEFT LoRA is `{lora}`. The base is veil's
`MeanPoolClassifier`: the encoder `{base}` (`bert`), then a linear `classifier` on the masked mean of the token
embeddings (saved in `modules_to_save`). `BertForSequenceClassification` and
`AutoPeftModelForSequenceClassification` load these keys without a warning but compute another function (the CLS
pooler). Load it this way:

```python
import peft
from veil.training.adapters import peft_base

base, tokenizer = peft_base("{lora}")
model = peft.PeftModel.from_pretrained(base, "{lora}")
logits = model(**tokenizer(["an example"], return_tensors="pt")).logits
```

Serve it alone: `veil export finetuned RUN --repo models --name NAME`; beside other LoRAs over one base:
`veil export adapters {encoder_source(base)} --adapter ID={lora} --repo models --name NAME`.
"""
