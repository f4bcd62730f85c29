"""The dump's recorder: what every engine adapter's hooks report to, written once.

:class:`DumpRecorder` turns hook calls into msprobe entries (``Module.<path>.<Class>.forward.<n>``,
``Functional.linear.<n>.forward``, ``...backward``, ``...parameters_grad.<n>``; named and put in
the call tree by :mod:`probe.dumper.tree`), starts each tensor's statistics on its device through
the adapter's :class:`~probe.engine_adapter.base.StatsBackend` (no host-device synchronisation per
tensor; :mod:`probe.dumper.rows`), and at the end of a step hands the step to the writer thread
(:mod:`probe.dumper.writer`), which gathers every statistic at once and writes both outputs:
msprobe's ``OUT/step{N}/rank{R}/dump.json, construct.json, stack.json`` and the TENSOR and NODE
records of the Arrow store.

Nothing raised inside the recorder reaches the training loop: it is reported once on stderr
and the step goes on.

>>> from probe.engine_adapter.base import get_adapter                        # doctest: +SKIP
>>> rec = DumpRecorder(get_adapter("torch"), DumpConfig(out="runs/d"))  # doctest: +SKIP
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import shutil
import sys
from time import perf_counter
from typing import Any, Iterable

from probe.collectors import msprobe_writer
from probe.engine_adapter.base import EngineAdapter
from probe.dumper.config import DumpConfig
from probe.dumper.rows import POS, RowBuilder
from probe.dumper.tree import CallTree
from probe.dumper.writer import DumpWriter, StepBatch
from probe.ground.frameworks import frameworks

log = logging.getLogger(__name__)

#: The note of an entry that holds uninitialised memory (``torch.empty`` and its kind).
UNINITIALISED_NOTE = "uninitialised memory (an empty tensor not yet written whole): not read"

#: files of the dump machinery other than the framework adapters, left out of stack.json
_MACHINERY_FILES = tuple(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), p)
                         for p in ("probe" + os.sep, "dumper" + os.sep, "engine_adapter" + os.sep + "base"))
#: how deep the adapter's hook is below :meth:`DumpRecorder._capture_stack` (under ``_open``,
#: ``_module_started``/``_api_started`` and ``module_forward_pre``/``api_call``): a hop to the
#: call site is learnt only when the hook is machinery too
_HOOK_DEPTH = 4
#: where a row of :class:`~probe.dumper.rows.RowBuilder` holds its tensor's element count
_NUMEL = 8
#: the modules that run a script (``probe dump -- SCRIPT``, ``python -m``), outside it: left out
#: of stack.json, as are ``<frozen runpy>`` (the name of runpy's frozen code) and the console
#: scripts beside the interpreter (``bin/probe``, ``bin/torchrun``)
_LAUNCHERS = ("runpy", "click")


def _module_files(names: Iterable[str]) -> list[str]:
    """The files of the imported modules among ``names`` (a package: its folder); a module not
    imported has no frames to leave out."""
    files = []
    for name in names:
        path = getattr(sys.modules.get(name), "__file__", None)
        if path:
            files.append(os.path.dirname(path) + os.sep if os.path.basename(path) == "__init__.py" else path)
    return files


def _own_files() -> tuple[str, ...]:
    """Path prefixes of the files left out of stack.json: the dump machinery's; for every
    framework of :mod:`probe.ground.frameworks`, its adapter's (``<folder>/torch_`` of
    ``torch_adapter.py``, its ``torch_*.py`` companions with it; an adapter module named
    otherwise: its one file) and its call machinery's (``torch/nn/modules/module.py``, whose
    ``_call_impl`` runs the hooks); and the launchers' (runpy, click, console scripts), which ran
    the script."""
    own = list(_MACHINERY_FILES)
    for spec in frameworks():
        try:
            found = importlib.util.find_spec(spec.adapter_module)
        except (ImportError, ValueError):      # its package is not importable: nothing to leave out
            found = None
        if found is not None and found.origin:
            origin = found.origin
            own.append(origin[:-len("adapter.py")] if origin.endswith("_adapter.py") else origin)
        own += _module_files(spec.call_machinery)
    import runpy  # noqa: F401 - a standard module, imported to name its file (python -m has it)

    own += _module_files(_LAUNCHERS)
    own += ["<frozen runpy>", os.path.join(os.path.dirname(sys.executable), "")]
    return tuple(own)


def call_stack(frame: Any, own: tuple[str, ...]) -> tuple:
    """``(file, line, function)`` of ``frame`` and of each frame it runs in, innermost first,
    but those of files under ``own``: a call's stack as stack.json shows it.

    >>> def train(): return call_stack(sys._getframe(), ())
    >>> train()[0][2]
    'train'
    """
    frames = []
    f = frame
    while f is not None:
        code = f.f_code
        if not code.co_filename.startswith(own):
            frames.append((code.co_filename, f.f_lineno, code.co_name))
        f = f.f_back
    return tuple(frames)


class DumpRecorder:
    """Implements :class:`~probe.engine_adapter.base.HookSink` for the dump; one per process."""

    def __init__(self, adapter: EngineAdapter, config: DumpConfig, *, rank: int | None = None,
                 store: Any = None) -> None:
        self.adapter = adapter
        self.config = config
        self.rank = adapter.rank() if rank is None else int(rank)
        self.store = store
        self.run = config.run or os.path.basename(os.path.abspath(config.out))
        self._steps = set(config.steps) if config.steps is not None else None
        self._scope = re.compile(config.scope) if config.scope else None
        self._names = tuple(f".{n.strip('.')}." for n in config.names) if config.names else None
        self._filtered = self._scope is not None or self._names is not None
        self._rank_selected = config.ranks is None or self.rank in set(config.ranks)
        self._values = RowBuilder(adapter.stats, want_hash=config.task == "md5",
                                  save=self._copy_tensor if config.task == "tensor" else None,
                                  tensor_ids=True)
        self._value = self._values.value
        self._errors_reported: set[str] = set()
        self._include_cache: dict[str, bool] = {}
        # a call site's stack: (its code, its frame's caller's code, the enclosing module call's
        # stack) for the key made of their ids (the codes held: an id is not reused)
        self._stack_cache: dict[tuple, tuple] = {}
        # a kind of call (module, api, comm) -> (how deep below _capture_stack the last frame of
        # machinery was, that frame's code): the hop to the call site
        self._hops: dict[str, tuple] = {}
        self._own_files = _own_files()
        self._writer: DumpWriter | None = None
        # which backward hook of a step opens the writer's window: the one that began the last
        # recorded step's longest stretch between two backward hooks (None: the first one)
        self._window_hook: int | None = None
        self._replayed = False                # backward hooks replayed by the adapter (told once)
        self.step = -1
        self.active = False
        self._reset()

    # ----------------------------------------------------------------- steps
    def begin_step(self, step: int) -> None:
        """Start recording ``step`` (when it is selected)."""
        self.step = int(step)
        self._reset()
        self.active = self._rank_selected and (self._steps is None or self.step in self._steps)
        self.adapter.recording(self.active)
        if self._writer is not None:
            self._writer.step_started()

    def end_step(self) -> None:
        """Finish the current step: hand it to the writer thread."""
        if self.active:
            try:
                with self.adapter.suspended():
                    self._flush()
            except Exception as e:  # noqa: BLE001 - never kill training
                self.report_error("writing the dump", e)
        self.active = False
        self._reset()

    @property
    def last_step(self) -> int | None:
        """The last selected step (None: every step is)."""
        return max(self._steps) if self._steps else None

    @property
    def steps_written(self) -> list[int]:
        """The steps whose files are written, in order."""
        return self._writer.steps_written if self._writer is not None else []

    @property
    def disk_full(self) -> Any:
        """The full disk that stopped the writer (a :class:`probe.ground.files.DiskFull`), or None."""
        return getattr(self._writer, "disk_full", None)

    def discard_step(self) -> None:
        """Drop the step in flight: nothing of it is written, and the tensor files it wrote
        already are removed (its ``dump_tensor_data`` folder, and its step folder if that is
        left empty)."""
        self.active = False
        folder = self._tensor_dir
        self._reset()
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
            for empty in (os.path.dirname(folder), os.path.dirname(os.path.dirname(folder))):
                try:
                    os.rmdir(empty)
                except OSError:      # not empty: another rank's or step's files are there
                    break

    def step_did_work(self) -> bool:
        """Whether the step in flight recorded work of the model: a module call, a backward, or
        an API call on a tensor of more than one element. A training loop's bookkeeping after its
        last optimizer step (the loss's ``.detach()``, ``.mean()``, ``-=`` for a log line) is
        none: that step is not written."""
        if self.open_entries or self.param_grads:
            return True
        prefix = self.adapter.module_prefix + "."
        if any(name.startswith(prefix) or ".backward" in name for name in self.data):
            return True
        return any((row[_NUMEL] or 0) > 1 for row in self._values.rows)

    def _reset(self) -> None:
        self.data: dict[str, dict] = {}
        self.open_entries: dict[str, dict] = {}
        self.stacks: dict[str, tuple] = {}
        self.tree = CallTree()
        self.param_grads: dict[int, dict] = {}
        self._tensor_dir: str | None = None
        self._files: list[tuple[str, Any]] = []     # (path, copy) of the tensor files to write
        self._values.start_step()
        self._hooks_seen = 0                  # backward hooks of this step so far
        self._last_hook_at = 0.0              # when the last one was called
        self._forward_calls = 0               # module and API calls begun this step so far
        self._forward_calls_at_hook = 0       # ... when the last backward hook was called
        self._longest = (0.0, None)           # (longest stretch between two of them, the hook that began it)
        self._window_open = False

    def _backward_hook(self) -> None:
        """Every backward hook of the recorder starts here: it times the stretches between
        them and opens the writer's window at the one that began the last step's longest.

        The writer writes the last step while this step's backward runs, and its Python holds
        the GIL: where the training thread's hooks come every few tens of microseconds (a
        block's norms and projections) each of them waited for the writer (~10 waits of ~0.1 ms
        a step on the 2-core reference machine); in the longest stretch (a large matmul's
        gradient, ~2-3 ms) it calls none. A step's backward makes the same calls as the last
        one's, so the index of that hook is known a step ahead; a step that calls fewer hooks
        opens the window as it ends (:meth:`_flush`)."""
        now = perf_counter()
        n = self._hooks_seen
        if n and self._forward_calls == self._forward_calls_at_hook:
            # (a stretch with a forward call in it is not the backward's: the next
            # micro-batch's forward, under gradient accumulation, is the interpreter's)
            stretch = now - self._last_hook_at
            if stretch > self._longest[0]:
                self._longest = (stretch, n - 1)
        self._hooks_seen = n + 1
        self._last_hook_at = now
        self._forward_calls_at_hook = self._forward_calls
        if not self._window_open and (self._window_hook is None or n == self._window_hook):
            self._open_window()

    def backward_started(self) -> None:
        """The adapter's hooks run outside the interpreter (their gradients are replayed as
        the step ends): the backward pass leaves the GIL to the writer from its first hook."""
        # (the window opens here; the replayed hooks' stretches would time nothing)
        self._replayed = True
        if self.active and not self._window_open:
            self._open_window()

    def accept_prepared_grads(self, kind: type, replayed: bool = False) -> bool:
        """Gradients already read are taken by this recorder's own backward (a task's recorder
        that reads the tensors itself overrides it), with the native row builder; ``replayed``
        (handed over as the step ends, not as they come) only at the module level (at mix
        level the replay's GIL waits cost more than it saves: docs/dump.md)."""
        cls = type(self)
        if ((replayed and self.config.level != "module") or cls.module_backward is not DumpRecorder.module_backward
                or cls.parameter_grad is not DumpRecorder.parameter_grad
                or cls.api_backward is not DumpRecorder.api_backward
                or cls._record_backward is not DumpRecorder._record_backward):
            return False
        return self._values.accept_prepared(kind)

    def _open_window(self) -> None:
        self._window_open = True
        if self._writer is not None:
            self._writer.open_window()

    # ----------------------------------------------------------------- filters
    def include(self, base: str) -> bool:
        """Whether entries of ``base`` (``Module.layers.0.attn.Attention``, ``Functional.linear``) are kept."""
        hit = self._include_cache.get(base)
        if hit is None:
            hit = True
            if self._scope is not None and not self._scope.search(base):
                hit = False
            if hit and self._names is not None:
                dotted = f".{base}."
                hit = any(n in dotted for n in self._names)
            self._include_cache[base] = hit
        return hit

    # ----------------------------------------------------------------- tensors and stacks
    def _tensor_path(self, name: str) -> tuple[str, str]:
        """The path and file name of the tensor file ``name`` of this step."""
        folder = self._tensor_dir
        if folder is None:          # made once a step
            folder = str(msprobe_writer.step_dir(self.config.out, self.step, self.rank) / "dump_tensor_data")
            os.makedirs(folder, exist_ok=True)
            self._tensor_dir = folder
        # a safe name holds no separator and no leading dot: it names an entry of ``folder``
        # (the backend's writer refuses a symbolic link planted under that name)
        file_name = msprobe_writer.safe_file_name(name, self._tensor_suffix())
        return os.path.join(folder, file_name), file_name

    def _tensor_suffix(self) -> str:
        """The tensor files' extension: msprobe's for the framework (``.pt``, ``.npy``: what
        its compare reads), or ``.safetensors`` (``tensor_format="safetensors"``)."""
        if getattr(self.config, "tensor_format", "msprobe") == "safetensors":
            return ".safetensors"
        return getattr(self.adapter.stats, "tensor_suffix", ".safetensors")

    def _save_tensor(self, t: Any, name: str) -> str:
        """Write ``t``'s file now; returns its name."""
        path, file_name = self._tensor_path(name)
        self.adapter.stats.save({"tensor": t}, path)
        return file_name

    def _copy_tensor(self, t: Any, name: str) -> str:
        """Copy ``t`` as it is now for the writer thread to write with the step (the tensor
        task); returns the file's name."""
        path, file_name = self._tensor_path(name)
        stats = self.adapter.stats
        copy = stats.snapshot(t)
        if copy is None:
            stats.save({"tensor": t}, path)
        else:
            self._files.append((path, copy))
        return file_name

    def _open(self, name: str, kind: str, args: tuple, kwargs: dict) -> None:
        """A call starts: its stack, and its inputs recorded as they are now."""
        self._capture_stack(name, kind)
        seq, value = self.tree.seq, self._value
        self.open_entries[name] = {
            "input_args": [value(a, seq, name, kind, "forward", "input", POS[i] if i < 64 else str(i))
                           for i, a in enumerate(args)],
            "input_kwargs": {k: value(v, seq, name, kind, "forward", "kwarg", k) for k, v in kwargs.items()},
        }

    def _capture_stack(self, name: str, kind: str) -> None:
        """Keep the stack of the call ``name`` that starts: from its call site (the innermost frame
        that is none of the dump's, the adapter's, the framework's call machinery's) outwards.

        A stack is walked once per call site: the site's code and instruction, its caller's, and
        the stack of the module call it runs in (which stands for the frames further out) make the
        key; a call from a site already seen takes its stack from the cache. How many frames of
        machinery lie between here and the site is learnt per ``kind`` of call (checked by the
        code of the last one), so a call seen before costs a few frame look-ups and one
        dictionary look-up, not a walk."""
        if not self.config.stack:
            return
        site = None
        hop = self._hops.get(kind)
        if hop is not None:
            try:
                last = sys._getframe(hop[0])
            except ValueError:       # a shallower stack than the one the hop was learnt on
                last = None
            if last is not None and last.f_code is hop[1]:
                site = last.f_back
        parent = self.stacks.get(self.tree.construct.get(name), ())
        own, walked = self._own_files, False
        while True:
            if site is None:         # walk to the site, and learn the hop from this hook
                last, site, depth, walked = None, sys._getframe(1), 1, True
                while site is not None and site.f_code.co_filename.startswith(own):
                    last, site, depth = site, site.f_back, depth + 1
                if site is None:
                    self.stacks[name] = ()
                    return
                if last is not None and depth > _HOOK_DEPTH:
                    self._hops[kind] = (depth - 1, last.f_code)
            code, caller = site.f_code, site.f_back
            caller_code = caller.f_code if caller is not None else None
            key = (id(code), site.f_lasti, id(caller_code), caller.f_lasti if caller is not None else -1,
                   id(parent))
            cached = self._stack_cache.get(key)
            if cached is not None and cached[0] is code and cached[1] is caller_code and cached[2] is parent:
                self.stacks[name] = cached[3]
                return
            if walked or not code.co_filename.startswith(own):
                break
            site = None              # the learnt hop ended inside the machinery: walk
        cached = self._stack_cache[key] = (code, caller_code, parent, call_stack(site, own))
        self.stacks[name] = cached[3]

    # ----------------------------------------------------------------- modules
    def module_forward_pre(self, base: str, module_key: int, args: tuple, kwargs: dict) -> str | None:
        """A module call starts: its name, its inputs recorded as they are now."""
        if not self.active or (self._filtered and not self.include(base)):
            return None
        self._forward_calls += 1
        try:
            name = self.tree.module_call(base, module_key)
            self._module_started(name, args, kwargs)
            return name
        except Exception as e:  # noqa: BLE001
            self.report_error("a module forward pre-hook", e)
            return None

    def _module_started(self, name: str, args: tuple, kwargs: dict) -> None:
        """What is kept of a module call as it starts: its stack and its inputs as they are now."""
        self._open(name, "module", args, kwargs)

    def module_forward(self, name: str, module_key: int, output: Any, params: Iterable[tuple[str, Any]]) -> None:
        """The module call ``name`` returned ``output``; ``params`` are its own parameters."""
        if name is None or not self.active:
            return
        try:
            tree = self.tree
            tree.module_return(name)
            entry = self.open_entries.pop(name, None)
            if entry is None:
                return
            self.data[name] = entry
            seq, value = tree.seq, self._value
            outs = output if isinstance(output, (tuple, list)) and type(output).__module__ == "builtins" else [output]
            entry["output"] = [value(o, seq, name, "module", "forward", "output", str(i)) for i, o in enumerate(outs)]
            entry["parameters"] = {p: value(t, seq, name, "module", "forward", "parameter", p) for p, t in params}
        except Exception as e:  # noqa: BLE001
            self.report_error("a module forward hook", e)

    def module_backward(self, name: str, module_key: int, grad_outputs: Any, grad_inputs: Any) -> None:
        """The gradients of the outputs and inputs of the module call ``name``."""
        if not self.active:
            return
        if not self._replayed:
            self._backward_hook()
        try:
            tree = self.tree
            backward = tree.module_backward(name, module_key)
            self._record_backward(backward, "module", tree.seq, grad_outputs, grad_inputs)
            self._emit_param_grads(module_key, complete_only=True)
        except Exception as e:  # noqa: BLE001
            self.report_error("a module backward hook", e)

    def _record_backward(self, name: str, kind: str, seq: int, grad_outputs: Any, grad_inputs: Any) -> None:
        value = self._value
        self.data[name] = {
            "input": [value(g, seq, name, kind, "backward", "input", str(i))
                      for i, g in enumerate(grad_outputs) if g is not None],
            "output": [value(g, seq, name, kind, "backward", "output", str(i))
                       for i, g in enumerate(grad_inputs) if g is not None],
        }

    def parameter_grad(self, base: str, module_key: int, param_name: str, grad: Any, expected: int) -> None:
        """One parameter gradient of a module; its entry is made once all ``expected`` are here."""
        if not self.active or (self._filtered and not self.include(base)):
            return
        if not self._replayed:
            self._backward_hook()
        try:
            pending = self.param_grads.setdefault(module_key, {"base": base, "grads": {}, "expected": expected})
            pending["grads"][param_name] = grad
            if len(pending["grads"]) >= expected:
                self._emit_param_grads(module_key, complete_only=False)
        except Exception as e:  # noqa: BLE001
            self.report_error("a parameter gradient hook", e)

    def _emit_param_grads(self, module_key: int, *, complete_only: bool) -> None:
        pending = self.param_grads.get(module_key)
        if not pending or (complete_only and len(pending["grads"]) < pending["expected"]):
            return
        del self.param_grads[module_key]
        tree = self.tree
        name = tree.parameter_grads(pending["base"], self.data)
        seq, value = tree.seq, self._value
        self.data[name] = {p: [value(g, seq, name, "module", "backward", "parameter_grad", p)]
                           for p, g in pending["grads"].items()}

    # ----------------------------------------------------------------- APIs
    def api_call(self, api: str, args: tuple, kwargs: dict) -> tuple[str, str] | None:
        """An API call starts: its token (name and kind), its inputs recorded as they are now."""
        if not self.active or (self._filtered and not self.include(api)):
            return None
        self._forward_calls += 1
        try:
            kind = "comm" if api.startswith("Distributed.") else "api"
            name = self.tree.api_call(api, kind)
            self._api_started(name, kind, api, args, kwargs)
            return name, kind
        except Exception as e:  # noqa: BLE001
            self.report_error("an API pre-hook", e)
            return None

    def _api_started(self, name: str, kind: str, api: str, args: tuple, kwargs: dict) -> None:
        """What is kept of an API call as it starts (a task's recorder keeps what it needs):
        here its stack and its inputs recorded as they are now."""
        self._open(name, kind, args, kwargs)

    def api_return(self, token: Any, output: Any) -> None:
        """The API call of ``token`` returned ``output``."""
        if token is None or not self.active:
            return
        try:
            name, kind = token
            entry = self.open_entries.pop(name, None)
            if entry is None:
                return
            self.data[name] = entry
            to = type(output)
            outs = output if to is tuple or to is list else (output,)
            seq, value = self.tree.seq, self._value
            entry["output"] = [value(o, seq, name, kind, "forward", "output", POS[i] if i < 64 else str(i))
                               for i, o in enumerate(outs)]
        except Exception as e:  # noqa: BLE001
            self.report_error("an API post-hook", e)

    def api_uninitialised(self, token: Any, inputs: list, outputs: list) -> None:
        """Mark the entries of ``token``'s call that hold uninitialised memory (positions or
        keyword names of its inputs, positions of its outputs;
        :class:`probe.engine_adapter.torch_api.UninitialisedMemory`): ``"uninitialised": true``
        beside what msprobe reads, no statistics (a compare does not grade them)."""
        try:
            name = token[0]
            entry = self.open_entries.get(name) or self.data.get(name) or {}
            args, kwargs, outs = entry.get("input_args", []), entry.get("input_kwargs", {}), entry.get("output", [])
            found = [args[i] if isinstance(i, int) and i < len(args) else kwargs.get(i) for i in inputs]
            found += [outs[i] for i in outputs if i < len(outs)]
            for value in found:
                if isinstance(value, dict):
                    value["uninitialised"] = True
                    value["note"] = UNINITIALISED_NOTE
        except Exception as e:  # noqa: BLE001
            self.report_error("marking uninitialised memory", e)

    def api_backward(self, token: Any, grad_outputs: Any, grad_inputs: Any) -> None:
        """The gradients of the outputs and differentiable inputs of ``token``'s call."""
        if token is None or not self.active:
            return
        self._backward_hook()
        try:
            tree = self.tree
            name, kind = tree.api_backward(token[0])
            self._record_backward(name, kind, tree.seq, grad_outputs, grad_inputs)
        except Exception as e:  # noqa: BLE001
            self.report_error("an API backward hook", e)

    # ----------------------------------------------------------------- errors
    def report_error(self, where: str, error: BaseException) -> None:
        """Say once on stderr what failed inside the dump; training goes on."""
        msg = str(error).splitlines()[0] if str(error) else ""
        key = f"{type(error).__name__}:{msg}"
        if key in self._errors_reported:
            return
        self._errors_reported.add(key)
        log.warning(f"probe dump: error in {where}: {type(error).__name__}: {msg} "
                    "(the dump goes on without it; training is not affected)",
                    exc_info=error if os.environ.get("PROBE_DEBUG") else None)

    # ----------------------------------------------------------------- writing
    def _flush(self) -> None:
        """Close the step on the hot path; the gather and all file writing go to the writer thread."""
        self.adapter.finish_pending()
        for key in list(self.param_grads):
            self._emit_param_grads(key, complete_only=False)
        for name, entry in self.open_entries.items():   # calls that never returned (an exception)
            entry["output"] = []
            self.data[name] = entry
        if self._hooks_seen:
            self._window_hook = self._longest[1]
        if not self._window_open:       # no backward, or fewer hooks than the last step's
            self._open_window()
        values = self._values
        batch = StepBatch(self.step, self.data, self.tree, self.stacks, values.leaves,
                          values.handles, values.rows, self._files,
                          released=values.seen_table(), records=values.statistics_records())
        if self._writer is None:
            self._writer = DumpWriter(self.adapter, self.config, rank=self.rank, run=self.run,
                                      store=self.store, report_error=self.report_error)
        self._writer.submit(batch)

    def drain(self) -> None:
        """Wait until every finished step is on disk (store records included)."""
        if self._writer is not None:
            self._writer.drain()
