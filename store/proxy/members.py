"""The stores the gRPC endpoint serves (:class:`Member`: one store with the endpoint's
producers and consumer groups)."""

from __future__ import annotations

from ..produce.transaction_producer import LeaveOpen
from .consumers import ConsumerGroups

#: The producer group of the half messages sent through this endpoint (the check-back asks
#: the endpoint's producers about them, by topic, as RocketMQ's proxy does).
PRODUCER_GROUP = "rmq-grpc"


class Member:
    """One store the endpoint serves, with its producers and consumer groups."""

    def __init__(self, name: str, store) -> None:
        self.name = name
        self.store = store
        self.producer = store.producer(PRODUCER_GROUP)
        self.transactions = store.transaction_producer(PRODUCER_GROUP, LeaveOpen())
        self.groups = ConsumerGroups(store)
