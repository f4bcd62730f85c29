"""The monitor's DuckDB store: an open alert's updates are written behind (at most once a
second, at once on a state change), and every reader still sees the latest."""

import threading

from probe.monitor.service import storage
from probe.monitor.service.storage import MonitorStore


def _alert(**kw):
    a = {"kind": "straggler", "job": "j", "rank": 1, "step": 10, "message": "rank 1 is slow",
         "evidence": {"ratio": 1.5}}
    a.update(kw)
    return a


def _updates(store, monkeypatch):
    """How many times the store writes pending alert updates to DuckDB."""
    calls = []
    write = store._write_alert_updates

    def counted():
        calls.append(len(store._alert_updates))
        write()
    monkeypatch.setattr(store, "_write_alert_updates", counted)
    return calls


def test_an_open_alerts_updates_are_read_at_once_and_written_in_one_go(tmp_path, monkeypatch):
    store = MonitorStore(tmp_path / "m.duckdb")
    monkeypatch.setattr(storage, "ALERT_WRITE_S", 3600.0)
    writes = _updates(store, monkeypatch)
    alert = store.add_alert(_alert())
    for step in range(11, 31):                       # the alert seen again at every step
        store.update_alert(dict(alert, count=step - 9, last_step=step, message=f"seen {step}"))
    assert writes == []                              # nothing written yet: nobody read
    [row] = store.alerts("j").to_pylist()            # a reader gets the latest
    assert (row["count"], row["last_step"], row["message"]) == (21, 30, "seen 30")
    assert writes == [1]                             # twenty updates, one write
    store.close()


def test_a_closed_alert_is_written_at_once_and_pending_updates_survive_a_restart(tmp_path, monkeypatch):
    path = tmp_path / "m.duckdb"
    monkeypatch.setattr(storage, "ALERT_WRITE_S", 3600.0)
    store = MonitorStore(path)
    writes = _updates(store, monkeypatch)
    a = store.add_alert(_alert())
    b = store.add_alert(_alert(rank=2))
    store.update_alert(dict(a, count=5, last_step=14))
    store.update_alert(dict(b, state="closed", last_step=12))     # a state change: written now
    assert writes == [2]
    store.update_alert(dict(a, count=6, last_step=15))
    store.close()                                                  # pending: written on close
    again = MonitorStore(path)
    rows = {r["rank"]: r for r in again.alerts("j").to_pylist()}
    assert (rows[1]["count"], rows[1]["last_step"], rows[1]["state"]) == (6, 15, "open")
    assert (rows[2]["state"], rows[2]["last_step"]) == ("closed", 12)
    assert [a["rank"] for a in again.open_alerts()] == [1]
    again.close()


def test_updates_are_written_once_the_oldest_has_waited_a_second(tmp_path, monkeypatch):
    store = MonitorStore(tmp_path / "m.duckdb")
    clock = [100.0]
    monkeypatch.setattr(storage.time, "monotonic", lambda: clock[0])
    writes = _updates(store, monkeypatch)
    a = store.add_alert(_alert())
    for step in range(4):                # 0.3 s apart: the fourth 0.9 s after the first
        clock[0] += 0.3
        store.update_alert(dict(a, count=step + 2, last_step=11 + step))
    assert writes == []
    clock[0] += 0.3                      # the fifth, 1.2 s after the first: written (its latest)
    store.update_alert(dict(a, count=6, last_step=15))
    assert writes == [1]
    store.close()


def test_reads_from_many_threads_see_what_the_writer_stored(tmp_path):
    store = MonitorStore(tmp_path / "m.duckdb")
    store.add_alert(_alert())
    seen = []

    def read():
        for _ in range(20):
            seen.append(store.alerts("j").num_rows)
    threads = [threading.Thread(target=read) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == [1] * 80
    store.close()


def test_a_reading_thread_that_ends_lets_its_cursor_go(tmp_path):
    import gc

    store = MonitorStore(tmp_path / "m.duckdb")
    for _ in range(5):
        t = threading.Thread(target=lambda: store.alerts("j"))
        t.start()
        t.join()
    gc.collect()
    assert len(store._cursors) == 0
    store.alerts("j")                       # this thread's: kept for its next read
    assert len(store._cursors) == 1
    store.close()
