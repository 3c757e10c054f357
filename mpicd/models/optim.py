"""Adam and SGD, step for step the arithmetic of torch.optim's CPU defaults, without torch.optim.

Why not ``torch.optim``: every ``torch.optim.Optimizer`` imports ``torch._dynamo`` (and with it
``torch._inductor``, sympy, ~900 modules) on construction and in every ``step``, whether or not
anything is compiled. On one rank that is ~2 s of CPU and ~150 MiB of memory, paid again by
every rank of a node: with 4 ranks on 2 cores, 4 s of a 11 s start-up. mpicd never compiles, so
it steps the parameters itself with the same tensor operations, in the same order, as torch's
single-tensor implementations (what ``torch.optim.Adam`` / ``SGD`` run on CPU by default), which
makes every result bit-identical to theirs on CPU (``tests/models/test_optim.py`` checks against
torch.optim). ``state_dict`` has torch's layout, so checkpoints load either way.

Supported: Adam (betas, eps, L2 ``weight_decay``) and SGD (``momentum``, L2 ``weight_decay``,
no dampening, no Nesterov): the options ``train`` offers. On a GPU torch.optim would pick its
multi-tensor (foreach) code instead, which launches fewer kernels per step; this module always
runs the single-tensor loop (a few kernel launches per parameter tensor: ~60 tensors for
ResNet-18). Not measured on a GPU yet.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


class Optimizer:
    """One parameter group; ``state[i]`` belongs to parameter ``i`` (torch's state_dict indexing)."""

    defaults: dict[str, Any]

    def __init__(self, params: Iterable[torch.nn.Parameter], **hyper: Any):
        self.params = list(params)
        if not self.params:
            raise ValueError("optimizer got an empty parameter list")
        self.hyper = {**self.defaults, **hyper}
        self.state: dict[int, dict[str, torch.Tensor]] = {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.detach_().zero_()

    def reset(self) -> None:
        """Forget every parameter's state (Adam's moments and step count, SGD's momentum): the next
        step is a fresh optimizer's first (``train.optimizer_state: reset``, once per round)."""
        self.state = {}

    @torch.no_grad()
    def step(self) -> None:
        for i, p in enumerate(self.params):
            if p.grad is not None:
                self._update(i, p, p.grad)

    def _update(self, i: int, param: torch.Tensor, grad: torch.Tensor) -> None:
        raise NotImplementedError

    def state_dict(self) -> dict:
        """torch.optim's layout: {'state': {i: {...}}, 'param_groups': [{hyper..., 'params': [0..]}]}."""
        return {
            "state": {i: dict(s) for i, s in self.state.items()},
            "param_groups": [{**self.hyper, "params": list(range(len(self.params)))}],
        }

    def load_state_dict(self, state_dict: dict) -> None:
        """Accepts this class's or torch.optim's state_dict of the same parameters (copied, not aliased)."""
        (group,) = state_dict["param_groups"]
        if len(group["params"]) != len(self.params):
            raise ValueError(f"the state holds {len(group['params'])} parameters, the model {len(self.params)}")
        self.hyper = {key: group.get(key, value) for key, value in self.hyper.items()}
        position = {pid: i for i, pid in enumerate(group["params"])}
        self.state = {}
        for pid, saved in state_dict["state"].items():
            param = self.params[position[pid]]
            self.state[position[pid]] = {
                key: value.clone() if key == "step" else value.to(dtype=param.dtype, device=param.device, copy=True)
                for key, value in saved.items()
                if value is not None
            }


class Adam(Optimizer):
    """torch.optim.Adam (amsgrad, maximize, decoupled decay off) as ``_single_tensor_adam`` runs it."""

    defaults = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0}

    def _update(self, i: int, param: torch.Tensor, grad: torch.Tensor) -> None:
        lr, (beta1, beta2), eps, decay = (self.hyper[k] for k in ("lr", "betas", "eps", "weight_decay"))
        state = self.state.get(i)
        if state is None:  # a CPU float step counter, as torch keeps it without capturable/fused
            state = self.state[i] = {
                "step": torch.tensor(0.0, dtype=_scalar_dtype()),
                "exp_avg": torch.zeros_like(param, memory_format=torch.preserve_format),
                "exp_avg_sq": torch.zeros_like(param, memory_format=torch.preserve_format),
            }
        exp_avg, exp_avg_sq, step_t = state["exp_avg"], state["exp_avg_sq"], state["step"]
        step_t += 1
        if decay != 0:
            grad = grad.add(param, alpha=decay)
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        step = step_t.item()
        step_size = lr / (1 - beta1**step)
        bias_correction2_sqrt = (1 - beta2**step) ** 0.5
        denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
        param.addcdiv_(exp_avg, denom, value=-step_size)


class SGD(Optimizer):
    """torch.optim.SGD (dampening 0, no Nesterov, maximize off) as ``_single_tensor_sgd`` runs it."""

    defaults = {"lr": 1e-3, "momentum": 0.0, "weight_decay": 0.0}

    def _update(self, i: int, param: torch.Tensor, grad: torch.Tensor) -> None:
        lr, momentum, decay = (self.hyper[k] for k in ("lr", "momentum", "weight_decay"))
        if decay != 0:
            grad = grad.add(param, alpha=decay)
        if momentum != 0:
            state = self.state.get(i)
            if state is None:
                state = self.state[i] = {"momentum_buffer": grad.detach().clone()}
            else:
                state["momentum_buffer"].mul_(momentum).add_(grad, alpha=1)
            grad = state["momentum_buffer"]
        param.add_(grad, alpha=-lr)


def _scalar_dtype() -> torch.dtype:
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
