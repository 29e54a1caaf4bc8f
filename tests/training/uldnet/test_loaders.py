"""Users' own images (issue 30 §2): `--data folder:DIR`, `cifar10:DIR`, `cifar100:DIR`, on small files written here."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from veil.training.uldnet.data import DataError, load_cifar, load_data_spec


def write_batch(path, n: int, labels_key: bytes, num_classes: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    batch = {b"batch_label": b"test", b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
             labels_key: [int(v) for v in np.arange(n) % num_classes], b"filenames": [b"x.png"] * n}
    path.write_bytes(pickle.dumps(batch, protocol=2))


def write_cifar10(root, n: int = 20):
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    for i in range(1, 6):
        write_batch(folder / f"data_batch_{i}", n, b"labels", 10, i)
    write_batch(folder / "test_batch", n, b"labels", 10, 9)
    names = [f"class{i}".encode() for i in range(10)]
    (folder / "batches.meta").write_bytes(pickle.dumps({b"label_names": names, b"num_vis": 3072}, protocol=2))
    return folder


def test_folder_loader_resizes_to_rgb_and_records_its_contract(image_folder) -> None:
    data = load_data_spec(f"folder:{image_folder()}", image_size=32)
    assert data.classes == ["cat", "dog"] and data.input_shape == [3, 32, 32]
    x = np.concatenate([data.x_train, data.x_val, data.x_test])
    assert x.dtype == np.float32 and len(x) == 12 and x.min() >= 0.0 and x.max() <= 1.0
    contract = data.describe()["input"]
    assert contract["layout"] == "CHW, RGB" and "pixel / 255" in contract["scale"] and contract["shape"] == [3, 32, 32]


def test_folder_loader_names_the_unreadable_file_and_the_flag(image_folder, tmp_path) -> None:
    image_folder()
    bad = tmp_path / "photos" / "dog" / "broken.png"
    bad.write_bytes(b"not a png")
    with pytest.raises(DataError, match=rf"{bad}: expected an image Pillow can read"):
        load_data_spec(f"folder:{tmp_path / 'photos'}")
    with pytest.raises(FileNotFoundError, match=r"--data folder:.*nowhere: expected a directory of class folders"):
        load_data_spec(f"folder:{tmp_path / 'nowhere'}")


def test_cifar10_batches_load_with_official_test_split_and_names(tmp_path) -> None:
    folder = write_cifar10(tmp_path)
    for root in (tmp_path, folder):  # the archive's folder or the folder holding it
        data = load_cifar("cifar10", root)
        assert data.classes[:2] == ["class0", "class1"] and data.input_shape == [3, 32, 32]
        assert len(data.y_test) == 20 and len(data.y_train) + len(data.y_val) == 100 and len(data.y_val) == 10
    raw = pickle.loads((folder / "test_batch").read_bytes())[b"data"]
    np.testing.assert_allclose(data.x_test[3], raw[3].reshape(3, 32, 32) / 255.0, atol=1e-7)  # channel-major rows
    assert load_data_spec(f"cifar10:{folder}").source == "cifar10:cifar-10-batches-py"


def test_cifar100_uses_fine_labels(tmp_path) -> None:
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    write_batch(folder / "train", 1000, b"fine_labels", 100, 0)
    write_batch(folder / "test", 100, b"fine_labels", 100, 1)
    data = load_data_spec(f"cifar100:{tmp_path}")
    assert len(data.classes) == 100 and sorted(set(data.y_test.tolist())) == list(range(100))


def test_cifar_errors_name_the_file_and_what_was_expected(tmp_path) -> None:
    folder = write_cifar10(tmp_path)
    (folder / "data_batch_3").unlink()
    with pytest.raises(FileNotFoundError, match=r"expected the batch file .*data_batch_3 \(the python version"):
        load_cifar("cifar10", folder)
    write_batch(folder / "data_batch_3", 5, b"fine_labels", 10, 0)  # CIFAR-100's key in a CIFAR-10 batch
    with pytest.raises(DataError, match=r"data_batch_3: expected a dict with b'data' \(N, 3072\) uint8 and b'labels'"):
        load_cifar("cifar10", folder)
    (folder / "data_batch_3").write_bytes(pickle.dumps({b"data": np.zeros((5, 100), np.uint8), b"labels": [0] * 5}))
    with pytest.raises(DataError, match=r"data_batch_3: expected b'data' of shape \(N, 3072\) .* received shape \(5, 100\)"):
        load_cifar("cifar10", folder)
    (folder / "data_batch_3").write_bytes(b"\x80\x02garbage")
    with pytest.raises(DataError, match="data_batch_3: expected a CIFAR python-pickle batch file"):
        load_cifar("cifar10", folder)


def test_a_pickle_that_calls_anything_but_numpy_is_refused(tmp_path) -> None:
    folder = write_cifar10(tmp_path)

    class Exploit:
        def __reduce__(self):
            return (print, ("pwned",))

    (folder / "test_batch").write_bytes(pickle.dumps({b"data": Exploit(), b"labels": []}))
    with pytest.raises(DataError, match=r"test_batch: .* received a pickle that calls builtins\.print"):
        load_cifar("cifar10", folder)


def test_an_unknown_data_kind_lists_the_accepted_ones() -> None:
    with pytest.raises(DataError, match=r"--data: expected folder:DIR, cifar10:DIR, cifar100:DIR, npz:FILE"):
        load_data_spec("imagenet:/data")
