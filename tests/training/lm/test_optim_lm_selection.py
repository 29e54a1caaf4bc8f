"""benchmarks/optim_lm.py picks each optimizer's configuration by training loss among those within the memory
target, and lists every configuration it ran."""

from __future__ import annotations


def _run(name: str, lr: float, loss: float, state: int, **args) -> dict:
    history = [{"step": 0, "held_out_loss": 5.0}, {"step": 50, "held_out_loss": 1.5 + loss},
               {"step": 100, "held_out_loss": 1.0 + loss}]
    return {"optimizer": name, "lr": lr, "optimizer_args": args, "diverged": None, "select_train_loss": loss,
            "history": history, "metrics": {"optimizer_state_bytes": state, "held_out_loss": 1.0 + loss}}


def test_choose_skips_configurations_over_the_state_limit(load_benchmark) -> None:
    module = load_benchmark("optim_lm")
    runs = [_run("adamw", 1e-3, 0.30, 1000), _run("adamw", 2e-3, 0.25, 1000, betas=[0.9, 0.95]),
            _run("alice", 0.02, 0.20, 400), _run("alice", 0.02, 0.10, 700, rank=64),
            {"optimizer": "alice", "lr": 0.05, "optimizer_args": {}, "diverged": "nan"}]
    assert module.choose(runs, "adamw", [1e-3])["lr"] == 2e-3  # AdamW has no state limit
    best = {"adamw": module.choose(runs, "adamw", [1e-3]), "alice": module.choose(runs, "alice", [0.02])}
    assert best["alice"] is runs[2] and not module.eligible(runs[3], runs) and not module.eligible(runs[4], runs)
    entries = [module.sweep_entry(r, best, runs, 100) for r in runs]
    assert [e["chosen"] for e in entries] == [False, True, True, False, False]
    assert entries[3]["state_vs_adamw"] == 0.7 and entries[3]["optimizer_args"] == {"rank": 64}
    assert entries[2]["steps_to_adamw_final"] == 100 and entries[4]["diverged"] == "nan"
    assert module.variant_args({"lr": 2e-3, "betas": [0.9, 0.95]}) == {"betas": [0.9, 0.95]}


def test_variants_are_valid_arguments(load_benchmark) -> None:
    import torch
    from veil.training.lm import PRESETS, LMModelConfig, LMTrainConfig
    from veil.training.lm.model import build_lm
    from veil.training.lm.trainer import optimizer_kwargs
    from veil.training.optim import build_optimizer

    module = load_benchmark("optim_lm")
    model_config = LMModelConfig(**PRESETS["micro"])
    model = build_lm(model_config, seed=0)
    x = torch.randint(0, 256, (2, 8))
    for name, variants in module.VARIANTS.items():
        for extra in variants:
            train = LMTrainConfig(optimizer=name, steps=10, optimizer_args=module.variant_args(extra))
            opt = build_optimizer(name, model, lr=extra.get("lr", 1e-3), **optimizer_kwargs(model_config, train))
            model.zero_grad()
            model(input_ids=x, labels=x).loss.backward()
            opt.step()


def test_control_adamw_trains_embeddings_and_norms_at_their_own_lr(load_benchmark) -> None:
    import torch
    import veil.training.optim as optim
    from veil.training.lm import PRESETS, LMModelConfig
    from veil.training.lm.model import build_lm

    module = load_benchmark("optim_lm")
    model = build_lm(LMModelConfig(**PRESETS["micro"]), seed=0)
    with module.adamw_split_lr():
        opt = optim.build_optimizer("adamw", model, lr=1e-3, adam_lr=0.02, weight_decay=0.0)
        alice = optim.build_optimizer("alice", model, lr=0.02, adam_lr=2e-3, rank=8, leading=2)
    assert isinstance(opt, torch.optim.AdamW) and [g["lr"] for g in opt.param_groups] == [1e-3, 0.02]
    rest = {id(p) for p in opt.param_groups[1]["params"]}
    assert id(model.model.embed_tokens.weight) in rest and id(model.lm_head.weight) not in rest
    assert [g["lr"] for g in alice.param_groups] == [0.02, 2e-3]
    assert optim.build_optimizer is not None and "adam_lr" not in optim.build_optimizer.__code__.co_varnames
