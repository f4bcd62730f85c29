"""Output folders: a verb replaces only what it can prove it wrote (ground.outdir), end to end."""

from __future__ import annotations

import os

import pytest

from probe.ground.errors import ProbeError
from probe.ground.outdir import MANIFEST, claim, created_by, owner, seal
from tests.conftest import run_probe


def test_a_verb_replaces_its_own_output_and_nothing_else(tmp_path):
    claim(tmp_path, "dump", ["store", "step*"])
    (tmp_path / "step0").mkdir()
    (tmp_path / "notes.txt").write_text("mine")
    claim(tmp_path, "dump", ["store", "step*"])
    assert not (tmp_path / "step0").exists() and (tmp_path / "notes.txt").read_text() == "mine"


def test_the_manifest_records_the_exact_names_written_not_the_patterns(tmp_path):
    claim(tmp_path, "dump", ["store", "step[0-9]*"])
    (tmp_path / "step0").mkdir()
    (tmp_path / "store").mkdir()
    seal(tmp_path)
    import json
    entries = json.loads((tmp_path / MANIFEST).read_text())["entries"]
    assert entries == {"step0": "dump", "store": "dump"}
    (tmp_path / "step1").mkdir()                        # made by the user after the run
    assert owner(tmp_path, "step0") == "dump" and owner(tmp_path, "step1") is None
    with pytest.raises(ProbeError, match="step1 was not written by probe"):
        claim(tmp_path, "dump", ["store", "step[0-9]*"])
    assert (tmp_path / "step0").exists() and (tmp_path / "step1").exists()


def test_an_open_claim_owns_what_matches_its_patterns_until_it_is_sealed(tmp_path):
    claim(tmp_path, "profile", ["store", "trace.json"])
    (tmp_path / "store").mkdir()
    assert owner(tmp_path, "store") == "profile" and owner(tmp_path, "trace.json") == "profile"
    seal(tmp_path)
    assert owner(tmp_path, "store") == "profile" and owner(tmp_path, "trace.json") is None


def test_a_manifest_of_patterns_from_before_is_still_honoured_once(tmp_path):
    import json
    (tmp_path / MANIFEST).write_text(json.dumps({"entries": {"step*": "dump"}}))
    (tmp_path / "step3").mkdir()
    claim(tmp_path, "dump", ["step[0-9]*"])
    assert not (tmp_path / "step3").exists()
    seal(tmp_path)
    assert json.loads((tmp_path / MANIFEST).read_text())["entries"] == {}


def test_what_probe_did_not_write_stops_the_verb_and_force_overrides(tmp_path):
    (tmp_path / "step7").mkdir()
    (tmp_path / "step7" / "data.bin").write_bytes(b"precious")
    with pytest.raises(ProbeError, match="step7 was not written by probe.*--force"):
        claim(tmp_path, "dump", ["step*"])
    assert (tmp_path / "step7" / "data.bin").exists()
    claim(tmp_path, "dump", ["step*"], force=True)
    assert not (tmp_path / "step7").exists()


def test_the_folder_itself_is_never_removed_and_its_creator_is_known(tmp_path):
    out = tmp_path / "new"
    claim(out, "demo", ["compare"])
    assert created_by(out) == "demo" and (out / MANIFEST).exists()
    claim(tmp_path, "demo", ["compare"])
    assert created_by(tmp_path) is None and out.is_dir()


def test_a_corrupt_manifest_is_one_line(tmp_path):
    (tmp_path / MANIFEST).write_text("{not json")
    with pytest.raises(ProbeError, match="unreadable output manifest"):
        claim(tmp_path, "dump", ["store"])


@pytest.mark.slow
def test_probe_dump_does_not_remove_a_train_runs_store(tmp_path):
    out = tmp_path / "run"
    trained = run_probe("train", "--max-steps", "1", "--out", str(out))
    assert trained.returncode == 0, trained.stderr[-2000:]
    segments = sorted(os.listdir(out / "store" / "metric" / "rank0"))
    dumped = run_probe("dump", "--max-steps", "1", "--out", str(out))
    assert dumped.returncode == 2
    assert dumped.stderr.count("\n") == 1 and "was written by 'probe train'" in dumped.stderr
    assert sorted(os.listdir(out / "store" / "metric" / "rank0")) == segments
    forced = run_probe("dump", "--max-steps", "1", "--out", str(out), "--force")
    assert forced.returncode == 0, forced.stderr[-2000:]
    assert (out / "step0" / "rank0" / "dump.json").exists()


@pytest.mark.slow
def test_probe_dump_into_the_current_folder_keeps_what_was_there(tmp_path):
    (tmp_path / "train.py").write_text("print('mine')\n")
    first = run_probe("dump", "--max-steps", "1", "--out", ".", cwd=str(tmp_path))
    second = run_probe("dump", "--max-steps", "1", "--out", ".", cwd=str(tmp_path))
    assert first.returncode == 0 and second.returncode == 0, second.stderr[-2000:]
    assert (tmp_path / "train.py").read_text() == "print('mine')\n"


@pytest.mark.slow
def test_rerunning_probe_dump_keeps_files_the_user_made_after_the_first_run(tmp_path):
    out = tmp_path / "o1"
    first = run_probe("dump", "--max-steps", "1", "--out", str(out))
    assert first.returncode == 0, first.stderr[-2000:]
    (out / "step_notes").mkdir()
    (out / "step_notes" / "n.txt").write_text("mine")
    (out / "stepping.txt").write_text("mine")
    (out / "configuration.txt").write_text("mine")
    second = run_probe("dump", "--max-steps", "1", "--out", str(out))
    assert second.returncode == 0, second.stderr[-2000:]
    assert (out / "step_notes" / "n.txt").read_text() == "mine"
    assert (out / "stepping.txt").read_text() == "mine" and (out / "configuration.txt").exists()
    assert (out / "step0" / "rank0" / "dump.json").exists()
    import json
    entries = json.loads((out / MANIFEST).read_text())["entries"]
    assert "step0" in entries and "step*" not in entries and "step_notes" not in entries
