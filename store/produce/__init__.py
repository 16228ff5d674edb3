"""Producers: single sends, batches and Arrow tables encoded into records."""
