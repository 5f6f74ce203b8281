"""`python -m lanpo.docgen [--check]`: write (or check) docs/cli.md and docs/configuration.md."""

import sys

from lanpo.docgen import main

sys.exit(main())
