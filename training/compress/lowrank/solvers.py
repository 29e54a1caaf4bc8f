"""The closed forms of the three low-rank methods, on one weight and its input statistics (float64).

Notation (docs/compress.md, spec §1.2-1.4): W (m, n) = (out, in); X (n, N) the layer's inputs in the partially
compressed model (student), X^f the same tokens' inputs in the uncompressed model (teacher), E = X^f - X.

- Plain SVD: W' = [W]_r; ignores data.
- SVD-LLM: whitening by the teacher Gram H^f = X^f X^fᵀ = L_f L_fᵀ: W' = [W L_f]_r L_f⁻¹, the optimum of
  ||(W - W') X^f||_F at rank r.
- CEALC (SAES-SVD): with H = X Xᵀ (student) and Δ = E Xᵀ, the objective ||W'X - W(X + βE)||_F² has the rank-r
  optimum W' = [G(β)]_r L⁻¹ with G(β) = W (H + βΔ) L⁻ᵀ, H = L Lᵀ.
- ACES: β maximising the retained energy ratio ρ(β) = Σ_{i≤r} σ_i²(G(β)) / Σ_i σ_i²(G(β)); closed form by
  freezing the top-r subspace of G(0) (a ratio of quadratics in β), and an exact 1-D search as a check.

Every factorisation returns (A (m, r), B (r, n)) with A = U_r Σ_r^½ and B = Σ_r^½ V_rᵀ L⁻¹ (balanced factors).
"""

from __future__ import annotations

import math

import torch

Tensor = torch.Tensor


def rank_for_ratio(out_features: int, in_features: int, ratio: float) -> int:
    """k = ⌊m n (1 − ratio) / (m + n)⌋ (at least 1): removes ``ratio`` of the matrix's weights (spec §1.6)."""
    if not 0.0 <= ratio < 1.0:
        raise ValueError(f"ratio: expected a removal fraction in [0, 1), received {ratio}")
    m, n = out_features, in_features
    return max(1, math.floor(m * n * (1.0 - ratio) / (m + n)))


def cholesky_ridge(h: Tensor, ridge: float, max_tries: int = 8) -> tuple[Tensor, float]:
    """Lower L with L Lᵀ = H + λ I, λ = ridge · mean(diag H), raised ×10 until Cholesky succeeds.

    Returns (L, λ used). A rank-deficient calibration set (N < n) needs λ > 0; λ is relative so it does not
    depend on the token count or the activation scale.
    """
    n = h.shape[0]
    scale = float(h.diagonal().mean()) if n else 1.0
    scale = scale if scale > 0 and math.isfinite(scale) else 1.0
    lam = ridge * scale
    eye = torch.eye(n, dtype=h.dtype)
    for _ in range(max_tries):
        chol, info = torch.linalg.cholesky_ex(h + lam * eye)
        if int(info) == 0 and torch.isfinite(chol).all():
            return chol, lam
        lam = max(lam * 10.0, 1e-12 * scale)
    raise FloatingPointError(f"Cholesky of the input Gram failed with ridge up to {lam:.3g}; "
                             f"check the calibration data (NaN/inf activations?)")


def _balanced(g: Tensor, rank: int) -> tuple[Tensor, Tensor, Tensor]:
    """SVD of G -> (U_r Σ_r^½ (m, r), Σ_r^½ V_rᵀ (r, n), all singular values)."""
    u, s, vh = torch.linalg.svd(g, full_matrices=False)
    root = s[:rank].sqrt()
    return u[:, :rank] * root, root[:, None] * vh[:rank], s


def plain_svd(w: Tensor, rank: int) -> tuple[Tensor, Tensor]:
    """Truncated SVD of W: (A (m, r), B (r, n)), W' = A B."""
    a, b, _ = _balanced(w.double(), rank)
    return a, b


def whitened(w: Tensor, g: Tensor, chol: Tensor, rank: int) -> tuple[Tensor, Tensor, Tensor]:
    """Rank-r factors of the whitened target G = (something) L⁻ᵀ: A = U_r Σ_r^½, B = Σ_r^½ V_rᵀ L⁻¹.

    ``w`` is unused except for its shape check; returns (A, B, singular values of G).
    """
    if g.shape != w.shape:
        raise ValueError(f"whitened: G shape {tuple(g.shape)} must equal W shape {tuple(w.shape)}")
    a, bw, s = _balanced(g, rank)
    # B = bw L⁻¹  <=>  B L = bw  <=>  Lᵀ Bᵀ = bwᵀ (upper-triangular solve, no explicit inverse)
    b = torch.linalg.solve_triangular(chol.T, bw.T, upper=True).T
    return a, b, s


def svd_llm(w: Tensor, h_teacher: Tensor, rank: int, ridge: float = 1e-5) -> tuple[Tensor, Tensor]:
    """SVD-LLM: truncation-aware whitening with the uncompressed model's input Gram H^f = L_f L_fᵀ."""
    w = w.double()
    chol, _ = cholesky_ridge(h_teacher.double(), ridge)
    a, b, _ = whitened(w, w @ chol, chol, rank)
    return a, b


def cealc_target(w: Tensor, h: Tensor, delta: Tensor, chol: Tensor) -> tuple[Tensor, Tensor]:
    """(G0, Gd) with G(β) = G0 + β Gd: G0 = W H L⁻ᵀ, Gd = W Δ L⁻ᵀ (solves against L, no inverse)."""
    def right_inv_t(m: Tensor) -> Tensor:  # M L⁻ᵀ = (L⁻¹ Mᵀ)ᵀ
        return torch.linalg.solve_triangular(chol, m.T, upper=False).T

    return right_inv_t(w @ h), right_inv_t(w @ delta)


def cealc(w: Tensor, h: Tensor, delta: Tensor, rank: int, beta: float, ridge: float = 1e-5
          ) -> tuple[Tensor, Tensor, Tensor]:
    """CEALC rank-r factors for a fixed β: (A, B, singular values of G(β)).

    H = X Xᵀ of the *compressed* model's inputs, Δ = (X^f − X) Xᵀ; the ridge λ I is added to H in both the
    target W(H + βΔ) and the whitening, i.e. the ridge-regularised objective is minimised exactly.
    """
    w, h, delta = w.double(), h.double(), delta.double()
    chol, lam = cholesky_ridge(h, ridge)
    g0, gd = cealc_target(w, h + lam * torch.eye(h.shape[0], dtype=h.dtype), delta, chol)
    return whitened(w, g0 + beta * gd, chol, rank)


def retained_energy(g: Tensor, rank: int) -> float:
    """ρ = Σ_{i≤r} σ_i² / Σ_i σ_i² of G (the ACES criterion)."""
    s2 = torch.linalg.svdvals(g).pow(2)
    total = float(s2.sum())
    return float(s2[:rank].sum()) / total if total > 0 else 1.0


def aces_beta_closed_form(g0: Tensor, gd: Tensor, rank: int, beta_min: float = 0.0, beta_max: float = 1.0,
                          shrink: float = 1.0) -> float:
    """ACES β by the fixed-subspace approximation (spec §1.4): freeze the top-r singular subspace of G0, then
    minimise tail(β)/total(β), both quadratics in β, over [beta_min, beta_max]; finally β ← shrink · β.

    tail = aβ² + bβ + c with a = ||P⊥Gd||², b = 2⟨P⊥G0, P⊥Gd⟩, c = ||P⊥G0||²;
    total = A'β² + B'β + C' with A' = ||Gd||², B' = 2⟨G0, Gd⟩, C' = ||G0||².
    Stationary points: (aB' − bA')β² + 2(aC' − cA')β + (bC' − cB') = 0.
    """
    u, _, vh = torch.linalg.svd(g0, full_matrices=False)
    ur, vr = u[:, :rank], vh[:rank].T  # (m, r), (n, r)

    def perp(m: Tensor) -> Tensor:  # (I − U Uᵀ) M (I − V Vᵀ)
        m = m - ur @ (ur.T @ m)
        return m - (m @ vr) @ vr.T

    p0, pd = perp(g0), perp(gd)
    a, b, c = float((pd * pd).sum()), 2 * float((p0 * pd).sum()), float((p0 * p0).sum())
    a2, b2, c2 = float((gd * gd).sum()), 2 * float((g0 * gd).sum()), float((g0 * g0).sum())

    def ratio(beta: float) -> float:
        total = a2 * beta * beta + b2 * beta + c2
        return (a * beta * beta + b * beta + c) / total if total > 0 else 0.0

    candidates = [beta_min, beta_max]
    qa, qb, qc = a * b2 - b * a2, 2 * (a * c2 - c * a2), b * c2 - c * b2
    scale = max(abs(qa), abs(qb), abs(qc), 1e-300)
    if abs(qa) > 1e-12 * scale:
        disc = qb * qb - 4 * qa * qc
        if disc >= 0:
            root = math.sqrt(disc)
            candidates += [(-qb + root) / (2 * qa), (-qb - root) / (2 * qa)]
    elif abs(qb) > 1e-12 * scale:
        candidates.append(-qc / qb)
    inside = [x for x in candidates if beta_min <= x <= beta_max and math.isfinite(x)]
    best = min(inside, key=lambda x: (ratio(x), x))  # ties -> the smaller β (less extrapolation)
    return shrink * best


def aces_beta_exact(g0: Tensor, gd: Tensor, rank: int, beta_min: float = 0.0, beta_max: float = 1.0,
                    grid: int = 21, refine: int = 20) -> float:
    """Exact β* = argmax ρ(β): a grid of ``grid`` points, then golden-section search around the best one.
    Every evaluation is a full SVD of G(β) (the test oracle of the closed form)."""
    def rho(beta: float) -> float:
        return retained_energy(g0 + beta * gd, rank)

    points = torch.linspace(beta_min, beta_max, grid).tolist()
    values = [rho(x) for x in points]
    i = max(range(grid), key=lambda j: values[j])
    lo, hi = points[max(0, i - 1)], points[min(grid - 1, i + 1)]
    phi = (math.sqrt(5) - 1) / 2
    x1, x2 = hi - phi * (hi - lo), lo + phi * (hi - lo)
    f1, f2 = rho(x1), rho(x2)
    for _ in range(refine):
        if f1 >= f2:
            hi, x2, f2 = x2, x1, f1
            x1 = hi - phi * (hi - lo)
            f1 = rho(x1)
        else:
            lo, x1, f1 = x1, x2, f2
            x2 = lo + phi * (hi - lo)
            f2 = rho(x2)
    best_x, best_f = (x1, f1) if f1 >= f2 else (x2, f2)
    return best_x if best_f >= values[i] else points[i]


def cealc_objective(w_new: Tensor, w: Tensor, x: Tensor, x_teacher: Tensor, beta: float) -> float:
    """||W'X − W(X + β(X^f − X))||_F² on explicit activations (n, N): the tests' reference objective."""
    target = w @ (x + beta * (x_teacher - x))
    return float((w_new @ x - target).pow(2).sum())
