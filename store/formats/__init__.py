"""Bytes, no file opened: the CommitLog record codec, layouts, message ids, CRC32, column types."""
