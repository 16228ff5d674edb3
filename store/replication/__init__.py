"""Replica sets: a leader and followers holding byte-identical copies of one CommitLog.

``replica_set`` reads the replica-set file; the replication stream a leader serves and a
follower reads is the Flight face's (:mod:`store.remote.replication_stream`); ``follower`` copies the leader's log and builds the
follower's queues from it; ``replica`` is one served store as a member (role, epoch, writes
refused on a follower).  The bytes are checked and appended by
:mod:`store.core.replica_log`.
"""
