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


def _flipped_pairs(model: AdapterModel) -> int:
    """How many SVD pairs PEFT's raw signs flip against veil's canonical ones (the parity tests need some)."""
    from veil.training.adapters.psoft.layer import peft_signs

    return sum(int((peft_signs(layer.base_layer.weight, layer.psoft_A)[0] < 0).sum())
               for layer in model.adapter_layers().values())


@pytest.mark.parametrize("neumann", [False, True])
def test_peft_loads_a_veil_checkpoint_as_the_same_function(bert_factory, tokens, randomize_trainable, tmp_path,
                                                           neumann: bool) -> None:
    """Issue 19, item 16: PEFT recomputes A/B with its own SVD signs; veil writes Q in that convention, so
    ``peft.PeftModel.from_pretrained`` gives veil's logits with nothing patched (formerly off by whole units)."""
    model = inject(bert_factory(), PsoftConfig(**KW, use_cayley_neumann=neumann))
    randomize_trainable(model)
    assert _flipped_pairs(model) > 0  # otherwise the two conventions agree by chance and nothing is tested
    model.save_pretrained(tmp_path / "p")
    theirs = peft.PeftModel.from_pretrained(bert_factory(), tmp_path / "p").eval()
    with torch.no_grad():
        diff = (theirs(**tokens).logits - model(**tokens).logits).abs().max().item()
    assert diff <= 1e-5


def test_veil_loads_a_peft_checkpoint_as_the_same_function(bert_factory, tokens, randomize_trainable, tmp_path) -> None:
    """Issue 19, item 16, the other way: a checkpoint trained and saved by PEFT loads in veil to PEFT's logits."""
    theirs = peft.get_peft_model(bert_factory(), peft.PsoftConfig(**KW))
    randomize_trainable(theirs)
    theirs.eval().save_pretrained(str(tmp_path / "p"))
    ours = AdapterModel.from_pretrained(bert_factory(), tmp_path / "p")
    assert _flipped_pairs(ours) > 0
    with torch.no_grad():
        diff = (ours(**tokens).logits - theirs(**tokens).logits).abs().max().item()
    assert diff <= 1e-5


def test_a_veil_checkpoint_keeps_its_meaning_where_lapack_signs_differ(bert_factory, tokens, randomize_trainable,
                                                                      tmp_path, monkeypatch) -> None:
    """The saved D, not the loading machine's SVD, says how the stored Q relates to veil's canonical bases."""
    from veil.training.adapters.psoft import model as psoft_model

    model = inject(bert_factory(), PsoftConfig(**KW))
    randomize_trainable(model)
    model.save_pretrained(tmp_path / "p")
    real = psoft_model.peft_signs
    monkeypatch.setattr(psoft_model, "peft_signs", lambda w, vh: (-real(w, vh)[0], 1.0))  # another LAPACK
    with torch.no_grad():
        again = AdapterModel.from_pretrained(bert_factory(), tmp_path / "p")(**tokens).logits
        assert (again - model(**tokens).logits).abs().max() <= 1e-6


def test_bases_no_sign_relates_are_refused_with_the_lora_way_out(bert_factory, randomize_trainable, tmp_path,
                                                                monkeypatch) -> None:
    from safetensors.torch import load_file, save_file
    from veil.training.adapters.psoft import model as psoft_model

    model = inject(bert_factory(), PsoftConfig(**KW))
    randomize_trainable(model)
    model.save_pretrained(tmp_path / "p")
    weights = tmp_path / "p" / "adapter_model.safetensors"
    state = load_file(str(weights))
    save_file({k: v for k, v in state.items() if not k.endswith("veil_signs")}, str(weights))  # as PEFT writes it
    real = psoft_model.peft_signs
    monkeypatch.setattr(psoft_model, "peft_signs", lambda w, vh: (real(w, vh)[0], 0.5))  # repeated singular values
    with pytest.raises(ValueError, match=r"not a sign flip of veil's.*convert it to a LoRA"):
        AdapterModel.from_pretrained(bert_factory(), tmp_path / "p")
    with pytest.warns(UserWarning, match="save_as_lora"):
        model.save_pretrained(tmp_path / "q")
    state["base_model.model.bert.encoder.layer.0.attention.self.query.psoft_R.veil_signs"] = torch.zeros(4, dtype=torch.int8)
    save_file(state, str(weights))
    with pytest.raises(ValueError, match=r"veil_signs: expected 4 values of ±1"):
        AdapterModel.from_pretrained(bert_factory(), tmp_path / "p")


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
