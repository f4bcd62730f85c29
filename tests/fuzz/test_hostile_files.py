"""Hostile files given to every loader a user points at a path: ``probe compare`` (dump.json,
construct.json, a mapping YAML, tensor files), ``probe query`` (store segments) and
``probe check-api`` (dump.json, tensor files). FIFOs, symbolic links to ``/dev/zero``, files
cut short, JSON nested a hundred thousand deep, a YAML alias bomb, a zip bomb and a safetensors
header claiming 16 GiB.

Every case runs in one child process (``probe.cli.main``, one case after another), watched: a
case must answer within :data:`CASE_SECONDS`, and the child's resident memory must stay under
:data:`MAX_RSS` (a watchdog ends it at once otherwise, naming the case). A refused input is exit
2 with one line naming the file; where the command's contract is to go on without the input (a
store segment, a tensor file, both skipped with one warning), it answers with that warning.
No case may hang, print a traceback or end in an internal error.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import zipfile

import pytest

from tests.compare.dumps import chain, write_dump

pytestmark = pytest.mark.timeout(300)

#: the most one case may take (they take well under a second; the machine may be shared)
CASE_SECONDS = 10.0
#: the most resident memory the child may hold (its imports take about 500 MB)
MAX_RSS = 1536 << 20

_HARNESS = textwrap.dedent("""
    import contextlib, io, json, os, sys, threading, time
    limit, cases = int(sys.argv[1]), json.load(open(sys.argv[2]))
    current = ["imports"]
    def watch():
        page = os.sysconf("SC_PAGE_SIZE")
        while True:
            with open("/proc/self/statm") as f:
                rss = int(f.read().split()[1]) * page
            if rss > limit:
                print(json.dumps({"case": current[0], "rss": rss, "killed": True}), flush=True)
                os._exit(99)
            time.sleep(0.02)
    threading.Thread(target=watch, daemon=True).start()
    from probe.cli import main
    for name, args in cases:
        current[0] = name
        err = io.StringIO()
        t0 = time.monotonic()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            rc = main(args)
        print(json.dumps({"case": name, "rc": rc, "s": time.monotonic() - t0, "err": err.getvalue()}), flush=True)
""")


def _tensor_pickle(numel: int) -> bytes:
    """``torch.save``'s data.pkl for a float32 tensor of ``numel`` elements in member ``data/0``."""
    text = lambda s: b"X" + len(s).to_bytes(4, "little") + s.encode()
    num = lambda n: b"J" + n.to_bytes(4, "little", signed=True)
    storage = b"(" + text("storage") + b"ctorch\nFloatStorage\n" + text("0") + text("cpu") + num(numel) + b"tQ"
    args = b"(" + storage + num(0) + b"(" + num(numel) + b"t(" + num(1) + b"t\x89}t"
    return b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n" + args + b"R."


def _zip_bomb(path, numel: int = 16 << 20) -> None:
    """A ``torch.save``-layout zip whose 64 MB storage member is deflated zeros (64 KB on disk)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        z.writestr(zipfile.ZipInfo("archive/data.pkl"), _tensor_pickle(numel), zipfile.ZIP_STORED)
        z.writestr("archive/data/0", bytes(numel * 4))


def _huge_safetensors(path) -> None:
    header = json.dumps({"tensor": {"dtype": "BF16", "shape": [65536, 131072],
                                    "data_offsets": [0, 2 * 65536 * 131072]}}).encode()
    path.write_bytes(len(header).to_bytes(8, "little") + header + bytes(8))


def _swap(path, kind: str) -> None:
    """Replace the file at ``path`` by a FIFO, a link to /dev/zero, or itself cut short."""
    if kind == "trunc":
        raw = path.read_bytes()
        path.write_bytes(raw[: len(raw) // 2])
        return
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")


DEEP = b'{"task": "statistics", "data": {"x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}}"
ALIAS_BOMB = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{c}: &{c} [{','.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi"))


def _compare_cases(root) -> dict:
    data, construct = chain(3)
    good = write_dump(root / "good", data, construct)
    cases = {}

    def bad(name: str):
        folder = root / name
        folder.mkdir()
        for f in ("dump.json", "construct.json"):
            (folder / f).write_bytes((good.parent / f).read_bytes())
        return folder

    for kind in ("fifo", "zero", "trunc"):
        for f in ("dump.json", "construct.json"):
            folder = bad(f"compare-{kind}-{f}")
            _swap(folder / f, kind)
            cases[folder.name] = (["compare", folder / "dump.json", good], 2, folder / f)
        m = root / f"mapping-{kind}.yaml"
        m.write_text("TopLayer:\n  layers: layers\n")
        _swap(m, kind)
        if kind != "trunc":
            cases[f"compare-{kind}-mapping"] = (["compare", good, good, "--mapping", m], 2, m)
    for f in ("dump.json", "construct.json"):
        folder = bad(f"compare-deep-{f}")
        (folder / f).write_bytes(DEEP)
        cases[folder.name] = (["compare", folder / "dump.json", good], 2, folder / f)
    m = root / "alias-bomb.yaml"
    m.write_text(ALIAS_BOMB)
    cases["compare-alias-bomb-mapping"] = (["compare", good, good, "--mapping", m], 2, m)
    # tensor files: a zip bomb and a 16 GiB header; the tensors are skipped with a line, the rows kept
    for name, make, file in (("zip-bomb", _zip_bomb, "t.pt"), ("huge-header", _huge_safetensors, "t.safetensors")):
        folder = root / f"compare-{name}"
        tdata = json.loads(json.dumps(data))
        first = tdata["Module.layers.0.fc.Linear.forward.0"]["output"][0]
        first["data_name"] = file
        write_dump(folder, tdata, construct)
        (folder / "dump_tensor_data").mkdir()
        make(folder / "dump_tensor_data" / file)
        doc = json.loads((folder / "dump.json").read_text())
        doc["task"] = "tensor"
        (folder / "dump.json").write_text(json.dumps(doc))
        cases[folder.name] = (["compare", folder / "dump.json", folder / "dump.json"], "skip", folder / "dump_tensor_data" / file)
    return cases


def _query_cases(root) -> dict:
    from probe.collectors.records import table_from_rows
    from probe.collectors.store import StoreWriter

    cases = {}
    for kind in ("fifo", "zero", "trunc", "fifo-only"):
        run = root / f"query-{kind}"
        store = StoreWriter(run, fsync="never")
        for step in range(1 if kind == "fifo-only" else 2):
            store.write("metric", table_from_rows("metric", [{"time": 0, "job": "j", "rank": 0, "step": step,
                                                              "name": "loss", "value": 1.0}]))
            store.end_step(step)
        store.close()
        seg = sorted((run / "store" / "metric" / "rank0").glob("*.parquet"))[0]
        _swap(seg, kind.split("-")[0])
        cases[run.name] = (["query", run, "select count(*) from metrics"], "skip", seg)
    return cases


def _check_api_cases(root) -> dict:
    import torch
    from safetensors.torch import save_file

    def dump(name: str):
        folder = root / name / "step0" / "rank0"
        (folder / "dump_tensor_data").mkdir(parents=True)
        x = torch.randn(4)
        save_file({"tensor": x}, str(folder / "dump_tensor_data" / "x.safetensors"))
        save_file({"tensor": torch.exp(x)}, str(folder / "dump_tensor_data" / "y.safetensors"))
        t = lambda f: {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [4], "data_name": f}
        data = {"Torch.exp.0.forward": {"input_args": [t("x.safetensors")], "input_kwargs": {},
                                        "output": [t("y.safetensors")]}}
        (folder / "dump.json").write_text(json.dumps({"task": "tensor", "level": "L1", "data": data}))
        return folder

    cases = {}
    for kind in ("fifo", "zero", "trunc"):
        folder = dump(f"check-{kind}-dump.json")
        _swap(folder / "dump.json", kind)
        cases[folder.parents[1].name] = (["check-api", folder.parents[1], "--out", root / f"out-{kind}"], 2,
                                         folder / "dump.json")
        folder = dump(f"check-{kind}-tensor")
        _swap(folder / "dump_tensor_data" / "x.safetensors", kind)
        cases[folder.parents[1].name] = (["check-api", folder.parents[1], "--out", root / f"out-t-{kind}"],
                                         "skip", folder / "dump_tensor_data" / "x.safetensors")
    folder = dump("check-deep-dump.json")
    (folder / "dump.json").write_bytes(DEEP)
    cases[folder.parents[1].name] = (["check-api", folder.parents[1], "--out", root / "out-deep"], 2, folder / "dump.json")
    for name, make in (("zip-bomb", _zip_bomb), ("huge-header", _huge_safetensors)):
        folder = dump(f"check-{name}")
        target = folder / "dump_tensor_data" / "x.safetensors"
        target.unlink()
        make(target)
        cases[folder.parents[1].name] = (["check-api", folder.parents[1], "--out", root / f"out-{name}"], "skip", target)
    return cases


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    cases = {**_compare_cases(root), **_query_cases(root), **_check_api_cases(root)}
    for name in cases:                      # every compare writes its own result folder
        if cases[name][0][0] == "compare":
            cases[name] = (cases[name][0] + ["--out", root / f"out-{name}"], *cases[name][1:])
    return cases, *_run_cases(root, cases)


def _run_cases(root, cases: dict) -> tuple[dict, str]:
    """Each case's outcome from the harness; a case that does not answer within
    :data:`CASE_SECONDS` (plus the child's imports) is recorded as hung, the child is killed and
    a fresh one goes on with the cases after it."""
    import select
    import time

    todo = list(cases)
    seen: dict = {}
    stderr = ""
    while todo:
        listed = root / "cases.json"
        listed.write_text(json.dumps([[n, [str(a) for a in cases[n][0]]] for n in todo]))
        child = subprocess.Popen([sys.executable, "-c", _HARNESS, str(MAX_RSS), str(listed)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + CASE_SECONDS + 30          # the first case waits for the imports
        while todo:
            ready, _, _ = select.select([child.stdout], [], [], max(0.0, deadline - time.monotonic()))
            line = child.stdout.readline() if ready else ""
            if not line:                             # a hang, or the child died (the watchdog)
                child.kill()
                child.wait()
                stderr += child.stderr.read()
                seen.setdefault(todo[0], {"case": todo[0], "hung": True})
                todo.pop(0)
                break
            r = json.loads(line)
            seen[r["case"]] = r
            if r.get("killed"):
                todo = []
                break
            todo.remove(r["case"])
            deadline = time.monotonic() + CASE_SECONDS
        else:
            child.wait()
            stderr += child.stderr.read()
    return seen, stderr


CASES = ["compare-fifo-dump.json", "compare-zero-dump.json", "compare-trunc-dump.json",
         "compare-fifo-construct.json", "compare-zero-construct.json", "compare-trunc-construct.json",
         "compare-fifo-mapping", "compare-zero-mapping", "compare-deep-dump.json", "compare-deep-construct.json",
         "compare-alias-bomb-mapping", "compare-zip-bomb", "compare-huge-header",
         "query-fifo", "query-zero", "query-trunc", "query-fifo-only",
         "check-fifo-dump.json", "check-zero-dump.json", "check-trunc-dump.json", "check-deep-dump.json",
         "check-fifo-tensor", "check-zero-tensor", "check-trunc-tensor", "check-zip-bomb", "check-huge-header"]


@pytest.mark.parametrize("name", CASES)
def test_a_hostile_file_is_answered_at_once_in_bounded_memory(outcomes, name):
    cases, seen, stderr = outcomes
    assert set(CASES) == set(cases)
    killed = [r for r in seen.values() if r.get("killed")]
    assert not killed, f"memory over {MAX_RSS >> 20} MB in case {killed[0]['case']}"
    r = seen.get(name)
    assert r is not None and not r.get("hung"), f"case {name} did not answer within {CASE_SECONDS} s; {stderr[-2000:]}"
    _, expected, path = cases[name]
    err = r["err"]
    lines = [x for x in err.splitlines() if x.strip()]
    assert r["s"] < CASE_SECONDS, f"{name}: {r['s']:.1f} s"
    assert "Traceback" not in err and "internal error" not in err, err
    if expected == 2:
        assert r["rc"] == 2, (r["rc"], err)
        assert len(lines) == 1 and lines[0].startswith("probe: error: ") and str(path) in lines[0], err
    else:                       # skipped with a line naming it; the command goes on
        assert r["rc"] in (0, 1), (r["rc"], err)
        if name.startswith("check"):        # check-api lists the call as skipped, saying why
            import pyarrow.parquet as pq

            out = cases[name][0][cases[name][0].index("--out") + 1]
            rows = pq.read_table(os.path.join(str(out), "check_api.parquet")).to_pylist()
            lines = [r_["reason"] for r_ in rows if r_["verdict"] == "skipped"]
        assert any(str(path) in x for x in lines), (err, lines)
