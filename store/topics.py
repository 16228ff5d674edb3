"""``config/topics.json``: the topics of a store and their queue counts.

Shape follows RocketMQ's TopicConfigManager (``topicConfigTable`` of per-topic configs plus a
``dataVersion``).  Written atomically (temp file, fsync, rename; the previous file kept as
``topics.json.bak`` and read when the main file is missing or unreadable).  Only the process
holding the store's write lock changes it; every process re-reads it when it changes.
"""

from __future__ import annotations

import os

from .fileio import read_json, write_json_atomic
from .message import is_system_topic

PERM_READ = 4
PERM_WRITE = 2


def default_queue_count(topic: str, user_default: int) -> int:
    """Queues of a new topic that no service registered: one for a system topic (as
    RocketMQ's system topics), ``user_default`` for a user topic."""
    return 1 if is_system_topic(topic) else user_default


class TopicTable:
    """In-memory view of ``topics.json`` with change detection."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._topics: dict[str, dict] = {}
        self.reload()

    def _file_stamp(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return (st.st_mtime_ns, st.st_ino)

    def reload(self, force: bool = False) -> dict[str, dict]:
        stamp = self._file_stamp()
        if force or stamp != self._stamp or stamp is None:
            data = read_json(self.path) or {}
            table = data.get("topicConfigTable", {}) if isinstance(data, dict) else {}
            self._topics = {k: v for k, v in table.items() if isinstance(v, dict)}
            self._stamp = stamp
        return self._topics

    def get(self, topic: str) -> dict | None:
        return self.reload().get(topic)

    def cached_queue_count(self, topic: str) -> int | None:
        """The queue count of a topic this process has already seen, without a re-read."""
        cfg = self._topics.get(topic)
        return int(cfg["writeQueueNums"]) if cfg is not None else None

    def queue_count(self, topic: str) -> int | None:
        cfg = self.get(topic)
        return int(cfg["writeQueueNums"]) if cfg else None

    def names(self) -> list[str]:
        return sorted(self.reload())

    def create(self, topic: str, queue_count: int, now_ms: int) -> dict:
        """Add a topic (caller holds the write lock) and persist the table."""
        topics = dict(self.reload(force=True))
        if topic in topics:
            return topics[topic]
        cfg = {
            "topicName": topic, "readQueueNums": queue_count, "writeQueueNums": queue_count,
            "perm": PERM_READ | PERM_WRITE, "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0,
            "order": False, "attributes": {},
        }
        topics[topic] = cfg
        write_json_atomic(self.path, {
            "topicConfigTable": topics,
            "dataVersion": {"counter": len(topics), "stateVersion": 0, "timestamp": now_ms},
        })
        self._topics = topics
        self._stamp = self._file_stamp()
        return cfg
