"""Training speed: our trainer against a transformers twin on the same data, step for step."""
