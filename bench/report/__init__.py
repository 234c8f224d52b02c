"""The benchmark report BENCHMARKS.md shows (`python -m bench.report`): build measures it with bench.serving
and bench.precision and writes the Markdown; plots draws its figures from build's JSON."""
