"""`python -m turbogs.bench SCENE ...`: the bench command on its own."""

import sys

from turbogs.bench.command import main

if __name__ == "__main__":
    sys.exit(main())
