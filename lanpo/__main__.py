"""`python -m lanpo ...`: the same command line as the `lanpo` console script."""

import sys

from lanpo.cli import main

sys.exit(main())
