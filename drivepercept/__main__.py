"""`python -m drivepercept` is the same as the `drivepercept` console script."""

from __future__ import annotations

import sys

from drivepercept.cli import main

if __name__ == "__main__":
    sys.exit(main())
