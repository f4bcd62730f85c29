"""One truth from compare to report: the tensor and node verdicts, their labelled counts (the
terminal, summary.json, compare.csv, nodes.parquet), where a divergence starts and what it
affects, and the fingerprints of the inputs."""

from __future__ import annotations

import csv
import json
import re
from collections import Counter

import pyarrow.parquet as pq

from probe.compare.api import compare
from probe.compare.fingerprint import fingerprint, foreign_input
from tests.compare.dumps import chain, write_dump
from tests.conftest import run_probe


def parse_counts(text: str) -> dict:
    """The labelled counts in a text (the terminal summary, the web page's header)."""
    out = {}
    for kind in ("tensors", "nodes"):
        found = re.search(rf"\b{kind}: ([a-z0-9 ,]+?)(?: ·|\n|$)", text)
        assert found, (kind, text)
        out[kind] = {} if found.group(1) == "none" else {
            k: int(v) for k, v in (part.split() for part in found.group(1).split(", "))}
    a, b = re.search(r"\bunmatched: A (\d+), B (\d+)", text).groups()
    out["unmatched"] = {"a": int(a), "b": int(b)}
    return out


def nonzero(counts: dict) -> dict:
    return {"tensors": {k: v for k, v in counts["tensors"].items() if v},
            "nodes": {k: v for k, v in counts["nodes"].items() if v}, "unmatched": counts["unmatched"]}


def test_counts_are_labelled_and_agree_in_the_terminal_summary_csv_and_nodes(tmp_path):
    a = write_dump(tmp_path / "a", *chain(5))
    data, construct = chain(6, scale={1: 1.5}, nan_at=4)
    b = write_dump(tmp_path / "b", data, construct)
    p = run_probe("compare", str(a), str(b), "--out", str(tmp_path / "o"))
    assert p.returncode == 0, p.stderr
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    counts = summary["counts"]
    assert set(counts["counted"]) == {"tensors", "nodes", "unmatched"}
    with open(tmp_path / "o" / "compare.csv", newline="") as f:
        from_csv = Counter(r["verdict"] for r in csv.DictReader(f))
    nodes = pq.read_table(tmp_path / "o" / "nodes.parquet").to_pylist()
    from_nodes = Counter(n["verdict"] for n in nodes)
    unmatched = {s: sum(1 for n in nodes if n["verdict"] == "unmatched" and n[f"node_{s}"]) for s in "ab"}
    truth = {"tensors": dict(from_csv), "nodes": dict(from_nodes), "unmatched": unmatched}
    assert nonzero(counts) == truth == parse_counts(p.stdout)
    assert truth["tensors"]["nan"] and truth["nodes"]["error"] and unmatched == {"a": 0, "b": 2}
    # the keys scripts already read say the same
    assert summary["verdicts"] == truth["tensors"] and summary["node_verdicts"] == truth["nodes"]
    assert (summary["unmatched_a"], summary["unmatched_b"]) == (0, 2)


def test_nan_on_one_side_is_its_own_verdict_and_fails_at_error_level(tmp_path):
    a, c = chain(5)
    b, _ = chain(5, nan_at=2)
    pa_, pb = write_dump(tmp_path / "a", a, c), write_dump(tmp_path / "b", b, c)
    r = compare(str(pa_), str(pb))
    rows = {x["name_a"]: x for x in r.rows.to_pylist()}
    assert rows["Module.layers.2.fc.Linear.forward.0.output.0"]["verdict"] == "nan"
    assert rows["Module.layers.2.fc.Linear.forward.0.input.0"]["verdict"] == "pass"
    nodes = {(n["node_a"], n["direction"]): n for n in r.nodes.to_pylist()}
    assert nodes[("Module.layers.2.fc.Linear.forward.0", "forward")]["verdict"] == "nan"
    assert nodes[("Module.layers.1.fc.Linear.forward.0", "forward")]["verdict"] == "pass"
    assert r.worst_verdict == "nan"
    p = run_probe("compare", str(pa_), str(pb), "--out", str(tmp_path / "o"), "--fail-on", "error")
    assert p.returncode == 1 and "nodes: nan" in p.stdout


def test_a_divergence_passed_on_names_the_node_it_starts_at(tmp_path):
    a, c = chain(5)
    b, _ = chain(5, scale={2: 1.5})
    r = compare(str(write_dump(tmp_path / "a", a, c)), str(write_dump(tmp_path / "b", b, c)))
    nodes = {(n["node_a"], n["direction"]): n for n in r.nodes.to_pylist()}
    fault = "Module.layers.2.fc.Linear.forward.0"
    assert nodes[(fault, "forward")]["origin"] and nodes[(fault, "forward")]["verdict"] == "error"
    for later in ("Module.layers.3.fc.Linear.forward.0", "Module.layers.4.fc.Linear.forward.0"):
        n = nodes[(later, "forward")]
        assert n["verdict"] == "error" and not n["origin"]
        assert (n["affected_by_a"], n["affected_by_b"]) == (fault, fault)
    assert not nodes[("Module.layers.1.fc.Linear.forward.0", "forward")]["origin"]
    assert nodes[("Module.layers.1.fc.Linear.forward.0", "forward")]["affected_by_a"] is None


def test_the_summary_records_the_inputs_fingerprints_which_tell_other_dumps_apart(tmp_path, monkeypatch):
    import probe.compare.fingerprint as fp

    a, c = chain(3)
    b, _ = chain(3, scale={1: 2.0})
    pa_, pb = write_dump(tmp_path / "a", a, c), write_dump(tmp_path / "b", b, c)
    s = compare(str(pa_), str(pb)).summary
    assert s["inputs"]["a"]["sha256"] == fingerprint(pa_)["sha256"] != s["inputs"]["b"]["sha256"]
    copy = tmp_path / "copy" / "dump.json"
    copy.parent.mkdir()
    copy.write_bytes(pa_.read_bytes())                  # same content elsewhere: the same dump
    assert foreign_input(s, {"a": copy, "b": pb}) is None
    assert "side B" in foreign_input(s, {"a": pa_, "b": pa_})
    # a large file is sampled: a change in its middle, of the same size, is still seen
    monkeypatch.setattr(fp, "FULL_BYTES", 1 << 10)
    monkeypatch.setattr(fp, "_EDGE", 256)
    monkeypatch.setattr(fp, "_BLOCK", 64)
    big = tmp_path / "big.json"
    body = bytearray(b"x" * 200_000)
    big.write_bytes(body)
    before = fingerprint(big)
    body[100_000:100_000 + 200_000 // fp.SAMPLES] = b"y" * (200_000 // fp.SAMPLES)
    big.write_bytes(body)
    assert before["scheme"] == "sampled" and fingerprint(big)["sha256"] != before["sha256"]
