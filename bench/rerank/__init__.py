"""Reranking and long inputs: a ColBERT served here against PyLate, colbert-ai and Infinity (`python -m bench.rerank`).
See bench/rerank/__main__.py."""
