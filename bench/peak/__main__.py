"""`python -m bench.peak`: the machine's peak and the engine's fraction of it (bench/peak/run.py)."""
import sys

from bench.peak.run import main

sys.exit(main())
