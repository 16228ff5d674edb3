"""``rmq promote``: a replica set's follower made its leader by hand."""

from __future__ import annotations

import json

import click

from .opening import refuse_url


@click.command()
@click.option("--store", "store_path", required=True, type=click.Path(file_okay=False),
              help="The follower's store directory (its server running or stopped).")
@click.option("--force", is_flag=True,
              help="Promote even when the follower holds less than its leader acknowledged "
                   "(the rest is given up).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def promote(store_path, force, as_json):
    """Make a follower of a replica set its leader, in a new epoch.

    A running follower is promoted by its server, in place (it takes writes and delivers
    due messages at once); a stopped one here. Refused when it holds less than its leader
    had confirmed as far as it last heard, unless --force. Then set the replica-set file's
    "leader" to this replica on every replica (and start stopped servers again)."""
    from store import StoreError, promote_replica

    refuse_url(store_path, "rmq promote", "run `rmq promote --store DIR` on the replica's "
               "host")
    try:
        done = promote_replica(store_path, force=force)
    except StoreError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(done, indent=2, sort_keys=True))
        return
    lost = f"; {done['lost_bytes']} bytes the old leader held are given up" \
        if done["forced"] and done["lost_bytes"] else ""
    click.echo(f"promoted {store_path}: leader in epoch {done['epoch']} from CommitLog offset "
               f"{done['start_offset']}{lost}. Set \"leader\" in the replica-set file of every "
               "replica to this one (and start stopped servers again).")
