"""Seeded fuzzing of every input a user hands to probe: dump.json, construct.json, stack.json,
mapping YAML, store Parquet segments and monitor protobuf messages.

Each case mutates a real file (ours from ``probe dump``, msprobe's from tests/msprobe_fixtures.py)
with :mod:`tests.fuzz.mutate` from its seed alone, runs the command in this process
(``probe.cli.main``) and checks the contract of bad input: never an internal error (exit 3),
never a traceback, every error one line, no case longer than a minute. A few cases run through
a real ``probe`` process. A failing case is reproduced by its test id (the seed).
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from probe.collectors.msprobe_layout import loads
from probe.cli import main
from tests.conftest import run_probe
from tests.fuzz import mutate

pytestmark = pytest.mark.timeout(60)


def _run(capsys, *args: str) -> tuple[int, str]:
    """``probe ARGS`` in this process: its exit code and stderr, checked against the contract."""
    rc = main([str(a) for a in args])
    err = capsys.readouterr().err
    _check(rc, err)
    return rc, err


def _check(rc: int, err: str) -> None:
    assert rc in (0, 1, 2), f"exit {rc}: {err}"
    assert "Traceback" not in err and "internal error" not in err, err
    if rc == 2:                        # one line, last (warnings of the reading may precede it)
        lines = [x for x in err.splitlines() if x.strip()]
        assert lines[-1].startswith("probe: error: "), err
        assert sum(x.startswith("probe: error") for x in lines) == 1, err


def _mutated_json(rng: random.Random, raw: bytes, entries: bool) -> bytes:
    """``raw`` with byte mutations (2 in 5) or 1 to 3 structural ones (``entries``: mutate the
    ``data`` object's names too)."""
    if rng.random() < 0.4:
        return mutate.mutate_bytes(rng, raw)
    doc = loads(raw)
    for _ in range(rng.randint(1, 3)):
        data = doc.get("data") if entries and isinstance(doc, dict) else None
        doc = mutate.mutate_doc(rng, doc, data if isinstance(data, dict) else None)
    return mutate.dump_json(doc)


def _case(rng: random.Random, sources: dict[str, Path], tmp_path: Path, which: str) -> tuple[Path, Path]:
    """A copy of a source dump folder, chosen by ``rng``, with ``which`` file mutated; returns
    (mutated dump.json, the source's dump.json)."""
    src = sources[rng.choice(sorted(sources))]
    case = tmp_path / "case"
    shutil.copytree(src, case)
    target = case / which
    if not target.exists():
        target.write_text("{}")
    target.write_bytes(_mutated_json(rng, target.read_bytes(), which == "dump.json"))
    return case / "dump.json", src / "dump.json"


@pytest.mark.parametrize("seed", range(100))
def test_mutated_dump_json_compares_or_is_one_line(seed, fuzz_sources, tmp_path, capsys):
    rng = random.Random(seed)
    bad, good = _case(rng, fuzz_sources, tmp_path, "dump.json")
    a, b = (bad, good) if rng.random() < 0.5 else (good, bad)
    _run(capsys, "compare", a, b, "--out", tmp_path / "o")


@pytest.mark.parametrize("seed", range(1000, 1030))
def test_mutated_construct_json_compares_or_is_one_line(seed, fuzz_sources, tmp_path, capsys):
    bad, good = _case(random.Random(seed), fuzz_sources, tmp_path, "construct.json")
    _run(capsys, "compare", bad, good, "--out", tmp_path / "o")


@pytest.mark.parametrize("seed", range(2000, 2024))
def test_mutated_stack_json_compares_or_is_one_line(seed, fuzz_sources, tmp_path, capsys):
    bad, good = _case(random.Random(seed), fuzz_sources, tmp_path, "stack.json")
    _run(capsys, "compare", bad, good, "--out", tmp_path / "o")


#: A mapping file of each kind msprobe reads, naming entries of mindspore_L0 against torch_L0.
MAPPINGS = {
    "layer": {"TopLayer": {"embed": "embed", "block": "block"}, "TinyAttention": {"q": "q", "k": "k"}},
    "cell": {"embed.Dense": "embed.Linear", "block.attn.q.Dense": "block.attn.q.Linear"},
    "api": [{"ms_api": "Functional.linear", "pt_api": "Functional.linear"},
            {"ms_api": "Mint.add", "pt_api": "Torch.add"}],
    "data": {"Cell.embed.Dense.forward.0.input.0": "Module.embed.Linear.forward.0.input.0"},
}


@pytest.mark.parametrize("seed", range(3000, 3060))
def test_mutated_mapping_yaml_compares_or_is_one_line(seed, fuzz_sources, tmp_path, capsys):
    import yaml

    rng = random.Random(seed)
    pair = [fuzz_sources.get("mindspore_L0", fuzz_sources["ours"]),
            fuzz_sources.get("torch_L0", fuzz_sources["ours"])]
    doc = json.loads(json.dumps(MAPPINGS[rng.choice(sorted(MAPPINGS))]))
    r = rng.random()
    if r < 0.3:
        text = mutate.mutate_bytes(rng, yaml.safe_dump(doc).encode())
    elif r < 0.8:
        for _ in range(rng.randint(1, 3)):
            doc = mutate.mutate_doc(rng, doc)
        text = mutate.dump_json(doc)                  # JSON is YAML (flow style)
    else:
        text = mutate.mutate_bytes(rng, mutate.dump_json(doc))
    m = tmp_path / "mapping.yaml"
    m.write_bytes(text)
    _run(capsys, "compare", pair[0] / "dump.json", pair[1] / "dump.json", "--mapping", m,
         "--out", tmp_path / "o")


@pytest.mark.parametrize("seed", range(4000, 4040))
def test_mutated_store_segment_is_queried_or_one_line(seed, our_run, tmp_path, capsys):
    rng = random.Random(seed)
    run = tmp_path / "run"
    shutil.copytree(our_run / "store", run / "store")
    segments = sorted((run / "store").glob("*/*/*.parquet"))
    seg = rng.choice(segments)
    seg.write_bytes(mutate.mutate_bytes(rng, seg.read_bytes()))
    view = {"tensor": "tensors", "node": "nodes", "metric": "metrics"}.get(seg.parent.parent.name, "tensors")
    _run(capsys, "query", run, f"select count(*) from {view}")


def _messages() -> list:
    """One filled-in instance of every message of the monitor protocol."""
    import numpy as np

    from probe.monitor.proto import monitor_pb2 as pb

    batch = pb.MetricBatch(job="j", rank=1, agent_id="a", seq=3, names=["loss", "step_time"],
                           name_index=np.int32([0, 1, 1]).tobytes(),
                           steps=np.int64([7, 7, 8]).tobytes(), time_ns=np.int64([5, 6, 7]).tobytes(),
                           values=np.float64([2.5, 0.1, 0.2]).tobytes(), dropped=2)
    out = [batch]
    for name, desc in pb.DESCRIPTOR.message_types_by_name.items():
        if name == "MetricBatch":
            continue
        msg = getattr(pb, name)()
        for f in desc.fields:
            value = {f.TYPE_STRING: "x\u00e9", f.TYPE_BYTES: b"\x00\x01", f.TYPE_BOOL: True,
                     f.TYPE_DOUBLE: 1.5, f.TYPE_FLOAT: 1.5}.get(f.type, 3)
            if f.message_type is not None:
                continue
            if f.is_repeated:
                getattr(msg, f.name).extend([value, value])
            else:
                setattr(msg, f.name, value)
        out.append(msg)
    return out


def test_mutated_monitor_messages_fail_to_parse_or_are_refused_in_words():
    """1200 mutated serialisations: parsing raises DecodeError or gives a message; a parsed
    metric batch is decoded by the service's check or refused with a ValueError."""
    from google.protobuf.message import DecodeError

    from probe.monitor.service.ingest import decode_batch

    rng = random.Random(5000)
    messages = _messages()
    outcomes = {"decode_error": 0, "parsed": 0, "refused": 0}
    for _ in range(1200):
        original = rng.choice(messages)
        raw = mutate.mutate_bytes(rng, original.SerializeToString()) if original.ByteSize() else b"\xff"
        msg = type(original)()
        try:
            msg.ParseFromString(raw)
        except DecodeError:
            outcomes["decode_error"] += 1
            continue
        outcomes["parsed"] += 1
        if type(msg).__name__ == "MetricBatch":
            try:
                table = decode_batch(msg)
            except ValueError as e:
                assert str(e) and "\n" not in str(e)
                outcomes["refused"] += 1
            else:
                assert table.num_rows == len(msg.values) // 8
    assert len(messages) > 10 and all(outcomes.values()), outcomes


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["alias-bomb mapping", "shape overflow", "binary dump"])
def test_bad_input_through_a_real_process_is_one_line_exit_2(kind, fuzz_sources, tmp_path):
    good = fuzz_sources["ours"] / "dump.json"
    args = [str(good), str(good)]
    if kind == "alias-bomb mapping":
        m = tmp_path / "m.yaml"
        m.write_text("a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
            f"{c}: &{c} [{','.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi")))
        args += ["--mapping", str(m)]
    else:
        bad = tmp_path / "bad" / "dump.json"
        shutil.copytree(good.parent, bad.parent)
        raw = good.read_bytes()
        bad.write_bytes(raw.replace(b'"shape": [', b'"shape": [18446744073709551616, ', 1)
                        if kind == "shape overflow" else raw[:100] + bytes(range(256)) + raw[100:])
        args[0] = str(bad)
    p = run_probe("compare", *args, "--out", str(tmp_path / "o"), timeout=60)
    _check(p.returncode, p.stderr)
    assert p.returncode == 2 and str(tmp_path) in p.stderr
