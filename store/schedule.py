"""4.x delay levels (interim: filled in by the delayed-messages work)."""

from __future__ import annotations


class ScheduleService:
    def __init__(self, store) -> None:
        self.store = store

    def rewrite(self, spec, level):
        raise NotImplementedError("delay levels are not implemented yet")

    def deliver_due(self) -> int:
        return 0

    def on_retention(self, commitlog_min: int) -> None:
        pass

    def close(self) -> None:
        pass
