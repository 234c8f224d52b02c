"""The corpus benchmark (issue #54): `python -m corpus embed`, file to Parquet, against the engine's in-process limit,
sentence-transformers (float32 and ONNX int8), our own HTTP /embed, and the job on a local two-node Ray cluster
(run.py; the peers: st_peer.py in their own environment, http_peer.py)."""
