"""Timer service (interim: filled in by the delayed-messages work)."""

from __future__ import annotations


class TimerService:
    def __init__(self, store) -> None:
        self.store = store

    def rewrite(self, spec, deliver_ms):
        raise NotImplementedError("the timer wheel is not implemented yet")

    def cancel(self, topic, msg_id):
        raise NotImplementedError("the timer wheel is not implemented yet")

    def deliver_due(self) -> int:
        return 0

    def on_retention(self, commitlog_min: int) -> None:
        pass

    def close(self) -> None:
        pass
