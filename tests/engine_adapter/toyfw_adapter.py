"""A third framework, "toyfw", plugged in at runtime the way an adapter outside this package is.

toyfw runs on PyTorch's autograd (its adapter is PyTorch's hooks), but it is another framework to
every reader of the framework table: its module entries are ``Block.<path>.<Class>...``, its
``dump.json`` says ``"framework": "toyfw"``, and its layers are its own classes with its own
names: ``Dense`` (PyTorch's ``Linear``) and a ``LayerNorm`` whose parameters are ``gamma`` and
``beta`` (as MindSpore names them).

    register_framework(SPEC)        # then probe.dump(model, framework="toyfw")
"""

from __future__ import annotations

import torch

from probe.engine_adapter.torch_adapter import TorchAdapter
from probe.ground.frameworks import FrameworkSpec

SPEC = FrameworkSpec(name="toyfw", msprobe_name="toyfw", module_prefix="Block",
                     adapter_module=__name__, aliases=("toy",))


class ToyAdapter(TorchAdapter):
    """PyTorch's hooks, naming entries as toyfw does."""

    framework = SPEC.msprobe_name
    module_prefix = SPEC.module_prefix


ADAPTER = ToyAdapter


class Dense(torch.nn.Module):
    """toyfw's fully connected layer: ``x @ weight.T + bias``."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(n_out, n_in))
        self.bias = torch.nn.Parameter(torch.empty(n_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addmm(self.bias, x, self.weight.t())


class LayerNorm(torch.nn.Module):
    """toyfw's layer norm, with ``gamma`` and ``beta``."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.gamma = torch.nn.Parameter(torch.ones(n))
        self.beta = torch.nn.Parameter(torch.zeros(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.layer_norm(x, self.gamma.shape, self.gamma, self.beta)
