"""The demo's summary is taken from a final state: its streaming queries are stopped first,
and the state's lock is held while it is read (a batch still running changed a set the
summary iterated: ``RuntimeError: Set changed size during iteration`` at the end of a demo
on a loaded machine)."""

from __future__ import annotations

from rmq_cli import demo


class FakeQuery:
    def __init__(self, log: list) -> None:
        self.log, self.active = log, True

    def stop(self) -> None:
        self.active = False
        self.log.append("stop")


def test_the_summary_reads_a_final_state_under_its_lock(tmp_path, monkeypatch):
    log: list = []
    queries: list = []
    seen: dict = {}

    def start_queries(qs, *args, **kwargs):
        qs.extend(FakeQuery(log) for _ in range(3))
        queries.extend(qs)

    def summary(console, state, *args, **kwargs):
        seen["locked"] = state.lock.locked()
        seen["stopped"] = [not q.active for q in queries]
        log.append("summary")
        return True

    monkeypatch.setattr(demo, "local_spark",
                        lambda *a, **k: type("Spark", (), {"stop": lambda self: None})())
    monkeypatch.setattr(demo, "_start_queries", start_queries)
    monkeypatch.setattr(demo, "_warm_up", lambda *a, **k: None)
    monkeypatch.setattr(demo, "_watch", lambda *a, **k: None)
    monkeypatch.setattr(demo, "_produce", lambda *a, **k: None)
    monkeypatch.setattr(demo, "_summary", summary)
    assert demo.run_demo(store_path=str(tmp_path / "store"), orders=4, quiet=True)
    assert seen == {"locked": True, "stopped": [True, True, True]}
    assert log[:4] == ["stop", "stop", "stop", "summary"]
