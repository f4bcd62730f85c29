"""A FIFO, a device (``/dev/zero``) or a folder given where a file is read (dump.json,
construct.json, stack.json, a mapping YAML, a tensor file, check-api's dump.json) is refused at
once with one line naming it, exit 2: no hang, no endless read. A number of thousands of digits
is one line too, not an internal error."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from probe.cli import main
from probe.ground.errors import ProbeError
from probe.ground.files import check_tensor_file, open_regular, read_regular
from tests.compare.dumps import chain, write_dump

pytestmark = pytest.mark.timeout(60)


def _one_line(capsys, *args: str) -> str:
    rc = main(list(args))
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert rc == 2 and len(err) == 1 and "Traceback" not in err[0], (rc, err)
    return err[0]


@pytest.fixture
def good(tmp_path):
    data, construct = chain(2)
    return write_dump(tmp_path / "good", data, construct)


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "folder"])
@pytest.mark.parametrize("name", ["dump.json", "construct.json"])
def test_a_fifo_a_device_or_a_folder_as_a_dump_file_is_one_line(tmp_path, capsys, good, kind, name):
    bad = tmp_path / "bad"
    shutil.copytree(good.parent, bad)
    target = bad / name
    target.unlink()
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "dev_zero":
        target.symlink_to("/dev/zero")
    else:
        target.mkdir()
    line = _one_line(capsys, "compare", str(bad / "dump.json"), str(good), "--out", str(tmp_path / "o"))
    assert str(target) in line                       # a folder named dump.json is searched as a folder
    assert "not a regular file" in line or (kind, name) == ("folder", "dump.json"), line


def test_a_fifo_stack_json_is_skipped_at_once(tmp_path, capsys, good):
    bad = tmp_path / "bad"
    shutil.copytree(good.parent, bad)
    (bad / "stack.json").unlink()
    os.mkfifo(bad / "stack.json")
    assert main(["compare", str(bad / "dump.json"), str(good), "--out", str(tmp_path / "o")]) in (0, 1)


@pytest.mark.parametrize("kind", ["fifo", "dev_zero"])
def test_a_fifo_or_a_device_as_a_mapping_file_is_one_line(tmp_path, capsys, good, kind):
    mapping = tmp_path / "layer_mapping.yaml"
    os.mkfifo(mapping) if kind == "fifo" else mapping.symlink_to("/dev/zero")
    line = _one_line(capsys, "compare", str(good), str(good), "--mapping", str(mapping), "--out", str(tmp_path / "o"))
    assert str(mapping) in line and "not a regular file" in line


def test_a_5000_digit_number_in_a_dump_or_a_mapping_is_one_line(tmp_path, capsys, good):
    bad = tmp_path / "bad"
    shutil.copytree(good.parent, bad)
    text = (bad / "dump.json").read_text()
    first = text.index('"Max": ') + len('"Max": ')
    end = text.index(",", first)
    (bad / "dump.json").write_text(text[:first] + "9" * 5000 + text[end:])
    line = _one_line(capsys, "compare", str(bad / "dump.json"), str(good), "--out", str(tmp_path / "o"))
    assert str(bad / "dump.json") in line and "out of range" in line
    mapping = tmp_path / "layer_mapping.yaml"
    mapping.write_text("TopLayer:\n  a: " + "7" * 5000 + "\n")
    line = _one_line(capsys, "compare", str(good), str(good), "--mapping", str(mapping), "--out", str(tmp_path / "o2"))
    assert str(mapping) in line


def test_check_api_refuses_a_fifo_dump_json_at_once(tmp_path, capsys):
    folder = tmp_path / "step0" / "rank0"
    folder.mkdir(parents=True)
    os.mkfifo(folder / "dump.json")
    line = _one_line(capsys, "check-api", str(tmp_path), "--out", str(tmp_path / "check"))
    assert "not a regular file (a FIFO)" in line


def test_the_helpers_refuse_what_is_no_regular_file_and_bound_what_is(tmp_path):
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    for path, kind in ((fifo, "a FIFO"), ("/dev/zero", "a character device"), (tmp_path, "a directory")):
        with pytest.raises(ProbeError, match=f"not a regular file \\({kind}\\)"):
            open_regular(path)
        with pytest.raises(ProbeError, match="not a regular file"):
            check_tensor_file(path)
    (tmp_path / "a.json").write_text(json.dumps({"x": 1}))
    assert read_regular(tmp_path / "a.json") == b'{"x": 1}'
    with pytest.raises(ProbeError, match="more than the 4"):
        read_regular(tmp_path / "a.json", 4)
