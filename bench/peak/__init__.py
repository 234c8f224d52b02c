"""This machine's arithmetic peak, and the fraction of it the engine reaches (bench/peak/run.py)."""
