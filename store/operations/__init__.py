"""Running a store: the server, published check rounds, statistics, the pending view."""
