"""`python -m turbogs ...` is the `turbogs` command (what torchrun and `--nproc` start per rank)."""

import sys

from turbogs.cli import main

sys.exit(main())
