"""Embed a whole corpus with the service's engine as a library: `python -m corpus embed INPUT --output DIR`."""
