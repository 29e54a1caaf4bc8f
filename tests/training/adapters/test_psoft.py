"""PSOFT (spec §4.5): identity at init, geometry preservation, exact LoRA export, parameter counts, canonical
signs, and formula/naming parity with PEFT's PSOFT."""

from __future__ import annotations

import peft
import pytest
import torch
from torch import nn
from veil.training.adapters import AdapterModel, PsoftConfig, inject
from veil.training.adapters.psoft import OrthRotation, canonical_signs, canonical_svd

KW = {"r": 4, "psoft_alpha": 4, "target_modules": ["query", "value", "dense"], "modules_to_save": ["classifier"]}


def test_init_is_identity(bert_factory, tokens) -> None:
    base = bert_factory()
    with torch.no_grad():
        ref = base(**tokens).logits
        out = inject(base, PsoftConfig(**KW))(**tokens).logits
    assert (out - ref).abs().max() <= 1e-6


def _gram_error(neumann_terms: int | None) -> float:
    """Relative max error of (A'RB')ᵀ(A'RB') vs (A'B')ᵀ(A'B') for one random Q (α = β = 1, fp64)."""
    torch.manual_seed(0)
    cfg = PsoftConfig(r=6, target_modules=["x"], psoft_mag_a=False, psoft_mag_b=False,
                      use_cayley_neumann=neumann_terms is not None, num_cayley_neumann_terms=neumann_terms or 5)
    rot = OrthRotation(6, cfg, dtype=torch.float64)
    with torch.no_grad():
        rot.weight.normal_(std=0.05)
    u, s, vh = canonical_svd(torch.randn(20, 12), 6)
    principal = u * s @ vh  # A'B' in torch layout (out, in)
    rotated = u @ rot.matrix() * s @ vh
    gram = principal.T @ principal
    return ((rotated.T @ rotated - gram).abs().max() / gram.abs().max()).item()


def test_rotation_preserves_principal_geometry() -> None:
    """Theorem 4.1: exact Cayley preserves column angles and norms to fp64 precision; the Neumann series
    approximately, with an error that shrinks as terms are added."""
    exact, k5, k9 = _gram_error(None), _gram_error(5), _gram_error(9)
    assert exact <= 1e-12
    assert k9 < k5 <= 1e-2


def test_rotation_is_orthogonal() -> None:
    rot = OrthRotation(5, PsoftConfig(r=5, target_modules=["x"]), dtype=torch.float64)
    with torch.no_grad():
        rot.weight.normal_()
    r = rot.rotation()
    assert (r.T @ r - torch.eye(5, dtype=torch.float64)).abs().max() <= 1e-12


def test_lora_export_reproduces_psoft_and_loads_in_peft(bert_factory, tokens, randomize_trainable, tmp_path) -> None:
    model = inject(bert_factory(), PsoftConfig(**KW))
    randomize_trainable(model)
    model.save_as_lora(tmp_path / "lora")
    with torch.no_grad():
        ref = model(**tokens).logits
        ours = AdapterModel.from_pretrained(bert_factory(), tmp_path / "lora")(**tokens).logits
        theirs = peft.PeftModel.from_pretrained(bert_factory(), tmp_path / "lora")(**tokens).logits
    assert (ours - ref).abs().max() <= 1e-5 and (theirs - ref).abs().max() <= 1e-5
    layer = next(iter(model.adapter_layers().values()))
    assert torch.linalg.matrix_rank(layer.delta_weight().detach().double(), rtol=1e-5).item() <= 4


def test_merge_unmerge_exact_and_save_load_round_trip(bert_factory, tokens, randomize_trainable, tmp_path) -> None:
    model = inject(bert_factory(), PsoftConfig(**KW))
    randomize_trainable(model)
    with torch.no_grad():
        ref = model(**tokens).logits
        model.merge()
        merged = model(**tokens).logits
        model.unmerge()
        back = model(**tokens).logits
    assert (merged - ref).abs().max() <= 1e-6 and (back - ref).abs().max() <= 1e-6
    model.save_pretrained(tmp_path / "p")
    with torch.no_grad():
        again = AdapterModel.from_pretrained(bert_factory(), tmp_path / "p")(**tokens).logits
    assert (again - ref).abs().max() <= 1e-6


def test_same_formula_and_keys_as_peft(bert_factory, tokens, randomize_trainable, tmp_path) -> None:
    """PEFT loads veil's PSOFT checkpoint; with PEFT's (uncanonicalised) A/B replaced by veil's, outputs agree."""
    model = inject(bert_factory(), PsoftConfig(**KW, use_cayley_neumann=True))
    randomize_trainable(model)
    model.save_pretrained(tmp_path / "p")
    theirs = peft.PeftModel.from_pretrained(bert_factory(), tmp_path / "p").eval()
    for name, layer in model.adapter_layers().items():
        target = theirs.base_model.model.get_submodule(name)
        target._set_psoft_ab_cache_buffers("default", layer.psoft_A, layer.psoft_B)
    with torch.no_grad():
        diff = (theirs(**tokens).logits - model(**tokens).logits).abs().max().item()
    assert diff <= 1e-5


def test_canonical_signs_survive_a_sign_flip() -> None:
    """Spec §4.5.6: flip one SVD pair's sign (as another LAPACK may) — canonical factors are unchanged."""
    w = torch.randn(10, 7, dtype=torch.float64)
    u, _, vh = canonical_svd(w, 4)
    u2, s2, vh2 = torch.linalg.svd(w, full_matrices=False)
    u2[:, 1] *= -1
    vh2[1] *= -1
    assert torch.allclose(u2 * s2 @ vh2, w)  # still an SVD of w
    u3, vh3 = canonical_signs(u2[:, :4], vh2[:4])
    assert torch.equal(u3, u) and torch.equal(vh3, vh)
    assert (u[u.abs().argmax(0), torch.arange(4)] > 0).all()


def test_parameter_counts_match_the_paper() -> None:
    """r(r−1)/2 + 2r per module: DeBERTaV3/ViT-B r=46 × 72 modules = 81,144 (meta device, no weights)."""
    with torch.device("meta"):
        net = nn.ModuleDict({f"m{i}": nn.Linear(768, 768) for i in range(72)})
    counts = {n: sum(p.numel() for p in OrthRotation(46, PsoftConfig(r=46, target_modules=["x"]), device=torch.device("meta")).parameters())
              for n in net}
    assert sum(counts.values()) == 81_144
    assert 352 * 351 // 2 * 196 + 2 * 352 * 196 == 12_246_080  # LLaMA-3.2-3B, all linear (spec §4.5.3)


def test_trainable_counts_equal_peft(bert_factory) -> None:
    ours = inject(bert_factory(), PsoftConfig(**KW)).trainable_report()["trainable"]
    theirs, _ = peft.get_peft_model(bert_factory(), peft.PsoftConfig(**KW)).get_nb_trainable_parameters()
    assert ours == theirs


def test_orth_penalty_is_the_aux_loss(bert_factory) -> None:
    model = inject(bert_factory(), PsoftConfig(**KW, orth_penalty=0.5))
    assert model.aux_loss().item() == 0.0  # C = I at init
    with torch.no_grad():
        next(iter(model.adapter_layers().values())).psoft_R.vector_a.fill_(2.0)
    assert model.aux_loss().item() == pytest.approx(0.5 * 4 * 9.0)  # CᵀC = 4I → ‖3I‖² = 4·9
