"""Which model fits my 32 examples? PAVE specs for two LoRA adapters on the bundled MiniLM, ranked in plaintext and
privately (CKKS: the ranker sees neither the user's vector nor a score; the evaluation keys are registered once,
each query sends only its ciphertexts). See docs/recommend.md.

    python examples/recommend.py                       # 2 adapters (sentiment, topic), a topic user, ~1 min on CPU
    python examples/recommend.py --train-size 32 --shots 16 --repo /tmp/pave-repo
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
from veil.training.adapters import inject
from veil.training.adapters.data import make_task
from veil.training.adapters.finetune import BUNDLED_MINILM, FinetuneConfig, build_classifier, train
from veil.training.pave import PaveConfig, SpecBase, classifier_predictor, model_spec

from veil.recommend import recommend


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-size", type=int, default=96, help="training examples per adapter")
    parser.add_argument("--shots", type=int, default=32, help="the user's labelled examples")
    parser.add_argument("--repo", type=Path, default=None, help="where the specs go (default: a temporary folder)")
    args = parser.parse_args()
    torch.set_num_threads(2)
    repo = args.repo or Path(tempfile.mkdtemp(prefix="veil-pave-"))
    base = SpecBase.bundled(PaveConfig())  # the shared base: MiniLM, seeded A (r=8), seeded head
    print(f"spec base {base.name} ({base.base_sha256[:12]}), vector dim {base.dim}")
    for name in ("sentiment", "topic"):
        cfg = FinetuneConfig(method="lora", r=4, target_modules=["query", "value"], task=name, epochs=1,
                             train_size=args.train_size, val_size=16, test_size=16, lr=5e-3)
        task = make_task(name, (args.train_size, 16, 16), seed=0)
        clf, tok = build_classifier(BUNDLED_MINILM, len(task.label_names), seed=0)
        model = inject(clf, cfg.adapter_config(len(task.label_names)))
        train(model, tok, task, cfg, progress=False)
        spec = model_spec(base, classifier_predictor(model, tok), task.train.texts[:64])  # fits the model's predictions
        (repo / name).mkdir(parents=True, exist_ok=True)
        (repo / name / "pave.json").write_text(spec.to_json())  # what `veil export ... --spec` writes
        print(f"{name}: spec written to {repo / name / 'pave.json'}")
    user = make_task("topic", (8, 8, 200), seed=1).test  # a user with a few topic examples
    texts, labels = user.texts[:args.shots], user.labels[:args.shots]
    plain = recommend(repo, texts, labels)
    private = recommend(repo, texts, labels, private=True)
    print("plaintext ranking:", json.dumps(plain["ranking"]))
    print("private ranking:  ", json.dumps(private["ranking"]))
    sent = private["bytes"]  # the keys are registered once (POST /v2/he/keys); each query is ciphertexts only
    print(f"private bytes: evaluation keys {sent['keys'] / 2**20:.2f} MiB once, then {sent['query'] / 2**20:.2f} MiB "
          "per query")
    same = [r["model"] for r in plain["ranking"]] == [r["model"] for r in private["ranking"]]
    print(f"best model for the user: {plain['ranking'][0]['model']}; encrypted ranking equals plaintext: {same}")


if __name__ == "__main__":
    main()
