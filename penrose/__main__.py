"""`python -m penrose ...` is the `penrose` command."""

import sys

from penrose.cli import main

sys.exit(main())
