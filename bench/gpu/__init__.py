"""The GPU acceptance run, `python -m bench.gpu` (__main__): its packages installed offline (env) and its
steps beyond the tests (steps)."""
