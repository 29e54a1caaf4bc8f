"""The optimizers drive a Hugging Face ``Trainer(optimizers=(opt, sched))`` on a tiny LoRA-adapted BERT."""

from __future__ import annotations

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments
from veil.training.adapters import LoraConfig, inject
from veil.training.optim import build_optimizer


class _Data(torch.utils.data.Dataset):
    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 64, (16, 6), generator=g)
        self.labels = (self.ids[:, 0] % 2).long()

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(6, dtype=torch.long), "labels": self.labels[i]}


@pytest.mark.parametrize("name", ["adams", "lracs", "alice", "racs"])
def test_trainer_steps(tmp_path, name: str) -> None:
    torch.manual_seed(0)
    bert = BertForSequenceClassification(BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1,
                                                    num_attention_heads=2, intermediate_size=32,
                                                    max_position_embeddings=16, num_labels=2))
    model = inject(bert, LoraConfig(r=2, target_modules=["query", "value"], task_type="SEQ_CLS"))
    lr = {"adams": 1e-3, "lracs": 0.02, "alice": 0.02, "racs": 0.02}[name]
    opt = build_optimizer(name, model, lr=lr, **({"rank": 2, "leading": 1} if name == "alice" else {}))
    sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=1.0, end_factor=0.5, total_iters=3)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=3, per_device_train_batch_size=8, report_to=[],
                             save_strategy="no", logging_steps=1, use_cpu=True, disable_tqdm=True,
                             remove_unused_columns=False)  # AdapterModel.forward takes **kwargs
    Trainer(model=model, args=args, train_dataset=_Data(), optimizers=(opt, sched)).train()
    moved = [n for n, p in model.named_parameters() if p.requires_grad and not torch.equal(before[n], p)]
    assert any("lora_B" in n for n in moved) and any("classifier" in n for n in moved)
    assert opt.param_groups[0]["lr"] == pytest.approx(lr * 0.5)  # the scheduler ran alongside
