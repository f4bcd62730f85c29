"""Tensor files are read within a stated memory limit: a zip-bomb ``.pt``, a safetensors or
``.npy`` header claiming more than the file holds, a dump.json shape that is not the file's:
each is one line naming the file and the tensor is skipped, checked from the headers before
anything is decompressed or allocated. Every read runs in a child process under an address-space
limit, so a regression fails fast instead of eating the machine's memory."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import zipfile

import pytest

pytestmark = pytest.mark.timeout(120)

#: the bomb expands to this much (about 1 MB on disk)
BOMB_BYTES = 1 << 30


def tensor_pickle(numel: int) -> bytes:
    """The ``data.pkl`` ``torch.save`` writes for a float32 tensor of ``numel`` elements whose
    storage is member ``data/0``, assembled opcode by opcode (no torch needed)."""
    text = lambda s: b"X" + len(s).to_bytes(4, "little") + s.encode()
    num = lambda n: b"J" + n.to_bytes(4, "little", signed=True)
    storage = b"(" + text("storage") + b"ctorch\nFloatStorage\n" + text("0") + text("cpu") + num(numel) + b"tQ"
    args = b"(" + storage + num(0) + b"(" + num(numel) + b"t(" + num(1) + b"t\x89}t"
    return b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n" + args + b"R."


def zip_bomb(path, numel: int = BOMB_BYTES // 4) -> None:
    """A ``torch.save``-layout zip whose storage member is ``numel`` float32 zeros, deflated."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        z.writestr(zipfile.ZipInfo("archive/data.pkl"), tensor_pickle(numel), zipfile.ZIP_STORED)
        with z.open("archive/data/0", "w", force_zip64=True) as member:
            chunk = bytes(64 << 20)
            for _ in range(numel * 4 // len(chunk)):
                member.write(chunk)


@pytest.fixture(scope="module")
def bomb_file(tmp_path_factory):
    """One zip bomb for the module's tests (building it deflates 1 GiB: seconds)."""
    path = tmp_path_factory.mktemp("bomb") / "bomb.pt"
    zip_bomb(path)
    return path


def bf16_safetensors(path, shape=(65536, 131072)) -> None:
    """A safetensors file whose header claims a BF16 tensor of ``shape`` (16 GiB) and holds 8 bytes."""
    header = json.dumps({"t": {"dtype": "BF16", "shape": list(shape),
                               "data_offsets": [0, 2 * shape[0] * shape[1]]}}).encode()
    path.write_bytes(len(header).to_bytes(8, "little") + header + bytes(8))


def in_bounded_child(code: str, headroom: int = 768 << 20) -> subprocess.CompletedProcess:
    """Run ``code`` in a child Python whose address space, once its imports are done, may grow by
    ``headroom`` bytes at most (a read that allocates the bomb fails there, not here)."""
    prologue = textwrap.dedent(f"""
        import resource
        def _bound():
            vm = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmSize"))
            resource.setrlimit(resource.RLIMIT_AS, (vm + {headroom}, resource.RLIM_INFINITY))
    """)
    return subprocess.run([sys.executable, "-c", prologue + textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=100)


def test_a_zip_bomb_pt_is_refused_by_compare_before_it_is_decompressed(tmp_path, bomb_file):
    import shutil

    bomb = tmp_path / "Functional.linear.0.forward.output.0.pt"
    shutil.copy(bomb_file, bomb)
    assert bomb.stat().st_size < 4 << 20
    ran = in_bounded_child(f"""
        import logging, sys
        logging.basicConfig(stream=sys.stdout, format="%(message)s")
        from probe.compare.metrics import load_array
        _bound()
        print("result", load_array({str(bomb)!r}))
    """)
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    assert lines[-1] == "result None" and len(lines) == 2, ran.stdout
    assert str(bomb) in lines[0] and "zip bomb" in lines[0], lines[0]


def test_a_safetensors_header_claiming_16_gib_is_refused_by_compare(tmp_path):
    fake = tmp_path / "x.safetensors"
    bf16_safetensors(fake)
    ran = in_bounded_child(f"""
        import logging, sys
        logging.basicConfig(stream=sys.stdout, format="%(message)s")
        from probe.compare.metrics import load_array
        _bound()
        print("result", load_array({str(fake)!r}))
    """)
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    assert lines[-1] == "result None" and str(fake) in lines[0] and "PROBE_MAX_TENSOR_BYTES" in lines[0], ran.stdout


def test_the_limit_is_overridable_and_a_header_beyond_the_file_is_refused_within_it(tmp_path, monkeypatch):
    from probe.ground.errors import ProbeError
    from probe.ground.files import check_tensor_file

    fake = tmp_path / "x.safetensors"
    bf16_safetensors(fake, shape=(4, 4))                    # 32 bytes claimed, 8 held
    with pytest.raises(ProbeError, match="the file holds 8 bytes"):
        check_tensor_file(fake)
    monkeypatch.setenv("PROBE_MAX_TENSOR_BYTES", "16")
    with pytest.raises(ProbeError, match="more than the 16 one tensor may take"):
        check_tensor_file(fake)
    monkeypatch.setenv("PROBE_MAX_TENSOR_BYTES", "lots")
    with pytest.raises(ProbeError, match="PROBE_MAX_TENSOR_BYTES"):
        check_tensor_file(fake)


def test_check_api_skips_a_bomb_a_huge_header_and_a_shape_that_is_not_the_files(tmp_path, bomb_file):
    import shutil

    folder = tmp_path / "dump" / "step0" / "rank0"
    data_dir = folder / "dump_tensor_data"
    data_dir.mkdir(parents=True)
    shutil.copy(bomb_file, data_dir / "bomb.pt")
    bf16_safetensors(data_dir / "huge.safetensors")
    t = lambda name, shape=(4,), dtype="torch.float32": {"type": "torch.Tensor", "dtype": dtype,
                                                          "shape": list(shape), "data_name": name}
    data = {
        "Torch.exp.0.forward": {"input_args": [t("bomb.pt", (BOMB_BYTES // 4,))], "output": [t("x.safetensors")]},
        "Torch.exp.1.forward": {"input_args": [t("huge.safetensors", (65536, 131072), "torch.bfloat16")],
                                "output": [t("x.safetensors")]},
        "Torch.exp.2.forward": {"input_args": [t("x.safetensors", (8,))], "output": [t("x.safetensors")]},
        "Torch.exp.3.forward": {"input_args": [t("x.safetensors", (1 << 40,))], "output": [t("x.safetensors")]},
    }
    (folder / "dump.json").write_text(json.dumps({"task": "tensor", "level": "L1", "data": data}))
    ran = in_bounded_child(f"""
        import torch
        from safetensors.torch import save_file
        save_file({{"t": torch.ones(4)}}, {str(data_dir / "x.safetensors")!r})
        from probe.checker.offline import check_dump
        _bound()
        rows, summary = check_dump({str(tmp_path / "dump")!r})
        for r in rows:
            print(r["name"], "|", r["verdict"], "|", r["reason"])
    """)
    assert ran.returncode == 0, ran.stderr
    rows = dict(line.split(" | ", 1) for line in ran.stdout.splitlines())
    assert set(rows) == set(data), ran.stdout
    assert all(v.startswith("skipped | not replayable: ") for v in rows.values()), rows
    assert "bomb.pt" in rows["Torch.exp.0.forward"] and "zip bomb" in rows["Torch.exp.0.forward"]
    assert "huge.safetensors" in rows["Torch.exp.1.forward"]
    assert "dump.json says [8]" in rows["Torch.exp.2.forward"]
    assert "PROBE_MAX_TENSOR_BYTES" in rows["Torch.exp.3.forward"]
