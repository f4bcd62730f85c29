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
ROOT = HERE.parent.parent
PROTO = HERE / "monitor.proto"
OUTPUTS = ("monitor_pb2.py", "monitor_pb2_grpc.py")


def generate(out_dir: Path) -> dict[str, str]:
    """Run protoc (from grpcio-tools) on monitor.proto into ``out_dir``; return {file: text}.

    The repository root is the include path, so the gRPC module imports its messages as
    ``monitor.proto.monitor_pb2``.
    """
    from grpc_tools import protoc

    rel = PROTO.relative_to(ROOT)
    rc = protoc.main(["grpc_tools.protoc", f"-I{ROOT}", f"--python_out={out_dir}",
                      f"--grpc_python_out={out_dir}", str(rel)])
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
