"""`python -m bench.serving`: the serving benchmark (bench/serving/throughput.py)."""
import sys

from bench.serving.throughput import main

sys.exit(main())
