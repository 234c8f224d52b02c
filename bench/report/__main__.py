"""`python -m bench.report`: measure the benchmark report and draw it (bench/report/build.py)."""
import sys

from bench.report.build import main

sys.exit(main())
