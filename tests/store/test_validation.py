"""Validation: every refusal is a typed StoreError naming the limit, and changes nothing."""

from __future__ import annotations

import pytest

from store import (InvalidBatchError, InvalidMessageError, InvalidTopicError, Message,
                   MessageStore, MessageTooLargeError, StoreError)

MIB = 1024 * 1024


@pytest.fixture
def store(store_path, small_config, clock):
    """One fresh store (the shared fixture's reopened variant adds nothing here)."""
    s = MessageStore.open(store_path, small_config, clock=clock)
    yield s
    s.close()


def snapshot(store):
    """What a refusal must not change: topics, max offsets, the CommitLog end."""
    topics = store.topics(include_system=True)
    return (topics, {(t, q): store.max_offset(t, q) for t in topics for q in store.queue_ids(t)},
            store.confirmed_offset())


def assert_unchanged(store, before, store_path, small_config, clock):
    assert snapshot(store) == before
    # still appendable, and the append lands right where the log ended
    r = store.producer("g").send(Message("ok", b"after"))
    assert r.commitlog_offset == before[2] or before[2] % small_config.commitlog_file_size_bytes
    assert store.pull("ok", r.queue_id, r.queue_offset)[0].body == b"after"
    store.close()
    with MessageStore.open(store_path, small_config, clock=clock) as again:
        assert again.pull("ok", r.queue_id, r.queue_offset)[0].body == b"after"
        for (t, q), m in before[1].items():
            assert again.max_offset(t, q) == m + (1 if (t, q) == ("ok", r.queue_id) else 0)


BAD_TOPICS = [
    ("", "non-blank"), ("   ", "non-blank"), (None, "non-blank"), ("a b", "characters"),
    ("../x", "characters"), ("x/../../etc", "characters"), ("/abs", "characters"),
    ("..", "characters"), (".", "characters"), ("a.b", "characters"), ("t\x00", "characters"),
    ("é", "characters"), ("t" * 128, "at most 127"),
    ("SCHEDULE_TOPIC_XXXX", "system topic"), ("RMQ_SYS_TRANS_HALF_TOPIC", "system topic"),
    ("RMQ_SYS_TRANS_OP_HALF_TOPIC", "system topic"), ("TRANS_CHECK_MAX_TIME_TOPIC", "system topic"),
    ("SELF_TEST_TOPIC", "system topic"), ("OFFSET_MOVED_EVENT", "system topic"),
    ("TBW102", "system topic"), ("rmq_sys_wheel_timer", "system topic"),
    ("rmq_sys_anything", "system topic"),
]


@pytest.mark.parametrize("topic, needle", BAD_TOPICS)
def test_bad_topics_are_refused(store, store_path, small_config, clock, topic, needle):
    before = snapshot(store)
    with pytest.raises(InvalidTopicError) as info:
        store.producer("g").send(Message(topic, b"x"))
    assert needle in str(info.value)
    with pytest.raises(InvalidTopicError):
        store.producer("g").send_batch([Message(topic, b"x")])
    assert_unchanged(store, before, store_path, small_config, clock)


def test_good_topic_names(store):
    p = store.producer("g")
    for topic in ("a", "A-b_c", "t" * 127, "%RETRY%grp", "a|b", "0123"):
        r = p.send(Message(topic, b"x"))
        assert store.pull(topic, r.queue_id, r.queue_offset)[0].topic == topic


@pytest.mark.parametrize("make, error, needle", [
    (lambda: Message("t", b""), InvalidMessageError, "empty"),
    (lambda: Message("t", "text"), InvalidMessageError, "must be bytes"),
    (lambda: Message("t", b"x" * (4 * MIB + 1)), MessageTooLargeError,
     "max_message_size_bytes=4194304"),
    (lambda: Message("t", b"x", properties={"p": "v" * 32767}), MessageTooLargeError, "32767"),
    (lambda: Message("t", b"x", properties={"KEYS": "k"}), InvalidMessageError, "reserved"),
    (lambda: Message("t", b"x", properties={"UNIQ_KEY": "k"}), InvalidMessageError, "reserved"),
    (lambda: Message("t", b"x", properties={"DELAY": "3"}), InvalidMessageError, "reserved"),
    (lambda: Message("t", b"x", properties={"__RMQ_DELIVER_MS": "3"}), InvalidMessageError,
     "reserved"),
    (lambda: Message("t", b"x", properties={"a\x01": "v"}), InvalidMessageError, "0x01 or 0x02"),
    (lambda: Message("t", b"x", properties={"a": "v\x02"}), InvalidMessageError, "0x01 or 0x02"),
    (lambda: Message("t", b"x", properties={" ": "v"}), InvalidMessageError, "blank"),
    (lambda: Message("t", b"x", properties={"a": ""}), InvalidMessageError, "blank"),
    (lambda: Message("t", b"x", properties={"a": " \t"}), InvalidMessageError, "blank"),
    (lambda: Message("t", b"x", properties={"a": 1}), InvalidMessageError, "must be str"),
    (lambda: Message("t", b"x", tags="a\x01"), InvalidMessageError, "0x01 or 0x02"),
    (lambda: Message("t", b"x", tags="a||b"), InvalidMessageError, "'|'"),
    (lambda: Message("t", b"x", tags=" "), InvalidMessageError, "blank"),
    (lambda: Message("t", b"x", keys=["a b"]), InvalidMessageError, "space"),
    (lambda: Message("t", b"x", keys="a \x02"), InvalidMessageError, "0x01 or 0x02"),
    (lambda: Message("t", b"x", keys=["k", 5]), InvalidMessageError, "must be a str"),
    (lambda: Message("t", b"x", flag=2**31), InvalidMessageError, "32-bit"),
    (lambda: "not a message", InvalidMessageError, "store.Message"),
])
def test_bad_messages_are_refused(store, store_path, small_config, clock, make, error, needle):
    before = snapshot(store)
    with pytest.raises(error) as info:
        store.producer("g").send(make())
    assert needle in str(info.value)
    assert isinstance(info.value, StoreError)
    # the same message inside a batch is refused too, with the same error
    with pytest.raises(error) as info:
        store.producer("g").send_batch([Message("t", b"fine"), make()])
    assert needle in str(info.value)
    assert_unchanged(store, before, store_path, small_config, clock)


def test_limits_are_inclusive(store):
    p = store.producer("g")
    big = Message("big", b"x" * (4 * MIB))
    # a 4 MiB body is allowed (it needs segments larger than the test store's 64 KiB)
    with pytest.raises(MessageTooLargeError) as info:
        p.send(big)
    assert "does not fit" in str(info.value)
    # properties: the whole properties string (user, TAGS, UNIQ_KEY) may be 32767 bytes
    props_overhead = len("UNIQ_KEY\x01\x02") + 32 + len("p\x01\x02")
    ok = Message("t", b"x", properties={"p": "v" * (32767 - props_overhead)})
    r = p.send(ok)
    assert store.pull("t", r.queue_id, r.queue_offset)[0].properties["p"] == ok.properties["p"]
    with pytest.raises(MessageTooLargeError):
        p.send(Message("t", b"x", properties={"p": "v" * (32768 - props_overhead)}))


def test_large_body_fits_a_large_segment(tmp_path):
    with MessageStore.open(tmp_path / "s", {"commitlog_file_size_bytes": 8 * MIB}) as s:
        r = s.producer("g").send(Message("big", b"y" * (4 * MIB)))
        assert s.pull("big", r.queue_id, r.queue_offset)[0].body == b"y" * (4 * MIB)


@pytest.mark.parametrize("make, error, needle", [
    (lambda: [], InvalidBatchError, "non-empty"),
    (lambda: (m for m in [Message("t", b"x")]), InvalidBatchError, "non-empty list"),
    (lambda: [Message("a", b"x"), Message("b", b"x")], InvalidBatchError, "one topic"),
    (lambda: [Message("%RETRY%g", b"x")], InvalidBatchError, "retry"),
    (lambda: [Message("%DLQ%g", b"x")], InvalidBatchError, "DLQ"),
    (lambda: [Message("t", b"x" * MIB) for _ in range(4)], MessageTooLargeError,
     "max_message_size_bytes=4194304"),
    (lambda: [Message("t", b"x"), "no"], InvalidMessageError, "store.Message"),
])
def test_bad_batches_are_refused(store, store_path, small_config, clock, make, error, needle):
    before = snapshot(store)
    with pytest.raises(error) as info:
        store.producer("g").send_batch(make())
    assert needle in str(info.value)
    assert_unchanged(store, before, store_path, small_config, clock)


def test_batch_size_rule_counts_rocketmqs_wire_size(tmp_path):
    """RocketMQ's batch size: per message 20 bytes + body + 2 + properties."""
    with MessageStore.open(tmp_path / "s", {"commitlog_file_size_bytes": 16 * MIB}) as s:
        p = s.producer("g")
        per_props = len("UNIQ_KEY\x01\x02") + 32
        body = 4 * MIB // 4 - 20 - 2 - per_props
        p.send_batch([Message("t", b"z" * body) for _ in range(4)])  # exactly 4 MiB
        with pytest.raises(MessageTooLargeError):
            p.send_batch([Message("t", b"z" * (body + 1))] + [Message("t", b"z" * body)] * 3)


def test_producer_group_is_validated(store):
    with pytest.raises(InvalidTopicError):
        store.producer("bad group")
    with pytest.raises(InvalidTopicError):
        store.producer("g" * 121)


def test_a_plainly_valid_batch_is_checked_column_by_column(store, monkeypatch):
    """The batch fast path: no per-message validation for an ordinary batch (and the same
    records as the per-message path)."""
    import store.produce.producer as producer_module

    def refuse(*_):
        raise AssertionError("per-message validation ran for a plainly valid batch")

    monkeypatch.setattr(producer_module, "validate_message", refuse)
    msgs = [Message("t", b"x" * (i + 1), tags=("a", None)[i % 2], keys=f"k{i} g{i % 3}",
                    properties={"p": str(i), "q": "v w"}) for i in range(50)]
    results = store.producer("g").send_batch(msgs)
    for m, r in zip(msgs, results):
        v = store.pull("t", r.queue_id, r.queue_offset)[0]
        assert (v.body, v.tags, v.keys, v.properties) == (m.body, m.tags, tuple(m.key_list()),
                                                           m.properties)


def _reference_verdict(message: Message):
    """The detailed checks alone (no shortcuts): the KEYS value, or the error type."""
    from store.formats.message import (check_tags, check_user_properties, keys_value,
                               validate_topic)
    try:
        validate_topic(message.topic)
        if not isinstance(message.body, (bytes, bytearray, memoryview)) or not message.body:
            raise InvalidMessageError("body")
        check_tags(message.tags)
        keys = keys_value(message.keys)
        check_user_properties(message.properties)
        return ("ok", keys)
    except StoreError as exc:
        return ("refused", type(exc))


_PIECES = ["a", "K", " ", "  ", "\t", "\x01", "\x02", "|", "é", "\u3000", "\n", "x y", ""]


def test_validate_message_shortcuts_agree_with_the_detailed_checks():
    """Seen-name caches and printable-text shortcuts never accept what the checks refuse
    (nor the reverse), however often a name comes back."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from store.formats.message import validate_message

    text = st.lists(st.sampled_from(_PIECES), max_size=4).map("".join)
    keys = st.none() | text | st.lists(text, max_size=3) | st.just(7)
    props = st.dictionaries(st.sampled_from(["p", "q", "TAGS", "k y"]) | text, text,
                            max_size=2) | st.just(["p"])

    @settings(max_examples=400, deadline=None)
    @given(topic=st.sampled_from(["t", "t t", "%RETRY%x"]), tags=st.none() | text, keys=keys,
           properties=props)
    def check(topic, tags, keys, properties):
        m = Message(topic, b"x", tags=tags, keys=keys, properties=properties)
        expected = _reference_verdict(m)
        for _ in range(2):  # the second time, caches are warm
            try:
                got = ("ok", validate_message(m, MIB))
            except StoreError as exc:
                got = ("refused", type(exc))
            assert got == expected, (m, got, expected)

    check()
