"""Fuzz the Arrow Flight face (``rmq serve --listen``) with what a hostile or broken client
sends, and check the server holds.

Starts ``rmq serve --listen 127.0.0.1:0`` on a fresh store in a process of its own, stores
one *canary* message (a random body the fuzzer never sends again), then sends generated
requests:

* tables of malformed Arrow: string / binary columns whose offsets point anywhere (past the
  buffer, backwards, negative) over random data; columns of types no call takes (nested
  lists, structs, unions, floats, dictionaries of binary); many columns, repeated names;
  all through ``DoPut`` (a sink's stage, a dry run) and ``DoExchange`` (send_table,
  replace_table, schedule_table), with and without the end marker;
* garbage commands and tickets (random bytes, JSON of the wrong shape, unknown ops, huge
  numbers, names with NUL or 200 KB);
* garbage actions (unknown types, random bodies).

Each answer is judged: the server process is alive; an error is a Flight error, and one
the server raised carries a typed ``extra_info`` (a :class:`~store.base.errors.StoreError`
subclass name); no answer or error text holds the canary (bytes the request did not send).
At the end, the canary is stored once and nothing else holds it, and a plain send works.

Run ``python tools/fuzz_flight.py --seconds 600`` for a long run (exit 1 on any failure);
the test suite runs a bounded number of examples (``tests/store/remote/test_fuzz_flight.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
from hypothesis import strategies as st
from pyarrow import flight

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from store import Message, connect, server_status
from store.base.remote_address import RemoteAddress

TOKEN = "fuzz-flight-token"
#: Names a table column may have (the calls' own, and a few others).
COLUMN_NAMES = ["body", "topic", "tags", "keys", "properties", "key", "delay_ms", "queue_id",
                "value", "cron", "every_ms", "x"]
PUT_OPS = ["sink_stage", "check_table"]
#: A name far past every length rule (the name tests send 200 KB ones).
LONG_NAME = "n" * 5000
EXCHANGE_OPS = ["send_table", "replace_table", "schedule_table"]


# ---------------------------------------------------------------------- what is sent
@st.composite
def crafted_strings(draw) -> pa.Array:
    """A string or binary column over random bytes whose offsets are anything: middle ones
    past the buffer or falling (the first and last kept inside it, so that Arrow's cheap
    checks pass), or any at all."""
    n = draw(st.integers(2, 12))
    data = draw(st.binary(min_size=1, max_size=64))
    mode = draw(st.sampled_from(["past", "falling", "any"]))
    if mode == "any":
        offsets = draw(st.lists(st.integers(-(1 << 31), (1 << 31) - 1), min_size=n + 1,
                                max_size=n + 1))
    else:
        middle = draw(st.lists(st.integers(len(data) + 1, (1 << 31) - 1) if mode == "past"
                               else st.integers(0, len(data)), min_size=n - 1, max_size=n - 1))
        if mode == "falling":
            middle = sorted(middle, reverse=True)
        offsets = [0, *middle, len(data)]
    kind = draw(st.sampled_from([pa.string(), pa.binary()]))
    try:
        return pa.Array.from_buffers(kind, n, [None, pa.py_buffer(np.array(offsets, np.int32)),
                                               pa.py_buffer(data)])
    except (pa.ArrowException, ValueError):
        return pa.array([b"x"] * n, pa.binary())


def _odd_array(kind: str, n: int) -> pa.Array:
    if kind == "nested":
        return pa.array([[[i]] for i in range(n)])
    if kind == "struct":
        return pa.array([{"a": i, "b": "x"} for i in range(n)])
    if kind == "float":
        return pa.array([float(i) for i in range(n)])
    if kind == "dict_binary":
        return pa.array([b"a", b"b"] * n, pa.binary()).slice(0, n).dictionary_encode()
    if kind == "union":
        return pa.UnionArray.from_sparse(pa.array([0] * n, pa.int8()),
                                         [pa.array(list(range(n)))])
    if kind == "map_int":
        return pa.array([[(1, 2)]] * n, pa.map_(pa.int32(), pa.int32()))
    return pa.array(["t"] * n)  # "plain": a valid string column


@st.composite
def tables(draw) -> pa.Table:
    """A table of 1 to 6 columns, each crafted, of an odd type, or plain."""
    n = draw(st.integers(1, 12))
    names = draw(st.lists(st.sampled_from(COLUMN_NAMES), min_size=1, max_size=6))
    columns = []
    for _ in names:
        choice = draw(st.sampled_from(["crafted", "nested", "struct", "float", "dict_binary",
                                       "union", "map_int", "plain"]))
        columns.append(draw(crafted_strings()) if choice == "crafted" else _odd_array(choice, n))
    length = min(len(a) for a in columns)
    try:
        return pa.Table.from_arrays([a.slice(0, length) for a in columns], names=names)
    except (pa.ArrowException, ValueError):  # Arrow's cheap checks caught it already
        return pa.table({"body": [b"x"] * n})


def _names():
    return st.one_of(st.sampled_from(["t", "orders", "/etc/passwd", "a\x00b", LONG_NAME, "",
                                      "..", "rmq_sys_x"]), st.text(max_size=20))


def commands(ops):
    """A descriptor command: mostly a well-formed call (so that the table is read), else
    odd fields or garbage."""
    good = st.fixed_dictionaries({"op": st.sampled_from(ops), "group": st.just("g"),
                                  "sink_id": st.just("s")},
                                 optional={"topic": st.just("t")})
    odd = st.fixed_dictionaries({"op": st.sampled_from(ops)}, optional={
        "group": _names(), "topic": _names(), "sink_id": _names(),
        "queue_id": st.integers(-(1 << 63), (1 << 63) - 1)})
    return st.one_of(good.map(lambda b: json.dumps(b).encode()),
                     good.map(lambda b: json.dumps(b).encode()),
                     good.map(lambda b: json.dumps(b).encode()),
                     odd.map(lambda b: json.dumps(b).encode()), st.binary(max_size=64),
                     st.sampled_from([b"[]", b"null", b"{}", b'{"op": 1}']))


tickets = st.one_of(
    st.fixed_dictionaries({"op": st.sampled_from(["read", "query_round", "server_round", "x"])},
                          optional={"topic": _names(),
                                    "queue_id": st.integers(-(1 << 63), (1 << 63) - 1),
                                    "start": st.integers(-(1 << 63), (1 << 63) - 1),
                                    "end": st.integers(-(1 << 63), (1 << 63) - 1),
                                    "columns": st.lists(st.text(max_size=8), max_size=3),
                                    "round": st.integers(-5, 5), "stream": _names()}
                          ).map(lambda b: json.dumps(b).encode()),
    st.binary(max_size=64))
actions = st.tuples(
    st.one_of(st.sampled_from(["send", "send_batch", "ensure_topic", "cancel", "schedule",
                               "end_transactions", "sink_commit", "snapshot", "nope"]),
              st.text(max_size=10)),
    st.one_of(st.dictionaries(st.sampled_from(["group", "topic", "message", "key", "items",
                                               "sink_id", "batch_id", "transactions"]),
                              st.one_of(_names(), st.integers(), st.lists(st.integers()),
                                        st.none()), max_size=4
                              ).map(lambda b: json.dumps(b).encode()),
              st.binary(max_size=64)))

cases = st.one_of(
    st.tuples(st.just("put"), commands(PUT_OPS), tables(), st.booleans()),
    st.tuples(st.just("exchange"), commands(EXCHANGE_OPS), tables(), st.booleans()),
    st.tuples(st.just("get"), tickets),
    st.tuples(st.just("action"), actions),
)


# ---------------------------------------------------------------------- the server
class FlightTarget:
    """A served store under fuzzing: ``rmq serve`` in a process of its own."""

    def __init__(self, workdir: str) -> None:
        self.path = os.path.join(workdir, "store")
        token_file = os.path.join(workdir, "token")
        with open(token_file, "w") as fh:
            fh.write(TOKEN + "\n")
        env = dict(os.environ, PYTHONPATH=ROOT)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rmq_cli.cli", "serve", "--create", "--store", self.path, "--listen",
             "127.0.0.1:0", "--token-file", token_file, "--log-level", "ERROR",
             "--max-request-mib", "16"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while True:
            status = server_status(self.path)
            if status and status.get("pid") == self.proc.pid and status.get("listen"):
                self.url = status["listen"]
                break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"rmq serve did not start: {self.proc.communicate()}")
            time.sleep(0.05)
        self.client = flight.connect(RemoteAddress.parse(self.url).location)
        self.options = flight.FlightCallOptions(timeout=20, headers=[
            (b"authorization", f"Bearer {TOKEN}".encode())])
        self.canary = b"CANARY-" + secrets.token_hex(24).encode()
        with connect(self.url, token=TOKEN) as remote:
            remote.producer("g").send(Message("canary", self.canary))

    def close(self) -> None:
        self.client.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    # ------------------------------------------------------------------ one case
    def run(self, case) -> list[str]:
        """Send one case; the problems found (none: the server held)."""
        problems = []
        answer = b""
        try:
            answer = self._send(case)
        except flight.FlightError as exc:
            problems += self._judge_error(exc)
        except (pa.ArrowException, ValueError, OSError):
            pass  # the client itself refused to write what it was given
        if self.canary in answer:
            problems.append("an answer holds the canary")
        if self.proc.poll() is not None:
            problems.append(f"the server died (exit {self.proc.returncode})")
        return problems

    def _send(self, case) -> bytes:
        kind = case[0]
        if kind == "get":
            return b"".join(b.serialize().to_pybytes() for b in self.client.do_get(
                flight.Ticket(case[1]), self.options).read_all().to_batches())
        if kind == "action":
            name, body = case[1]
            return b"".join(r.body.to_pybytes() for r in self.client.do_action(
                flight.Action(name, body), self.options))
        _, command, table, end = case
        descriptor = flight.FlightDescriptor.for_command(command)
        marker = json.dumps({"end": table.num_rows}).encode()
        if kind == "put":
            writer, answers = self.client.do_put(descriptor, table.schema, self.options)
            try:
                writer.write_table(table)
                if end:
                    writer.write_metadata(marker)
                writer.done_writing()
                got = answers.read()
            finally:
                writer.close()
            return b"" if got is None else got.to_pybytes()
        writer, reader = self.client.do_exchange(descriptor, self.options)
        try:
            writer.begin(table.schema)
            writer.write_table(table)
            if end:
                writer.write_metadata(marker)
            writer.done_writing()
            out = reader.read_all()
        finally:
            writer.close()
        return b"".join(b.serialize().to_pybytes() for b in out.to_batches())

    def _judge_error(self, exc: flight.FlightError) -> list[str]:
        problems = []
        if self.canary in str(exc).encode("utf-8", "surrogateescape"):
            problems.append("an error text holds the canary")
        info = getattr(exc, "extra_info", b"") or b""
        if self.canary in bytes(info):
            problems.append("an error's extra_info holds the canary")
        if isinstance(exc, flight.FlightInternalError):
            problems.append(f"an untyped internal error: {str(exc)[:200]}")
        elif isinstance(exc, flight.FlightServerError) and info:
            try:
                kind = json.loads(bytes(info))["type"]
            except (ValueError, KeyError, TypeError):
                problems.append(f"extra_info is not a typed error: {bytes(info)[:100]!r}")
            else:
                if not (isinstance(kind, str) and kind.endswith(("Error", "Request", "Large",
                                                                 "Overloaded"))):
                    problems.append(f"unknown error type {kind!r}")
        return problems

    def final_problems(self) -> list[str]:
        """After the cases: the canary stored once, nothing else holds it, sends work."""
        problems = []
        if self.proc.poll() is not None:
            return [f"the server died (exit {self.proc.returncode})"]
        with connect(self.url, token=TOKEN, timeout_s=30) as remote:
            remote.producer("g").send(Message("after", b"still serving"))
            remote.refresh()
            found = 0
            for topic in remote.topics():
                for q in remote.queue_ids(topic):
                    lo, hi = remote.min_offset(topic, q), remote.max_offset(topic, q)
                    if hi > lo:
                        found += sum(self.canary in b for b in remote.read_arrow(
                            topic, q, lo, hi).column("body").to_pylist())
        if found != 1:
            problems.append(f"the canary is stored {found} times; allowed: once")
        return problems


def main() -> int:
    from hypothesis import HealthCheck, given, settings

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=300.0)
    args = parser.parse_args()
    failures: list = []
    with tempfile.TemporaryDirectory() as workdir:
        target = FlightTarget(workdir)
        deadline = time.monotonic() + args.seconds
        sent = [0]

        @settings(max_examples=200, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(cases)
        def fuzz(case):
            sent[0] += 1
            problems = target.run(case)
            if problems:
                failures.append((case[:2], problems))

        try:
            while time.monotonic() < deadline and not failures:
                fuzz()  # rounds of 200 fresh random examples until the time is up
            failures += [(None, p) for p in target.final_problems()]
        finally:
            target.close()
    print(f"fuzz_flight: {sent[0]} requests sent; {len(failures)} failure(s)")
    for case, problems in failures[:20]:
        print(f"  {problems} <- {str(case)[:300]}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
