"""text-embeddings-inference's gRPC API (package tei.v1) beside HTTP: the .proto and its generated module, the calls
over the front door, and the server each front end runs (server.py says how it behaves)."""
