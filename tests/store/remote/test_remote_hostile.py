"""The Flight face against a hostile or careless client: malformed Arrow, bad names, streams
cut off half-way, requests too large; the server (a process of its own, so that a crash
would show) answers each with a typed error and keeps serving."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pytest
from pyarrow import flight

from store import Message, connect, server_status
from store.base.remote_address import RemoteAddress
from store.remote.wire import END_OF_ROWS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
TOKEN = "hostile-test-token"
SECRET = b"HEAP-SECRET-" * 4  # bytes the bad offsets could reach if they were followed


def serve(path, token_file, *extra):
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.Popen([sys.executable, "-m", "rmq_cli.cli", "serve", "--create", "--store", path,
                             "--listen", "127.0.0.1:0", "--token-file", str(token_file),
                             "--log-level", "WARNING", *extra],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while True:
        status = server_status(path)
        if status and status.get("pid") == proc.pid and status.get("listen"):
            return proc, status["listen"]
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, status
        time.sleep(0.05)


def stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    base = tmp_path_factory.mktemp("hostile")
    token_file = base / "token"
    token_file.write_text(TOKEN + "\n")
    path = str(base / "s")
    proc, url = serve(path, token_file, "--max-request-mib", "8")
    yield proc, url, path
    stop(proc)


def client_of(url):
    return flight.connect(RemoteAddress.parse(url).location)


def options(timeout=20):
    return flight.FlightCallOptions(timeout=timeout, headers=[
        (b"authorization", f"Bearer {TOKEN}".encode())])


def bad_strings(n=4) -> pa.Array:
    """A string column whose middle offsets point far past its 8-byte buffer (the last one
    inside it, so Arrow's cheap checks pass)."""
    offsets = np.array([0, 2, 1 << 20, 1 << 24] + [8] * (n - 3), np.int32)[:n + 1]
    data = pa.py_buffer(b"abcdefgh")
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), data])


def bad_table(column="body") -> pa.Table:
    n = 4
    good = pa.array(["t"] * n)
    cols = {"topic": good, "body": pa.array([b"x"] * n)}
    cols[column] = bad_strings(n)
    return pa.table(cols)


def put(client, command: dict, table: pa.Table, *, end=True):
    writer, answers = client.do_put(flight.FlightDescriptor.for_command(
        json.dumps(command).encode()), table.schema, options())
    try:
        writer.write_table(table)
        if end:
            writer.write_metadata(json.dumps({END_OF_ROWS: table.num_rows}).encode())
        writer.done_writing()
        answer = answers.read()
    finally:
        writer.close()
    return answer


def exchange(client, command: dict, table: pa.Table):
    writer, reader = client.do_exchange(flight.FlightDescriptor.for_command(
        json.dumps(command).encode()), options())
    try:
        writer.begin(table.schema)
        writer.write_table(table)
        writer.write_metadata(json.dumps({END_OF_ROWS: table.num_rows}).encode())
        writer.done_writing()
        return reader.read_all()
    finally:
        writer.close()


def alive(proc, url, path):
    assert proc.poll() is None, proc.communicate()
    with connect(url, token=TOKEN, timeout_s=20) as remote:
        remote.producer("g").send(Message("alive", b"still here"))


def stored_bodies(url, topic):
    with connect(url, token=TOKEN, timeout_s=20) as remote:
        remote.refresh()
        if topic not in remote.topics():
            return []
        out = []
        for q in remote.queue_ids(topic):
            out += remote.read_arrow(topic, q, remote.min_offset(topic, q),
                                     remote.max_offset(topic, q)).column("body").to_pylist()
        return out


@pytest.mark.parametrize("column", ["body", "topic"])
@pytest.mark.parametrize("call", ["check_table", "sink_stage", "send_table", "replace_table"])
def test_crafted_offsets_are_refused_typed_and_the_server_lives(server, call, column):
    proc, url, path = server
    client = client_of(url)
    table = bad_table(column).drop_columns(["topic"]) if column == "body" else bad_table(column)
    topic = {"topic": "victim"} if column == "body" else {}
    with pytest.raises(flight.FlightServerError) as info:
        if call in ("check_table", "sink_stage"):
            put(client, {"op": call, "group": "g", "sink_id": "s1", **topic}, table)
        else:
            exchange(client, {"op": call, "group": "g", **topic}, table)
    payload = json.loads(bytes(info.value.extra_info))
    assert payload["type"] == "InvalidRequest" and "malformed" in payload["message"]
    assert SECRET not in bytes(info.value.extra_info) and b"HEAP" not in str(info.value).encode()
    alive(proc, url, path)
    assert stored_bodies(url, "victim") == []


def test_a_local_table_with_crafted_offsets_never_reaches_a_kernel(tmp_path):
    """The wrapper that hands Arrow buffers to the compiled loops checks their offsets, for
    local callers too (no network, no full validation on the way)."""
    from store import InvalidMessageError, MessageStore
    from store.formats.byte_columns import ByteColumn

    with pytest.raises(InvalidMessageError, match="offsets outside their buffer"):
        ByteColumn.from_arrow(bad_strings())
    store = MessageStore.open(str(tmp_path / "s"))
    try:
        for column in ("body", "topic"):
            with pytest.raises(InvalidMessageError, match="offsets outside"):
                store.producer("g").send_table(bad_table(column))
        assert store.topics() == []
    finally:
        store.close()


def _fds(pid) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.mark.slow
def test_open_files_stay_flat_across_50_bursts_of_64_calls(server):
    """Reads borrow a reader from a small pool: bursts of concurrent calls (new server
    threads each time) leave no reader open behind them."""
    from concurrent.futures import ThreadPoolExecutor

    proc, url, _ = server
    with connect(url, token=TOKEN, timeout_s=20) as remote:
        remote.producer("g").send_table(pa.table({
            "body": [b"x"] * 100, "queue_id": pa.array([i % 4 for i in range(100)], pa.int32())}),
            topic="burst")

    def call(i):
        with connect(url, token=TOKEN, timeout_s=20) as remote:
            if i % 2:
                return remote.read_arrow("burst", i % 4, 0, 10).num_rows
            remote.refresh()
            return len(remote.topics())

    counts = []
    with ThreadPoolExecutor(64) as pool:
        for burst in range(50):
            list(pool.map(call, range(64)))
            counts.append(_fds(proc.pid))
    assert proc.poll() is None
    warm = max(counts[:5])
    assert max(counts[5:]) <= warm + 16, counts


_HALFWAY_CLIENT = r"""
import json, sys, time
import pyarrow as pa
from pyarrow import flight
location, token, op = sys.argv[1:4]
client = flight.connect(location)
options = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {token}".encode())])
command = flight.FlightDescriptor.for_command(json.dumps(
    {"op": op, "group": "g", "sink_id": "half", "topic": "halfway"}).encode())
batch = pa.record_batch({"body": pa.array([b"row-%d" % i for i in range(1000)])})
if op == "send_table":
    writer, _ = client.do_exchange(command, options)
    writer.begin(batch.schema)
else:
    writer, _ = client.do_put(command, batch.schema, options)
for _ in range(3):
    writer.write_batch(batch)
print("sent", flush=True)
time.sleep(600)  # killed here: no end marker, no done_writing
"""


@pytest.mark.parametrize("op", ["send_table", "sink_stage"])
def test_a_client_killed_mid_stream_stores_nothing(server, op):
    proc, url, path = server
    env = dict(os.environ, PYTHONPATH=ROOT)
    child = subprocess.Popen([sys.executable, "-c", _HALFWAY_CLIENT,
                              RemoteAddress.parse(url).location, TOKEN, op],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert child.stdout.readline().strip() == b"sent", child.stderr.read()
        time.sleep(0.5)  # the batches are at the server
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    time.sleep(1.0)  # the server sees the stream end
    alive(proc, url, path)
    assert stored_bodies(url, "halfway") == []
    with connect(url, token=TOKEN, timeout_s=20) as remote:
        assert remote.sink("half").open_halves() == []


def test_an_upload_past_the_bound_is_refused_before_it_is_all_sent(server):
    """The server (bound: 8 MiB here) refuses a 64 MiB stream as soon as it passes the
    bound; the client's writes fail long before the end, and the server's memory stays
    flat."""
    proc, url, path = server
    client = client_of(url)

    def rss_kib():
        with open(f"/proc/{proc.pid}/status") as fh:
            return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS"))

    with connect(url, token=TOKEN, timeout_s=20) as remote:  # the kernels loaded first
        remote.producer("g").send_table(pa.table({"body": [b"w"] * 10}), topic="warm")
    before, deadline = rss_kib(), time.monotonic() + 30
    while time.monotonic() < deadline:  # until the server's background warm-up is done
        time.sleep(0.5)
        now = rss_kib()
        if abs(now - before) < 2048:
            break
        before = now
    batch = pa.record_batch({"body": pa.array([b"z" * 1024] * 1024)})  # 1 MiB
    writer, reader = client.do_exchange(flight.FlightDescriptor.for_command(json.dumps(
        {"op": "send_table", "group": "g", "topic": "toolarge"}).encode()), options())
    written = 0
    with pytest.raises(flight.FlightError) as info:
        writer.begin(batch.schema)
        for _ in range(64):
            writer.write_batch(batch)
            written += 1
        writer.write_metadata(json.dumps({END_OF_ROWS: 64 * 1024}).encode())
        writer.done_writing()
        reader.read_all()
    assert written < 64 and "RequestTooLarge" in str(getattr(info.value, "extra_info", b""))
    try:
        writer.close()
    except flight.FlightError:
        pass
    assert rss_kib() - before < 64 * 1024
    alive(proc, url, path)
    assert stored_bodies(url, "toolarge") == []
