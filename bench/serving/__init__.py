"""The HTTP serving benchmarks: throughput and latency against the in-process limit (throughput, the one
`python -m bench.serving` runs), the load generator they share (load), the naive peer they compare with, the
front end's own CPU cost (server_cpu, cpu_budget), the wire encodings (encoding) and overload (overload)."""
