"""Every model kind over both fronts (issue 20 §1): adapters, encrypted inference (BYTES ciphertexts), codec and
sampler answer the same over gRPC (stock ``tritonclient.grpc``) as over HTTP, from one live loopback server.

The models are the smallest each exporter makes (a few training steps): speed and quality do not matter here,
only that the gRPC front carries each kind's tensors and parameters unchanged.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException

GL2_PRIOR = {"family": "gaussian", "mean": [0.2, -0.1], "std": [0.06, 0.06]}


@pytest.fixture(scope="module")
def kinds_repo(tmp_path_factory, write_lora_toy, tiny_polymlp):
    """plain + tiny-he (latency HE plan), codec, gl2 (sampler), tiny (an affine graph with one ORT LoRA adapter)."""
    from veil.export import export_uldnet
    from veil.export.codec import export_codec
    from veil.export.he import export_he
    from veil.export.sampler import export_sampler
    from veil.training.codec.config import CodecModelConfig, CodecTrainConfig
    from veil.training.codec.data import skimage_images
    from veil.training.codec.trainer import save_codec, train_codec
    from veil.training.priorguide import (
        SamplerTrainConfig,
        ScoreNetConfig,
        get_task,
        save_sampler,
        train_score,
    )

    root = tmp_path_factory.mktemp("grpc-kinds")
    repo = root / "repo"
    checkpoint, data = tiny_polymlp
    export_uldnet(checkpoint, repo, name="plain")
    export_he(checkpoint, repo, "tiny-he", mode="latency")

    images = skimage_images(("camera",))
    codec = CodecModelConfig(d=8, bits=[4, 4, 4, 4, 6, 6, 6, 8, 8, 8], channels=[8, 8, 8, 8], prior_width=16,
                             prior_layers=1, prior_heads=2)
    train = CodecTrainConfig(tokenizer_steps=2, prior_steps=2, crop=64, prior_crop=64, batch_size=2, prior_crops=2)
    save_codec(train_codec(codec, train, list(images.values()), progress=False), root / "codec", sorted(images))
    export_codec(root / "codec", repo, "codec")

    task = get_task("gaussian_linear", 2)
    theta, xs = task.simulate_pairs(256, seed=0)
    score = train_score(theta, xs, task.prior, ScoreNetConfig(dim=2, x_dim=2, hidden=16),
                        SamplerTrainConfig(simulations=256, steps=20, batch_size=64), progress=False)
    save_sampler(score, root / "sampler", {"name": task.name, "dim": 2})
    export_sampler(root / "sampler", repo, "gl2")

    write_lora_toy(repo / "tiny")
    return repo, data


@pytest.fixture(scope="module")
def live(kinds_repo, oip):
    """(http address, grpc address) of one server over the repository."""
    repo, _ = kinds_repo
    with oip.live_server(oip.make_config(repo, grpc_port=0)) as (url, server):
        yield url, f"127.0.0.1:{server.config.app.state.grpc_port}"


def pair(live, model: str, inputs: dict[str, tuple[str, np.ndarray]], **parameters) -> tuple[dict, dict]:
    """The same request over HTTP (binary) and gRPC (raw) -> (http outputs, grpc outputs), name -> array."""
    h_inputs, g_inputs = [], []
    for name, (datatype, array) in inputs.items():
        h_inputs.append(thttp.InferInput(name, list(array.shape), datatype))
        h_inputs[-1].set_data_from_numpy(array, binary_data=True)
        g_inputs.append(tgrpc.InferInput(name, list(array.shape), datatype))
        g_inputs[-1].set_data_from_numpy(array)
    http = thttp.InferenceServerClient(live[0]).infer(model, h_inputs, parameters=parameters or None)
    grpc_result = tgrpc.InferenceServerClient(live[1]).infer(model, g_inputs, parameters=parameters or None)
    names = [o["name"] for o in http.get_response()["outputs"]]
    assert sorted(names) == sorted(o.name for o in grpc_result.get_response().outputs)
    return {n: http.as_numpy(n) for n in names}, {n: grpc_result.as_numpy(n) for n in names}


def test_adapters_over_grpc(live) -> None:
    inputs = {"x": ("FP32", np.random.default_rng(1).normal(size=(2, 4)).astype(np.float32))}
    base_http, base_grpc = pair(live, "tiny", inputs)
    lora_http, lora_grpc = pair(live, "tiny", inputs, adapter_id="t1")
    np.testing.assert_array_equal(base_http["y"], base_grpc["y"])
    np.testing.assert_array_equal(lora_http["y"], lora_grpc["y"])
    assert np.abs(lora_grpc["y"] - base_grpc["y"]).max() > 1e-4  # adapter active
    by_name = tgrpc.InferenceServerClient(live[1])
    g_inputs = [tgrpc.InferInput(n, list(a.shape), d) for n, (d, a) in inputs.items()]
    for tensor, (_, array) in zip(g_inputs, inputs.values(), strict=True):
        tensor.set_data_from_numpy(array)
    np.testing.assert_array_equal(by_name.infer("tiny:t1", g_inputs).as_numpy("y"),
                                  lora_grpc["y"])
    with pytest.raises(InferenceServerException, match="no adapter 'nope'") as err:
        by_name.infer("tiny", g_inputs, parameters={"adapter_id": "nope"})
    assert err.value.status() == "StatusCode.NOT_FOUND"


def test_encrypted_inference_over_grpc(live, kinds_repo, tmp_path) -> None:
    """Keys registered over HTTP (POST /v2/he/keys); the BYTES ciphertext envelope goes over gRPC."""
    import onnxruntime as ort
    from veil.he.client import HeSession

    repo, data = kinds_repo
    session = HeSession.create(f"http://{live[0]}", "tiny-he", tmp_path / "k.keyring")
    x = data.x_test[:2]
    envelope = np.array([session.encrypt(x)], dtype=object)
    inp = tgrpc.InferInput("ciphertext", [1], "BYTES")
    inp.set_data_from_numpy(envelope)
    client = tgrpc.InferenceServerClient(live[1])
    result = client.infer("tiny-he", [inp], parameters={"key_id": session.key_id, "key_secret": session.key_secret})
    logits = session.decrypt(bytes(result.as_numpy(result.get_response().outputs[0].name).reshape(-1)[0]))
    expected = ort.InferenceSession(str(repo / "plain" / "1" / "model.onnx")).run(None, {"x": x})[0]
    assert np.abs(logits - expected).max() < 1e-2
    with pytest.raises(InferenceServerException) as err:  # a wrong key secret: the HE store's refusal, mapped
        client.infer("tiny-he", [inp], parameters={"key_id": session.key_id, "key_secret": "wrong"})
    assert err.value.status() == "StatusCode.PERMISSION_DENIED"


def test_codec_over_grpc(live) -> None:
    import skimage.data
    from veil.codec.images import png_bytes

    photo = np.ascontiguousarray(skimage.data.astronaut()[100:164, 200:264])
    http, grpc_out = pair(live, "codec", {"image": ("BYTES", np.array([png_bytes(photo)], dtype=object))}, scales=4)
    assert http["bitstream"].tolist() == grpc_out["bitstream"].tolist() and http["image"].tolist() == \
        grpc_out["image"].tolist()
    back_http, back_grpc = pair(live, "codec", {"bitstream": ("BYTES", grpc_out["bitstream"].reshape(-1))})
    assert back_grpc["image"].tolist() == back_http["image"].tolist() == grpc_out["image"].tolist()


def test_sampler_over_grpc(live) -> None:
    x = np.array([0.15, -0.05], np.float32)
    prior = np.array([json.dumps(GL2_PRIOR).encode()], dtype=object)
    http, grpc_out = pair(live, "gl2", {"x": ("FP32", x), "prior": ("BYTES", prior)}, num_samples=50, seed=3,
                          steps=5, langevin_steps=1, pilot=20)
    np.testing.assert_array_equal(http["samples"], grpc_out["samples"])  # the seed reproduces over both fronts
    assert grpc_out["samples"].shape == (50, 2)
    tensor = tgrpc.InferInput("x", [2], "FP32")
    tensor.set_data_from_numpy(x)
    with pytest.raises(InferenceServerException, match="unknown parameters") as err:
        tgrpc.InferenceServerClient(live[1]).infer("gl2", [tensor], parameters={"bogus": 1})
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
