"""Wrapped and sharded models: the names and the parameters a dump gives their modules.

Data-parallel wrappers change a model's module paths and classes, and sharding changes what its
parameters are between uses; a dump of the same model must read the same either way:

1. **Names**: the wrappers' path segments go (``_fsdp_wrapped_module``,
   ``_checkpoint_wrapped_module``, ``_orig_mod`` of ``torch.compile``, and DDP's leading
   ``module`` when the model given is the DDP wrapper), a wrapper module is not a node of its
   own (FSDP1's ``FullyShardedDataParallel``, ``CheckpointWrapper``, DDP: the module it wraps
   is), and FSDP2's class ``FSDPLlamaDecoderLayer`` is its module's own ``LlamaDecoderLayer``.
   An FSDP, a DDP and a single-process dump of one model have the same names.
2. **Parameters**: a module's parameters are those of the unwrapped model (FSDP1's
   ``FlatParameter`` is not one: the original parameters it holds, by their names, are), and in
   a sharded model they are looked up as the module runs (:meth:`ModelLayout.live`): FSDP1
   and FSDP2 have all-gathered them then, and the module's attributes are the unsharded
   tensors (FSDP2: one ``nn.Parameter`` per parameter, kept across steps; FSDP1: views of the
   flat parameter, new each forward). Their gradients are hooked there too, so
   ``parameters_grad`` holds each rank's gradient of the whole parameter before the reduction,
   as under DDP. A parameter still sharded or freed when read is not read: its entry says why
   (:func:`probe.engine_adapter.torch_stats.readable`).

>>> import torch
>>> net = torch.nn.Sequential(torch.nn.Linear(2, 2))
>>> layout = ModelLayout(net)
>>> layout.sharded, layout.path("0"), layout.class_name(net[0])
(False, '0', 'Linear')
>>> ModelLayout(torch.nn.Module()).path("model._fsdp_wrapped_module.layers.0._checkpoint_wrapped_module")
'model.layers.0'
"""

from __future__ import annotations

from typing import Any

import torch

#: path segments that wrappers add
WRAPPER_SEGMENTS = frozenset({"_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod"})
#: classes of wrapper modules, not nodes of their own: the module they wrap is
WRAPPER_CLASSES = frozenset({"FullyShardedDataParallel", "CheckpointWrapper", "OffloadWrapper",
                             "DistributedDataParallel", "DataParallel", "OptimizedModule"})
#: root wrappers whose wrapped model is their ``module`` attribute
_ROOT_MODULE_WRAPPERS = frozenset({"DistributedDataParallel", "DataParallel"})


def _is_flat_param(p: Any) -> bool:
    """An FSDP1 ``FlatParameter`` (the original parameters of several modules in one)."""
    return hasattr(p, "_param_infos") and hasattr(p, "_fqns")


def _is_fsdp2(module: torch.nn.Module) -> bool:
    """A module ``fully_shard`` made a sharding unit of (its class is ``FSDP<Class>``)."""
    return any(b.__name__ == "FSDPModule" for b in type(module).__mro__[1:])


def _sharded_tensor(p: Any) -> bool:
    """A parameter sharded across ranks: a DTensor, or a ZeRO-3 partitioned one (``ds_id``)."""
    return type(p).__torch_dispatch__ is not torch.Tensor.__torch_dispatch__ or hasattr(p, "ds_id")


class ModelLayout:
    """How a dump names a model's modules and finds their parameters (see the module
    docstring); made once per model attached."""

    def __init__(self, model: torch.nn.Module) -> None:
        self._root_wrapper = type(model).__name__ in _ROOT_MODULE_WRAPPERS
        #: id(module) -> the names of its parameters an FSDP1 FlatParameter holds
        self._flat: dict[int, list[str]] = {}
        sharded = False
        for m in model.modules():
            sharded = sharded or _is_fsdp2(m)
            for p in m._parameters.values():
                if p is None:
                    continue
                if _is_flat_param(p):
                    sharded = True
                    infos = list(p._param_infos) + list(getattr(p, "_shared_param_infos", ()))
                    for info in infos:
                        names = self._flat.setdefault(id(info.module), [])
                        if info.param_name not in names:
                            names.append(info.param_name)
                elif _sharded_tensor(p):
                    sharded = True
        #: whether parameters change between uses (FSDP1, FSDP2, ZeRO-3): looked up as the
        #: modules run, and the forward hook runs before the wrapper's own (it frees them)
        self.sharded = sharded

    def path(self, raw: str) -> str:
        """The module's path in the unwrapped model ('' for the root)."""
        parts = [p for p in raw.split(".") if p and p not in WRAPPER_SEGMENTS]
        if self._root_wrapper and parts and parts[0] == "module":
            parts = parts[1:]
        return ".".join(parts)

    @staticmethod
    def is_wrapper(module: torch.nn.Module) -> bool:
        """A wrapper module: not a node of its own (the module it wraps is)."""
        return type(module).__name__ in WRAPPER_CLASSES

    @staticmethod
    def class_name(module: torch.nn.Module) -> str:
        """The module's class name as the unwrapped model has it."""
        cls = type(module)
        if _is_fsdp2(module):
            for base in cls.__bases__:
                if base.__name__ != "FSDPModule":
                    return base.__name__
        return cls.__name__

    def params(self, module: torch.nn.Module) -> list[tuple[str, Any]]:
        """The module's own parameters as the unwrapped model has them, as they are now."""
        own = [(n, p) for n, p in module._parameters.items() if p is not None and not _is_flat_param(p)]
        extra = self._flat.get(id(module))
        if extra:
            names = {n for n, _ in own}
            own += [(n, t) for n in extra if n not in names
                    for t in (getattr(module, n, None),) if isinstance(t, torch.Tensor)]
        return own

    def live(self, module: torch.nn.Module, attached: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
        """The module's parameters as it runs: in a sharded model the module's attributes now
        (the unsharded tensors), else ``attached`` as it is."""
        if not self.sharded:
            return attached
        out = []
        for name, p in attached:
            t = getattr(module, name, None)
            out.append((name, t if isinstance(t, torch.Tensor) else p))
        return out

    def hook_at_attach(self, p: Any) -> bool:
        """Whether a parameter's gradient is hooked on the tensor attached (else as the module
        runs, :meth:`live`): a plain leaf; not a DTensor shard or a flat parameter's view,
        which autograd never hands a gradient to."""
        if not self.sharded:
            return True
        try:
            return p.is_leaf and not _sharded_tensor(p)
        except RuntimeError:        # a view of a flat parameter changed in place since
            return False
