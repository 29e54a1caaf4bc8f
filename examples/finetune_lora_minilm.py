"""Fine-tune the bundled all-MiniLM-L6-v2 with LoRA on a templated task, save it in the PEFT layout,
load it back into a fresh base, merge it, and check the merged model gives the same predictions.

Run:
    python examples/finetune_lora_minilm.py                       # ~1-2 min on 2 CPU cores
    python examples/finetune_lora_minilm.py --train-size 32 --epochs 1 --out /tmp/lora
"""

from __future__ import annotations

import argparse

import torch
from veil.training.adapters import AdapterModel, inject
from veil.training.adapters.data import make_task
from veil.training.adapters.finetune import (
    BUNDLED_MINILM,
    FinetuneConfig,
    build_classifier,
    make_batches,
    train,
)

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--task", default="sentiment", choices=["sentiment", "number", "topic"])
parser.add_argument("--train-size", type=int, default=384)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--out", default="runs/lora-minilm")
args = parser.parse_args()

cfg = FinetuneConfig(method="lora", task=args.task, train_size=args.train_size, epochs=args.epochs,
                     val_size=64, test_size=128)
task = make_task(cfg.task, (cfg.train_size, cfg.val_size, cfg.test_size), seed=cfg.seed)

# 1. base model (pretrained encoder + fresh head) -> LoRA on q/k/v/dense, head in modules_to_save
base, tokenizer = build_classifier(BUNDLED_MINILM, len(task.label_names), cfg.seed)
model = inject(base, cfg.adapter_config(len(task.label_names)))
print(model.format_trainable_report().splitlines()[-1])

# 2. train, then save in the PEFT layout (adapter_config.json + adapter_model.safetensors)
metrics = train(model, tokenizer, task, cfg, progress=False)
print(f"test accuracy: {metrics['test_accuracy']:.3f} ({metrics['train_seconds']} s)")
model.save_pretrained(args.out)

# 3. load into a fresh base, merge, compare predictions with the trained model
fresh, _ = build_classifier(BUNDLED_MINILM, len(task.label_names), seed=123)
merged = AdapterModel.from_pretrained(fresh, args.out).merge_and_unload().eval()
batch = make_batches(tokenizer, task.test.texts, task.test.labels, cfg)[0]
with torch.no_grad():
    model.eval()
    diff = (merged(batch["input_ids"], batch["attention_mask"]) - model(batch["input_ids"], batch["attention_mask"]))
print(f"reloaded + merged vs trained: max |logit diff| = {diff.abs().max().item():.2e}")
