"""StoreConfig: RocketMQ's defaults, validation, and the layout recorded in the store."""

from __future__ import annotations

import json
import os

import pytest

from store import ConfigMismatchError, InvalidConfigError, Message, MessageStore, StoreConfig
from store.base.config import LAYOUT_FIELDS, parse_delay_levels


def test_defaults_are_rocketmqs():
    c = StoreConfig()
    assert c.commitlog_file_size_bytes == 1024**3
    assert c.flush_disk_type == "ASYNC_FLUSH"
    assert c.default_queue_count == 4
    assert c.file_reserved_time_hours == 72
    assert c.message_delay_level == "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
    assert c.timer_precision_ms == 1000
    assert c.timer_max_delay_ms >= 365 * 86_400_000
    assert c.transaction_timeout_ms == 6000
    assert c.transaction_check_max == 15
    assert c.max_message_size_bytes == 4 * 1024 * 1024
    assert c.max_properties_size_bytes == 32767
    assert c.consume_queue_file_entries == 300_000
    assert c.file_reserved_time_ms == 72 * 3_600_000


def test_delay_levels_parse():
    assert StoreConfig().delay_levels_ms[:5] == (1000, 5000, 10_000, 30_000, 60_000)
    assert StoreConfig().delay_levels_ms[-1] == 7_200_000
    assert len(StoreConfig().delay_levels_ms) == 18
    assert parse_delay_levels("1s 5m 2h 1d") == (1000, 300_000, 7_200_000, 86_400_000)


@pytest.mark.parametrize("changes, needle", [
    ({"flush_disk_type": "SOMETIMES"}, "flush_disk_type='SOMETIMES'"),
    ({"commitlog_file_size_bytes": 0}, "commitlog_file_size_bytes=0"),
    ({"commitlog_file_size_bytes": 1000}, ">= 4096"),
    ({"commitlog_file_size_bytes": 3 * 1024**3}, "< 2 GiB"),
    ({"commitlog_file_size_bytes": 4096.0}, "must be an int"),
    ({"default_queue_count": True}, "must be an int"),
    ({"default_queue_count": 0}, "default_queue_count=0"),
    ({"default_queue_count": 5000}, "1 to 1024"),
    ({"file_reserved_time_hours": -1}, "file_reserved_time_hours=-1"),
    ({"timer_precision_ms": 300}, "100, 200, 500, 1000"),
    ({"message_delay_level": ""}, "empty"),
    ({"message_delay_level": "1s 5x"}, "'5x'"),
    ({"message_delay_level": "0s"}, "'0s'"),
    ({"timer_roll_window_slots": 1}, "timer_roll_window_slots=1"),
    ({"transaction_check_max": 0}, "transaction_check_max=0"),
])
def test_invalid_values_are_refused_with_a_message_naming_them(changes, needle):
    with pytest.raises(InvalidConfigError) as info:
        StoreConfig(**changes)
    assert needle in str(info.value)


def test_unknown_keys_are_refused():
    with pytest.raises(InvalidConfigError) as info:
        StoreConfig.from_dict({"flush_disk_type": "SYNC_FLUSH", "flushDiskType": "SYNC_FLUSH"})
    assert "flushDiskType" in str(info.value)
    assert StoreConfig.from_dict({"flush_disk_type": "SYNC_FLUSH"}).flush_disk_type == "SYNC_FLUSH"


def test_open_accepts_a_mapping_and_refuses_unknown_keys(store_path):
    with MessageStore.open(store_path, {"commitlog_file_size_bytes": 65536}) as s:
        assert s.config.commitlog_file_size_bytes == 65536
    with pytest.raises(InvalidConfigError):
        MessageStore.open(store_path, {"no_such_setting": 1})
    with pytest.raises(InvalidConfigError):
        MessageStore.open(store_path, "SYNC_FLUSH")


def test_layout_is_recorded_at_creation(store_path, small_config):
    with MessageStore.open(store_path, small_config):
        pass
    with open(os.path.join(store_path, "config", "store.json")) as fh:
        recorded = json.load(fh)["layout"]
    assert set(recorded) == set(LAYOUT_FIELDS)
    assert recorded["commitlog_file_size_bytes"] == 64 * 1024
    assert recorded["consume_queue_file_entries"] == 1000


def test_reopen_with_other_layout_uses_the_recorded_values(store_path, small_config, clock):
    with MessageStore.open(store_path, small_config, clock=clock) as s:
        for i in range(600):  # > one 64 KiB segment
            s.producer("g").send(Message("t", b"x" * 100, keys=f"k{i}"))
        maxes = [s.max_offset("t", q) for q in range(4)]
    other = StoreConfig(default_queue_count=8, flush_disk_type="SYNC_FLUSH",
                        message_delay_level="1s 2s")
    with MessageStore.open(store_path, other, clock=clock) as s:
        assert s.config.commitlog_file_size_bytes == 64 * 1024  # recorded wins
        assert s.config.consume_queue_file_entries == 1000
        assert s.config.default_queue_count == 4
        assert s.config.message_delay_level == small_config.message_delay_level
        assert s.config.flush_disk_type == "SYNC_FLUSH"  # not a layout setting: given wins
        assert [s.max_offset("t", q) for q in range(4)] == maxes
        assert [len(s.pull("t", q, 0, 1000)) for q in range(4)] == maxes


def test_strict_layout_refuses_other_layout_values(store_path, small_config):
    with MessageStore.open(store_path, small_config):
        pass
    strict = StoreConfig(strict_layout=True)
    with pytest.raises(ConfigMismatchError) as info:
        MessageStore.open(store_path, strict)
    msg = str(info.value)
    assert "commitlog_file_size_bytes" in msg and str(64 * 1024) in msg
    # the same values with strict_layout open fine
    with MessageStore.open(store_path, small_config.replace(strict_layout=True)) as s:
        assert s.config.commitlog_file_size_bytes == 64 * 1024


@pytest.mark.parametrize("changes, named", [
    ({"delete_when": "25"}, "delete_when"), ({"delete_when": ""}, "delete_when"),
    ({"delete_when": "4am"}, "delete_when"), ({"disk_max_used_space_ratio": 0}, "1 to 100"),
    ({"disk_space_clean_forcibly_ratio": 101}, "1 to 100"),
    ({"clean_resource_interval_ms": 0}, "clean_resource_interval_ms"),
])
def test_retention_schedule_settings_are_checked(changes, named):
    with pytest.raises(InvalidConfigError, match=named):
        StoreConfig(**changes)
    assert StoreConfig(delete_when="02;14").delete_when == "02;14"
