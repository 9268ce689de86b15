"""Checkpoint helpers (notes 01, 07, 21): reading a saved directory, coordinates, optimizer resharding.

0.19.0's notices on every save and load are filtered with the others in ``snippets/__init__.py``."""
