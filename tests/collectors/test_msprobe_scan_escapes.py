"""The native scanner reads what Python's json module writes: escaped names and strings, NaN and
Infinity literals, each to the records the general reader gives (never the general path for them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import probe.collectors.msprobe_scan as scan
from probe.collectors.msprobe_reader import read_msprobe_dump
from probe.ground.errors import ProbeError
from tests.collectors.test_msprobe_scan import _both, _equal, _same, _t, _write

pytestmark = pytest.mark.skipif(not scan._scanner(), reason="no C compiler: the native scanner is off")

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("name", [
    "Mint.ü.0.forward",                          # json.dump: \u00fc
    "Module.层.Linear.forward.0",                 # three bytes of UTF-8
    "Module.a\"b\\c/d.Linear.forward.0",          # quote, backslash, solidus
    "Functional.\t\n\r\b\f.0.forward",            # control characters as short escapes
    "Functional.\U0001f600.0.backward",           # a surrogate pair
    "Module.x.Linear.parameters_grad\u00e9.0",    # the parameters_grad marker next to an escape
])
def test_escaped_names_are_scanned_to_the_general_readers_records(name: str, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    entry = {"weight": [_t()]} if "parameters_grad" in name else {
        "input_args": [_t(md5="ab\"c", data_name="ü.pt")], "input_kwargs": {"kéy\\": _t()},
        "output": [_t()], "parameters": {"wéight": _t()}}
    doc = {"task": "statistics", "framework": "pytorch",
           "data": {name: entry, "Functional.g.0.forward": {"output": [_t()]}}}
    path = _write(tmp_path / "e", json.dumps(doc, indent=1))           # ensure_ascii: escapes
    assert "\\" in path.read_text()
    _same(path, monkeypatch)
    assert read_msprobe_dump(path).tensors.column("node").to_pylist()[0] == name


def test_nan_and_infinity_literals_are_scanned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = {f"Module.l{i}.Linear.forward.0": {
        "input_args": [_t(Max=INF, Min=-INF, Mean=NAN, Norm=NAN)], "output": [_t(Max=NAN)],
        "parameters": {"weight": _t(Norm=INF)}} for i in range(50)}
    path = _write(tmp_path / "n", json.dumps({"task": "statistics", "data": data}, indent=1))
    text = path.read_text()
    assert "NaN" in text and "-Infinity" in text and "Infinity" in text
    _same(path, monkeypatch)
    maxes = read_msprobe_dump(path).tensors.column("max").to_pylist()
    assert maxes.count(INF) == 50 and sum(m != m for m in maxes) == 50


@pytest.mark.parametrize("text", [
    '{"data": {"Functional.\\ud800.0.forward": {"output": [%s]}}}',          # a lone high half
    '{"data": {"Functional.\\udc00x.0.forward": {"output": [%s]}}}',         # a lone low half
    '{"data": {"Functional.f.0.forward": {"input_kwargs": {"\\ud83d": %s}}}}',
    '{"data": {"Functional.\\x.0.forward": {"output": [%s]}}}',              # no such escape
    '{"data": {"Functional.\\u12.0.forward": {"output": [%s]}}}',            # short \\u
])
def test_bad_escapes_go_the_general_way_and_are_refused_alike(text: str, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path / "b", text % json.dumps(_t()))
    assert scan.scan_dump(path.read_bytes()) is None
    with pytest.raises(ProbeError):
        _both(path, monkeypatch)


def test_an_escaped_quote_does_not_end_a_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = '{"data": {"Functional.\\"x\\\\\\".0.forward": {"output": [%s]}}}' % json.dumps(_t())
    path = _write(tmp_path / "q", doc)
    _same(path, monkeypatch)
    general, native = _both(path, monkeypatch)
    assert _equal(native.nodes, general.nodes)
    assert native.tensors.column("node")[0].as_py() == 'Functional."x\\".0.forward'
