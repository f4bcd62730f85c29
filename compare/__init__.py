"""Compare: load two dumps, normalise, match, compute metrics, give verdicts and localise."""
