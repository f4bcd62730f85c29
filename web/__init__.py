"""The Dash app: graph diff, live cluster, timeline and SQL pages."""
