"""Fine-tune LoRA on the bundled all-MiniLM-L6-v2 with a LoRA-aware optimizer (AdamS or LRACS) next to AdamW:
the (A, B) pair of each adapted layer is one param group, the head trains with AdamW.

Run:
    python examples/optim_lora_minilm.py                                   # AdamW, AdamS, LRACS (~20 s)
    python examples/optim_lora_minilm.py --optimizers adams --train-size 64 --epochs 1
"""

from __future__ import annotations

import argparse
import math

import torch
from torch import nn
from veil.training.adapters import LoraConfig, inject
from veil.training.adapters.data import make_task
from veil.training.adapters.finetune import (
    BUNDLED_MINILM,
    FinetuneConfig,
    accuracy,
    build_classifier,
    make_batches,
)
from veil.training.optim import build_optimizer, lora_param_groups, optimizer_state_bytes

# the lrs benchmarks/optim_lora.py picked on validation; AdamS/LRACS move X like full fine-tuning: smaller lrs
LRS = {"adamw": 5e-3, "adams": 3e-4, "lracs": 2.5e-4}

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--task", default="sentiment", choices=["sentiment", "number", "topic"])
parser.add_argument("--optimizers", nargs="+", default=list(LRS), choices=list(LRS))
parser.add_argument("--train-size", type=int, default=128)
parser.add_argument("--epochs", type=int, default=2)
args = parser.parse_args()
torch.set_num_threads(1)

cfg = FinetuneConfig(task=args.task, train_size=args.train_size, epochs=args.epochs, val_size=16, test_size=96)
task = make_task(cfg.task, (cfg.train_size, cfg.val_size, cfg.test_size), seed=cfg.seed)
steps = cfg.epochs * math.ceil(cfg.train_size / cfg.batch_size)
test = None
for name in args.optimizers:
    # 1. the same base, head and LoRA init for every optimizer (seeded)
    base, tokenizer = build_classifier(BUNDLED_MINILM, len(task.label_names), cfg.seed)
    model = inject(base, LoraConfig(r=8, lora_alpha=16, target_modules=["query", "key", "value", "dense"],
                                    exclude_modules=["pooler.dense"], modules_to_save=["classifier"],
                                    task_type="SEQ_CLS"))
    if name != "adamw":  # what build_optimizer does for adams/lracs: one group per LoRA pair, one for the rest
        groups = lora_param_groups(model)
        print(f"{name}: {sum(g['lora_pair'] for g in groups)} LoRA pairs, e.g. {groups[0]['name']}")
    # 2. the optimizer by name, with a linear-decay schedule
    opt = build_optimizer(name, model, lr=LRS[name])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 - s / steps)
    for epoch in range(cfg.epochs):
        model.train()
        for b in make_batches(tokenizer, task.train.texts, task.train.labels, cfg, shuffle_seed=epoch):
            loss = nn.functional.cross_entropy(model(b["input_ids"], b["attention_mask"]), b["labels"])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
    # 3. evaluate
    test = test or make_batches(tokenizer, task.test.texts, task.test.labels, cfg)
    print(f"{name}: lr {LRS[name]:g}, final loss {loss.item():.3f}, test accuracy {accuracy(model, test):.3f}, "
          f"optimizer state {optimizer_state_bytes(opt) / 2**20:.2f} MiB")
