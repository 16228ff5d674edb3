"""``config/topics.json``: the topics of a store and their queue counts.

Shape and text follow RocketMQ's TopicConfigManager (``topicConfigTable`` of per-topic configs
plus a ``dataVersion`` whose counter goes up by one per change), written as fastjson writes it
(:mod:`store.broker_files`), so a broker's ``topics.json`` stays one the broker can load:
topics and fields rmq does not know are kept.  Written atomically (temp file, fsync, rename;
the previous file kept as ``topics.json.bak`` and read when the main file is missing or
unreadable).  Only the process holding the store's write lock changes it; every process
re-reads it when it changes.
"""

from __future__ import annotations

import os

from .broker_files import read_lenient_json, write_config
from .message import is_system_topic

PERM_READ = 4
PERM_WRITE = 2


def default_queue_count(topic: str, user_default: int) -> int:
    """Queues of a new topic that no service registered: one for a system topic (as
    RocketMQ's system topics), ``user_default`` for a user topic."""
    return 1 if is_system_topic(topic) else user_default


def _topic_config(topic: str, queue_count: int) -> dict:
    return {
        "topicName": topic, "readQueueNums": queue_count, "writeQueueNums": queue_count,
        "perm": PERM_READ | PERM_WRITE, "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0,
        "order": False, "attributes": {},
    }


class TopicTable:
    """In-memory view of ``topics.json`` with change detection.

    A topic whose ConsumeQueue directory exists but that the file does not list (the file is
    missing, unreadable, or the directory was written by RocketMQ's store, which keeps no
    topic table) is known too, with as many queues as its highest queue directory says.
    """

    def __init__(self, path: str, queue_root: str | None = None) -> None:
        self.path = path
        self.queue_root = queue_root
        self._stamp: tuple[int, int] | None = None
        self._dir_stamp: int | None = None
        self._from_dirs: dict[str, dict] = {}
        self._topics: dict[str, dict] = {}
        self._file_topics: dict[str, dict] = {}
        self._version: dict = {}
        self.reload()

    def _queue_dirs(self) -> dict[str, dict]:
        """Topics from the ConsumeQueue directories (cached while the directory is unchanged)."""
        if self.queue_root is None:
            return {}
        try:
            stamp = os.stat(self.queue_root).st_mtime_ns
        except FileNotFoundError:
            return {}
        if stamp != self._dir_stamp:
            found = {}
            for topic in os.listdir(self.queue_root):
                tdir = os.path.join(self.queue_root, topic)
                if not os.path.isdir(tdir):
                    continue
                ids = [int(q) for q in os.listdir(tdir) if q.isdigit()]
                if ids:
                    found[topic] = _topic_config(topic, max(ids) + 1)
            self._from_dirs, self._dir_stamp = found, stamp
        return self._from_dirs

    def _file_stamp(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return (st.st_mtime_ns, st.st_ino)

    def reload(self, force: bool = False) -> dict[str, dict]:
        stamp = self._file_stamp()
        if force or stamp != self._stamp or stamp is None:
            data = read_lenient_json(self.path, valid=_is_topic_table) or {}
            table = data.get("topicConfigTable", {})
            version = data.get("dataVersion")
            self._version = version if isinstance(version, dict) else {}
            self._file_topics = {k: v for k, v in table.items()
                                 if isinstance(v, dict) and _queue_count_of(v) is not None}
            self._stamp = stamp
        dirs = self._queue_dirs()
        if any(t not in self._file_topics for t in dirs):
            self._topics = {**dirs, **self._file_topics}  # the file wins where it says
        else:
            self._topics = self._file_topics
        return self._topics

    def get(self, topic: str) -> dict | None:
        return self.reload().get(topic)

    def cached_queue_count(self, topic: str) -> int | None:
        """The queue count of a topic this process has already seen, without a re-read."""
        cfg = self._topics.get(topic)
        return _queue_count_of(cfg) if cfg is not None else None

    def queue_count(self, topic: str) -> int | None:
        cfg = self.get(topic)
        return _queue_count_of(cfg) if cfg else None

    def names(self) -> list[str]:
        return sorted(self.reload())

    def create(self, topic: str, queue_count: int, now_ms: int) -> dict:
        """Add a topic (caller holds the write lock) and persist the table."""
        topics = dict(self.reload(force=True))
        if topic in topics:
            return topics[topic]
        cfg = _topic_config(topic, queue_count)
        topics[topic] = cfg
        self._write(topics, now_ms)
        return cfg

    def _write(self, topics: dict[str, dict], now_ms: int) -> None:
        counter = self._version.get("counter")
        counter = counter if isinstance(counter, int) and not isinstance(counter, bool) else 0
        version = {"stateVersion": 0, **self._version, "counter": counter + 1,
                   "timestamp": now_ms}
        write_config(self.path, {"topicConfigTable": topics, "dataVersion": version})
        self._topics = self._file_topics = topics
        self._version = version
        self._stamp = self._file_stamp()


    def widen(self, counts: dict[str, int], now_ms: int) -> list[str]:
        """Raise the queue count of topics to at least ``counts[topic]`` (a repair found
        records in those queues; the caller holds the write lock); return the topics changed."""
        topics = dict(self.reload(force=True))
        changed = []
        for topic, count in counts.items():
            cfg = topics.get(topic)
            if cfg is None or (_queue_count_of(cfg) or 0) < count:
                topics[topic] = _topic_config(topic, count)
                changed.append(topic)
        if changed:
            self._write(topics, now_ms)
        return sorted(changed)


def _is_topic_table(data: object) -> bool:
    """Whether ``data`` has the shape of ``topics.json`` (a dict of topic configs)."""
    return isinstance(data, dict) and isinstance(data.get("topicConfigTable", {}), dict)


def _queue_count_of(cfg: dict) -> int | None:
    """``writeQueueNums`` of a topic config (``None`` when it is not a positive int)."""
    value = cfg.get("writeQueueNums")
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return None
    return value
