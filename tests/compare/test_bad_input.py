"""Bad compare inputs are one line naming the file and the problem (exit 2), never a crash or a
hang: numbers out of range in a dump.json, binary and foreign files, YAML alias bombs."""

from __future__ import annotations

import json
import time

import pytest

from probe.collectors import msprobe_scan
from probe.ground.errors import ProbeError
from probe.cli import main
from tests.compare.dumps import chain, write_dump

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(params=["native", "python"])
def reader_path(request, monkeypatch):
    """Each test runs with the native scanner and with the general (orjson + Python) path."""
    if request.param == "native" and not msprobe_scan._scanner():
        pytest.skip("no C compiler: the native scanner is not built")
    if request.param == "python":
        monkeypatch.setattr(msprobe_scan, "_fn", False)
    return request.param


def _error_line(capsys, *args: str) -> str:
    rc = main(list(args))
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.strip()]
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, (rc, err)
    return lines[0]


def _dump_with(tmp_path, text_of_first_shape: str, key: str = "shape") -> tuple:
    """A good dump, and a copy whose first tensor's ``key`` is replaced by the JSON literal given."""
    data, construct = chain(2)
    good = write_dump(tmp_path / "good", data, construct)
    first = data["Module.layers.0.fc.Linear.forward.0"]["input_args"][0]
    first[key] = "@@"
    bad = write_dump(tmp_path / "bad", data, construct)
    bad.write_text(bad.read_text().replace('"@@"', text_of_first_shape, 1))
    return good, bad


@pytest.mark.parametrize("literal", ["[18446744073709551616, 4]", "[-1e308, 4]", "[1e300]",
                                     "[NaN, 2]", "[Infinity]", '["4", 2]', "[true, 4]", '"2x4"'])
def test_a_shape_out_of_range_or_not_integers_is_one_line_naming_file_and_entry(
        tmp_path, capsys, reader_path, literal):
    good, bad = _dump_with(tmp_path, literal)
    line = _error_line(capsys, "compare", str(bad), str(good), "--out", str(tmp_path / "o"))
    assert str(bad) in line and "Module.layers.0.fc.Linear.forward.0" in line and "shape" in line


@pytest.mark.parametrize("literal, why", [("[4, -2]", "negative dimension"),
                                          ("[4294967296, 4294967296]", "more elements")])
def test_a_negative_dimension_or_an_element_count_beyond_int64_is_one_line(
        tmp_path, capsys, reader_path, literal, why):
    good, bad = _dump_with(tmp_path, literal)
    line = _error_line(capsys, "compare", str(good), str(bad), "--out", str(tmp_path / "o"))
    assert str(bad) in line and "'Module.layers.0.fc.Linear.forward.0', input 0" in line and why in line


def test_a_statistic_beyond_a_float_is_one_line_naming_the_entry(tmp_path, capsys, reader_path):
    good, bad = _dump_with(tmp_path, "1" + "0" * 400, key="Max")
    line = _error_line(capsys, "compare", str(bad), str(good), "--out", str(tmp_path / "o"))
    assert str(bad) in line and "Module.layers.0.fc.Linear.forward.0" in line and "Max" in line


def test_a_dump_with_a_shape_out_of_range_is_a_probe_error_for_the_web_graph_too(tmp_path):
    from probe.visualizer.graph import load_graph

    _, bad = _dump_with(tmp_path, "[18446744073709551616]")
    with pytest.raises(ProbeError, match="Module.layers.0.fc.Linear.forward.0"):
        load_graph(bad)


@pytest.mark.parametrize("raw, word", [
    (bytes(range(256)) * 8, "binary file"),
    (b'{"task": "statistics", "data": {}}\x00\x00\x00', "binary file"),
    (b"\x89PNG\r\n\x1a\n not JSON \xc3", "binary file"),
    (b"[1, 2, 3]", "not an msprobe dump.json"),
    (b'{"data": 3}', "not an msprobe dump.json"),
    (b'{"data": {"Module.a.A.forward.0": [1]}}', "not an object"),
    (b'{"task": "statistics", "data": {"Module.a.A.forward.0": {"output": [{"dtype": "x", "sh', "truncated"),
    (b'{"data": {"Module.\\ud800.A.forward.0": {"output": [{"Max": NaN}]}}}', "surrogate"),
    (b'{"data": {"Module.a.A.forward.0": {"output": ' + b"[" * 5000 + b"]" * 5000 + b"}}}", "nests too deeply"),
    (b'{"data": {"Module.a.A.forward.0": {"output": ' + b"[" * 990 + b"]" * 990 + b"}}}", "nests too deeply"),
])
def test_binary_foreign_and_malformed_dump_json_are_one_line(tmp_path, capsys, reader_path, raw, word):
    good = write_dump(tmp_path / "good", *chain(2))
    bad = tmp_path / "bad" / "dump.json"
    bad.parent.mkdir()
    bad.write_bytes(raw)
    line = _error_line(capsys, "compare", str(good), str(bad), "--out", str(tmp_path / "o"))
    assert str(bad) in line and word in line


def test_a_stack_json_nested_too_deeply_is_skipped_not_a_crash(tmp_path, capsys):
    data, construct = chain(2)
    a = write_dump(tmp_path / "a", data, construct)
    (a.parent / "stack.json").write_text('{"0": [' + "[" * 990 + "]" * 990 + "]}")
    assert main(["compare", str(a), str(a), "--out", str(tmp_path / "o")]) == 0
    assert "Traceback" not in capsys.readouterr().err


# -- mapping files -------------------------------------------------------------------------

BILLION_LAUGHS = "\n".join(
    [f'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    + [f"{c}: &{c} [{','.join([f'*{p}'] * 9)}]" for p, c in zip("abcdefgh", "bcdefghi")]) + "\n"


@pytest.fixture
def pair(tmp_path):
    data, construct = chain(2)
    return write_dump(tmp_path / "a", data, construct), write_dump(tmp_path / "b", data, construct)


def test_a_yaml_alias_bomb_as_mapping_is_refused_at_once(tmp_path, capsys, pair):
    m = tmp_path / "layer_mapping.yaml"
    m.write_text(BILLION_LAUGHS)
    assert len(BILLION_LAUGHS) < 400
    t = time.perf_counter()
    line = _error_line(capsys, "compare", *map(str, pair), "--mapping", str(m), "--out", str(tmp_path / "o"))
    assert time.perf_counter() - t < 10
    assert str(m) in line and "alias" in line


@pytest.mark.parametrize("raw, word", [
    (bytes(range(256)) * 4, "binary file"),
    (b"TopLayer: {fc: fc}\n\xff\xfe\xc3\x28", "not UTF-8"),
    (b"- " * 60 + b"x\n", "nests deeper"),
    (b"[" * 2000 + b"]" * 2000, "unreadable mapping YAML"),
    (b"a: [b\n c: d: e\n", "unreadable mapping YAML"),
    (b"a: !!python/object:os.system {}\n", "unreadable mapping YAML"),
    (b"a: &x {b: c}\nd: *x\n", "alias"),
    (b"base: &b {fc: fc}\nTopLayer:\n  <<: *b\n", "alias"),
])
def test_binary_deep_and_aliased_mapping_files_are_one_line(tmp_path, capsys, pair, raw, word):
    m = tmp_path / "mapping.yaml"
    m.write_bytes(raw)
    line = _error_line(capsys, "compare", *map(str, pair), "--mapping", str(m), "--out", str(tmp_path / "o"))
    assert str(m) in line and word in line


def test_a_mapping_file_over_the_size_cap_is_refused_before_it_is_read(tmp_path, capsys, pair, monkeypatch):
    from probe.compare import mapping

    monkeypatch.setattr(mapping, "MAX_MAPPING_BYTES", 1 << 20)
    m = tmp_path / "cell_mapping.yaml"
    m.write_text("".join(f"layers.{i}.fc.Linear: layers.{i}.fc.Linear\n" for i in range(40_000)))
    line = _error_line(capsys, "compare", *map(str, pair), "--mapping", str(m), "--out", str(tmp_path / "o"))
    assert str(m) in line and "at most 1 MB" in line


def test_a_mapping_with_a_bom_and_no_aliases_still_maps(tmp_path, capsys):
    data, construct = chain(2)
    a = write_dump(tmp_path / "a", data, construct)
    renamed = {k.replace("layers.", "blocks."): v for k, v in data.items()}
    b = write_dump(tmp_path / "b", renamed, {k.replace("layers.", "blocks."): v for k, v in construct.items()})
    m = tmp_path / "layer_mapping.yaml"
    m.write_bytes(b"\xef\xbb\xbf" + json.dumps({"TopLayer": {"layers": "blocks"}}).encode())
    out = tmp_path / "o"
    assert main(["compare", str(a), str(b), "--mapping", str(m), "--out", str(out)]) == 0, capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["match_methods"] == {"mapping": 4} and summary["unmatched_a"] == 0
