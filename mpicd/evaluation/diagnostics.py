"""``eval.diagnostics``: what the algorithm's mechanism does, per round and client (an audit, off by default).

Three measurements, written to ``/diag`` (NaN where undefined); none of them changes anything that
is trained or drawn (no random stream, no model state, the optimizer sees the same gradient):

* ``term_grad_share``: ||g_term|| / (||g_ce|| + ||g_term||), the share of the gradient norm the
  algorithm's extra term contributes, from two ``torch.autograd.grad`` calls on the batch's two
  loss parts (graph retained) before the usual ``backward`` of their sum; averaged over the epoch's
  batches, a batch without the term counting 0; NaN when no batch of the round had one. The
  term's share of the *loss* needs no dataset: it is ``train_extra / train_loss``.
* ``r_distance`` (co-distillation, teacher drawn per round): ||m - R|| / ||R||, m the student's own
  eval-mode mean output (features, or logits with ``share: logits``) over all its training images
  of the class R describes (Frobenius over every class with ``classes: all``), at the start of the
  round, before training; NaN where no R was received.
* ``cka_teacher`` (co-distillation, teacher drawn per round): linear CKA between the student's
  and its teacher's eval-mode features on a fixed probe set (:func:`probe_set`), after the round's
  training. The teacher's probe features (P x D float32) are sent point-to-point after the round's
  ledger row is closed, so they count in ``/comm/outside_rounds``, never in a round's bytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

PROBE_IMAGES = 64  # the probe set: the first 64 images of the validation split (test without one)
CHUNK = 256  # images per forward pass


@dataclass(frozen=True)
class Diagnostics:
    """One client's diagnostics of one round (NaN: not defined there)."""

    term_grad_share: float = math.nan
    r_distance: float = math.nan
    cka_teacher: float = math.nan


def linear_cka(x: np.ndarray, y: np.ndarray) -> float:
    """Linear CKA (Kornblith et al. 2019) of two representations of the same n examples (rows):
    ||Y^T X||_F^2 / (||X^T X||_F ||Y^T Y||_F) on column-centred X (n, p) and Y (n, q), in float64.
    NaN when either is constant (a zero norm)."""
    x = torch.as_tensor(np.asarray(x, dtype=np.float64))  # torch: its thread count is the rank's (numpy's
    y = torch.as_tensor(np.asarray(y, dtype=np.float64))  # BLAS would spin a thread per core on every rank)
    if x.ndim != 2 or y.ndim != 2 or x.shape[0] != y.shape[0]:
        raise ValueError(f"linear_cka: need (n, p) and (n, q), got {tuple(x.shape)} and {tuple(y.shape)}")
    x = x - x.mean(dim=0)
    y = y - y.mean(dim=0)
    # The same quantities through the n x n Gram matrices: ||Y^T X||_F^2 = <X X^T, Y Y^T>_F and
    # ||X^T X||_F = ||X X^T||_F (cheaper for n probe images < D features).
    kx, ky = x @ x.T, y @ y.T
    den = float(torch.linalg.norm(kx) * torch.linalg.norm(ky))
    return float((kx * ky).sum()) / den if den > 0 else math.nan


def relative_distance(m: np.ndarray, r: np.ndarray) -> float:
    """||m - r|| / ||r|| (Frobenius for tables), in float64; NaN when r is zero."""
    m, r = np.asarray(m, dtype=np.float64), np.asarray(r, dtype=np.float64)
    norm = np.linalg.norm(r)
    return float(np.linalg.norm(m - r) / norm) if norm > 0 else math.nan


def eval_outputs(
    outputs: Callable[[torch.Tensor], torch.Tensor], model: torch.nn.Module, x: torch.Tensor
) -> torch.Tensor:
    """``outputs(x)`` in eval mode without gradients, in chunks; the model's mode is restored."""
    was_training = model.training
    model.eval()
    with torch.no_grad():
        out = torch.cat([outputs(x[i : i + CHUNK]) for i in range(0, len(x), CHUNK)])
    model.train(was_training)
    return out


def class_means(
    outputs: Callable[[torch.Tensor], torch.Tensor],
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    classes: Sequence[int],
) -> np.ndarray:
    """(classes, width) float32: the eval-mode mean of ``outputs`` over all images of each class."""
    rows = [eval_outputs(outputs, model, x[y == c]).mean(dim=0) for c in classes]
    return np.ascontiguousarray(torch.stack(rows).cpu().numpy(), dtype=np.float32)


def probe_set(eval_sets: dict) -> tuple[str, torch.Tensor]:
    """(split name, images): the first PROBE_IMAGES images of ``val``, else of ``test`` (all when fewer)."""
    split = "val" if "val" in eval_sets else "test"
    return split, eval_sets[split][0][:PROBE_IMAGES]


def _norm(grads) -> float:
    return math.sqrt(sum(float(g.detach().double().pow(2).sum()) for g in grads if g is not None))


class GradShare:
    """Accumulates ||g_term|| / (||g_ce|| + ||g_term||) over an epoch's batches.

    :meth:`add` differentiates each part separately with ``torch.autograd.grad(..., retain_graph=True)``:
    nothing is accumulated into ``.grad``, so the caller's ``backward`` of ce + term afterwards (and the
    optimizer step) is exactly the one without diagnostics.
    """

    def __init__(self, parameters):
        self.parameters = [p for p in parameters if p.requires_grad]
        self.shares: list[float] = []
        self.with_term = 0

    def add(self, ce: torch.Tensor, term: torch.Tensor | None) -> None:
        if term is None or not term.requires_grad:
            self.shares.append(0.0)  # the term moves nothing in this batch
            return
        g_ce = _norm(torch.autograd.grad(ce, self.parameters, retain_graph=True, allow_unused=True))
        g_term = _norm(torch.autograd.grad(term, self.parameters, retain_graph=True, allow_unused=True))
        self.with_term += 1
        total = g_ce + g_term
        self.shares.append(g_term / total if total > 0 else math.nan)

    def value(self) -> float:
        """The mean over the batches; NaN when no batch had the term (none in this algorithm or round)."""
        return float(np.mean(self.shares)) if self.with_term else math.nan
