"""Sinks and sources: the record schemas, the Arrow/DuckDB store, format readers and writers."""
