"""Ranking, the two recipe stages (heapr, expert_prune) and their ratio convention (spec §5.2 tests 1, 4, 5)."""

from __future__ import annotations

import copy

import pytest
import torch
from veil.training.compress.heapr import (
    STAGES,
    ExpertPruneConfig,
    HEAPrConfig,
    count_params,
    layout,
    moe_blocks,
    removal_mask,
    routed_expert_params,
)
from veil.training.compress.heapr.importance import batch_loss
from veil.training.compress.log import ModuleLog
from veil.training.compress.registry import get_stage


def ids() -> torch.Tensor:
    return torch.randint(0, 256, (2, 20), generator=torch.Generator().manual_seed(9))


def test_stages_are_registered() -> None:
    assert get_stage("heapr") is STAGES["heapr"] and get_stage("expert_prune") is STAGES["expert_prune"]
    assert STAGES["heapr"].config_cls is HEAPrConfig and STAGES["expert_prune"].config_cls is ExpertPruneConfig
    assert HEAPrConfig.from_json(HEAPrConfig(ratio=0.4, ranking="per_layer").to_json()).ratio == 0.4
    with pytest.raises(ValueError, match=r"HEAPrConfig\.ratio"):
        HEAPrConfig(ratio=1.0)
    with pytest.raises(ValueError, match=r"HEAPrConfig\.fisher"):
        HEAPrConfig(fisher="diag")


@pytest.mark.parametrize("stage,config", [("heapr", HEAPrConfig(ratio=0.0)), ("expert_prune", ExpertPruneConfig(ratio=0.0))])
def test_ratio_zero_is_the_identity(stage, config, moe_factory, calibration_factory) -> None:
    model = moe_factory(seed=6)
    x = ids()
    ref, params = model(input_ids=x).logits, count_params(model)
    summary = STAGES[stage].apply(model, config, calibration_factory(), ModuleLog(progress=False))
    assert summary["params_after"] == params and summary["removed_fraction"] == 0
    torch.testing.assert_close(model(input_ids=x).logits, ref, rtol=0, atol=1e-6)


def test_global_ranking_removes_exactly_round_ratio_n_and_differs_from_per_layer() -> None:
    scores = {"a": [torch.tensor([1.0, 2.0, 3.0]), torch.tensor([4.0, 5.0])],  # layer a: low scores
              "b": [torch.tensor([10.0, 20.0, 30.0, 40.0, 50.0])]}
    glob = removal_mask(scores, 0.4, "global")  # round(0.4 * 10) = 4 lowest over both layers: all in layer a
    assert [m.tolist() for m in glob["a"]] == [[True, True, True], [True, False]]
    assert glob["b"][0].sum() == 0
    per = removal_mask(scores, 0.4, "per_layer")  # round(0.4 * 5) = 2 in each layer
    assert [m.tolist() for m in per["a"]] == [[True, True, False], [False, False]]
    assert per["b"][0].tolist() == [True, True, False, False, False]
    for ratio in (0.1, 0.25, 0.33, 0.5):
        assert sum(int(m.sum()) for ms in removal_mask(scores, ratio, "global").values() for m in ms) == round(10 * ratio)


@pytest.mark.parametrize("arch", ["qwen2_moe", "mixtral"])
def test_heapr_stage_slices_experts_and_logs(arch: str, moe_factory, calibration_factory) -> None:
    model = moe_factory(arch, seed=7)
    shared_before = {k: v.clone() for k, v in model.state_dict().items() if "experts" not in k}
    log = ModuleLog(progress=False)
    summary = STAGES["heapr"].apply(model, HEAPrConfig(ratio=0.25), calibration_factory(), log)
    d, total = model.config.hidden_size, summary["atomic_experts_total"]
    assert total == 2 * 4 * 16 and summary["atomic_experts_removed"] == round(0.25 * total)
    assert summary["params_before"] - summary["params_after"] == summary["atomic_experts_removed"] * 3 * d
    assert summary["routed_expert_params_after"] == routed_expert_params(model) == 3 * d * (total - 32)
    assert sum(sum(v["widths"]) for v in layout(model).values()) == total - 32
    assert summary["routed_flops_per_token_after"] < summary["routed_flops_per_token_before"]
    assert summary["passes"] == {"forward": 2, "backward": 1}
    assert [r["module"] for r in log.records] == ["model.layers.0.mlp.experts", "model.layers.1.mlp.experts"]
    after = model.state_dict()
    assert all(torch.equal(v, after[k]) for k, v in shared_before.items())  # router, shared expert, attention
    assert model.generate(input_ids=ids()[:1, :4], max_new_tokens=3, do_sample=False).shape == (1, 7)


@pytest.mark.parametrize("criterion", ["reap", "frequency"])
def test_expert_prune_drops_experts_and_router_rows(criterion: str, moe_factory, calibration_factory) -> None:
    model = moe_factory(seed=8)
    d, f = model.config.hidden_size, 16
    summary = STAGES["expert_prune"].apply(model, ExpertPruneConfig(ratio=0.25, criterion=criterion),
                                           calibration_factory(), ModuleLog(progress=False))
    assert summary["experts_removed"] == 2 and summary["removed_fraction"] == 0.25
    assert {len(v) for v in summary["dropped"].values()} == {1}  # spread evenly: one per layer
    assert summary["params_before"] - summary["params_after"] == 2 * (3 * d * f + d)  # expert + its router row
    seen = []
    for _, block in moe_blocks(model):
        assert block.gate.weight.shape == (3, d) and block.experts.num_experts == block.gate.num_experts == 3
        block.gate.register_forward_hook(lambda m, i, o: seen.append(int(o[2].max())))
    model(input_ids=ids())
    assert max(seen) < 3  # the router only picks existing experts
    with pytest.raises(ValueError, match="top_k=2"):
        STAGES["expert_prune"].apply(copy.deepcopy(model), ExpertPruneConfig(ratio=0.5), calibration_factory(),
                                     ModuleLog(progress=False))


def test_heapr_beats_expert_pruning_on_trained_model(trained, text_calibration, corpus) -> None:
    from veil.training.compress.calibration import Calibration

    held = Calibration.from_bytes(corpus.held_out, seq_len=64, num_sequences=32, batch_size=16)

    def loss(model) -> float:
        with torch.no_grad():
            return sum(batch_loss(model, b)[0].item() for b in held.batches) / held.num_tokens

    base, results = loss(trained), {}
    for name, stage, cfg in [("heapr", "heapr", HEAPrConfig(ratio=0.25)),
                             ("layerwise", "heapr", HEAPrConfig(ratio=0.25, ranking="per_layer")),
                             ("experts", "expert_prune", ExpertPruneConfig(ratio=0.25))]:
        model = copy.deepcopy(trained)
        STAGES[stage].apply(model, cfg, text_calibration, ModuleLog(progress=False))
        results[name] = loss(model) - base
    assert results["heapr"] < results["experts"], results
    assert results["layerwise"] < results["experts"], results


def test_recipe_through_compress_api(moe_factory, calibration_factory) -> None:
    from veil.training.compress.api import compress

    model = moe_factory(seed=3)
    recipe = [{"method": "heapr", "ratio": 0.25, "ranking": "per_layer"}, {"method": "expert_prune", "ratio": 0.25}]
    report = compress(model, recipe, calibration_factory(), progress=False, drift=False)
    heapr, experts = report["stages"]
    assert heapr["atomic_experts_removed"] == 32 and heapr["config"]["ranking"] == "per_layer"
    assert experts["experts_removed"] == 2 and len(report["modules"]) == 4
    assert report["parameters"]["whole_model"]["params_after"] == count_params(model)


def test_compress_output_folder_reloads_a_pruned_moe(moe_factory, calibration_factory, tmp_path) -> None:
    """compress(output_dir=...) records the ragged expert widths; load_compressed rebuilds them exactly."""
    from veil.training.compress.api import compress, load_compressed

    model = moe_factory(seed=4)
    compress(model, [{"method": "heapr", "ratio": 0.25}], calibration_factory(), output_dir=tmp_path / "out",
             progress=False, drift=False)
    again, config = load_compressed(tmp_path / "out")
    assert config["moe_layout"] and count_params(again) == count_params(model)
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(again(input_ids=ids).logits, model.eval()(input_ids=ids).logits)
