"""GrpoTrainer mechanics on a tiny toy-sort Llama: sampling, Lopti's two passes, AR's gradient effect, LoRA,
the KL reference and determinism."""

from __future__ import annotations

import pytest
import torch
from veil.training.adapters import LoraConfig, inject
from veil.training.rl import GrpoConfig, GrpoTrainer, get_reward, register_reward
from veil.training.rl.diagnostics import gradient_share, logit_gradient_bounds
from veil.training.rl.losses import ar_weights, lopti_masks
from veil.training.rl.rollout import Rollout, completion_log_probs, pad_prompts
from veil.training.rl.toy import EOS, PAD, sample_prompts, sort_reward

FAST = {"lr": 1e-2, "temperature": 1.0, "max_new_tokens": 4, "group_size": 4}


def trainer_for(policy, task, **kw) -> GrpoTrainer:
    cfg = GrpoConfig(**{**FAST, "kl_coef": 0.0, **kw})
    return GrpoTrainer(policy, cfg, get_reward("sort"), EOS, PAD)


def prompts(task, n: int = 4, seed: int = 0) -> list[list[int]]:
    return sample_prompts(n, task, torch.Generator().manual_seed(seed))


def test_sort_reward_and_registry() -> None:
    assert sort_reward([1, 7, 5, 6, 2], [5, 6, 7]) == 1.0
    assert sort_reward([1, 7, 5, 6, 2], [5, 7, 7]) == pytest.approx(2 / 3)
    assert sort_reward([1, 7, 5, 6, 2], [5, 6, 7, 4]) == pytest.approx(3 / 4)  # an extra token counts as wrong
    with pytest.raises(ValueError, match="already registered"):
        register_reward("sort")(sort_reward)
    with pytest.raises(KeyError, match="sort"):
        get_reward("nope")


def test_group_sampling_masks_padding_after_eos(policy_factory, task) -> None:
    trainer = trainer_for(policy_factory(), task, max_new_tokens=6)
    batch = trainer.make_batch(prompts(task, 6))
    r = batch.rollout
    assert r.completion_ids.shape[0] == 6 * 4 and torch.equal(r.prompt_ids[0], r.prompt_ids[3])  # groups contiguous
    m = r.response_mask
    assert (m[:, 1:] <= m[:, :-1]).all()  # once a completion ends it stays ended
    assert (r.completion_ids[m == 0] == PAD).all()
    for ids, n, comp in zip(r.completion_ids.tolist(), m.sum(1).tolist(), r.completions(), strict=True):
        assert EOS not in ids[:n - 1] and comp == ids[:n]
    assert (batch.old_log_probs[m == 0] == 0).all() and (batch.old_log_probs[m == 1] < 0).all()


def test_left_padding_does_not_change_log_probs(policy_factory, task) -> None:
    policy = policy_factory()
    completion = torch.tensor([[6, 5, EOS]])
    short, long_ = [1, 4, 6, 2], [1, 7, 4, 4, 6, 2]
    ids, mask = pad_prompts([short, long_], PAD)  # the short prompt gets two pads on the left
    both = Rollout(ids, mask, completion.repeat(2, 1), torch.ones(2, 3, dtype=torch.long))
    alone = Rollout(torch.tensor([short]), torch.ones(1, 4, dtype=torch.long), completion, torch.ones(1, 3, dtype=torch.long))
    with torch.no_grad():
        assert torch.allclose(completion_log_probs(policy, both, 1.0)[0], completion_log_probs(policy, alone, 1.0)[0],
                              atol=1e-5)


def test_lopti_runs_two_passes_low_first_and_pass_two_sees_pass_one(policy_factory, task) -> None:
    for order in ("low_first", "high_first"):
        trainer = trainer_for(policy_factory(), task, lopti=True, lopti_eta=0.5, lopti_order=order)
        batch = trainer.make_batch(prompts(task))
        low, high = lopti_masks(batch.old_log_probs, batch.rollout.response_mask, 0.5)
        assert low.any() and high.any()
        calls, inner = [], trainer._optimizer_step

        def spy(b, token_adv, kl_mask, rows, inner=inner, calls=calls, params=trainer.params):
            calls.append({"mask": kl_mask.clone(), "adv": token_adv.clone(), "old": b.old_log_probs,
                          "params": [p.detach().clone() for p in params]})
            return inner(b, token_adv, kl_mask, rows)
        trainer._optimizer_step = spy
        start = [p.detach().clone() for p in trainer.params]
        stats = trainer.update(batch)
        assert stats["optimizer_steps"] == 2 and len(calls) == 2
        first, second = (low, high) if order == "low_first" else (high, low)
        assert torch.equal(calls[0]["mask"], first) and torch.equal(calls[1]["mask"], second)
        assert (calls[0]["adv"][~first] == 0).all() and (calls[1]["adv"][~second] == 0).all()
        assert calls[0]["old"] is calls[1]["old"] is batch.old_log_probs  # both passes clip against the rollout
        assert all(torch.equal(a, b) for a, b in zip(calls[0]["params"], start, strict=True))
        assert any(not torch.equal(a, b) for a, b in zip(calls[1]["params"], start, strict=True))  # moved by pass 1


def test_grpo_takes_one_optimizer_step_per_epoch_and_mini_batch(policy_factory, task) -> None:
    trainer = trainer_for(policy_factory(), task, ppo_epochs=3, mini_batches=2)
    assert trainer.update(trainer.make_batch(prompts(task)))["optimizer_steps"] == 6


def test_low_probability_gradient_share_drops_with_ar_as_prop_4_2_says(policy_factory, task) -> None:
    policy = policy_factory()
    trainer = trainer_for(policy, task, group_size=8)
    batch = trainer.make_batch(prompts(task, 8))
    resp = batch.rollout.response_mask.bool()
    probs = batch.old_log_probs.exp()
    # Per token at the logits: ‖∂(w·A·log π_y)/∂z‖ lies in w·|A|·[(1−π)√(N/(N−1)), √2(1−π)] (AR: w = 0.3π + 0.7).
    r = batch.rollout
    ids = torch.cat([r.prompt_ids, r.completion_ids], 1)
    logits = policy(input_ids=ids).logits[:, r.prompt_ids.shape[1] - 1:-1].detach().requires_grad_(True)
    logp = logits.log_softmax(-1).gather(-1, r.completion_ids[..., None])[..., 0]
    w = ar_weights(batch.old_log_probs, 0.3) * batch.advantages[:, None]
    (grad,) = torch.autograd.grad((w * logp * resp).sum(), logits)
    lo, hi = logit_gradient_bounds(probs, task.vocab_size)
    norm = grad.norm(dim=-1)[resp]
    assert (norm >= (w.abs() * lo)[resp] - 1e-5).all() and (norm <= (w.abs() * hi)[resp] + 1e-5).all()
    # Over all parameters, low-probability tokens own most of the plain gradient; AR shrinks their share, and
    # shrinks it more with larger α.
    plain = gradient_share(policy, batch, trainer.cfg)
    ar2 = gradient_share(policy, batch, trainer.cfg.replace(ar=True, ar_alpha=0.2))
    ar6 = gradient_share(policy, batch, trainer.cfg.replace(ar=True, ar_alpha=0.6))
    assert plain["low_share"] > ar2["low_share"] > ar6["low_share"]
    # Lopti isolates them instead: the first pass's gradient is exactly the low-token gradient.
    low, _ = lopti_masks(batch.old_log_probs, resp, 0.5)
    logp = completion_log_probs(policy, r, trainer.cfg.temperature)
    loss = -((batch.advantages[:, None] * low * logp).sum() / resp.sum())
    grads = torch.autograd.grad(loss, [p for p in policy.parameters() if p.requires_grad])
    assert torch.sqrt(sum((g ** 2).sum() for g in grads)).item() == pytest.approx(plain["low_norm"], rel=1e-4)


def test_lora_policy_updates_only_adapter_parameters(policy_factory, task) -> None:
    model = inject(policy_factory(), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "o_proj"]))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = trainer_for(model, task, kl_coef=0.01)
    for seed in range(2):
        trainer.step(prompts(task, seed=seed))
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all("lora_" in n for n in changed)
    assert changed == {n for n, p in model.named_parameters() if p.requires_grad}


def test_kl_is_zero_when_policy_equals_reference(policy_factory, task) -> None:
    trainer = trainer_for(policy_factory(), task, kl_coef=0.1)  # reference: a frozen copy of the initial policy
    batch = trainer.make_batch(prompts(task))
    assert torch.equal(batch.ref_log_probs, batch.old_log_probs)
    stats = trainer.update(batch)
    assert stats["kl"] == 0.0
    assert trainer.update(trainer.make_batch(prompts(task, seed=1)))["kl"] > 0  # the policy has moved away
    # LoRA with the adapters switched off as reference: equal while B = 0, different once the adapters move.
    model = inject(policy_factory(), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    lora_trainer = trainer_for(model, task, kl_coef=0.1)
    batch = lora_trainer.make_batch(prompts(task))
    assert torch.equal(batch.ref_log_probs, batch.old_log_probs)
    lora_trainer.update(batch)
    batch = lora_trainer.make_batch(prompts(task, seed=1))
    assert not torch.allclose(batch.ref_log_probs, batch.old_log_probs)


def test_same_seed_same_run(policy_factory, task) -> None:
    runs = []
    for _ in range(2):
        policy = policy_factory()
        trainer = trainer_for(policy, task, lopti=True, ar=True)
        metrics = [trainer.step(prompts(task, seed=s)) for s in range(2)]
        runs.append(([{k: v for k, v in m.items() if k != "seconds"} for m in metrics],
                     [p.detach().clone() for p in policy.parameters()]))
    assert runs[0][0] == runs[1][0]
    assert all(torch.equal(a, b) for a, b in zip(runs[0][1], runs[1][1], strict=True))
