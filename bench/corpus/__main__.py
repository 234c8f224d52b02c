"""`python -m bench.corpus`: the corpus benchmark (bench/corpus/run.py)."""
import sys

from bench.corpus.run import main

sys.exit(main())
