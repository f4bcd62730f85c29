"""Reproduce one divergence that ``probe compare`` found, with torch and safetensors alone.

Written by ``probe repro`` as ``run.py`` into its output folder, beside ``repro.json`` (what
the compare said), ``a/`` and ``b/`` (each side's inputs, parameters and recorded outputs as
safetensors, and the code that builds its module). It imports nothing of probe.

    python run.py                 # A's and B's module on their own inputs: the compare's metrics
    python run.py --json          # {"node", "verdict", "max_abs_error", "max_rel_error", "cosine"}
    python run.py --swap-inputs   # B's module on A's inputs, A's on B's: the module, or its inputs?

Exit codes: 0 the divergence does not reproduce (``--swap-inputs``: the module agrees),
1 it reproduces (``--swap-inputs``: the module diverges), 2 the folder is incomplete.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import math
import os
import sys

import torch
from safetensors.torch import load_file

HERE = os.path.dirname(os.path.abspath(__file__))
_SEVERITY = {"pass": 0, "warning": 1, "error": 2, "nan": 3}
_FAMILIES = {"Torch": lambda a: getattr(torch, a, None),
             "Functional": lambda a: getattr(torch.nn.functional, a, None),
             "Tensor": lambda a: getattr(torch.Tensor, a, None),
             "Aten": lambda a: getattr(torch.ops.aten, a, None)}
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class ReproError(Exception):
    """The folder cannot be run: one line says why."""


# ------------------------------------------------------------------ values from repro.json
def rebuild(tree, tensors):
    """A value of ``repro.json``'s argument trees, tensors taken from ``tensors`` by key."""
    if isinstance(tree, list):
        return [rebuild(v, tensors) for v in tree]
    if not isinstance(tree, dict):
        return tree
    if "tensor" in tree:
        key = tree["tensor"]
        if key not in tensors:
            raise ReproError(f"inputs.safetensors holds no tensor {key!r}")
        return tensors[key].clone()
    if "tuple" in tree:
        return tuple(rebuild(v, tensors) for v in tree["tuple"])
    if "list" in tree:
        return [rebuild(v, tensors) for v in tree["list"]]
    if "dict" in tree:
        return {k: rebuild(v, tensors) for k, v in tree["dict"].items()}
    if "dtype" in tree:
        return getattr(torch, tree["dtype"])
    if "device" in tree:
        return torch.device(tree["device"])
    if "slice" in tree:
        return slice(*tree["slice"])
    if "size" in tree:
        return torch.Size(tree["size"])
    if "ellipsis" in tree:
        return Ellipsis
    return tree.get("value")


def flat(x):
    """The tensors of an output (a tensor, nested tuples/lists/dicts of them), depth first."""
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, dict) or hasattr(x, "to_tuple"):
        x = list(x.values()) if isinstance(x, dict) else list(x.to_tuple())
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in flat(v)]
    return []


def resolve_api(api):
    """The function a dump's API name stands for (``Functional.linear``)."""
    family, _, attr = api.partition(".")
    find = _FAMILIES.get(family)
    fn = find(attr) if find is not None and attr else None
    if not callable(fn):
        raise ReproError(f"this torch has no {api}")
    return fn


# ------------------------------------------------------------------ the sides
class Side:
    """One side (``a`` or ``b``): its inputs, its recorded outputs and its module (or API)."""

    def __init__(self, name, spec):
        self.name, self.spec = name, spec
        self.dir = os.path.join(HERE, name)
        self.tensors = _load(os.path.join(self.dir, "inputs.safetensors"))
        rebuild(spec["args"], self.tensors), rebuild(spec["kwargs"], self.tensors)   # all there
        self.recorded = _load(os.path.join(self.dir, "outputs.safetensors"))
        self.how = None
        self.fn = self._build()

    def _build(self):
        self.own = []                       # the module's own parameters (not its children's)
        if self.spec["kind"] == "api":
            self.how = f"the API {self.spec['api']}"
            return resolve_api(self.spec["api"])
        params = _load(os.path.join(self.dir, "params.safetensors"))
        self.own = [v for k, v in params.items() if "." not in k]
        module, self.how, route = self._module()
        missing, unexpected = module.load_state_dict(params, strict=False, assign=True)   # (their dtypes too)
        if unexpected:
            raise ReproError(f"{self.name}/params.safetensors: {unexpected[0]!r} is no parameter of the module")
        named = dict(module.named_parameters())
        lacking = [k for k in missing if k in named]
        if lacking:
            raise ReproError(f"{self.name}/params.safetensors lacks the module's parameter {lacking[0]!r}")
        if route["kind"] != "export":        # (an exported graph has its mode built in)
            module.train(bool(route.get("training", self.spec.get("training", True))))
        return module

    def _module(self):
        """The module, by the first route of ``repro.json`` that works here: the bundled
        engine's code, the user's class with its constructor arguments, the exported graph."""
        errors = []
        for route in self.spec["routes"]:
            try:
                if route["kind"] == "source":
                    mod = _import_file(os.path.join(self.dir, route["file"]), f"repro_{self.name}_module")
                    return mod.build(), f"{route['file']} ({route['what']})", route
                if route["kind"] == "class":
                    return _from_class(route), f"class {route['module']}.{route['qualname']}", route
                if route["kind"] == "export":
                    ep = torch.export.load(os.path.join(self.dir, route["file"]))
                    return ep.module(), f"the graph exported with torch.export ({self.name}/{route['file']})", route
            except Exception as e:  # noqa: BLE001 - try the next route, say why if none works
                errors.append(f"{route['kind']}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        raise ReproError(f"side {self.name}: no way to build the module here ({'; '.join(errors) or 'no route'})")

    def inputs(self):
        """A fresh copy of this side's positional and keyword arguments."""
        return rebuild(self.spec["args"], self.tensors), rebuild(self.spec["kwargs"], self.tensors)

    def run(self, args=None, kwargs=None, dtype=None):
        """The outputs on this side's inputs (or the given ones), cast to ``dtype`` when given."""
        if args is None:
            args, kwargs = self.inputs()
        fn = self.fn
        if dtype is not None:
            args, kwargs = _cast(args, dtype), _cast(kwargs, dtype)
            if isinstance(fn, torch.nn.Module):
                import copy
                fn = copy.deepcopy(fn).to(dtype)
        autocast = self.spec.get("autocast") if dtype is None else None
        with torch.no_grad(), torch.autocast("cpu", dtype=getattr(torch, autocast or "bfloat16"),
                                             enabled=bool(autocast)):
            return flat(fn(*args, **kwargs))


def _load(path):
    if not os.path.exists(path):
        raise ReproError(f"{os.path.relpath(path, HERE)}: no such file")
    return load_file(path)


def _import_file(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod             # (dataclasses look their module up there)
    spec.loader.exec_module(mod)
    return mod


def _from_class(route):
    if route.get("path"):
        sys.path.insert(0, route["path"])
    if route.get("file"):
        mod = _import_file(route["file"], "repro_user_code")
    else:
        mod = importlib.import_module(route["module"])
    cls = mod
    for part in route["qualname"].split("."):
        cls = getattr(cls, part)
    return cls(*route.get("args", []), **route.get("kwargs", {}))


def _cast(x, dtype):
    if isinstance(x, torch.Tensor):
        return x.to(dtype) if x.dtype in _FLOATS else x
    if isinstance(x, list):
        return [_cast(v, dtype) for v in x]
    if isinstance(x, tuple):
        return tuple(_cast(v, dtype) for v in x)
    if isinstance(x, dict):
        return {k: _cast(v, dtype) for k, v in x.items()}
    return x


# ------------------------------------------------------------------ metrics and verdicts
def metrics(a, b):
    """The compare's element-wise metrics of two tensors, in float64 over finite elements:
    cosine, max absolute error, max relative error (over |a|)."""
    x = a.detach().reshape(-1).to(torch.float64)
    y = b.detach().reshape(-1).to(torch.float64)
    if x.numel() != y.numel():
        return {"cosine": float("nan"), "max_abs_error": float("nan"), "max_rel_error": float("nan")}
    keep = torch.isfinite(x) & torch.isfinite(y)
    x, y = x[keep], y[keep]
    if x.numel() == 0:
        return {"cosine": float("nan"), "max_abs_error": float("nan"), "max_rel_error": float("nan")}
    diff = (x - y).abs()
    rel = diff / x.abs().clamp_min(torch.finfo(torch.float64).tiny)
    nx, ny = float(torch.linalg.vector_norm(x)), float(torch.linalg.vector_norm(y))
    cos = float(torch.dot(x, y)) / (nx * ny) if nx > 0 and ny > 0 else (1.0 if nx == ny else 0.0)
    return {"cosine": cos, "max_abs_error": float(diff.max()), "max_rel_error": float(rel.max())}


def _stats(t):
    t = t.detach().to(torch.float64)
    if t.numel() == 0:
        return None
    return float(t.max()), float(t.min()), float(t.mean()), float(torch.linalg.vector_norm(t))


def _ladder(err, bounds):
    if err != err:
        return "error"
    if err <= bounds[0]:
        return "pass"
    return "warning" if err <= bounds[1] else "error"


def bounds_of(dtype, tolerance):
    """(pass, warning) bounds on the error of a dtype, as the compare graded it."""
    name = str(dtype).replace("torch.", "")
    if name in tolerance:
        return tuple(tolerance[name])
    if not (name.startswith("float") or name.startswith("bfloat") or name.startswith("complex")):
        return (0.0, 0.0)
    return tuple(tolerance.get("float32", (1e-4, 1e-3)))


#: machine epsilon of each floating dtype, and the noise floor in epsilons (compare/verdict.py)
_EPS = {"float64": 2.220446049250313e-16, "float32": 1.1920928955078125e-07, "float16": 9.765625e-04,
        "bfloat16": 7.8125e-03}
_NOISE_ULPS = 8.0
_CONTEXT_FLOOR = 1e-2


def context(tensors):
    """The magnitude around a node: the largest finite |value| and the largest L2 norm of the
    tensors at it (both sides' inputs, its own parameters, its outputs), as the compare takes it."""
    mag = norm = 0.0
    for t in tensors:
        if not isinstance(t, torch.Tensor) or t.numel() == 0 or not (t.is_floating_point() or t.is_complex()):
            continue
        s = _stats(t)
        for v in (s[0], s[1]):
            if math.isfinite(v):
                mag = max(mag, abs(v))
        if math.isfinite(s[3]):
            norm = max(norm, abs(s[3]))
    return mag, norm


def grade(a, b, tolerance, ctx=(0.0, 0.0)):
    """The compare's verdict of a pair of tensors (``compare/tensor_rows.py`` and
    ``compare/metrics.py``): a pair whose values on both sides are at most 8 epsilons of the
    magnitude around the node (``ctx``) is rounding noise and passes; else its statistics'
    differences over their scale (floored at 1% of the magnitude around it) and its largest
    element error over its magnitude, on the dtype's ladder, the worse of the two; NaN/Inf on
    one side only is ``nan``."""
    bad_a, bad_b = not bool(torch.isfinite(a).all()), not bool(torch.isfinite(b).all())
    if bad_a != bad_b:
        return "nan", float("inf")
    if tuple(a.shape) != tuple(b.shape):
        return "error", float("inf")
    bounds = tuple(max(p, q) for p, q in zip(bounds_of(a.dtype, tolerance), bounds_of(b.dtype, tolerance)))
    if bad_a and bad_b:
        return ("pass", 0.0) if torch.equal(a.nan_to_num(), b.nan_to_num()) else ("error", float("inf"))
    sa, sb = _stats(a), _stats(b)
    if sa is None or sb is None:
        return "pass", 0.0
    mag = max(abs(sa[0]), abs(sa[1]), abs(sb[0]), abs(sb[1]))
    sref = max(mag, _CONTEXT_FLOOR * ctx[0], 1e-30)
    nref = max(abs(sa[3]), abs(sb[3]), _CONTEXT_FLOOR * ctx[0], 1e-30)
    err = max(abs(sb[0] - sa[0]) / sref, abs(sb[1] - sa[1]) / sref, abs(sb[2] - sa[2]) / sref,
              abs(sb[3] - sa[3]) / nref)
    eps = max(_EPS.get(str(a.dtype).replace("torch.", ""), 0.0), _EPS.get(str(b.dtype).replace("torch.", ""), 0.0))
    noise_ref = eps * max(ctx)
    if noise_ref > 0 and mag <= _NOISE_ULPS * noise_ref:
        return "pass", err                  # rounding noise: zero in exact arithmetic
    verdict = _ladder(err, bounds)
    elem = metrics(a, b)["max_abs_error"] / max(mag, 1e-30)
    by_elem = _ladder(elem, bounds)
    if _SEVERITY[by_elem] > _SEVERITY[verdict]:
        return by_elem, elem
    return verdict, err


def compare_outputs(out_a, out_b, pairs, tolerance, around=()):
    """Grade the output pairs the compare graded (``pairs``: [flat index A, flat index B]),
    ``around``: the node's other tensors (inputs, own parameters); the worst pair's verdict and
    metrics."""
    for ia, ib in pairs:
        if ia >= len(out_a) or ib >= len(out_b):
            raise ReproError(f"the module returned {len(out_a)} / {len(out_b)} tensors; the dump recorded more")
    ctx = context([*around, *out_a, *out_b])
    worst = None
    for ia, ib in pairs:
        verdict, err = grade(out_a[ia], out_b[ib], tolerance, ctx)
        row = {"verdict": verdict, "err": err, **metrics(out_a[ia], out_b[ib]), "pair": (ia, ib)}
        if worst is None or (_SEVERITY[verdict], err) > (_SEVERITY[worst["verdict"]], worst["err"]):
            worst = row
    return worst


# ------------------------------------------------------------------ the three runs
def reproduce(spec, a, b):
    out_a, out_b = a.run(), b.run()
    around = [*a.tensors.values(), *b.tensors.values(), *a.own, *b.own]
    return compare_outputs(out_a, out_b, spec["output_pairs"], spec["tolerance"], around), out_a, out_b


def swap(spec, a, b):
    """B's module on A's inputs against A's module on them, and A's on B's against B's."""
    tol = spec["tolerance"]
    pairs = spec["output_pairs"]
    found = []
    for mine, other, label in ((a, b, f"{b.name}'s module on {a.name}'s inputs"),
                               (b, a, f"{a.name}'s module on {b.name}'s inputs")):
        ref = mine.run()
        try:
            moved = other.run(*mine.inputs())
        except Exception as e:  # noqa: BLE001 - the two modules take different inputs
            raise ReproError(f"{label}: the modules do not take each other's inputs "
                             f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
        around = [*mine.tensors.values(), *a.own, *b.own]
        if mine is a:
            found.append((label, compare_outputs(ref, moved, pairs, tol, around)))
        else:
            found.append((label, compare_outputs(moved, ref, pairs, tol, around)))
    return found


def replay_lines(spec, side):
    """An API call replayed in its own dtype (against the recorded output) and in float64."""
    lines = []
    own = side.run()
    recorded = [side.recorded[k] for k in sorted(side.recorded, key=lambda k: int(k.split(".")[-1]))]
    gold = side.run(dtype=torch.float64)
    for i, t in enumerate(own[:len(recorded)]):
        rec = metrics(recorded[i], t)
        g = metrics(gold[i], t)
        lines.append(f"  {side.name}: output {i} replayed in {str(t.dtype).replace('torch.', '')}: "
                     f"{'identical to' if torch.equal(recorded[i], t) else 'max abs error %.3e from' % rec['max_abs_error']}"
                     f" the recorded one; against float64: max abs error {g['max_abs_error']:.3e}, "
                     f"max rel error {g['max_rel_error']:.3e}")
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description="Reproduce one divergence of a probe compare.")
    ap.add_argument("--json", action="store_true", help="print the result as one JSON object")
    ap.add_argument("--swap-inputs", action="store_true",
                    help="run B's module on A's inputs and A's on B's: does the module diverge?")
    opts = ap.parse_args(argv)
    torch.manual_seed(0)
    try:
        with open(os.path.join(HERE, "repro.json")) as f:
            spec = json.load(f)
        a, b = Side("a", spec["sides"]["a"]), Side("b", spec["sides"]["b"])
        node = spec["node"]
        if opts.swap_inputs:
            found = swap(spec, a, b)
            diverging = [(label, r) for label, r in found if r["verdict"] != "pass"]
            if diverging:
                label, r = diverging[0]
                line = (f"the module diverges ({label}: {r['verdict']}, max abs error "
                        f"{r['max_abs_error']:.3e}, cosine {r['cosine']:.9f})")
            elif reproduce(spec, a, b)[0]["verdict"] != "pass":
                line = f"the module agrees; its inputs carry the divergence (look upstream at {spec['upstream']})"
            else:
                line = "the module agrees, and so do its outputs on their own inputs: no divergence here to carry"
            if opts.json:
                say(json.dumps({"node": node, "swap": "diverges" if diverging else "agrees", "line": line,
                                  "runs": [{"run": label, **{k: v for k, v in r.items() if k != "pair"}}
                                           for label, r in found]}))
            else:
                say(line)
            return 1 if diverging else 0
        r, _, _ = reproduce(spec, a, b)
        result = {"node": node, "verdict": r["verdict"], "max_abs_error": r["max_abs_error"],
                  "max_rel_error": r["max_rel_error"], "cosine": r["cosine"]}
        if opts.json:
            say(json.dumps(result))
        else:
            exp = spec.get("expected") or {}
            say(f"node   A {spec['sides']['a']['node']}\n       B {spec['sides']['b']['node']}")
            say(f"built  A from {a.how}\n       B from {b.how}")
            say(f"output A vs B: {r['verdict']}  max_abs_error {r['max_abs_error']:.6e}  "
                  f"max_rel_error {r['max_rel_error']:.6e}  cosine {r['cosine']:.12f}")
            if exp:
                say(f"compare said: {exp.get('verdict')}  max_abs_error {_num(exp.get('max_abs_error'))}  "
                      f"max_rel_error {_num(exp.get('max_rel_error'))}  cosine {_num(exp.get('cosine'), 12)}"
                    + (f"  (the node: {exp['node_verdict']}, for its parameters or inputs)"
                       if exp.get("node_verdict") and exp.get("node_verdict") != exp.get("verdict") else ""))
            if spec.get("kind") == "api":
                for side in (a, b):
                    for line in replay_lines(spec, side):
                        say(line)
            say("the divergence reproduces" if r["verdict"] != "pass" else
                  "the divergence does not reproduce here (the outputs agree)")
        return 1 if r["verdict"] != "pass" else 0
    except ReproError as e:
        say(f"run.py: error: {e}", err=True)
        return 2
    except (OSError, ValueError, KeyError) as e:
        say(f"run.py: error: {type(e).__name__}: {e}", err=True)
        return 2
    except Exception as e:  # noqa: BLE001 - one line, never a traceback
        say(f"run.py: error: the module failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
            err=True)
        return 2


def say(text, err=False):
    """One line on stdout (or stderr): run.py is a program of its own, not a library."""
    (sys.stderr if err else sys.stdout).write(f"{text}\n")


def _num(v, digits=6):
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}e}" \
        if digits == 6 else f"{v:.{digits}f}"


if __name__ == "__main__":
    sys.exit(main())
