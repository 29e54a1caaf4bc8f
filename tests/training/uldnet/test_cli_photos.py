"""`veil train uldnet` for issue 30: --preset photos32 recipes, --data KIND:PATH, flag-named errors, the input contract."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from veil.training.uldnet.cli import build_parser, configs_from_args, main
from veil.training.uldnet.config import PHOTOS32_PRESETS

from veil.config import ConfigError

torch.set_num_threads(1)
RGB32 = SimpleNamespace(input_shape=[3, 32, 32], classes=[str(i) for i in range(12)])


def configs(*argv: str):
    return configs_from_args(build_parser().parse_args(list(argv)), RGB32)


def test_photos32_preset_defaults_to_resnet20_with_its_recipe() -> None:
    model, train = configs("--preset", "photos32")
    assert (model.arch, model.width, model.depth, model.num_classes) == ("resnet", 16, 3, 12)
    recipe = PHOTOS32_PRESETS["resnet"]["train"]
    assert {k: getattr(train, k) for k in recipe} == recipe
    vit, _ = configs("--preset", "photos32", "--arch", "vit")
    assert vit.patch_size == 4 and vit.norm.token_stats == "sample" and vit.norm.train_fallback
    assert model.norm.train_fallback and train.warmup_penalty
    twin, _ = configs("--preset", "photos32", "--baseline")
    assert twin.baseline and twin.arch == "resnet"


def test_your_own_data_gets_the_resnet20_recipe_and_flags_override_it() -> None:
    parser = build_parser()
    args = parser.parse_args(["--data", "folder:x", "--arch", "resnet", "--depth", "2", "--lr", "0.01"])
    model, train = configs_from_args(args, RGB32)
    assert (model.width, model.depth, train.lr) == (16, 2, 0.01)


@pytest.mark.parametrize("argv, message", [
    (["--epochs", "5"], "--warmup-epochs: expected 0 <= --warmup-epochs < --epochs=5, received 5; lower --warmup-epochs"),
    (["--preset", "photos32", "--depth", "0"], "--depth: expected >= 1 for arch 'resnet', received 0"),
    (["--preset", "photos32", "--act-degree", "5"], "--act-degree: expected 0..3"),
])
def test_config_errors_name_the_flag(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        configs(*argv)
    assert message in str(info.value)


def test_folder_data_trains_a_resnet_and_records_the_input_contract(image_folder, tmp_path, capsys) -> None:
    root = image_folder(per_class=8)
    out = tmp_path / "ck"
    assert main(["--data", f"folder:{root}", "--arch", "resnet", "--width", "4", "--depth", "1",
                 "--image-size", "16", "--epochs", "2", "--warmup-epochs", "1", "--threads", "1", "--out", str(out),
                 "--no-progress"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["polynomial"] and metrics["depth_per_block"] == [10, 10, 10]
    saved = json.loads((out / "config.json").read_text())
    assert saved["model"]["arch"] == "resnet" and saved["model"]["input_shape"] == [3, 16, 16]
    assert saved["data"]["input"]["scale"].startswith("pixel / 255") and saved["data"]["input"]["shape"] == [3, 16, 16]
