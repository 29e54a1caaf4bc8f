"""Every registered optimizer honours the torch.optim contract: it trains, takes closures and schedulers, and a
``state_dict`` round trip resumes bit-identically."""

from __future__ import annotations

import copy

import pytest
import torch
from veil.training.optim import OPTIMIZERS, build_optimizer, optimizer_state_bytes

SETTINGS = {  # name -> (model kind, lr, extra hyperparameters); small problems, lrs picked per method
    "adamw": ("lora", 1e-2, {}),
    "racs": ("mlp", 0.2, {}),
    "alice": ("mlp", 0.02, {"rank": 4, "leading": 2, "update_interval": 2}),
    "adams": ("lora", 1e-2, {}),
    "lracs": ("lora", 0.05, {}),
}


@pytest.fixture
def setup(lora_net_factory, mlp_factory, regression):
    """name -> (model, optimizer, loss function) on the shared regression problem."""
    x, y = regression

    def make(name: str):
        kind, lr, extra = SETTINGS[name]
        model = lora_net_factory(seed=0) if kind == "lora" else mlp_factory(0)
        opt = build_optimizer(name, model, lr=lr, **extra)
        return model, opt, lambda: ((model(x) - y) ** 2).mean()

    return make


def _train(model, opt, loss_fn, steps: int) -> float:
    for _ in range(steps):
        opt.zero_grad()
        loss = loss_fn()
        loss.backward()
        opt.step()
    return float(loss.detach())


def test_registry_lists_the_methods() -> None:
    assert set(SETTINGS) <= set(OPTIMIZERS)
    with pytest.raises(ValueError, match="expected one of"):
        build_optimizer("sgdx", [torch.nn.Parameter(torch.zeros(2))], lr=0.1)


def test_pair_optimizers_need_lora(mlp_factory) -> None:
    with pytest.raises(ValueError, match="LoRA"):
        build_optimizer("adams", mlp_factory(0), lr=1e-3)


@pytest.mark.parametrize("name", list(SETTINGS))
def test_decreases_loss(setup, name: str) -> None:
    model, opt, loss_fn = setup(name)
    with torch.no_grad():
        start = float(loss_fn())
    end = _train(model, opt, loss_fn, 150)
    assert end < 0.05 * start, (start, end)


@pytest.mark.parametrize("name", list(SETTINGS))
def test_closure_returns_the_loss(setup, name: str) -> None:
    _, opt, loss_fn = setup(name)

    def closure():
        opt.zero_grad()
        loss = loss_fn()
        loss.backward()
        return loss

    with torch.no_grad():
        expected = float(loss_fn())
    assert float(opt.step(closure).detach()) == pytest.approx(expected)
    with torch.no_grad():
        assert float(loss_fn()) < expected


@pytest.mark.parametrize("name", list(SETTINGS))
def test_scheduler_controls_the_step(setup, name: str) -> None:
    model, opt, loss_fn = setup(name)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.0 if step == 0 else 1.0)
    assert all(g["lr"] == 0.0 and "initial_lr" in g for g in opt.param_groups)
    before = copy.deepcopy(model.state_dict())
    _train(model, opt, loss_fn, 1)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # lr 0: nothing moves
    sched.step()
    _train(model, opt, loss_fn, 1)
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize("name", list(SETTINGS))
def test_state_dict_resume_is_bit_identical(setup, name: str) -> None:
    model, opt, loss_fn = setup(name)
    _train(model, opt, loss_fn, 3)
    saved_model, saved_opt = copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())
    _train(model, opt, loss_fn, 4)  # crosses Alice's refreshes at steps 4 and 6 (random complement draws)
    reference = copy.deepcopy(model.state_dict())

    model2, opt2, loss_fn2 = setup(name)
    model2.load_state_dict(saved_model)
    opt2.load_state_dict(saved_opt)
    _train(model2, opt2, loss_fn2, 4)
    assert all(torch.equal(reference[k], v) for k, v in model2.state_dict().items())
    assert optimizer_state_bytes(opt2) == optimizer_state_bytes(opt) > 0


@pytest.mark.parametrize("name", ["racs", "alice", "adams", "lracs"])
def test_bfloat16_parameters(pair_factory, name: str) -> None:
    model = pair_factory(8, 6, 2, torch.bfloat16)
    with torch.no_grad():
        model.lora_B.weight.normal_()
    opt = build_optimizer(name, model, lr=1e-3, **({"rank": 2, "leading": 1} if name == "alice" else {}))
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(4, 8, dtype=torch.bfloat16)).float().pow(2).sum().backward()
        opt.step()
    assert all(p.dtype == torch.bfloat16 and torch.isfinite(p).all() for p in model.parameters())


def test_racs_and_alice_beat_sgd_at_the_same_lr(mlp_factory, regression) -> None:
    """Spec §7.6.5: a 2-layer MLP on synthetic data, the same lr for all; Alice-0 (β3 = 0) tracks Alice early."""
    x, y = regression
    final = {}
    for name, kwargs in (("sgd", {}), ("racs", {}), ("alice", {"rank": 4, "leading": 2}),
                         ("alice0", {"rank": 4, "leading": 2, "betas": (0.9, 0.9, 0.0)})):
        model = mlp_factory(0)
        opt = (torch.optim.SGD(model.parameters(), lr=0.02) if name == "sgd"
               else build_optimizer(name.rstrip("0"), model, lr=0.02, **kwargs))
        final[name] = _train(model, opt, lambda model=model: ((model(x) - y) ** 2).mean(), 100)
    assert final["racs"] < final["sgd"] and final["alice"] < final["sgd"]
    assert abs(final["alice0"] - final["alice"]) < 0.25 * final["alice"]
