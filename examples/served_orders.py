"""The demo's order time-outs against a served store (``rmq serve --listen``): the order
service, the payment service and the Spark job reach the store only by its URL.

Run on one machine::

    rmq serve --store /tmp/rmq-served --create --listen 127.0.0.1:7911 --token-file token.txt &
    python examples/served_orders.py rmq://127.0.0.1:7911 token.txt

or, served over TLS (``--tls-cert cert.pem --tls-key key.pem``), with the certificate that
signs the server's as a third argument::

    python examples/served_orders.py rmqs://127.0.0.1:7911 token.txt cert.pem

Without arguments it starts a server of its own on a free loopback port.  Each order gets a
delayed "close if unpaid" message; a third of them are paid (transactional messages,
committed) before their time-out; a streaming query reads time-outs and payments through
``rmq://`` and closes every unpaid order exactly once, never before its time-out.

Run it any number of times against one server: each run reads from where the topics ended
when it started (its own orders, payments and closings), and removes its checkpoint.
"""

import json
import sys
import tempfile
import time

from store import (
    AuthenticationError,
    LocalTransactionState,
    Message,
    RemoteError,
    StoreServer,
    connect,
)

ORDERS = 60
TIMEOUT_MS = 1500


class Payments:
    """The payment service's local transaction: charge the card, then commit."""

    def execute_local_transaction(self, message, arg):
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, view):
        return LocalTransactionState.COMMIT_MESSAGE


def main(spark=None, url=None, token=None, tls_root_certs=None):
    from _session import local_spark

    server = None
    if url is None:  # a server of our own, as `rmq serve --listen 127.0.0.1:0` would be
        token = "example-token"
        server = StoreServer(tempfile.mkdtemp(prefix="rmq-served-"), listen="127.0.0.1:0",
                             token=token)
        url = server.url
    spark = spark or local_spark()
    try:
        return _run(spark, url, {"token": token, "tls_root_certs": tls_root_certs})
    finally:
        if server is not None:
            server.close()


def _wait_until_served(url, access, timeout_s=60.0):
    """Wait for a server just started (``rmq serve ... &``) to answer; a wrong token fails
    at once."""
    deadline = time.time() + timeout_s
    while True:
        try:
            with connect(url, timeout_s=5, **access) as remote:
                remote.topics()
            return
        except AuthenticationError:
            raise
        except RemoteError:
            if time.time() > deadline:
                raise
            time.sleep(0.5)


def _run(spark, url, access):
    """``access``: the keyword arguments of ``connect`` (token, TLS roots)."""
    from _session import offsets_now

    # the same, as the Spark source's options
    options = {k: v for k, v in (("token", access["token"]),
                                 ("tlsRootCerts", access["tls_root_certs"])) if v}
    _wait_until_served(url, access)
    with connect(url, **access) as remote:
        start = offsets_now(remote, ["payments", "order_timeouts"])  # this run's come after
        closings = offsets_now(remote, ["closed_orders"])
        orders = remote.producer("order-service")
        payments = remote.transaction_producer("pay-service", Payments())
        for i in range(ORDERS):
            oid = f"o-{i}"
            orders.send(Message("order_timeouts", json.dumps({"order": oid}).encode(),
                                tags="close_if_unpaid", keys=oid), delay_ms=TIMEOUT_MS)
            if i % 3 == 0:
                payments.send_in_transaction(Message("payments", b"paid", keys=oid))
    started = time.time()
    paid, closed, early = set(), {}, []

    def handle(df, batch_id):
        now_ms = time.time_ns() // 1_000_000
        rows = df.select("topic", "keys", "deliver_timestamp").collect()
        paid.update(r["keys"][0] for r in rows if r["topic"] == "payments")
        to_close = []
        for r in rows:
            if r["topic"] != "order_timeouts":
                continue
            oid = r["keys"][0]
            if now_ms < int(r["deliver_timestamp"].timestamp() * 1000):
                early.append(oid)
            if oid not in paid and oid not in closed:
                closed[oid] = 1
                to_close.append(oid)
        if to_close:
            with connect(url, **access) as remote:
                remote.producer("order-closer").send_batch(
                    [Message("closed_orders", oid.encode(), keys=oid) for oid in to_close])

    unpaid = {f"o-{i}" for i in range(ORDERS) if i % 3}
    with tempfile.TemporaryDirectory(prefix="rmq-chk-") as checkpoint:
        query = (spark.readStream.format("rmq").option("subscribe", "payments,order_timeouts")
                 .option("startingOffsets", start).options(**options).load(url)
                 .writeStream.foreachBatch(handle).option("checkpointLocation", checkpoint)
                 .trigger(processingTime="250 milliseconds").start())
        while set(closed) != unpaid and time.time() < started + 120 and query.isActive:
            time.sleep(0.2)
        failed = query.exception()  # a query that died says why, not what it left undone
        query.stop()
    if failed is not None:
        raise failed
    closed_rows = (spark.read.format("rmq").option("subscribe", "closed_orders")
                   .option("startingOffsets", closings).options(**options).load(url)
                   .select("body").collect())
    result = {"closed": len(closed_rows), "distinct": len({bytes(r.body) for r in closed_rows}),
              "unpaid": len(unpaid), "early": len(early)}
    print(f"served at {url}: {result['closed']} unpaid orders closed once each, "
          f"{len(paid)} paid, {len(early)} early")
    assert result["closed"] == result["distinct"] == len(unpaid) and not early, result
    return result


if __name__ == "__main__":
    token_arg = None
    if len(sys.argv) > 2:
        with open(sys.argv[2]) as fh:
            token_arg = fh.readline().strip()
    main(url=sys.argv[1] if len(sys.argv) > 1 else None, token=token_arg,
         tls_root_certs=sys.argv[3] if len(sys.argv) > 3 else None)
