"""One module per on-disk structure: mapped segments, the CommitLog, ConsumeQueues, the
checkpoint, the topic table, the broker's JSON files, the crash marker."""
