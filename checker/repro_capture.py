"""Re-run a user's script up to one module's first call, and take what rebuilds that module.

Run by ``probe repro`` as ``python -m probe.checker.repro_capture SPEC.json`` (in a process of
its own: the script's imports and globals stay there). The spec names the script and its
arguments, its folder, the module's path in the model (``model.layers.1.mlp``) and class, the
side's folder and the node's recorded inputs (trees of ``repro.json``, tensors in the side's
``inputs.safetensors``). A global forward pre-hook learns the model's module paths from the
first module called (the model) and stops the script at the named module's first call; then,
out of the script:

- the class route: the module's class, importable by its module name (or from the script's own
  file), and its constructor arguments read off the module's attributes of the same name
  (``Linear(in_features, out_features, bias)``); kept only when the class so built has the
  module's parameter names and shapes and, with the module's parameters, returns its outputs
  on the recorded inputs exactly;
- the export route: ``torch.export`` of the module on the recorded inputs, saved as
  ``module.pt2`` and checked the same way.

It writes ``capture.json`` into the side's folder: ``{"class": route|null, "export":
route|null, "errors": [...]}``.
"""

from __future__ import annotations

import inspect
import json
import os
import runpy
import sys
from pathlib import Path
from typing import Any

import torch

from probe.checker.repro_template import flat, rebuild


class _Captured(BaseException):
    """Raised from the hook to leave the script (a BaseException: the script's own ``except
    Exception`` does not catch it)."""


def capture(spec: dict) -> dict:
    """Run the script of ``spec`` to the module's first call; the routes that rebuild it."""
    target = spec["path"]
    paths: dict[int, str] = {}
    found: dict[str, Any] = {}

    def hook(module: torch.nn.Module, args: Any) -> None:
        if id(module) not in paths:
            for name, m in module.named_modules():
                paths.setdefault(id(m), name)
        if paths.get(id(module)) == target and type(module).__name__ == spec["cls"]:
            found["module"] = module
            raise _Captured

    script = Path(spec["argv"][0])
    if not script.is_absolute():
        script = Path(spec["cwd"]) / script
    handle = torch.nn.modules.module.register_module_forward_pre_hook(hook)
    saved = sys.argv
    sys.argv = [str(script), *spec["argv"][1:]]
    sys.path.insert(0, str(script.resolve().parent))
    try:
        runpy.run_path(str(script), run_name="__main__")
    except _Captured:
        pass
    except SystemExit:
        pass
    finally:
        handle.remove()
        sys.argv = saved
    module = found.get("module")
    if module is None:
        return {"class": None, "export": None,
                "errors": [f"{script} ran to its end without calling a {spec['cls']} at {target!r}"]}
    side = Path(spec["side_dir"])
    from safetensors.torch import load_file

    tensors = load_file(str(side / "inputs.safetensors"))
    params = load_file(str(side / "params.safetensors"))
    args, kwargs = rebuild(spec["args"], tensors), rebuild(spec["kwargs"], tensors)
    try:
        module.load_state_dict(params, strict=False)
    except RuntimeError as e:
        return {"class": None, "export": None, "errors": [f"the dump's parameters do not fit the module: {e}"]}
    with torch.no_grad():
        expected = flat(module(*rebuild(spec["args"], tensors), **rebuild(spec["kwargs"], tensors)))
    errors: list[str] = []
    result = {"class": _class_route(module, script, params, spec, tensors, expected, errors),
              "export": _export_route(module, args, kwargs, side, params, spec, tensors, expected, errors),
              "errors": errors}
    return result


def _class_route(module: torch.nn.Module, script: Path, params: dict, spec: dict, tensors: dict,
                 expected: list, errors: list[str]) -> dict | None:
    cls = type(module)
    if "<locals>" in cls.__qualname__:
        errors.append(f"class: {cls.__qualname__} is defined inside a function: not importable")
        return None
    try:
        sig = inspect.signature(cls.__init__)
    except (TypeError, ValueError) as e:
        errors.append(f"class: no signature of {cls.__qualname__}.__init__ ({e})")
        return None
    kwargs: dict[str, Any] = {}
    for p in list(sig.parameters.values())[1:]:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.name in ("device", "dtype"):
            continue
        value = getattr(module, p.name, inspect.Parameter.empty)
        if p.name == "bias" and (value is None or isinstance(value, torch.Tensor)):
            value = value is not None
        if isinstance(value, tuple):
            value = list(value)
        if value is not inspect.Parameter.empty and _plain(value):
            kwargs[p.name] = value
        elif p.default is inspect.Parameter.empty:
            errors.append(f"class: {cls.__qualname__}'s constructor argument {p.name!r} is not an attribute "
                          "of the module with a plain value")
            return None
    route = {"kind": "class", "module": cls.__module__, "qualname": cls.__qualname__, "args": [],
             "kwargs": kwargs, "path": str(script.resolve().parent), "training": module.training}
    if cls.__module__ == "__main__":
        route["module"], route["file"] = script.stem, str(script.resolve())
    try:
        rebuilt = cls(**kwargs)
        mine = {k: tuple(v.shape) for k, v in module.state_dict().items()}
        theirs = {k: tuple(v.shape) for k, v in rebuilt.state_dict().items()}
        if mine != theirs:
            errors.append(f"class: {cls.__qualname__}({_words(kwargs)}) has other parameters than the module")
            return None
        rebuilt.load_state_dict(module.state_dict())
        rebuilt.train(module.training)
        if not _same(rebuilt, spec, tensors, expected):
            errors.append(f"class: {cls.__qualname__}({_words(kwargs)}) does not give the module's outputs")
            return None
    except Exception as e:  # noqa: BLE001 - the class route is optional
        errors.append(f"class: {cls.__qualname__}({_words(kwargs)}) failed: {type(e).__name__}: {e}")
        return None
    return route


def _export_route(module: torch.nn.Module, args: Any, kwargs: Any, side: Path, params: dict, spec: dict,
                  tensors: dict, expected: list, errors: list[str]) -> dict | None:
    try:
        ep = torch.export.export(module, tuple(args), kwargs=dict(kwargs), strict=False)
        torch.export.save(ep, str(side / "module.pt2"))
        loaded = torch.export.load(str(side / "module.pt2")).module()
        missing, unexpected = loaded.load_state_dict(params, strict=False)
        if unexpected:
            errors.append(f"export: the exported graph has no parameter {unexpected[0]!r}")
            (side / "module.pt2").unlink()
            return None
        if not _same(loaded, spec, tensors, expected):
            errors.append("export: the exported graph does not give the module's outputs")
            (side / "module.pt2").unlink()
            return None
    except Exception as e:  # noqa: BLE001 - say why and go on
        errors.append(f"export: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        if (side / "module.pt2").exists():
            (side / "module.pt2").unlink()
        return None
    return {"kind": "export", "file": "module.pt2"}


def _same(module: Any, spec: dict, tensors: dict, expected: list) -> bool:
    with torch.no_grad():
        got = flat(module(*rebuild(spec["args"], tensors), **rebuild(spec["kwargs"], tensors)))
    return len(got) == len(expected) and all(torch.equal(a, b) for a, b in zip(got, expected))


def _plain(v: Any) -> bool:
    if v is None or isinstance(v, (bool, int, float, str)):
        return True
    if isinstance(v, list):
        return all(_plain(x) for x in v)
    return False


def _words(kwargs: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in kwargs.items())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    spec = json.loads(Path(argv[0]).read_text())
    os.chdir(spec["cwd"])
    torch.manual_seed(0)
    result = capture(spec)
    Path(spec["side_dir"], "capture.json").write_text(json.dumps(result))
    sys.stdout.flush()
    os._exit(0)             # the script's threads and atexit handlers are not ours to wait for


if __name__ == "__main__":
    main()
