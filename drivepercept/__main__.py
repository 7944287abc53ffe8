"""`python -m drivepercept` is the same as the `drivepercept` console script."""

from __future__ import annotations

from drivepercept.cli import run

if __name__ == "__main__":
    run()
