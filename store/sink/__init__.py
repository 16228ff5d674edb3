"""The exactly-once sink: staged halves and the commit that makes them visible."""
