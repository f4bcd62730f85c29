"""Regenerate ``monitor_pb2.py`` and ``monitor_pb2_grpc.py`` from ``monitor.proto`` with grpcio-tools.

The generated modules are committed; ``tests/monitor/test_proto.py`` checks they are exactly
what this script produces. Run it after editing the ``.proto``::

    python -m monitor.proto.generate
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTO = HERE / "monitor.proto"
#: Where the proto sits under the import root: the generated modules import each other by it.
PACKAGE_PATH = Path("probe", "monitor", "proto")
OUTPUTS = ("monitor_pb2.py", "monitor_pb2_grpc.py")


def generate(out_dir: Path) -> dict[str, str]:
    """Run protoc (from grpcio-tools) on monitor.proto into ``out_dir``; return {file: text}.

    The proto is laid under its import path (``probe/monitor/proto/``, the folder is
    ``monitor/proto/`` in the checkout) in a scratch include root, so the gRPC module imports its
    messages as ``probe.monitor.proto.monitor_pb2``.
    """
    import shutil

    from grpc_tools import protoc

    include = out_dir / "include"
    rel = PACKAGE_PATH / PROTO.name
    (include / PACKAGE_PATH).mkdir(parents=True)
    shutil.copyfile(PROTO, include / rel)
    rc = protoc.main(["grpc_tools.protoc", f"-I{include}", f"--python_out={out_dir}",
                      f"--grpc_python_out={out_dir}", str(include / rel)])
    if rc != 0:
        raise RuntimeError(f"{PROTO}: protoc failed with exit code {rc}")
    produced = {}
    for name in OUTPUTS:
        text = (out_dir / rel.parent / name).read_text()
        produced[name] = text
    return produced


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in generate(Path(tmp)).items():
            (HERE / name).write_text(text)
            print(f"wrote {HERE / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
