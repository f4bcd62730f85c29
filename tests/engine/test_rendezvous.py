"""The ranks of ``probe train`` rendezvous on loopback: rank 0's store listens on 127.0.0.1 alone."""

from __future__ import annotations

import threading
import time

import pytest

from probe.engine import launch
from probe.engine.spec import RunSpec


def _listeners(port: int) -> list[str]:
    """Local addresses (hex, as /proc/net/tcp* writes them) of the sockets listening on ``port``."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            if state == "0A" and local.endswith(f":{port:04X}"):
                found.append(local.rsplit(":", 1)[0])
    return found


@pytest.mark.slow
def test_the_rendezvous_store_listens_on_loopback_alone_while_ranks_train(tmp_path, monkeypatch):
    port = launch._free_port()
    monkeypatch.setattr(launch, "_free_port", lambda: port)
    done = []
    run = threading.Thread(target=lambda: done.append(launch.run_training(RunSpec(
        nproc=2, max_steps=40, out_dir=str(tmp_path), quiet=True))))
    run.start()
    seen: set[str] = set()
    while run.is_alive():
        seen.update(_listeners(port))
        time.sleep(0.05)
    run.join()
    assert done and len(done[0].steps) == 40
    assert seen, "rank 0's store was never seen listening"
    loopback = {"0100007F", "0000000000000000FFFF00000100007F"}
    assert seen <= loopback, f"the rendezvous port listens beyond loopback: {seen}"
