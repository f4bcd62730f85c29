"""The committed gRPC stubs are exactly what grpcio-tools generates from monitor.proto."""

from pathlib import Path

from probe.monitor.proto import generate


def test_committed_stubs_match_what_grpcio_tools_generates(tmp_path: Path) -> None:
    produced = generate.generate(tmp_path)
    for name, text in produced.items():
        committed = (generate.HERE / name).read_text()
        assert committed == text, f"{name} is stale: run python -m probe.monitor.proto.generate"


def test_stubs_import_as_a_package_and_expose_the_service() -> None:
    from probe.monitor.proto import monitor_pb2, monitor_pb2_grpc

    assert monitor_pb2.DESCRIPTOR.services_by_name["Monitor"].methods_by_name["Push"]
    assert hasattr(monitor_pb2_grpc, "MonitorStub")
