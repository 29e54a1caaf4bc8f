"""PAVE model identification: the low-rank identity, a synthetic market, a real MiniLM adapter market, private ranking.

*A Study on PAVE Specification for Learnware* (ICLR 2026; spec ``other_seeds.md`` §2, §7). Four parts, one run:

1. Low-rank identity: |cos(B1 A, B2 A) - cos(B1, B2)| at n = 512, r = 8 over 20 draws of A (target <= 0.05).
2. Synthetic markets (§7): a tiny MLP base pre-trained on a mixture of linear-teacher tasks; developer models are
   full fine-tunes of it, corrupted ones trained on shuffled labels; model vectors fit h(x), user vectors fit 32
   labelled shots. Two markets, three seeds each: §7's own (8 tasks + 2 corrupted models = 10 models, 10 users per
   task; the target's market) and a crowded one (20 tasks, each clean + corrupted = 40 models, 5 users per task).
   Top-1 identification (target >= 80 %), corrupted below clean, and the ablation fitting labels in the model
   vectors (PAVE-club) that should lower the clean-vs-corrupted margin.
3. Real market: LoRA r=4 adapters on the bundled all-MiniLM-L6-v2 for the `veil finetune` tasks (sentiment, number,
   topic), each also label-permuted (another task on the same inputs) and corrupted (shuffled labels); users with 32
   shots of each clean task. Compared with learnware's RKME (``RKMETableSpecification`` on the base's mean-pooled
   embeddings, reduced set 50, gamma 0.1; if the package imports; else a reduced-set kernel-mean-embedding baseline
   of our own, labelled so) and with evaluating every model on the 32 shots (accuracy and wall time).
4. Private ranking: CKKS (veil.he, 128-bit, N = 8192) encrypted ranking == plaintext ranking on every user of both
   markets; latency and bytes for 40 models at the real spec dimension (the real model vectors plus random unit
   vectors up to 40: cost depends only on the count and the dimension).

Writes docs/results/recommend_pave.json and the recommend_pave section of docs/results.md.

    nice -n 10 python benchmarks/recommend_pave.py            # ~10 min of CPU (2 cores)
    python benchmarks/recommend_pave.py --quick --out /tmp/docs   # smoke: small markets
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from common import argument_parser, command_line, environment, save_results
from torch import nn
from veil.he.keystore import KeyStore
from veil.he.recommend import (
    PrivateRecommendClient,
    encrypted_scores,
    open_query,
    registered_keys,
    seal_scores,
)
from veil.pave import PaveVector, rank_models
from veil.training.pave import PaveConfig, SpecBase, classifier_predictor, model_spec, projection, user_spec

LEARNWARE_TARGET = Path(__file__).resolve().parents[1] / ".venv" / "learnware-target"


# -- 1. the low-rank identity ---------------------------------------------------------------------------------------
def low_rank_identity(n: int = 512, r: int = 8, m: int = 64, draws: int = 20, seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    diffs = []
    for d in range(draws):
        b1 = rng.normal(size=(m, r))
        b2 = rng.uniform(0, 1) * b1 + rng.normal(size=(m, r))  # cosines spread over (0, 1)
        a = projection(seed, d, r, n, 1.0).double().numpy()
        cos = lambda x, y: float((x * y).sum() / np.linalg.norm(x) / np.linalg.norm(y))  # noqa: E731
        diffs.append(abs(cos(b1 @ a, b2 @ a) - cos(b1, b2)))
    return {"n": n, "r": r, "m": m, "draws": draws, "mean_abs_diff": float(np.mean(diffs)),
            "max_abs_diff": float(np.max(diffs)), "target": 0.05, "met": float(np.mean(diffs)) <= 0.05}


# -- 2. the synthetic market ----------------------------------------------------------------------------------------
class MLP(nn.Module):
    def __init__(self, d: int = 16, h: int = 64, k: int = 4) -> None:
        super().__init__()
        self.l1, self.l2, self.head = nn.Linear(d, h), nn.Linear(h, h), nn.Linear(h, k)

    def forward(self, x: torch.Tensor, deltas: list[torch.Tensor] | None = None, centre: bool = False) -> torch.Tensor:
        z = self.l1(x) + (0 if deltas is None else x @ deltas[0].T)
        z = torch.tanh(z)
        z = torch.tanh(self.l2(z) + (0 if deltas is None else z @ deltas[1].T))  # (n, h)
        return self.head(z - z.mean(0, keepdim=True) if centre else z)  # the spec head centres, as on MiniLM


def _train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int, lr: float) -> None:
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(steps):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()


def _mlp_spec(base: MLP, x: torch.Tensor, targets: torch.Tensor, r: int, seed: int, steps: int = 10,
              lr: float = 0.5) -> np.ndarray:
    """PAVE on the MLP: B_k (out x r) from zero through frozen A_k (r x in), full-batch SGD, base frozen."""
    a = [projection(seed, k, r, lin.in_features, 1.0) for k, lin in enumerate((base.l1, base.l2))]
    bs = [torch.zeros(lin.out_features, r, requires_grad=True) for lin in (base.l1, base.l2)]
    opt = torch.optim.SGD(bs, lr=lr)
    for _ in range(steps):
        deltas = [b @ ak for b, ak in zip(bs, a, strict=True)]
        loss = -(targets * nn.functional.log_softmax(base(x, deltas, centre=True), -1)).sum(-1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return torch.cat([b.detach().flatten() for b in bs]).numpy()


def synthetic_market(tasks: int = 20, users_per_task: int = 5, shots: int = 32, d: int = 16, k: int = 4,
                     seed: int = 0, corrupted: int | None = None) -> dict[str, Any]:
    """One draw of the market: ``tasks`` linear teachers, a clean full fine-tune each and a corrupted one (shuffled
    labels) for the first ``corrupted`` tasks (None: every task), ``users_per_task`` users of every task."""
    corrupted = tasks if corrupted is None else corrupted
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    teachers = [torch.randn(k, d, generator=gen) for _ in range(tasks)]
    label = lambda t, x: (x @ teachers[t].T).argmax(-1)  # noqa: E731
    base = MLP(d, 64, k)
    mix_x = torch.randn(4000, d, generator=gen)
    mix_t = torch.randint(0, tasks, (4000,), generator=gen)
    mix_y = torch.stack([label(int(t), xi[None])[0] for t, xi in zip(mix_t, mix_x, strict=True)])
    _train(base, mix_x, mix_y, 300, 1e-2)  # the shared base: a mixture of every task
    for p in base.parameters():
        p.requires_grad_(False)
    ident = {"base": "synthetic-mlp", "base_sha256": "0" * 64, "projection_seed": seed, "rank": 8}
    models: dict[str, PaveVector] = {}
    club: dict[str, PaveVector] = {}
    accuracy: dict[str, float] = {}
    for t in range(tasks):
        x = torch.randn(1000, d, generator=gen)
        y = label(t, x)
        for variant in ("clean", "corrupted") if t < corrupted else ("clean",):
            yy = y if variant == "clean" else y[torch.randperm(len(y), generator=gen)]
            dev = MLP(d, 64, k)
            dev.load_state_dict(base.state_dict())
            for p in dev.parameters():
                p.requires_grad_(True)
            _train(dev, x, yy, 300, 1e-2)  # a full fine-tune of the base
            name = f"task{t:02d}-{variant}"
            probe = torch.randn(200, d, generator=gen)
            with torch.no_grad():
                probs = torch.softmax(dev(probe), -1)
                accuracy[name] = float((dev(probe).argmax(-1) == label(t, probe)).float().mean())
            models[name] = PaveVector("model", ident, _mlp_spec(base, probe, probs, 8, seed))
            club[name] = PaveVector("model", ident, _mlp_spec(
                base, x[:200], nn.functional.one_hot(yy[:200], k).float(), 8, seed))
    hits, below, margins, margins_club, users, specs = 0, 0, [], [], 0, []
    for t in range(tasks):
        for _ in range(users_per_task):
            x = torch.randn(shots, d, generator=gen)
            u = PaveVector("user", ident, _mlp_spec(base, x, nn.functional.one_hot(label(t, x), k).float(), 8, seed))
            ranking = rank_models(u, models)
            hits += ranking[0][0] == f"task{t:02d}-clean"
            users += 1
            specs.append((u, f"task{t:02d}-clean"))
            if t >= corrupted:
                continue
            scores, sc = dict(ranking), dict(rank_models(u, club))
            below += scores[f"task{t:02d}-corrupted"] < scores[f"task{t:02d}-clean"]
            margins.append(scores[f"task{t:02d}-clean"] - scores[f"task{t:02d}-corrupted"])
            margins_club.append(sc[f"task{t:02d}-clean"] - sc[f"task{t:02d}-corrupted"])
    return {"tasks": tasks, "corrupted_models": corrupted, "models": len(models), "users": users, "shots": shots,
            "seed": seed, "top1": hits / users, "corrupted_below_clean": below / len(margins),
            "margin_clean_minus_corrupted": float(np.mean(margins)),
            "margin_pave_club_fit_labels": float(np.mean(margins_club)),
            "dev_accuracy_clean": float(np.mean([v for n, v in accuracy.items() if n.endswith("clean")])),
            "dev_accuracy_corrupted": float(np.mean([v for n, v in accuracy.items() if n.endswith("corrupted")])),
            "_models": models, "_users": specs}


# -- 3. the real market ---------------------------------------------------------------------------------------------
def _variant_labels(labels: list[int], n_classes: int, variant: str, seed: int) -> list[int]:
    if variant == "perm":  # a different task on the same inputs: 2 classes swapped, 4 classes shifted
        return [(y + 1) % n_classes for y in labels]
    if variant == "corrupted":
        rng = np.random.default_rng(seed)
        return [int(v) for v in rng.permutation(labels)]
    return list(labels)


def train_adapter(task, labels: list[int], n_classes: int, train_size: int, epochs: int, seed: int):
    from veil.training.adapters import inject
    from veil.training.adapters.finetune import BUNDLED_MINILM, FinetuneConfig, build_classifier, make_batches

    cfg = FinetuneConfig(method="lora", r=4, alpha=8.0, target_modules=["query", "value"], task=task.name,
                         train_size=train_size, epochs=epochs, lr=5e-3, seed=seed)
    clf, tok = build_classifier(BUNDLED_MINILM, n_classes, seed)
    model = inject(clf, cfg.adapter_config(n_classes))
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr)
    torch.manual_seed(seed)
    for epoch in range(epochs):
        model.train()
        for b in make_batches(tok, task.train.texts[:train_size], labels[:train_size], cfg, shuffle_seed=seed + epoch):
            loss = nn.functional.cross_entropy(model(b["input_ids"], b["attention_mask"]), b["labels"])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return model.eval(), tok


def _accuracy(predict, texts: list[str], labels: list[int]) -> float:
    return float((predict(texts).argmax(1) == np.asarray(labels)).mean())


def _embeddings(base: SpecBase, texts: list[str]) -> np.ndarray:
    cache = base.encode(texts)
    with torch.no_grad():
        hidden = base._top(cache)
    mask = cache["mask"].unsqueeze(-1).float()
    return ((hidden * mask).sum(1) / mask.sum(1)).numpy()


def _rkme_factory():
    """learnware's RKMETableSpecification (isolated install under .venv/learnware-target), or our own reduced-set KME."""
    try:
        import importlib
        import types

        if LEARNWARE_TARGET.is_dir() and str(LEARNWARE_TARGET) not in sys.path:
            sys.path.append(str(LEARNWARE_TARGET))
        importlib.import_module("learnware")
        for name in ("learnware.specification", "learnware.specification.regular"):  # skip the LLM-side imports
            if name not in sys.modules:
                mod = types.ModuleType(name)
                mod.__path__ = [str(LEARNWARE_TARGET / name.replace(".", "/"))]
                sys.modules[name] = mod
        from learnware.specification.regular.table.rkme import RKMETableSpecification

        def make(x: np.ndarray):
            spec = RKMETableSpecification(gamma=0.1, cuda_idx=-1)
            spec.generate_stat_spec_from_data(x.astype(np.float64), K=min(50, len(x)), step_size=0.1, steps=3,
                                              nonnegative_beta=True)
            return spec

        return "learnware 0.4.0.post1 RKMETableSpecification (gamma 0.1, K 50, 3 steps)", make, lambda a, b: -a.dist(b)
    except Exception as exc:
        reason = f"{type(exc).__name__}: {exc}"

    def make_own(x: np.ndarray):
        rng = np.random.default_rng(0)
        z = x[rng.choice(len(x), size=min(50, len(x)), replace=False)]
        return z, np.full(len(z), 1.0 / len(z))

    def mmd(a, b, gamma=0.1):
        k = lambda p, q: np.exp(-gamma * ((p[:, None] - q[None]) ** 2).sum(-1))  # noqa: E731
        (za, wa), (zb, wb) = a, b
        return -(wa @ k(za, za) @ wa + wb @ k(zb, zb) @ wb - 2 * wa @ k(za, zb) @ wb)

    return f"our own reduced-set KME (50 points, RBF gamma 0.1; learnware unavailable: {reason[:80]})", make_own, mmd


def real_market(users_per_task: int, shots: int, train_size: int, epochs: int, probe_size: int,
                cfg: PaveConfig, seed: int = 0, test_size: int = 120) -> dict[str, Any]:
    from veil.training.adapters.data import TASKS, make_task

    base = SpecBase.bundled(cfg)
    rkme_name, rkme_make, rkme_score = _rkme_factory()
    models: dict[str, PaveVector] = {}
    predictors: dict[str, Any] = {}
    rkme: dict[str, Any] = {}
    info: dict[str, Any] = {}
    tasks = {name: make_task(name, (train_size, 8, test_size), seed) for name in TASKS}
    t_models = time.perf_counter()
    for name, task in tasks.items():
        n_classes = len(TASKS[name])
        emb = _embeddings(base, task.train.texts[:probe_size])
        for variant in ("clean", "perm", "corrupted"):
            labels = _variant_labels(task.train.labels, n_classes, variant, seed)
            model, tok = train_adapter(task, labels, n_classes, train_size, epochs, seed)
            predict = classifier_predictor(model, tok)
            key = f"{name}-{variant}"
            test_labels = _variant_labels(task.test.labels, n_classes, "perm" if variant == "perm" else "clean", seed)
            t0 = time.perf_counter()
            models[key] = model_spec(base, predict, task.train.texts[:probe_size])
            info[key] = {"test_accuracy": _accuracy(predict, task.test.texts, test_labels),
                         "spec_seconds": round(time.perf_counter() - t0, 2)}
            print(f"[recommend_pave] model {key}: {info[key]}", file=sys.stderr, flush=True)
            predictors[key] = predict
            rkme[key] = rkme_make(emb)
    build_s = time.perf_counter() - t_models
    rows: list[dict[str, Any]] = []
    pave_s = eval_s = 0.0
    for name, task in tasks.items():
        n_classes = len(TASKS[name])
        for variant in ("clean", "perm"):
            for u in range(users_per_task):
                rng = np.random.default_rng([seed, u, len(rows)])
                idx = rng.choice(len(task.test.texts), size=shots, replace=False)
                texts = [task.test.texts[i] for i in idx]
                labels = _variant_labels([task.test.labels[i] for i in idx], n_classes,
                                         "perm" if variant == "perm" else "clean", seed)
                t0 = time.perf_counter()
                spec = user_spec(base, texts, labels)
                ranking = rank_models(spec, models)
                pave_s += time.perf_counter() - t0
                t0 = time.perf_counter()
                accs = {k: _accuracy(p, texts, labels) for k, p in predictors.items()}
                eval_s += time.perf_counter() - t0
                best_eval = max(sorted(accs), key=lambda k: accs[k])
                user_rkme = rkme_make(_embeddings(base, texts))
                print(f"[recommend_pave] user {len(rows)} of {name}-{variant}: pave "
                      f"{ranking[0][0]}", file=sys.stderr, flush=True)
                rk = max(sorted(rkme), key=lambda k: rkme_score(rkme[k], user_rkme))
                scores = dict(ranking)
                truth = f"{name}-{variant}"
                rows.append({"task": truth, "pave_top1": ranking[0][0], "rkme_top1": rk, "eval_top1": best_eval,
                             "clean_score": scores[truth], "corrupted_score": scores[f"{name}-corrupted"],
                             "spec": spec})
    n = len(rows)
    clean_rows = [r for r in rows if r["task"].endswith("-clean")]
    return {
        "base": base.identity, "dim": base.dim, "models": sorted(models), "model_info": info,
        "build_models_and_specs_seconds": round(build_s, 1), "users": n, "shots": shots,
        "pave_top1": sum(r["pave_top1"] == r["task"] for r in rows) / n,
        "rkme_top1": sum(r["rkme_top1"] == r["task"] for r in rows) / n,
        "eval_every_model_top1": sum(r["eval_top1"] == r["task"] for r in rows) / n,
        "corrupted_below_clean": sum(r["corrupted_score"] < r["clean_score"] for r in clean_rows) / len(clean_rows),
        "rkme": rkme_name,
        "seconds_per_user": {"pave_user_spec_and_ranking": round(pave_s / n, 3),
                             "evaluate_every_model": round(eval_s / n, 3)},
        "per_user": [{k: v for k, v in r.items() if k != "spec"} for r in rows],
        "_models": models, "_users": [(r["spec"], r["task"]) for r in rows],
    }


# -- 4. private ranking ---------------------------------------------------------------------------------------------
def private_round(client: PrivateRecommendClient, models: dict[str, PaveVector],
                  store: KeyStore) -> tuple[list, dict[str, float]]:
    """One query with keys registered beforehand (issue 33 item 6): the request is the ciphertexts alone."""
    t0 = time.perf_counter()
    body = client.query()
    t1 = time.perf_counter()
    identity, _, cts, key_id, key_secret = open_query(body, max_dim=1 << 22)
    names = sorted(models)
    ct = encrypted_scores(registered_keys(store, key_id, key_secret), cts, np.stack([models[n].vector for n in names]))
    answer = seal_scores(ct, names, key_id, identity)
    t2 = time.perf_counter()
    ranking = client.ranking(answer)
    t3 = time.perf_counter()
    return ranking, {"client_encrypt_s": t1 - t0, "server_s": t2 - t1, "client_decrypt_s": t3 - t2,
                     "request_bytes": len(body), "response_bytes": len(answer)}


def private_checks(markets: dict[str, dict[str, Any]], latency_models: int = 40) -> dict[str, Any]:
    import tempfile

    out: dict[str, Any] = {}
    keyring, secret = None, None
    folder = tempfile.TemporaryDirectory(prefix="veil-pave-keys-")
    store = KeyStore(Path(folder.name), quota_bytes=2**30, ttl_seconds=86400)  # what the server holds
    for label, market in markets.items():
        same, top1, worst, gaps = 0, 0, 0.0, []
        for spec, _ in market["_users"]:
            client = PrivateRecommendClient(spec, keyring, secret)
            if secret is None:  # one keyring, registered once
                client.register(store)
            keyring, secret = client.keyring, client.key_secret
            enc, _ = private_round(client, market["_models"], store)
            plain = rank_models(spec, market["_models"])
            enc_names, plain_names, plain_score = [n for n, _ in enc], [n for n, _ in plain], dict(plain)
            same += enc_names == plain_names
            top1 += enc_names[0] == plain_names[0]
            if enc_names != plain_names:  # CKKS is approximate: how close in plaintext are the models it swapped?
                gaps.append(max(abs(plain_score[a] - plain_score[b])
                                for a, b in zip(enc_names, plain_names, strict=True) if a != b))
            worst = max(worst, max(abs(a - b) for (_, a), (_, b) in zip(sorted(enc), sorted(plain), strict=True)))
        out[label] = {"users": len(market["_users"]), "encrypted_equals_plaintext": same, "top1_equal": top1,
                      "max_abs_score_error": worst, "swapped_plaintext_gap_max": max(gaps, default=0.0)}
    real = markets["real"]
    spec = real["_users"][0][0]
    rng = np.random.default_rng(1)
    models = dict(real["_models"])
    for i in range(latency_models - len(models)):
        models[f"random-{i:02d}"] = PaveVector("model", spec.identity, rng.normal(size=spec.dim))
    client = PrivateRecommendClient(spec, keyring, secret)
    key_bytes = len(client.evaluation_keys())
    runs = [private_round(client, models, store)[1] for _ in range(3)]
    folder.cleanup()
    median = {k: float(np.median([r[k] for r in runs])) for k in runs[0]}
    t0 = time.perf_counter()
    for _ in range(20):
        rank_models(spec, models)
    out["latency_40"] = {"models": len(models), "dim": spec.dim, "ciphertexts_per_query": -(-spec.dim // 4096),
                         **{k: round(v, 3) for k, v in median.items()}, "evaluation_key_bytes": key_bytes,
                         "query_ciphertext_bytes": median["request_bytes"],  # keys registered once, not resent
                         "plaintext_ranking_s": (time.perf_counter() - t0) / 20,
                         "params": client.params.to_dict()}
    return out


SYNTHETIC_MARKETS = {  # name -> settings; "spec": other_seeds.md §7's market (the target's), "crowded": 4x the models
    "spec": {"tasks": 8, "corrupted": 2, "users_per_task": 10},
    "crowded": {"tasks": 20, "corrupted": None, "users_per_task": 5},
}


def synthetic_markets(seeds: list[int], quick: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every market of SYNTHETIC_MARKETS on every seed: (summary per market, the crowded seed-0 draw with its specs
    for the encrypted check)."""
    out, keep = {}, None
    for name, settings in SYNTHETIC_MARKETS.items():
        draws = []
        for seed in seeds:
            kw = {**settings, "tasks": min(settings["tasks"], 6)} if quick else settings
            kw = {**kw, "corrupted": min(kw["corrupted"] or kw["tasks"], kw["tasks"])}
            draw = synthetic_market(seed=seed, **kw)
            keep = draw if keep is None and name == "crowded" else keep
            draws.append({k: v for k, v in draw.items() if not k.startswith("_")})
        mean = {k: float(np.mean([d[k] for d in draws])) for k in ("top1", "corrupted_below_clean",
                                                                   "margin_clean_minus_corrupted",
                                                                   "margin_pave_club_fit_labels")}
        out[name] = {"draws": draws, "mean": mean, "models": draws[0]["models"], "users_per_seed": draws[0]["users"],
                     "tasks": draws[0]["tasks"], "corrupted_models": draws[0]["corrupted_models"]}
        print(f"[recommend_pave] synthetic market {name} done", file=sys.stderr, flush=True)
    return out, keep


def render(res: dict[str, Any], argv: list[str] | None) -> str:
    lr, markets, real, priv = res["low_rank"], res["synthetic"], res["real"], res["private"]
    lat = priv["latency_40"]
    pct = lambda v: f"{100 * v:.0f} %"  # noqa: E731
    lines = [
        "# PAVE model identification (`POST /v2/recommend`)", "",
        f"`{command_line(__file__, argv)}` — {res['environment']['date']}, {res['environment']['machine']}. "
        "Spec: other_seeds.md §2, §7; issue 22.", "",
        "| check | measured | target |", "|---|---|---|",
        f"| low-rank identity, mean \\|cos(B1A,B2A) − cos(B1,B2)\\| (n={lr['n']}, r={lr['r']}, {lr['draws']} draws) | "
        f"{lr['mean_abs_diff']:.4f} (max {lr['max_abs_diff']:.4f}) | ≤ 0.05 |",
        *[row for name, syn in markets.items() for row in (
            f"| synthetic market `{name}` ({syn['tasks']} tasks, {syn['models']} models of which "
            f"{syn['corrupted_models']} corrupted; {syn['users_per_seed']} users × {len(syn['draws'])} seeds, 32 shots): "
            f"top-1 | {pct(syn['mean']['top1'])} (seeds: {', '.join(pct(d['top1']) for d in syn['draws'])}) | "
            f"{'≥ 80 %' if name == 'spec' else '— (stress)'} |",
            f"| `{name}`: corrupted ranks below its task's clean model | {pct(syn['mean']['corrupted_below_clean'])} of "
            f"those tasks' users (seeds: {', '.join(pct(d['corrupted_below_clean']) for d in syn['draws'])}) | all |",
            f"| `{name}`: clean − corrupted score margin, PAVE (fits ŷ) vs PAVE♣ (fits labels) | "
            f"{syn['mean']['margin_clean_minus_corrupted']:.3f} vs {syn['mean']['margin_pave_club_fit_labels']:.3f} "
            f"(PAVE larger on {sum(d['margin_clean_minus_corrupted'] > d['margin_pave_club_fit_labels'] for d in syn['draws'])}"
            f"/{len(syn['draws'])} seeds) | PAVE > PAVE♣ |")],
        f"| real market (MiniLM, {len(real['models'])} LoRA r=4 adapters): PAVE top-1 over {real['users']} users, "
        f"32 shots | {pct(real['pave_top1'])} | ≥ 80 % |",
        f"| real: corrupted below clean of its task | {pct(real['corrupted_below_clean'])} of clean-task users | all |",
        f"| real: RKME top-1 ({real['rkme']}) | {pct(real['rkme_top1'])} | PAVE better |",
        f"| real: evaluate every model on the 32 shots, top-1 | {pct(real['eval_every_model_top1'])} | — |",
        f"| real: seconds per user, PAVE (user spec + ranking) vs evaluating {len(real['models'])} models | "
        f"{real['seconds_per_user']['pave_user_spec_and_ranking']} vs {real['seconds_per_user']['evaluate_every_model']}"
        " | — |",
        f"| encrypted ranking == plaintext ranking (whole ranking) | synthetic "
        f"{priv['synthetic']['encrypted_equals_plaintext']}/{priv['synthetic']['users']}, real "
        f"{priv['real']['encrypted_equals_plaintext']}/{priv['real']['users']} (max score error "
        f"{max(priv['synthetic']['max_abs_score_error'], priv['real']['max_abs_score_error']):.1e}; top-1 equal: "
        f"synthetic {priv['synthetic']['top1_equal']}/{priv['synthetic']['users']}, real "
        f"{priv['real']['top1_equal']}/{priv['real']['users']}; models swapped by the encryption are within "
        f"{max(priv['synthetic']['swapped_plaintext_gap_max'], priv['real']['swapped_plaintext_gap_max']):.1e} "
        "of each other in plaintext) | every user |",
        f"| private ranking, {lat['models']} models, D={lat['dim']} ({lat['ciphertexts_per_query']} ciphertexts): "
        f"client encrypt / server / client decrypt | {lat['client_encrypt_s']:.2f} / {lat['server_s']:.2f} / "
        f"{lat['client_decrypt_s']:.3f} s (plaintext {1e3 * lat['plaintext_ranking_s']:.2f} ms) | — |",
        f"| private ranking bytes: evaluation keys (registered once) / request per query (ciphertexts) / response | "
        f"{lat['evaluation_key_bytes'] / 2**20:.1f} MiB / {lat['request_bytes'] / 2**10:.0f} KiB / "
        f"{lat['response_bytes'] / 2**10:.0f} KiB | — |",
        "",
        "Real market models (test accuracy of each on its own labels): "
        + ", ".join(f"{k} {v['test_accuracy']:.2f}" for k, v in real["model_info"].items()) + ". "
        f"Market build (9 adapters + their specs): {real['build_models_and_specs_seconds']} s. The latency row pads "
        "the real model vectors with random unit vectors to 40 (cost depends on the count and the dimension only). "
        "Evaluating every model needs the user's examples at every model (no privacy) and M forward passes; PAVE needs "
        "one spec fit on the shared base and M dot products (or the encrypted protocol).",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="small markets (smoke run)")
    parser.add_argument("--users-per-task", type=int, default=2, help="real market: users per clean task")
    parser.add_argument("--train-size", type=int, default=64, help="real market: training examples per adapter")
    parser.add_argument("--epochs", type=int, default=2, help="real market: epochs per adapter")
    parser.add_argument("--probe-size", type=int, default=64, help="real market: probe inputs per model spec")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # one thread: on a shared, oversubscribed machine a second one mostly waits
    cfg = PaveConfig()
    t0 = time.perf_counter()
    res: dict[str, Any] = {"environment": environment(torch=torch.__version__), "config": cfg.to_dict()}
    res["low_rank"] = low_rank_identity()
    res["synthetic"], syn = synthetic_markets([0] if args.quick else [0, 1, 2], args.quick)
    real = real_market(users_per_task=1 if args.quick else args.users_per_task, shots=32,
                       train_size=32 if args.quick else args.train_size, epochs=1 if args.quick else args.epochs,
                       probe_size=32 if args.quick else args.probe_size, cfg=cfg, test_size=48)
    res["private"] = private_checks({"synthetic": syn, "real": real})
    res["real"] = {k: v for k, v in real.items() if not k.startswith("_")}
    res["seconds"] = round(time.perf_counter() - t0, 1)
    body = render(res, argv)
    save_results(args.out, "recommend_pave", res, body)
    print(json.dumps({k: res[k] for k in ("low_rank", "synthetic", "seconds")}, indent=1))
    print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
