"""``config/topics.json``: the topics of a store and their queue counts.

Shape and text follow RocketMQ's TopicConfigManager (``topicConfigTable`` of per-topic configs
plus a ``dataVersion`` whose counter goes up by one per change), written as fastjson writes it
(:mod:`store.files.broker_files`), so a broker's ``topics.json`` stays one the broker can load:
topics and fields rmq does not know are kept.  Written atomically (temp file, fsync, rename;
the previous file kept as ``topics.json.bak`` and read when the main file is missing or
unreadable).  Only the process holding the store's write lock changes it; every process
re-reads it when it changes.
"""

from __future__ import annotations

import logging
import os

from .broker_files import read_lenient_json, write_config
from ..formats.message import is_system_topic, is_valid_topic_name, validate_topic

log = logging.getLogger("store")

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
        self._dir_stamp: tuple | None = None
        self._from_dirs: dict[str, dict] = {}
        self._topics: dict[str, dict] = {}
        self._file_topics: dict[str, dict] = {}
        self._unnamed: dict[str, object] = {}
        self._version: dict = {}
        #: Queues this process wrote that the file or the directories may not show yet.
        self._written: dict[str, int] = {}
        #: what the last :meth:`_merge` merged (directories, file, written), to skip a merge
        #: of the same inputs
        self._merged_from: tuple | None = None
        self.reload()

    def _queue_dirs(self) -> dict[str, dict]:
        """Topics from the ConsumeQueue directories, cached while neither the root nor the
        directory of a topic the file does not list changes (a new queue directory changes
        its topic's directory, not the root: another process's recovery, say)."""
        if self.queue_root is None:
            return {}
        try:
            root = os.stat(self.queue_root)
        except FileNotFoundError:
            return {}
        if self._stamp_of(self._from_dirs, root) != self._dir_stamp:
            found, stamp = {}, [(root.st_mtime_ns, root.st_nlink)]
            for topic in os.listdir(self.queue_root):
                tdir = os.path.join(self.queue_root, topic)
                try:  # stat before listing: a queue made in between changes the stamp
                    st = os.stat(tdir)
                    ids = [int(q) for q in os.listdir(tdir) if q.isdigit()]
                except (FileNotFoundError, NotADirectoryError):
                    continue
                if ids and is_valid_topic_name(topic):
                    found[topic] = _topic_config(topic, max(ids) + 1)
                    if topic not in self._file_topics:
                        stamp.append((st.st_mtime_ns, st.st_nlink))
            self._from_dirs, self._dir_stamp = found, tuple(stamp)
        return self._from_dirs

    def _stamp_of(self, found: dict, root: os.stat_result) -> tuple:
        """What :meth:`_queue_dirs` compares: the root's and each unlisted topic's directory."""
        stamp = [(root.st_mtime_ns, root.st_nlink)]
        for topic in found:
            if topic not in self._file_topics:
                try:
                    st = os.stat(os.path.join(self.queue_root, topic))
                except FileNotFoundError:
                    return ()
                stamp.append((st.st_mtime_ns, st.st_nlink))
        return tuple(stamp)

    def queue_written(self, topic: str, queue_id: int, now_ms: int) -> None:
        """A queue this process writes entries to (a dispatch, recovery's rescan; the caller
        holds the write lock): listed at once, with every queue below it.  Where the store
        has a topic table the table is widened on disk too, so other processes and later
        opens list it; else (a RocketMQ store, which keeps none) in this process's view,
        as other processes find its directory."""
        cfg = self._topics.get(topic)
        if cfg is not None and (_queue_count_of(cfg) or 0) > queue_id:
            return
        if self._stamp is not None:
            self.widen({topic: queue_id + 1}, now_ms)
        else:
            self._written[topic] = max(self._written.get(topic, 0), queue_id + 1)
            self._merge()

    def _file_stamp(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return (st.st_mtime_ns, st.st_ino)

    def reload(self, force: bool = False) -> dict[str, dict]:
        """Re-read ``topics.json`` if it changed (or ``force``); return the merged topic table.

        Topics found only as ConsumeQueue directories, and queue counts this process has
        written past the file's, are merged in; the file wins where it says.
        """
        stamp = self._file_stamp()
        if force or stamp != self._stamp or stamp is None:
            data = read_lenient_json(self.path, valid=_is_topic_table) or {}
            table = data.get("topicConfigTable", {})
            version = data.get("dataVersion")
            self._version = version if isinstance(version, dict) else {}
            self._file_topics = {k: v for k, v in table.items()
                                 if isinstance(v, dict) and _queue_count_of(v) is not None
                                 and is_valid_topic_name(k)}
            # a name no rmq would write (an older version's, a hand edit): kept in the file as
            # it is, never served, so that the rest of the store still opens and reads
            self._unnamed = {k: v for k, v in table.items() if not is_valid_topic_name(k)}
            if self._unnamed:
                log.warning("%s: skipped %d topic(s) whose name breaks the topic rules (first: "
                            "%.60r)", self.path, len(self._unnamed), next(iter(self._unnamed)))
            self._stamp = stamp
        self._merge()
        return self._topics

    def _merge(self) -> None:
        dirs = self._queue_dirs()
        inputs = (dirs, self._file_topics, tuple(self._written.items()))
        merged = self._merged_from
        if merged is not None and merged[0] is inputs[0] and merged[1] is inputs[1] \
                and merged[2] == inputs[2]:
            return  # nothing changed since the last merge (the usual reload)
        self._merged_from = inputs
        if any(t not in self._file_topics for t in dirs):
            self._topics = {**dirs, **self._file_topics}  # the file wins where it says
        else:
            self._topics = self._file_topics
        widened = {t: n for t, n in self._written.items()
                   if (_queue_count_of(self._topics.get(t) or {}) or 0) < n}
        if widened:
            self._topics = {**self._topics, **{t: _topic_config(t, n) for t, n in widened.items()}}

    def get(self, topic: str) -> dict | None:
        return self.reload().get(topic)

    def cached_queue_count(self, topic: str) -> int | None:
        """The queue count of a topic this process has already seen, without a re-read."""
        cfg = self._topics.get(topic)
        return _queue_count_of(cfg) if cfg is not None else None

    def queue_count(self, topic: str) -> int | None:
        """The topic's queue count, or None for a topic the table does not know."""
        cfg = self.get(topic)
        return _queue_count_of(cfg) if cfg else None

    def names(self) -> list[str]:
        return sorted(self.reload())

    def create(self, topic: str, queue_count: int, now_ms: int) -> dict:
        """Add a topic (caller holds the write lock) and persist the table; a name outside
        the topic rules raises :class:`~store.base.errors.InvalidTopicError` (every path that
        creates a topic ends here)."""
        validate_topic(topic, allow_system=True)
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
        write_config(self.path, {"topicConfigTable": {**self._unnamed, **topics},
                                 "dataVersion": version})
        self._topics = self._file_topics = topics
        self._version = version
        self._stamp = self._file_stamp()


    def widen(self, counts: dict[str, int], now_ms: int) -> list[str]:
        """Raise the queue count of topics to at least ``counts[topic]`` (a repair found
        records in those queues; the caller holds the write lock); return the topics changed."""
        topics = dict(self.reload(force=True))
        changed = []
        for topic, count in counts.items():
            if not is_valid_topic_name(topic):
                continue  # (recovery checks names read back; a table never takes a bad one)
            cfg = topics.get(topic)
            if cfg is None or (_queue_count_of(cfg) or 0) < count:
                topics[topic] = _topic_config(topic, count)
                changed.append(topic)
        if changed:
            self._write(topics, now_ms)
            self._merge()
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
