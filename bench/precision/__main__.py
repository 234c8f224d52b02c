"""`python -m bench.precision`: speed and fidelity of every CPU precision (bench/precision/variants.py)."""
import sys

from bench.precision.variants import main

sys.exit(main())
