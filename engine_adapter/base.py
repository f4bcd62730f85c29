"""The one engine adapter interface: how the dump (and the profiler) attach to a framework.

An adapter knows one framework (PyTorch, MindSpore, ...) and nothing about dump files. It:

- hooks every module (cell) of a model: forward inputs/kwargs, outputs and parameters, backward
  gradients, and parameter gradients, reporting each to a :class:`HookSink`;
- intercepts framework API calls (``api`` and ``mix`` levels), reporting them the same way;
- detects training steps (an optimizer step) and calls back;
- owns the framework's :class:`StatsBackend`: tensor description, on-device statistics,
  one gather per step, content hashes and tensor files.

The dump's recorder (``dumper/recorder.py``) is the :class:`HookSink` (the flight recorder's
ring, ``dumper/flight_ring.py``, is a second, lighter one); each is written once, for every
engine. Adding an engine means one new module ``engine_adapter/<name>_adapter.py`` that defines
``ADAPTER = <a subclass of EngineAdapter>`` and one row of the framework table,
:mod:`probe.ground.frameworks` (its names, its module prefix, that module), or, for an adapter
that lives outside this package, ``register_framework(FrameworkSpec(...))`` at runtime;
:func:`get_adapter` finds it through the table.

>>> get_adapter("torch").framework       # doctest: +SKIP
'pytorch'
"""

from __future__ import annotations

import contextlib
import importlib
from abc import ABC, abstractmethod
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Protocol, Sequence

from probe.ground.errors import ProbeError
from probe.ground.frameworks import framework as framework_spec, framework_names

#: statistics kinds a backend assigns to a tensor
FLOAT = "float"       # Max, Min, Mean, Norm, NaN and Inf counts
INTEGER = "int"       # Max and Min only (exact; Mean/Norm are not meaningful)
OPAQUE = "none"       # dtype and shape only: bool, complex, quantized, empty


class TensorMeta(NamedTuple):
    """What a backend says about one tensor without reading its values."""

    type_name: str              # "torch.Tensor", "mindspore.Tensor"
    dtype: str                  # as the framework prints it: "torch.float32", "Float32"
    shape: tuple[int, ...]
    numel: int
    requires_grad: bool | None  # None where the framework has no such flag (MindSpore)
    kind: str                   # FLOAT | INTEGER | OPAQUE


class StatsBackend(ABC):
    """Tensor statistics computed where the tensor lives, gathered once per step.

    :meth:`reduce` must not synchronise with a device: it returns a handle (a small tensor
    on the tensor's device); :meth:`gather` turns all handles of a step into Python numbers
    in one transfer per device. A handle's values are ``[max, min, sum, sumsq, nan_count,
    inf_count]`` for FLOAT tensors and ``[max, min]`` for INTEGER tensors.
    """

    #: the framework's tensor class(es), for ``isinstance`` on the hot path
    tensor_type: Any = ()
    #: the extension of the tensor files msprobe's dump of this framework writes (and its
    #: compare reads): ``.pt`` for PyTorch, ``.npy`` for MindSpore
    tensor_suffix: str = ".npy"

    @abstractmethod
    def describe(self, t: Any) -> TensorMeta:
        """Type, dtype, shape, numel, requires_grad and statistics kind of ``t``."""

    def identity(self, t: Any) -> Any:
        """A key equal for two references to the same unchanged data (None: no reuse).

        Within a step the recorder reuses the statistics (and the tensor id) of data it has
        already read under the same key while the key's :meth:`owner` is still alive (so the
        memory cannot have been reused): a module's output that is the next module's input is
        reduced once, also when it reaches that module as another tensor object (a view of the
        same bytes).
        """
        return None

    def inspect(self, t: Any) -> tuple:
        """:meth:`describe` and :meth:`identity` at once, as one plain tuple ``(type_name,
        dtype, shape, numel, requires_grad, kind, identity)`` (a backend may do it faster)."""
        return (*self.describe(t), self.identity(t))

    def owner(self, t: Any) -> Any:
        """The object whose life bounds ``t``'s :meth:`identity` key (weakly referenced): while
        it lives, the memory under the key cannot have been given to other data. The tensor
        itself by default; a backend whose memory block outlives the first tensor object read
        (the other views of it) may give the block.
        """
        return t

    def readable(self, t: Any) -> tuple[Any, str | None]:
        """``(data, note)``: what holds ``t``'s values and is safe to read (``t`` itself, a
        shard of it, or None when nothing is: freed or sharded-away memory) and what the dump
        entry should say about it (None: nothing). Asked before anything reads ``t``."""
        return t, None

    @abstractmethod
    def reduce(self, t: Any, kind: str) -> Any:
        """Start the statistics of ``t`` on its device; returns a handle for :meth:`gather`."""

    @abstractmethod
    def gather(self, handles: Sequence[Any]) -> list[list[float]]:
        """Values of every handle, in order, with one transfer per device."""

    @abstractmethod
    def digest(self, t: Any) -> str:
        """A content hash of ``t``'s bytes (8 hex digits, CRC32 as msprobe's md5 task)."""

    @abstractmethod
    def save(self, tensors: dict[str, Any], path: str) -> None:
        """Write ``tensors`` to one file at ``path``, in the format its extension names:
        ``.safetensors`` (every tensor of ``tensors``), or msprobe's one tensor a file (``.pt``
        through ``torch.save``; ``.npy``). A symbolic link at ``path`` is refused, not followed."""

    def snapshot(self, t: Any) -> Any:
        """A host copy of ``t`` that nothing else writes to, for :meth:`save` to write later,
        off the training thread; None: write ``t`` now (no copy cheaper than writing it)."""
        return None

    def scalar_type(self, x: Any) -> str | None:
        """msprobe's ``type`` for a framework scalar-like value (dtype, device), or None."""
        return None


class HookSink(Protocol):
    """Receives what an adapter's hooks see: the dump's recorder, the flight recorder's ring."""

    active: bool

    def module_forward_pre(self, base: str, module_key: int, args: tuple, kwargs: dict) -> str | None:
        """A module starts: ``base`` is ``Module.<path>.<Class>``; returns the call's name."""

    def module_forward(self, name: str, module_key: int, output: Any, params: Iterable[tuple[str, Any]]) -> None:
        """A module returned ``output``; ``params`` are its own (non-recursive) parameters."""

    def module_backward(self, name: str, module_key: int, grad_outputs: Any, grad_inputs: Any) -> None:
        """The gradients of the outputs (``input``) and inputs (``output``) of the module call
        ``name`` (as :meth:`module_forward_pre` returned it) are known."""

    def parameter_grad(self, base: str, module_key: int, param_name: str, grad: Any,
                       expected: int) -> None:
        """One parameter gradient of a module; ``expected`` is how many the module has."""

    def api_call(self, api: str, args: tuple, kwargs: dict) -> Any:
        """An API is about to run; returns a token for :meth:`api_return` (None = skip)."""

    def api_return(self, token: Any, output: Any) -> None:
        """The API call of ``token`` returned ``output``."""

    def api_backward(self, token: Any, grad_outputs: Any, grad_inputs: Any) -> None:
        """Gradients of an API call's outputs and of its differentiable inputs."""

    def report_error(self, where: str, error: BaseException) -> None:
        """An exception inside dump code: reported once, never raised into training."""

    def accept_prepared_grads(self, kind: type, replayed: bool = False) -> bool:
        """Whether :meth:`module_backward`, :meth:`parameter_grad` and :meth:`api_backward`
        may be given gradients already read, as instances of ``kind`` (the adapter's own; its
        values hold the statistics), in place of the tensors; ``replayed``: handed over as the
        step ends rather than as they come. An adapter asks once, when it attaches; False:
        tensors only."""

    def backward_started(self) -> None:
        """A recorded step's backward pass reached its first hooked gradient (told by an
        adapter whose hooks run outside the interpreter and replay them later)."""


class EngineAdapter(ABC):
    """One framework behind one interface; see the module docstring."""

    #: msprobe's ``framework`` value ("pytorch", "mindspore"): its row's ``msprobe_name``
    framework: str = ""
    #: prefix of module entries ("Module", "Cell"): its row's ``module_prefix``
    module_prefix: str = ""

    def __init__(self) -> None:
        self.stats: StatsBackend = self.make_stats()

    @abstractmethod
    def make_stats(self) -> StatsBackend:
        """The framework's statistics backend."""

    @abstractmethod
    def attach_modules(self, model: Any, sink: HookSink, *, backward: bool = True,
                       include: Callable[[str], bool] | None = None, prefix: str = "") -> list[str]:
        """Hook every sub-module of ``model`` (not the root, as msprobe); returns the paths hooked.

        ``include(base)`` may skip modules by name; ``prefix`` is put before every path
        (a second model of one script).
        """

    @abstractmethod
    def attach_api(self, sink: HookSink, *, backward: bool = True,
                   include: Callable[[str], bool] | None = None) -> None:
        """Intercept framework API calls (``Torch.*``, ``Functional.*``, ``Tensor.*``, ...)."""

    @abstractmethod
    def watch_steps(self, on_step: Callable[[], None]) -> None:
        """Call ``on_step()`` after every optimizer step."""

    @abstractmethod
    def watch_models(self, on_model: Callable[[Any], None]) -> None:
        """Call ``on_model(root)`` the first time an unseen top-level module runs (script mode)."""

    @abstractmethod
    def detach(self) -> None:
        """Remove every hook, wrapper and mode this adapter installed. Safe to call twice."""

    def recording(self, active: bool) -> None:
        """A step begins; ``active``: the sink records it (the recorder calls it)."""

    def finish_pending(self) -> None:
        """Report the backward of every call still waiting for some of its gradients (a
        backward that computed only some of them); the recorder calls it as a step ends."""

    @contextlib.contextmanager
    def suspended(self) -> Iterator[None]:
        """While inside, the adapter's interception ignores calls (the dump's own work)."""
        yield

    def root_prefix(self) -> str:
        """Path prefix for the next model found in script mode ('' for the first)."""
        return ""

    def rank(self) -> int:
        """This process's rank in the framework's distributed group (0 when none)."""
        return 0

    def world_size(self) -> int:
        return 1

    def notes(self) -> list[str]:
        """Human-readable notes on what the adapter did (e.g. compiled regions)."""
        return []


def get_adapter(framework: str) -> EngineAdapter:
    """The adapter for ``framework`` (a name or alias of :mod:`probe.ground.frameworks`:
    "torch"/"pytorch", "mindspore"/"ms", or one registered at runtime), newly built.

    Imports the row's ``adapter_module`` and builds its ``ADAPTER``.
    """
    spec = framework_spec(framework)
    try:
        module = importlib.import_module(spec.adapter_module)
    except ModuleNotFoundError as e:
        if e.name and (spec.adapter_module + ".").startswith(e.name + "."):
            raise ProbeError(f"--framework {framework!r}: its adapter module {spec.adapter_module} "
                             f"is missing; use {' or '.join(framework_names())}") from None
        raise ProbeError(f"--framework {framework!r}: {e.name} is not installed; "
                         f"install it (pip install {e.name}) or use --framework torch") from None
    return module.ADAPTER()
