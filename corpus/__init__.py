"""Embed a whole corpus with the engine as a library: `python -m corpus embed INPUT --output DIR`."""
