"""Visualizer: the module hierarchy graph, its diff, colouring, search and layout data (no UI)."""
