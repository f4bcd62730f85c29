"""A dump.json (or construct.json) that names one key twice in an object is refused with one
line naming the file and the key (exit 2), by the native scanner's path and the general one,
by compare and by check-api, instead of silently keeping the last value (issue #33, finding 17).
Colons inside names and values, and escapes, are no repeat."""

from __future__ import annotations

import json

import pytest

from probe.cli import main
from probe.collectors import msprobe_scan
from probe.collectors.msprobe_layout import DuplicateKey, loads_unique
from tests.compare.dumps import chain, write_dump

pytestmark = pytest.mark.timeout(60)

FIRST = "Module.layers.0.fc.Linear.forward.0"


@pytest.fixture(params=["native", "python"])
def reader_path(request, monkeypatch):
    if request.param == "native" and not msprobe_scan._scanner():
        pytest.skip("no C compiler: the native scanner is not built")
    if request.param == "python":
        monkeypatch.setattr(msprobe_scan, "_fn", False)
    return request.param


def _one_line(capsys, *args: str) -> str:
    rc = main([str(a) for a in args])
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert rc == 2 and len(err) == 1 and "Traceback" not in err[0], (rc, err)
    return err[0]


def _text(tmp_path) -> tuple:
    data, construct = chain(2)
    good = write_dump(tmp_path / "good", data, construct)
    return good, good.read_text()


#: (what is repeated, how the text is changed, the key the line must name)
CASES = {
    "entry name": (lambda t: t.replace('"data": {', '"data": {"%s": {"output": []}, ' % FIRST, 1), FIRST),
    "statistic": (lambda t: t.replace('"Max": ', '"Max": 99.0, "Max": ', 1), "Max"),
    "parameter": (lambda t: t.replace('"parameters": {', '"parameters": {"weight": null, ', 1), "weight"),
    "parameter with a tensor": (lambda t: t.replace(
        '"parameters": {', '"parameters": {"weight": {"type": "torch.Tensor", "dtype": "torch.float32", '
        '"shape": [4], "Max": 1.0, "Min": 0.0, "Mean": 0.5, "Norm": 1.0}, ', 1), "weight"),
    "slot": (lambda t: t.replace('"input_args": ', '"input_args": [], "input_args": ', 1), "input_args"),
    "top-level member": (lambda t: t.replace('{', '{"task": "tensor", ', 1), "task"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_repeated_key_in_dump_json_is_one_line_naming_file_and_key(tmp_path, capsys, reader_path, case):
    good, text = _text(tmp_path)
    change, key = CASES[case]
    bad_text = change(text)
    assert bad_text != text
    bad = tmp_path / "bad" / "dump.json"
    bad.parent.mkdir()
    bad.write_text(bad_text)
    (bad.parent / "construct.json").write_text((good.parent / "construct.json").read_text())
    line = _one_line(capsys, "compare", bad, good, "--out", tmp_path / "o")
    assert str(bad) in line and repr(key) in line and "twice" in line, line


def test_a_repeated_key_in_construct_json_is_one_line(tmp_path, capsys, reader_path):
    good, _ = _text(tmp_path)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "dump.json").write_text(good.read_text())
    text = (good.parent / "construct.json").read_text()
    (bad / "construct.json").write_text(text.replace("{", '{"%s": null, ' % FIRST, 1))
    line = _one_line(capsys, "compare", bad / "dump.json", good, "--out", tmp_path / "o")
    assert str(bad / "construct.json") in line and FIRST in line


def test_check_api_refuses_a_call_named_twice(tmp_path, capsys):
    folder = tmp_path / "d" / "step0" / "rank0"
    folder.mkdir(parents=True)
    call = '{"input_args": [], "output": []}'
    (folder / "dump.json").write_text('{"task": "tensor", "level": "L1", "data": {"Torch.add.0.forward": %s, '
                                      '"Torch.add.0.forward": %s}}' % (call, call))
    line = _one_line(capsys, "check-api", tmp_path / "d", "--out", tmp_path / "check")
    assert str(folder / "dump.json") in line and "Torch.add.0.forward" in line


def test_colons_and_escapes_are_no_repeat(tmp_path, capsys, reader_path):
    data, construct = chain(2)
    data["Module.a:b\u00e9.Linear.forward.0"] = {"input_args": [], "output": [],
                                                 "input_kwargs": {"mode:x": {"type": "str", "value": "a:b:c"}}}
    good = write_dump(tmp_path / "good", data, construct)
    text = good.read_text()
    assert "\\u00e9" in text
    escaped = tmp_path / "escaped" / "dump.json"        # a colon written as \u003a: still no repeat
    escaped.parent.mkdir()
    escaped.write_text(text.replace("a:b:c", "a\\u003ab"))
    assert main(["compare", str(escaped), str(good), "--out", str(tmp_path / "o")]) in (0, 1)
    assert "error" not in capsys.readouterr().err


def test_loads_unique_names_the_first_repeat_and_keeps_every_value():
    assert loads_unique(b'{"a": [1, {"b": "x:y"}], "c": NaN}')["a"] == [1, {"b": "x:y"}]
    with pytest.raises(DuplicateKey) as e:
        loads_unique(b'{"a": {"k": 1, "k": 2}}')
    assert e.value.key == "k"
    with pytest.raises(DuplicateKey):
        loads_unique(b'{"a\\u003a": 1, "a:": 2}')       # the same key, one escaped
    with pytest.raises(DuplicateKey):
        loads_unique(json.dumps({"n": 1}).replace("{", '{"big": 18446744073709551616, "big": 1, ').encode())
