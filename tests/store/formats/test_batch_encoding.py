"""``send_batch``'s column-wise encoding against single sends, record field by field."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from store import Message, MessageStore
from store.formats.batch_encoding import OnePair, properties_column
from store.formats.record_codec import encode_properties

NAMES = st.sampled_from(["p", "q", "ü", "a-long-property-name"])
VALUES = st.sampled_from(["1", "v", "✓", "two words"])
# each column drawn whole, so that uniform columns (one tag, one pair name, keys everywhere)
# come up as often as mixed ones: the encoder has a shortcut for each
TAGS = st.one_of(st.lists(st.sampled_from(["a", "标签"]), min_size=1, max_size=1),
                 st.lists(st.one_of(st.none(), st.sampled_from(["a", "b", "标签"]))))
KEYS = st.one_of(st.none(), st.sampled_from(["k1", "order-7"]),
                 st.lists(st.sampled_from(["k1", "k2", "key-3"]), max_size=3))
PROPS = st.one_of(st.just({}), st.dictionaries(NAMES, VALUES, min_size=1, max_size=1),
                  st.dictionaries(NAMES, VALUES, max_size=3))


def _fields(store, offset):
    rec = store.read_record(offset)
    props = dict(rec.properties)
    return (rec.topic, rec.body, rec.flag, rec.sys_flag, rec.born_timestamp_ms,
            rec.total_size, props.pop("UNIQ_KEY"), props)


@settings(max_examples=60, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 25), tags=TAGS, keys=st.lists(KEYS, min_size=1, max_size=25),
       props=st.lists(PROPS, min_size=1, max_size=25), same_name=st.booleans(),
       data=st.data())
def test_batch_records_equal_single_send_records(fresh_dir, small_config, clock, n,
                                                 tags, keys, props, same_name, data):
    if same_name:  # one pair per message, all with one name: the OnePair shape
        props = [{"p": v} for v in data.draw(st.lists(VALUES, min_size=n, max_size=n))]
    messages = [Message("orders", b"body-%d" % i, tags=tags[i % len(tags)] if tags else None,
                        keys=keys[i % len(keys)], properties=props[i % len(props)], flag=i)
                for i in range(n)]
    root = fresh_dir("batch")
    with MessageStore.open(str(root / "singles"), small_config, clock=clock) as s:
        p = s.producer("g")
        expected = [_fields(s, p.send(m).commitlog_offset) for m in messages]
    with MessageStore.open(str(root / "batch"), small_config, clock=clock) as s:
        results = s.producer("g").send_batch(messages)
        got = [_fields(s, r.commitlog_offset) for r in results]
        assert [g[6] for g in got] == [r.msg_id for r in results]
    strip = [g[:6] + g[7:] for g in got]
    assert strip == [e[:6] + e[7:] for e in expected]


@given(st.lists(st.tuples(st.one_of(st.none(), st.sampled_from(["a", "b"])),
                          st.one_of(st.none(), st.sampled_from(["k", "k1 k2"])),
                          VALUES), min_size=1, max_size=20), st.booleans())
def test_properties_column_matches_the_codec(rows, one_pair):
    """Every shape of the columns (one tag or many, keys everywhere or not, one pair name or
    general pairs) gives the bytes ``encode_properties`` gives the single-send dict."""
    ids = [f"{i:032X}" for i in range(len(rows))]
    tags, keys, values = (list(c) for c in zip(*rows))
    users = OnePair("p", values) if one_pair else [f"p\x01{v}\x02" for v in values]
    column = properties_column(users, tags, keys, ids)
    got = [column.data[a:b].tobytes() for a, b in zip(column.starts, column.ends)]
    assert len(got) == len(rows)
    for (tag, key, value), msg_id, encoded in zip(rows, ids, got):
        props = {"p": value}
        if tag:
            props["TAGS"] = tag
        if key:
            props["KEYS"] = key
        props["UNIQ_KEY"] = msg_id
        assert encoded == encode_properties(props)
