"""The frameworks probe can attach to: one table that every reader consults.

A row, :class:`FrameworkSpec`, holds what code on every floor needs to know of a framework
without importing it: the name ``--framework`` takes and its aliases, msprobe's ``framework``
value in ``dump.json``, the first part of its module entries' names (``Module``, ``Cell``) and the
module that defines its engine adapter (``ADAPTER``, see :mod:`probe.engine_adapter.base`). The
readers: the ``--framework`` choice of ``probe dump``, ``get_adapter``, the adapters' own
``framework``/``module_prefix``, the dump's stack filter (an adapter's files and the
framework's call machinery are left out of ``stack.json``), the module/API split of msprobe
names (:mod:`probe.collectors.msprobe_layout`, :mod:`probe.collectors.msprobe_nodes`, the
compare's normalisation, ``check-api``).

PyTorch and MindSpore are built in. Another framework registers at runtime, before a dump is
opened, with :func:`register_framework`; its adapter is a module that defines ``ADAPTER``.
The command line sees the rows registered when it loads (the built-in ones): a framework
registered by a program is dumped through the Python API (``probe.dump(model,
framework=...)``), and its dumps compare as any other.

>>> framework("pytorch").name, framework("ms").module_prefix
('torch', 'Cell')
>>> framework_names(), module_prefixes()
(('torch', 'mindspore'), ('Module', 'Cell'))
"""

from __future__ import annotations

from dataclasses import dataclass

from probe.ground.errors import ProbeError

__all__ = ["FrameworkSpec", "register_framework", "unregister_framework", "framework",
           "frameworks", "framework_names", "module_prefixes"]


@dataclass(frozen=True)
class FrameworkSpec:
    """The facts of one framework (see the module docstring).

    >>> FrameworkSpec("toyfw", "toyfw", "Block", "my_pkg.toyfw_adapter").aliases
    ()
    """

    #: the name ``--framework`` and ``probe.dump(framework=...)`` take: ``torch``
    name: str
    #: msprobe's ``framework`` value in ``dump.json``: ``pytorch``
    msprobe_name: str
    #: the first part of a module entry's name: ``Module`` in ``Module.fc.Linear.forward.0``
    module_prefix: str
    #: the import name of the module that defines ``ADAPTER`` (an ``EngineAdapter`` subclass)
    adapter_module: str
    #: other names accepted for ``name``: ``pytorch``
    aliases: tuple[str, ...] = ()
    #: the framework's modules whose frames only pass a call on (``torch.nn.modules.module``:
    #: ``_call_impl`` and the hooks it runs); ``stack.json`` leaves them out, so that a stack
    #: starts at the code that made the call
    call_machinery: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for what, value in (("name", self.name), ("module_prefix", self.module_prefix),
                            *(("alias", a) for a in self.aliases)):
            if not isinstance(value, str) or not value.isidentifier():
                raise ProbeError(f"framework {self.name!r}: {what} {value!r} is not an identifier")


_BUILT_IN = (
    FrameworkSpec("torch", "pytorch", "Module", "probe.engine_adapter.torch_adapter", ("pytorch",),
                  ("torch.nn.modules.module",)),
    FrameworkSpec("mindspore", "mindspore", "Cell", "probe.engine_adapter.mindspore_adapter", ("ms",),
                  ("mindspore.nn.cell", "mindspore._check_jit_forbidden_api")),
)

_specs: dict[str, FrameworkSpec] = {s.name: s for s in _BUILT_IN}
_by_name: dict[str, FrameworkSpec] = {}
_prefixes: tuple[str, ...] = ()


def _index() -> None:
    global _by_name, _prefixes
    _by_name = {n: s for s in _specs.values() for n in (s.name, *s.aliases)}
    _prefixes = tuple(s.module_prefix for s in _specs.values())


_index()


def register_framework(spec: FrameworkSpec) -> FrameworkSpec:
    """Add ``spec`` to the table (the same row again: nothing changes); returns it.

    A name, alias or module prefix that another framework already has is a :class:`ProbeError`.

    >>> register_framework(framework("torch")).name
    'torch'
    """
    if _specs.get(spec.name) == spec:
        return spec
    taken = [n for n in (spec.name, *spec.aliases) if n in _by_name]
    if taken:
        raise ProbeError(f"framework {spec.name!r}: the name {taken[0]!r} is taken by "
                         f"{_by_name[taken[0]].name!r}; register it under another name")
    if spec.module_prefix in _prefixes:
        raise ProbeError(f"framework {spec.name!r}: module prefix {spec.module_prefix!r} is "
                         "another framework's; module entries must tell the frameworks apart")
    _specs[spec.name] = spec
    _index()
    return spec


def unregister_framework(name: str) -> None:
    """Remove the framework registered as ``name`` (a plug-in unloaded; nothing if absent).

    >>> unregister_framework("no_such_framework")
    """
    if _specs.pop(name, None) is not None:
        _index()


def framework(name: str) -> FrameworkSpec:
    """The row of ``name`` (a name or an alias).

    >>> framework("jax")
    Traceback (most recent call last):
    probe.ground.errors.ProbeError: --framework 'jax': no adapter for this engine; use torch or mindspore
    """
    spec = _by_name.get(name)
    if spec is None:
        raise ProbeError(f"--framework {name!r}: no adapter for this engine; "
                         f"use {' or '.join(framework_names())}")
    return spec


def frameworks() -> tuple[FrameworkSpec, ...]:
    """Every registered row, built-in ones first."""
    return tuple(_specs.values())


def framework_names() -> tuple[str, ...]:
    """The names (not the aliases) of every registered framework."""
    return tuple(_specs)


def module_prefixes() -> tuple[str, ...]:
    """The first part of a module entry's name, for every registered framework."""
    return _prefixes
