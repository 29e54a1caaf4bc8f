"""Trainer, data loaders and checkpoints: determinism, round trips, users' files, clear errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image
from veil.training.uldnet import (
    ModelConfig,
    TrainConfig,
    load_digits_preset,
    load_image_folder,
    load_npz,
    load_uldnet,
    save_uldnet,
    train_uldnet,
)
from veil.training.uldnet.trainer import augment_batch, random_flip_rotate, random_shift

FAST = TrainConfig(epochs=3, warmup_epochs=1, batch_size=32, lr=3e-3)


@pytest.fixture(scope="module")
def digits():
    return load_digits_preset()


def test_digits_split_is_fixed_stratified_and_disjoint(digits) -> None:
    assert digits.describe()["sizes"] == {"train": 1077, "val": 360, "test": 360}
    assert np.bincount(digits.y_test).min() >= 35  # stratified: every class about 36 times
    again = load_digits_preset()
    assert np.array_equal(again.x_test, digits.x_test)
    train_rows = {r.tobytes() for r in digits.x_train}
    assert not any(r.tobytes() in train_rows for r in digits.x_test if r.any())


def test_same_seed_gives_identical_weights(digits) -> None:
    cfg = ModelConfig(arch="mlp", input_shape=digits.input_shape, width=32)
    a = train_uldnet(cfg, FAST, digits, progress=False).model.state_dict()
    b = train_uldnet(cfg, FAST, digits, progress=False).model.state_dict()
    c = train_uldnet(cfg, FAST.replace(seed=1), digits, progress=False).model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


@pytest.mark.parametrize("arch", ["mlp", "cnn", "vit"])
def test_checkpoint_round_trip_gives_identical_logits(arch: str, digits, tmp_path) -> None:
    cfg = ModelConfig(arch=arch, input_shape=digits.input_shape, width=16, heads=2, patch_size=4)
    result = train_uldnet(cfg, FAST.replace(epochs=4), digits, progress=False)
    assert result.metrics["test_accuracy"] > 0.3  # far above chance (0.1) after four epochs
    save_uldnet(result, tmp_path / "ck", digits)
    model, config = load_uldnet(tmp_path / "ck")
    x = torch.as_tensor(digits.x_test[:32])
    with torch.no_grad():
        torch.testing.assert_close(model(x), result.model(x), rtol=0, atol=0)
    assert config["model"] == cfg.to_dict() and config["data"]["source"] == "preset:digits"
    metrics = json.loads((tmp_path / "ck" / "metrics.json").read_text())
    assert len(metrics["history"]) == 4 and metrics["depth_total"] == result.metrics["depth_total"]


def test_saving_over_a_checkpoint_replaces_it_whole(digits, tmp_path) -> None:
    cfg = ModelConfig(arch="mlp", input_shape=digits.input_shape, width=8)
    first = train_uldnet(cfg, FAST.replace(epochs=2), digits, progress=False)
    save_uldnet(first, tmp_path / "ck", digits)
    second = train_uldnet(cfg.replace(width=12), FAST.replace(epochs=2), digits, progress=False)
    save_uldnet(second, tmp_path / "ck", digits)
    _, config = load_uldnet(tmp_path / "ck")
    assert config["model"]["width"] == 12
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]  # no temporary or old folders left


def test_wrong_checkpoint_kind_and_missing_files_are_named(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match=r"expected config\.json"):
        load_uldnet(tmp_path)


def test_npz_loader_trains_on_users_features(tmp_path) -> None:
    rng = np.random.default_rng(0)
    y = np.repeat(["cat", "dog", "eel"], 40)
    x = rng.normal(size=(120, 6)).astype(np.float32)
    x[np.arange(120), np.arange(120) // 40] += 4.0  # class c: mean 4 e_c, separable
    np.savez(tmp_path / "d.npz", x=x, y=y)
    data = load_npz(tmp_path / "d.npz")
    assert data.classes == ["cat", "dog", "eel"] and data.input_shape == [6]
    cfg = ModelConfig(arch="mlp", input_shape=[6], num_classes=3, width=16)
    result = train_uldnet(cfg, TrainConfig(epochs=15, warmup_epochs=2, batch_size=16, lr=1e-2), data, progress=False)
    assert result.metrics["test_accuracy"] >= 0.9


@pytest.mark.parametrize(("arrays", "message"), [
    ({"x": np.zeros((4, 2))}, r"missing \['y'\]"),
    ({"x": np.zeros((4, 2)), "y": np.zeros(3)}, r"expected x of shape \(N, \.\.\.\) and y of shape \(N,\)"),
    ({"x": np.zeros((4, 2)), "y": np.zeros(4)}, "expected at least 2 classes"),
])
def test_bad_npz_files_get_clear_errors(tmp_path, arrays: dict, message: str) -> None:
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(ValueError, match=message):
        load_npz(tmp_path / "bad.npz")


def test_image_folder_loader(tmp_path) -> None:
    rng = np.random.default_rng(0)
    for label, value in (("dark", 40), ("light", 210)):
        (tmp_path / label).mkdir()
        for i in range(6):
            pixels = np.clip(rng.normal(value, 10, size=(12, 12, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(tmp_path / label / f"{i}.png")
    data = load_image_folder(tmp_path, image_size=8)
    assert data.classes == ["dark", "light"] and data.input_shape == [1, 8, 8]
    assert data.x_train.min() >= 0.0 and data.x_train.max() <= 1.0
    rgb = load_image_folder(tmp_path, image_size=4, grayscale=False)
    assert rgb.input_shape == [3, 4, 4]
    with pytest.raises(ValueError, match="expected >= 5 images per class"):
        (tmp_path / "rare").mkdir()
        Image.fromarray(np.zeros((4, 4), np.uint8)).save(tmp_path / "rare" / "0.png")
        load_image_folder(tmp_path, image_size=8)


def test_model_config_must_match_the_data(digits) -> None:
    with pytest.raises(ValueError, match=r"ModelConfig\.input_shape: expected the data's sample shape \[1, 8, 8\]"):
        train_uldnet(ModelConfig(arch="mlp", input_shape=[64]), FAST, digits, progress=False)


def test_random_shift_moves_images_by_at_most_one_pixel() -> None:
    x = torch.zeros(64, 1, 5, 5)
    x[:, 0, 2, 2] = 1.0
    shifted = random_shift(x, torch.Generator().manual_seed(0))
    positions = {tuple(torch.nonzero(img[0]).squeeze(0).tolist()) for img in shifted}
    assert positions == {(r, c) for r in (1, 2, 3) for c in (1, 2, 3)}
    assert torch.equal(shifted.sum(dim=(1, 2, 3)), torch.ones(64))


def test_random_shift_of_k_pixels_reaches_every_offset_up_to_k_and_no_further() -> None:
    x = torch.zeros(400, 1, 9, 9)
    x[:, 0, 4, 4] = 1.0
    shifted = random_shift(x, torch.Generator().manual_seed(0), pixels=3)
    positions = {tuple(torch.nonzero(img[0]).squeeze(0).tolist()) for img in shifted}
    assert positions == {(r, c) for r in range(1, 8) for c in range(1, 8)}
    with pytest.raises(ValueError, match=r"TrainConfig\.shift: expected >= 0 pixels, received -1"):
        TrainConfig(shift=-1)


@pytest.mark.parametrize("flip_rotate", [False, True])
def test_augmented_batches_are_contiguous_nchw(flip_rotate: bool) -> None:
    # the shift's gather left a channels-last view, and torch 2.13's oneDNN backward of a strided 1x1 conv over
    # 4 channels-last channels corrupts the heap: `veil train uldnet --arch resnet --width 4` died in backward
    x = torch.randn(14, 4, 16, 16)
    out = augment_batch(x, torch.Generator().manual_seed(0), TrainConfig(shift=1, flip_rotate=flip_rotate))
    assert out.shape == x.shape and out.is_contiguous()


def test_random_flip_rotate_applies_one_of_the_eight_symmetries_per_image() -> None:
    torch.manual_seed(0)
    x = torch.randn(256, 2, 5, 5)
    before = x.clone()
    out = random_flip_rotate(x, torch.Generator().manual_seed(1))
    symmetries = lambda img: [torch.rot90(v, k, dims=(1, 2)) for v in (img, img.flip(2)) for k in range(4)]  # noqa: E731
    seen = set()
    for img, aug in zip(x, out, strict=True):
        matches = [i for i, s in enumerate(symmetries(img)) if torch.equal(s, aug)]
        assert len(matches) == 1  # a random image has 8 distinct symmetries: exactly one was applied
        seen.add(matches[0])
    assert seen == set(range(8))  # every flip x turn is drawn
    assert torch.equal(out, random_flip_rotate(x, torch.Generator().manual_seed(1)))  # seeded
    assert torch.equal(x, before)  # the input is left alone
    with pytest.raises(ValueError, match="flip_rotate: expected square images, received 4x5"):
        random_flip_rotate(torch.zeros(2, 1, 4, 5), torch.Generator())


@pytest.mark.slow
def test_digits_preset_polycnn_reaches_its_accuracy(digits) -> None:
    """The issue's target: the digits PolyCNN >= 98.0 % test accuracy with the default recipe."""
    result = train_uldnet(ModelConfig(arch="cnn", input_shape=digits.input_shape), TrainConfig(), digits, progress=False)
    assert result.metrics["test_accuracy"] >= 0.98
    assert result.metrics["depth_max_per_operator"] <= 3
