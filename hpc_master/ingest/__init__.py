"""Metrics ingest behind the API: the group-commit writer, its SQLite worker process, the plain-row parser."""
