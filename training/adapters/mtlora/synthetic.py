"""A seeded synthetic multi-task suite that reproduces the multi-task collapse mtLoRA addresses (spec §1.7.6, §12.4).

A frozen pre-LN residual block ``h = E x; h + mlp(LN h); head`` is the base. Task t's target adds, beside the MLP
sub-layer, the map ``W_t = S + T_t`` on x̂ = LN(h): S is shared, rank ``shared_rank`` with large singular values;
``T_t = Σ_j c_tj K_j`` mixes ``skills`` rank-1 low-σ components with task-specific coefficients. The input carries
the task: x = [z, e_t] with z ~ N(0, I) and e_t a fixed per-task embedding, so a router on x̂ can see it.
One adapter shared by all tasks can only learn the average map (≈ S): the collapse.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


class BlockNet(nn.Module):
    """The frozen base: embed -> pre-LN residual MLP block (sub-layer ``mlp``) -> head."""

    def __init__(self, d_in: int, d: int, d_out: int) -> None:
        super().__init__()
        self.embed, self.norm, self.head = nn.Linear(d_in, d), nn.LayerNorm(d), nn.Linear(d, d_out)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x: torch.Tensor, extra: torch.Tensor | None = None) -> torch.Tensor:
        h = self.embed(x)  # (B, d)
        xhat = self.norm(h)
        h = h + self.mlp(xhat) + (extra(xhat) if callable(extra) else 0.0)
        return self.head(h)  # (B, d_out)


@dataclass
class MultiTaskSuite:
    """T tasks over one frozen :class:`BlockNet`; ``sample`` draws (x, task, y), ``r2`` scores predictions."""

    base: BlockNet
    task_emb: torch.Tensor  # (T, d_task)
    maps: torch.Tensor  # (T, d, d): W_t = S + T_t
    shared: torch.Tensor  # (d, d): S
    d_z: int

    @property
    def num_tasks(self) -> int:
        return self.maps.shape[0]

    @torch.no_grad()
    def sample(self, n: int, generator: torch.Generator, tasks: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (n, d_z + d_task), task (n,), target y (n, d_out) and the base output y0 (n, d_out)."""
        if tasks is None:
            tasks = torch.randint(0, self.num_tasks, (n,), generator=generator)
        z = torch.randn(n, self.d_z, generator=generator)
        x = torch.cat([z, self.task_emb[tasks]], dim=1)
        y = self.base(x, lambda xhat: torch.einsum("bij,bj->bi", self.maps[tasks], xhat))
        return x, tasks, y, self.base(x)

    @torch.no_grad()
    def shared_output(self, x: torch.Tensor) -> torch.Tensor:
        """What the shared map alone gives (base + S x̂): the best a task-blind adapter can aim at."""
        return self.base(x, lambda xhat: xhat @ self.shared.T)

    @staticmethod
    def r2(pred: torch.Tensor, y: torch.Tensor, ref: torch.Tensor, tasks: torch.Tensor, num_tasks: int) -> list[float]:
        """Per task, 1 − ‖y − ŷ‖² / ‖y − ref‖²: with ref = base output, the share of the task's shift explained;
        with ref = :meth:`shared_output`, the share of the task-specific part explained (0 = task-blind)."""
        return [float(1 - (y[m] - pred[m]).pow(2).sum() / (y[m] - ref[m]).pow(2).sum())
                for m in (tasks == t for t in range(num_tasks))]


def make_suite(num_tasks: int = 20, d: int = 64, d_z: int = 24, d_task: int = 16, d_out: int = 16,
               shared_sigma: tuple[float, ...] = (3.0, 2.0), skills: int = 6, skill_sigma: float = 0.5,
               seed: int = 0) -> MultiTaskSuite:
    """The suite, fully determined by ``seed``: S = U diag(shared_sigma) Vᵀ, K_j = skill_sigma · u_j v_jᵀ,
    c_tj ~ N(0, 1), all directions orthonormal and random."""
    if not 15 <= num_tasks <= 25:
        raise ValueError(f"make_suite: num_tasks: expected 15..25, received {num_tasks}")
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    base = BlockNet(d_z + d_task, d, d_out).requires_grad_(False).eval()
    k = len(shared_sigma)
    u = torch.linalg.qr(torch.randn(d, k + skills, generator=g))[0]  # (d, k + skills) output directions
    v = torch.linalg.qr(torch.randn(d, k + skills, generator=g))[0]  # (d, k + skills) input directions
    shared = u[:, :k] * torch.tensor(shared_sigma) @ v[:, :k].T  # (d, d), high σ
    skill = skill_sigma * torch.einsum("ij,kj->jik", u[:, k:], v[:, k:])  # (skills, d, d), rank 1 each
    coef = torch.randn(num_tasks, skills, generator=g)  # (T, skills)
    maps = shared + torch.einsum("tj,jik->tik", coef, skill)  # (T, d, d)
    return MultiTaskSuite(base, torch.randn(num_tasks, d_task, generator=g), maps, shared, d_z)
