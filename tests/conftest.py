"""Shared fixtures: a controllable clock, small-segment stores, one local Spark session."""

from __future__ import annotations

import os
from pathlib import Path
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading

import pytest

from store import MessageStore, StoreConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class FakeClock:
    """A clock tests move by hand (epoch ms); thread-safe; callable like ``system_clock``."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._now = start_ms
        self._lock = threading.Lock()

    def __call__(self) -> int:
        with self._lock:
            return self._now

    def advance(self, ms: int) -> int:
        with self._lock:
            self._now += ms
            return self._now

    def set(self, ms: int) -> None:
        with self._lock:
            self._now = ms


def load_tool(name: str):
    """The script ``tools/<name>.py`` as a module (registered in ``sys.modules``, since its
    dataclasses look their module up); tests of the fuzzers and generators use it."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "tools",
                                                                     f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


SMALL = StoreConfig(commitlog_file_size_bytes=64 * 1024, consume_queue_file_entries=1000,
                    timer_precision_ms=100, timer_wheel_slots=4096, timer_roll_window_slots=1024,
                    timer_log_file_size_bytes=64 * 1024,
                    schedule_min_interval_ms=100,  # tests fire schedules every 100 ms
                    max_hash_slot_num=512, max_index_num=2048,  # index files of 43 KB
                    message_index_enable=True)  # (off by default: tests keep it exercised)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(autouse=True)
def round_robin_from_queue_0(monkeypatch):
    """Round robins start at queue 0 in tests (at random otherwise), so that two stores
    fed the same sends can be compared record by record; tests of the random start undo it
    with ``monkeypatch.undo()``."""
    from store.core import appender

    monkeypatch.setattr(appender, "round_robin_start", lambda: 0)


@pytest.fixture
def small_config() -> StoreConfig:
    return SMALL


@pytest.fixture
def store_path(tmp_path) -> str:
    return str(tmp_path / "store")


@pytest.fixture(params=["fresh", "reopened"])
def store(request, store_path, clock):
    """A small-segment store on a fake clock; the "reopened" variant was closed and reopened."""
    s = MessageStore.open(store_path, SMALL, clock=clock)
    if request.param == "reopened":
        s.producer("warmup").send(__import__("store").Message("warmup", b"w"))
        s.close()
        s = MessageStore.open(store_path, SMALL, clock=clock)
    yield s
    s.close()


@pytest.fixture(scope="session", autouse=True)
def _temp_files_under_basetemp(tmp_path_factory):
    """Every temporary file of the run (stores made by tempfile, warm-ups, notebooks, Spark's
    local dirs, subprocesses) goes under pytest's base directory, which pytest removes after a
    passing run: nothing piles up in the machine's /tmp."""
    root = tmp_path_factory.mktemp("tmp", numbered=False)
    names = ("TMPDIR", "SPARK_LOCAL_DIRS")  # the second for the JVMs of subprocesses
    old_env, old_tempdir = {n: os.environ.get(n) for n in names}, tempfile.tempdir
    os.environ.update(dict.fromkeys(names, str(root)))
    tempfile.tempdir = str(root)
    yield root
    tempfile.tempdir = old_tempdir
    for name, value in old_env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="session")
def fresh_dir(tmp_path_factory):
    """A new directory per hypothesis example, removing the previous one of the same prefix.

    Every store holds a fully allocated 38 MB timer wheel; kept for every example, a suite run
    would leave gigabytes behind. The previous example's store is closed by then.
    """
    last: dict[str, Path] = {}

    def make(prefix: str) -> Path:
        old = last.pop(prefix, None)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        last[prefix] = path = tmp_path_factory.mktemp(prefix)
        return path

    yield make
    for path in last.values():
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def spark(_spark_session):
    """The suite's one Spark session, made the JVM's active session of the thread that serves
    this test's calls.  Spark finds a Python data source (``format("rmq")``) through the
    active session of the JVM thread a call runs on; py4j gives the Python thread a new JVM
    thread (with no active session) whenever its connection is replaced, and a lookup there
    fails with DATA_SOURCE_NOT_FOUND (seen twice in CI, in a test that had not changed)."""
    return active_spark(_spark_session)


def active_spark(session):
    """``session``, made the active session of the JVM thread serving this Python thread
    (module-scoped fixtures take the session through this, see the ``spark`` fixture)."""
    from pyspark.sql import SparkSession

    SparkSession._get_j_spark_session_class(session._jvm).setActiveSession(
        session._jsparkSession)
    return session


@pytest.fixture(scope="session")
def _spark_session(tmp_path_factory):
    """One local[2] Spark session for the whole suite (quiet logs, this interpreter's Python)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # workers must import store, rmq_source and pyspark_rmq even without an install
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p)
    from pyspark.sql import SparkSession

    log4j = tmp_path_factory.mktemp("log4j") / "log4j2.properties"
    log4j.write_text("rootLogger.level = error\nrootLogger.appenderRef.stdout.ref = console\n"
                     "appender.console.type = Console\nappender.console.name = console\n"
                     "appender.console.layout.type = PatternLayout\n"
                     "appender.console.layout.pattern = %d %p %c: %m%n\n")
    warehouse = tmp_path_factory.mktemp("warehouse")
    session = (
        SparkSession.builder.master("local[2]").appName("rmq-tests")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.warehouse.dir", str(warehouse))
        .config("spark.driver.extraJavaOptions",
                f"-Dlog4j2.configurationFile=file:{log4j} -Djava.io.tmpdir={tempfile.gettempdir()}")
        .config("spark.local.dir", tempfile.gettempdir())
        .config("spark.sql.streaming.numRecentProgressUpdates", "1000")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


ROCKETMQ_TARBALL = os.path.join(ROOT, "tests", "fixtures", "rocketmq-4.9.8", "stores.tar.gz")


@pytest.fixture(scope="session")
def rocketmq_root(tmp_path_factory) -> str:
    """The fixtures extracted once, as sparse files (the queue files are mostly zeros)."""
    raw = tmp_path_factory.mktemp("rocketmq-raw")
    with tarfile.open(ROCKETMQ_TARBALL) as tar:
        try:
            tar.extractall(raw, filter="data")
        except TypeError:  # Python before 3.10.12 has no extraction filters
            tar.extractall(raw)  # noqa: S202 - our own fixture
    sparse = str(tmp_path_factory.mktemp("rocketmq")) + "/stores"
    subprocess.run(["cp", "-r", "--sparse=always", str(raw), sparse], check=True)
    shutil.rmtree(raw)
    return sparse


def pytest_collection_modifyitems(config, items):
    """The long tests (marker ``slow``) run first: under ``-n 2`` (pytest-xdist) each worker
    starts one of them while the short ones fill the gaps, instead of a long one starting
    last while the other worker idles.  Each worker starts its own Spark session for the
    tests that ask for it (xdist's ``xdist_group`` no longer holds them on one worker since
    pytest 9.2 changed how node ids are stored)."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
