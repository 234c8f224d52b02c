"""python -m corpus embed INPUT --output DIR [options] (corpus.cli)."""

import sys

from corpus.cli import main

sys.exit(main())
