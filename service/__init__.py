"""The BERT inference service: settings -> schemas -> routes -> batcher -> engine."""
