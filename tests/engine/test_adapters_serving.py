"""Serving LoRA adapters: by parameters.adapter_id and by `<model>:<adapter>`, 404s, mixed batches, the LRU cache."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from peft import LoraConfig, get_peft_model
from transformers import BertConfig, BertModel
from veil.engine.server import create_app
from veil.export.adapters import export_adapters, merged, read_lora, sentence_encoder_spec
from veil.export.encoder import SentenceEncoder, random_tokens

CONFIG = dict(attn_implementation="eager", vocab_size=1100, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
              intermediate_size=32, max_position_embeddings=48)
IDS = ["t1", "t2", "t3"]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A repo with model `tiny` (3 adapters, LRU of 2, 20 ms batching window) and torch references per adapter."""
    root = tmp_path_factory.mktemp("adapter-serving")
    config = BertConfig(**CONFIG)
    torch.manual_seed(0)
    model = SentenceEncoder(BertModel(config).eval(), normalize=False).eval()
    folders = {}
    for n, adapter_id in enumerate(IDS):
        torch.manual_seed(10 + n)
        peft_model = get_peft_model(BertModel(config), LoraConfig(r=2 + n, lora_alpha=8, target_modules=["query", "dense"],
                                                                 init_lora_weights=False))
        peft_model.save_pretrained(str(root / adapter_id))
        folders[adapter_id] = root / adapter_id
    repo = root / "repo"
    export_adapters(model, sentence_encoder_spec(config), folders, repo, "tiny", max_batch_size=16, cache_size=2)
    pbtxt = repo / "tiny" / "config.pbtxt"
    pbtxt.write_text(pbtxt.read_text().replace("max_queue_delay_microseconds: 500", "max_queue_delay_microseconds: 20000"))
    refs = {None: model, **{i: merged(model, read_lora(i, folders[i])) for i in IDS}}
    return {"repo": repo, "refs": refs, "vocab": config.vocab_size}


@pytest.fixture(scope="module")
def client(served: dict, oip):
    with TestClient(create_app(oip.make_config(served["repo"]))) as c:
        yield c


def body(oip, tokens: dict, **params) -> tuple[bytes, dict]:
    return oip.binary_body([(k, "INT64", v.numpy()) for k, v in tokens.items()], **params)


def expected(served: dict, adapter: str | None, tokens: dict) -> np.ndarray:
    with torch.no_grad():
        return served["refs"][adapter](*tokens.values()).numpy()


def test_adapter_by_parameter_and_by_name_match_the_merged_model(client, served: dict, oip) -> None:
    tokens = random_tokens(served["vocab"], batch=2, sequence=6, seed=1)
    for adapter in IDS:
        for url, params in ((f"/v2/models/tiny:{adapter}/infer", {}), ("/v2/models/tiny/infer", {"adapter_id": adapter})):
            r = client.post(url, content=(b := body(oip, tokens, **params))[0], headers=b[1])
            assert r.status_code == 200, r.text
            got = oip.decode(r)["sentence_embedding"]
            assert np.abs(got - expected(served, adapter, tokens)).max() <= 1e-5
    r = client.post("/v2/models/tiny/infer", content=(b := body(oip, tokens))[0], headers=b[1])
    assert np.abs(oip.decode(r)["sentence_embedding"] - expected(served, None, tokens)).max() <= 1e-5


def test_unknown_or_conflicting_adapter_is_refused(client, served: dict, oip) -> None:
    tokens = random_tokens(served["vocab"], batch=1, sequence=4)
    for url, params in (("/v2/models/tiny:nope/infer", {}), ("/v2/models/tiny/infer", {"adapter_id": "nope"})):
        r = client.post(url, content=(b := body(oip, tokens, **params))[0], headers=b[1])
        assert r.status_code == 404 and "known adapters: ['t1', 't2', 't3']" in r.json()["error"]
    assert client.get("/v2/models/tiny:nope").status_code == 404
    r = client.post("/v2/models/tiny:t1/infer", content=(b := body(oip, tokens, adapter_id="t2"))[0], headers=b[1])
    assert r.status_code == 400 and "parameters.adapter_id" in r.json()["error"]
    r = client.post("/v2/models/tiny/infer", content=(b := body(oip, tokens, adapter_id=3))[0], headers=b[1])
    assert r.status_code == 400
    assert client.get("/v2/health/ready").status_code == 200  # still serving


def test_metadata_names_the_adapter(client) -> None:
    meta = client.get("/v2/models/tiny:t2").json()
    assert meta["name"] == "tiny:t2" and meta["parameters"]["adapter_id"] == "t2"
    assert client.get("/v2/models/tiny").json()["parameters"]["adapters"] == IDS
    assert client.get("/v2/models/tiny:t2/ready").json()["ready"] is True


def test_lru_eviction_is_counted_in_stats_and_metrics(served: dict, oip) -> None:
    tokens = random_tokens(served["vocab"], batch=1, sequence=4)
    with TestClient(create_app(oip.make_config(served["repo"]))) as c:
        for adapter in ["t1", "t2", "t1", "t3", "t2"]:  # capacity 2: miss miss hit miss(evict t2) miss(evict t1)
            assert c.post("/v2/models/tiny/infer", content=(b := body(oip, tokens, adapter_id=adapter))[0],
                          headers=b[1]).status_code == 200
        cache = c.get("/v2/models/tiny/stats").json()["model_stats"][0]["adapter_cache"]
        assert (cache["hits"], cache["misses"], cache["evictions"]) == (1, 4, 2) and cache["loaded"] == ["t3", "t2"]
        text = c.get("/metrics").text
        assert 'veil_adapter_cache_evictions_total{model="tiny",version="1"} 2.0' in text
        assert 'veil_adapter_cache_hits_total{model="tiny",version="1"} 1.0' in text


def test_mixed_adapter_batches_under_concurrency(served: dict, oip) -> None:
    plan = [[*IDS, None][i % 4] for i in range(24)]
    inputs = [random_tokens(served["vocab"], batch=1, sequence=5, seed=i) for i in range(len(plan))]

    async def one(client: httpx.AsyncClient, url: str, i: int) -> np.ndarray:
        params = {} if plan[i] is None else {"adapter_id": plan[i]}
        content, headers = body(oip, inputs[i], **params)
        r = await client.post(f"http://{url}/v2/models/tiny/infer", content=content, headers=headers)
        assert r.status_code == 200, r.text
        return oip.decode(r)["sentence_embedding"]

    async def run_all(url: str) -> list[np.ndarray]:
        async with httpx.AsyncClient(timeout=30) as client:
            return await asyncio.gather(*(one(client, url, i) for i in range(len(plan))))

    with oip.live_server(oip.make_config(served["repo"])) as (url, _):
        results = asyncio.run(run_all(url))
        stats = httpx.get(f"http://{url}/v2/models/tiny/stats").json()["model_stats"][0]
    for i, got in enumerate(results):
        assert np.abs(got - expected(served, plan[i], inputs[i])).max() <= 1e-5, (i, plan[i])
    assert stats["inference_count"] == len(plan)
    assert stats["execution_count"] < len(plan)  # groups of several requests ran as one session run
