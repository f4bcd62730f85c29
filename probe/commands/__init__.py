"""One module per ``probe`` verb; each exposes a click ``command``."""
