"""What a user's call returns is the same under a mix-level dump of a compiled model.

A hook whose graph break Dynamo cannot handle in the graph runs eagerly ("Skipping the function
and falling back to eager"), and Dynamo compiles each API wrapper it calls as a frame of its own. Its compiled
code is kept per code object and guarded on the arguments, not on the wrapper's closure: with one
code object shared by all wrappers, ``f.max()`` ran the code compiled for ``f.float()``'s wrapper
and returned a tensor of ``f``'s shape (``float(f.max())``: "only one element tensors can be
converted to Python scalars", a tiny HF Llama under ``torch.compile(backend="aot_eager")``).
"""

from __future__ import annotations

import torch
from torch import nn

import probe
from probe.engine_adapter.torch_api import make_wrapper


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.act = nn.GELU()

    def forward(self, x):
        y = self.act(self.fc(x))
        # max in a compiled forward: the three overloads
        return y - y.max() + torch.max(y) * 0.5 + y.max(dim=0).values * 0.25


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(_Block(), _Block())
        self.head = nn.Linear(6, 1)

    def forward(self, x):
        return self.head(self.blocks(x))


def _run(out):
    torch._dynamo.reset()
    torch.manual_seed(0)
    net = _Net()
    compiled = torch.compile(net, backend="aot_eager")
    seen: dict[str, list] = {}

    def watch(path):
        # run eagerly, its calls compiled as frames of their own: what Dynamo does with a hook
        # whose graph break it cannot handle in the graph ("Skipping the function and falling
        # back to eager": the Llama's decoder layers)
        @torch.compiler.disable(recursive=False)
        def hook(mod, args, out):
            with torch.no_grad():
                f = out.detach().float()
                by_dim = f.max(dim=0)
                seen.setdefault(path, []).append((
                    float(f.max()), float(torch.max(f)), float(f.min()),
                    tuple(f.shape[1:]), tuple(by_dim.values.shape), tuple(by_dim.indices.shape),
                    by_dim.values.clone(), torch.max(f, 0).indices.clone()))
        return hook

    handles = [m.register_forward_hook(watch(p)) for p, m in net.named_modules() if p]
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    session = probe.start(compiled, out=str(out), level="mix", quiet=True) if out else None
    losses = []
    try:
        for i in range(2):
            x = torch.randn(4, 6, generator=torch.Generator().manual_seed(i))
            loss = compiled(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.detach())
    finally:
        if session is not None:
            probe.stop()
        for h in handles:
            h.remove()
        torch._dynamo.reset()
    return torch.stack(losses), {k: v.detach().clone() for k, v in net.state_dict().items()}, seen


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def test_a_compiled_hooks_max_returns_what_it_returns_without_the_dump(tmp_path):
    ref_losses, ref_weights, ref_seen = _run(None)
    losses, weights, seen = _run(tmp_path)
    assert torch.equal(ref_losses, losses)
    assert all(torch.equal(ref_weights[k], weights[k]) for k in ref_weights)
    assert seen.keys() == ref_seen.keys() and seen
    for path, calls in ref_seen.items():
        assert _same(calls, seen[path]), path
        for (_, _, _, row, values_shape, indices_shape, _, _) in seen[path]:
            assert values_shape == indices_shape == row


def test_each_api_wrapper_has_its_own_code_object():
    """Dynamo's compiled code for one wrapper is never found for another."""
    class Sink:
        active = False

    class Guard:
        depth = 0

    wraps = [make_wrapper(orig, name, False, Sink(), Guard(), False)
             for orig, name in ((torch.Tensor.float, "Tensor.float"), (torch.Tensor.max, "Tensor.max"),
                                (torch.max, "Torch.max"))]
    assert len({id(w.__code__) for w in wraps}) == len(wraps)
    x = torch.arange(6.0).reshape(2, 3)
    torch._dynamo.reset()       # each compiled as a frame of its own, one after the other
    try:
        results = [torch.compile(w, backend="aot_eager")(x) for w in wraps]
    finally:
        torch._dynamo.reset()
    assert results[0].shape == (2, 3)
    assert results[1].shape == () and float(results[1]) == 5.0
    assert results[2].shape == () and float(results[2]) == 5.0

