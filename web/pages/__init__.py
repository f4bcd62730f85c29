"""The dashboard pages: each has ``layout(...)`` and ``register(app, ...)``."""
