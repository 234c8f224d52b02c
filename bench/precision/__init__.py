"""In-process measurements of the engine's CPU precisions, no HTTP: speed and fidelity of every variant
(variants, the one `python -m bench.precision` runs), the per-core ceiling of the kernels (cpu_ceiling) and
the ONNX copies the ONNX Runtime rows and Infinity's optimum engine read (onnx_export)."""
