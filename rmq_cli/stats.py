"""``rmq stats``: what a store holds, gathered through the store's public API."""

from __future__ import annotations

import datetime as _dt

import click

from store import is_system_topic, replication_status, server_status


def _topics(store, names) -> list[dict]:
    """Each topic of ``names`` with its queues' offsets and message counts."""
    topics = []
    for topic in names:
        queues = []
        for q in store.queue_ids(topic):
            lo, hi = store.min_offset(topic, q), store.max_offset(topic, q)
            queues.append({"queue_id": q, "min_offset": lo, "max_offset": hi, "messages": hi - lo})
        topics.append({"topic": topic, "system": is_system_topic(topic), "queues": queues,
                       "messages": sum(q["messages"] for q in queues)})
    return topics


def collect_remote_stats(remote) -> dict:
    """What a served store tells a client (``rmq stats --store rmq://...``): its topics and
    queues; the rest (delayed and half messages, disk, the server's health) is read from its
    files, on its host."""
    import time

    remote.refresh()
    return {"store": remote.root, "remote": True, "now_ms": int(time.time() * 1000),
            "written_by_rmq": remote.written_by_rmq, "topics": _topics(remote, remote.topics())}


def collect_stats(store, *, include_system: bool = False) -> dict:
    """Topics with per-queue offsets, pending delayed and half messages, disk use."""
    topics = _topics(store, store.topics(include_system=include_system))
    now = store.now_ms()
    read_only = getattr(store, "read_only", False)
    delayed = None if read_only else store.pending_delayed_stats()
    server = server_status(store.root)
    next_due = delayed.get("next_due_ms") if delayed else None
    return {
        "store": store.root,
        "now_ms": now,
        "read_only": read_only,
        "topics": topics,
        # a directory Apache RocketMQ wrote is only read: its schedule / timer / transaction
        # state is RocketMQ's, not figured here
        "delayed": delayed,
        # how long the oldest due delayed message has waited to be moved (0: none waits)
        "due_behind_ms": max(0, now - next_due) if next_due is not None else 0,
        "server": server,
        "transactions": None if read_only else store.pending_transaction_stats(),
        "disk_bytes": store.disk_usage_bytes(),
        "retention": None if read_only else _retention(store, now),
        # a replica set's member: role, epoch, leader; lag while a server runs it
        "replication": replication_status(store.root, server),
    }


def _retention(store, now: int) -> dict:
    """Disk use and the CommitLog segments against the retention settings."""
    import shutil

    cfg = store.config
    disk = shutil.disk_usage(store.root)
    plan = store.retention_plan()
    return {"disk_used_percent": round(disk.used / disk.total * 100, 1) if disk.total else 0.0,
            "disk_max_used_space_ratio": cfg.disk_max_used_space_ratio,
            "disk_space_clean_forcibly_ratio": cfg.disk_space_clean_forcibly_ratio,
            "file_reserved_time_hours": cfg.file_reserved_time_hours,
            "segments": len(plan),
            "segments_expired": sum(p["action"] == "delete" for p in plan),
            "segments_needed": sum(p["action"] == "needed" for p in plan)}


def _human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)  # pragma: no cover


def render_stats(data: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    disk = f"   disk {_human_bytes(data['disk_bytes'])}" if "disk_bytes" in data else ""
    console.print(f"[bold]store[/bold] {data['store']}{disk}")
    t = Table(title="topics", show_lines=False)
    for col in ("topic", "queue", "min offset", "max offset", "messages"):
        t.add_column(col, justify="right" if col != "topic" else "left")
    for topic in data["topics"]:
        for q in topic["queues"]:
            t.add_row(topic["topic"], str(q["queue_id"]), str(q["min_offset"]),
                      str(q["max_offset"]), str(q["messages"]))
    console.print(t)
    if data.get("remote"):
        console.print("a served store: its pending delayed and half messages, disk use and "
                      "server health are read from its files: run `rmq stats --store DIR` on "
                      "the server's host")
        return
    delayed = data["delayed"]
    if delayed is None:  # a store Apache RocketMQ wrote: only read
        console.print("read-only: a store written by Apache RocketMQ (its delayed and "
                      "half messages are RocketMQ's to deliver; not counted here)")
        return
    console.print(f"[bold]pending delayed messages[/bold] {delayed['pending']} "
                  f"(delay levels {delayed['schedule_pending']}, "
                  f"timer wheel {delayed['timer_pending']})")
    d = Table(title="by due time")
    d.add_column("due within")
    d.add_column("messages", justify="right")
    for bucket in delayed["by_due"]:
        d.add_row(bucket["label"], str(bucket["count"]))
    console.print(d)
    if delayed.get("next_due_ms") is not None:
        when = _dt.datetime.fromtimestamp(delayed["next_due_ms"] / 1000, _dt.timezone.utc)
        console.print(f"next due: {when.isoformat(timespec='milliseconds')}")
    server = data.get("server")
    behind = data.get("due_behind_ms", 0)
    if server and server.get("attached"):
        ago = data["now_ms"] - server.get("last_run_ms", data["now_ms"])
        console.print(f"server: attached (pid {server.get('pid')}), last delivery step {ago} ms "
                      f"ago, {server.get('delivered', 0)} delivered since it started; "
                      f"due delivery {behind} ms behind")
        if server.get("listen"):
            console.print(f"server: serving clients at {server['listen']}")
        if server.get("grpc"):
            console.print(f"server: serving RocketMQ 5 clients at {server['grpc']}")
    else:
        console.print(f"server: none attached; due delivery {behind} ms behind (delayed "
                      "messages move when a reader delivers them: run `rmq serve --store "
                      f"{data['store']}` to deliver on time)")
    rep = data.get("replication")
    if rep:
        lag = (f"{rep['lag_bytes']} bytes, {rep['lag_messages']} messages behind"
               if rep.get("running") else "lag shown while it is served")
        mark = rep.get("high_watermark")
        console.print(f"replica set: {rep['role']} (epoch {rep['epoch']}), leader "
                      f"{rep['leader']}; {lag}"
                      + ("" if mark is None else f"; readers see the CommitLog below {mark}"
                         " (high watermark)"))
    ret = data.get("retention")
    if ret:
        console.print(f"retention: disk {ret['disk_used_percent']}% used (runs at any hour above "
                      f"{ret['disk_max_used_space_ratio']}%, ignores age above "
                      f"{ret['disk_space_clean_forcibly_ratio']}%); {ret['segments']} "
                      f"segment(s), {ret['segments_expired']} past "
                      f"{ret['file_reserved_time_hours']} h and deletable now, "
                      f"{ret['segments_needed']} held by pending messages")
    tx = data["transactions"]
    console.print(f"pending half messages: {tx['pending']}"
                  + (f" (oldest born {tx['oldest_born_ms']})" if tx.get("oldest_born_ms") else ""))


def render_verify(report: dict) -> None:
    """Print what ``store.verify_commitlog()`` found."""
    mb = report["bytes_checked"] / 1e6
    rate = mb / report["seconds"] if report["seconds"] else 0.0
    click.echo(f"verified {report['records']} records, {mb:.1f} MB of CommitLog in "
               f"{report['seconds']:.2f} s ({rate:.0f} MB/s): "
               + ("all intact" if report["ok"] else "DAMAGE FOUND"))
    for bad in report["bad_crc"]:
        click.echo(f"  bad body CRC: {bad['file']} at CommitLog offset {bad['offset']}")
    for d in report["damaged"]:
        click.echo(f"  damaged: {d['file']} from CommitLog offset {d['from']} to {d['to']}")
