"""The native dump.json scanner: the same records as the general reader, or None (never a crash).

Every case is read twice, with the scanner and with it switched off (the orjson path), and the
tensor and node tables must be equal; layouts it does not take must come back as None and still
be read by the general path; truncated and corrupted files must never crash it.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

import probe.collectors.msprobe_scan as scan
from probe.collectors.msprobe_reader import read_msprobe_dump
from probe.ground.errors import ProbeError

pytestmark = pytest.mark.skipif(not scan._scanner(), reason="no C compiler: the native scanner is off")


def _t(dtype: str = "torch.float32", shape=(2, 3), **stats) -> dict:
    d = {"type": "torch.Tensor", "dtype": dtype, "shape": list(shape),
         "Max": 1.5, "Min": -2.25, "Mean": 0.125, "Norm": 3.0, "requires_grad": True}
    d.update(stats)
    return d


def _write(folder: Path, doc: dict | str, construct: dict | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "dump.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc, indent=1, ensure_ascii=False),
                    encoding="utf-8")
    if construct is not None:
        (folder / "construct.json").write_text(json.dumps(construct))
    return path


def _both(path: Path, monkeypatch: pytest.MonkeyPatch):
    """(general, native) readings of one file."""
    monkeypatch.setattr(scan, "_fn", False)
    general = read_msprobe_dump(path)
    monkeypatch.setattr(scan, "_fn", None)
    native = read_msprobe_dump(path)
    return general, native


def _equal(a, b) -> bool:
    """Tables equal, NaN equal to NaN (Arrow's equals says NaN != NaN)."""
    def norm(t):
        return [{k: ("nan" if isinstance(v, float) and v != v else v) for k, v in r.items()}
                for r in t.to_pylist()]
    return a.schema == b.schema and norm(a) == norm(b)


def _same(path: Path, monkeypatch: pytest.MonkeyPatch, *, scanned: bool = True) -> None:
    assert (scan.scan_dump(path.read_bytes()) is not None) is scanned
    general, native = _both(path, monkeypatch)
    assert _equal(native.tensors, general.tensors)
    assert _equal(native.nodes, general.nodes)
    assert (native.framework, native.task, native.level, native.meta) == \
           (general.framework, general.task, general.level, general.meta)


def test_real_msprobe_dumps_read_alike(msprobe_data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = sorted(msprobe_data.rglob("dump.json"))
    assert files
    took = 0
    for f in files:
        took += scan.scan_dump(f.read_bytes()) is not None
        general, native = _both(f, monkeypatch)
        assert _equal(native.tensors, general.tensors), f
        assert _equal(native.nodes, general.nodes), f
    assert took >= 2      # the module-level dumps of both frameworks are the common layout


def test_every_slot_and_value_kind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nan, inf = float("nan"), float("inf")
    doc = {"task": "statistics", "level": "mix", "framework": "pytorch", "dump_data_dir": None,
           "extra": {"nested": [1, {"a": None}], "s": "x\"y"},
           "data": {
               "Module.fc.Linear.forward.0": {
                   "input_args": [_t(), None, _t(shape=())],
                   "input_kwargs": {"bias": _t(dtype="torch.bfloat16"), "skip": None},
                   "output": [_t(Max=nan, Min=-inf, Mean=inf, Norm=None)],
                   "parameters": {"weight": _t(), "bias": _t(shape=(3,))},
                   "is_recompute": False, "stack_info": ["a", {"b": 1}]},
               "Module.fc.Linear.backward.0": {       # a backward entry: input before output
                   "input": [_t(requires_grad=False)], "output": [_t(), {}]},
               "Module.fc.Linear.parameters_grad.0": {"weight": [_t()], "bias": [_t(shape=(3,))]},
               "Functional.linear.0.forward": {
                   "input_args": [_t(md5="abc123", data_name="Functional.linear.0.forward.input.0.pt")],
                   "output": [_t(dtype="torch.int64", Max=3, Min=-1, Mean=1, Norm=None, shape=[4])]},
               "Functional.linear.0.backward": {"input": [], "output": None},
               "Tensor.add_.1.forward": {"input_args": [{"dtype": "torch.float32", "shape": None}],
                                         "output": [{"shape": [1, 2]}]},
               "Mint.unicode_ün.0.forward": {"output": [_t(dtype="mindspore.Float32")]},
           }}
    path = _write(tmp_path / "a", doc, {"Module.fc.Linear.forward.0": None,
                                        "Functional.linear.0.forward": "Module.fc.Linear.forward.0"})
    _same(path, monkeypatch)
    native = read_msprobe_dump(path)
    rows = native.tensors.to_pylist()
    bwd = [(r["slot"], r["index"]) for r in rows if r["node"] == "Module.fc.Linear.backward.0"]
    assert bwd == [("output", "0"), ("output", "1"), ("input", "0")]    # as the general path orders
    out = next(r for r in rows if r["node"] == "Module.fc.Linear.forward.0" and r["slot"] == "output")
    assert out["max"] != out["max"] and out["min"] == -float("inf") and out["l2norm"] is None


@pytest.mark.parametrize("entry", [
    {"input_args": [[_t(), _t()]], "output": [_t()]},                    # nested outputs
    {"input_args": [{"type": "int", "value": 3}], "output": [_t()]},     # a non-tensor argument
    {"input_args": [_t(Max="nan")], "output": [_t()]},                   # a statistic as a string
    {"input_args": [_t(shape=[2.0, 3])], "output": [_t()]},              # a float in a shape
    {"input_args": [_t(dtype=7)], "output": [_t()]},                     # a dtype that is no string
    {"output": [_t()], "input_args": "x"},                               # a slot of the wrong type
    {"input_args": [1], "output": [_t()]},                               # a bare number
])
def test_other_layouts_go_the_general_way(entry: dict, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    doc = {"task": "statistics", "data": {"Functional.f.0.forward": entry,
                                          "Functional.g.0.forward": {"output": [_t()]}}}
    path = _write(tmp_path / "a", doc)
    assert scan.scan_dump(path.read_bytes()) is None
    try:
        general, native = _both(path, monkeypatch)
    except ProbeError:
        return                                 # refused alike by the general path: fine
    assert _equal(native.tensors, general.tensors)


def test_repeated_names_go_the_general_way(tmp_path: Path) -> None:
    text = ('{"data": {"Functional.f.0.forward": {"output": [%s]}, '
            '"Functional.f.0.forward": {"output": [%s, %s]}}}' % ((json.dumps(_t()),) * 3))
    repeated = _write(tmp_path / "r", text)
    assert scan.scan_dump(repeated.read_bytes()) is None
    with pytest.raises(ProbeError, match="'Functional.f.0.forward' appears twice"):   # not the last one
        read_msprobe_dump(repeated)


def test_truncated_and_corrupted_files_never_crash(tmp_path: Path) -> None:
    doc = {"task": "statistics", "data": {
        f"Module.l{i}.Linear.forward.0": {"input_args": [_t()], "input_kwargs": {"k": _t()},
                                          "output": [_t(Max=float("nan"))], "parameters": {"weight": _t()}}
        for i in range(5)}}
    raw = json.dumps(doc, indent=1).encode()
    assert scan.scan_dump(raw) is not None
    for cut in range(0, len(raw) - 1, 7):                # every truncation is refused, not read
        assert scan.scan_dump(raw[:cut]) is None
    rng = random.Random(0)
    for _ in range(400):                                  # random corruption: None or a reading
        b = bytearray(raw)
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] = rng.choice(b'{}[]",:0-9eE.nN \\\x00\xff')
        r = scan.scan_dump(bytes(b))
        assert r is None or r.flat.num_rows >= 0
    path = _write(tmp_path / "t", raw[: len(raw) // 2].decode())
    with pytest.raises(ProbeError, match="truncated"):
        read_msprobe_dump(path)


def test_a_dense_file_overflowing_the_first_capacities_is_rescanned(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # tiny tensor objects ({} and short shapes) are denser than the first capacity guess
    data = {f"Functional.f.{i}.forward": {"output": [{}, {}, {"shape": [1, 1, 1, 1, 1, 1]}]}
            for i in range(300)}
    path = _write(tmp_path / "d", json.dumps({"data": data}, separators=(",", ":")))
    _same(path, monkeypatch)


def test_every_number_is_read_to_the_double_the_general_path_reads(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # the scanner's own decimal conversion (strtod only where it cannot be exact) on the
    # shortest spellings of random doubles of every magnitude, and on spellings that are hard
    # to round: halfway between two doubles, more digits than a double holds, the ends of the
    # range, subnormals, exponents
    import struct

    rng = random.Random(3)
    texts = []
    while len(texts) < 4000:
        x = struct.unpack("d", struct.pack("Q", rng.getrandbits(64)))[0]
        if x == x and abs(x) != float("inf"):
            texts.append(repr(x))
    texts += [repr((rng.random() - 0.5) * 10 ** rng.randint(-12, 12)) for _ in range(4000)]
    texts += [f"{rng.randint(0, 10 ** rng.randint(1, 19))}e{rng.randint(-30, 30)}" for _ in range(2000)]
    texts += ["9007199254740993", "9007199254740992.5", "2.5e-324", "1e-400", "1e400", "5e-324",
              "123456789012345678901234567890", "2.2250738585072011e-308", "1.7976931348623157e308",
              "0.1000000000000000055511151231257827021181583404541015625", "7.2057594037927933e16",
              "1.00000000000000011102230246251565404236316680908203125", "1e23", "-0.0", "0e10",
              "1E5", "1e+5", "4.9406564584124654e-324", "8.98846567431158e307", "99999999999999999999"]
    tensors = [f'{{"dtype": "torch.float32", "shape": [2], "Max": {t}, "Min": {t}, "Mean": 0, "Norm": 1}}'
               for t in texts]
    doc = '{"task": "statistics", "data": {%s}}' % ", ".join(
        f'"Functional.f.{i}.forward": {{"output": [{t}]}}' for i, t in enumerate(tensors))
    path = _write(tmp_path / "n", doc)
    _same(path, monkeypatch)
    got = read_msprobe_dump(path).tensors.column("max").to_pylist()
    assert [struct.pack("d", v) for v in got] == [struct.pack("d", float(t)) for t in texts]
