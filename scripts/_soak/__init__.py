"""The pieces of scripts/soak.py (its docstring says what the soak checks and how to run
it), one job a module:

* `measure`: the pure measurements and the pass/fail criteria.
* `sampling`: the `soak-sampler` thread and the thread counts around the run.
* `run`: serve the clips, run live, sample, measure: the soak itself.
* `report`: everything measured, as soak.json and as printed.

The folder is named after its script with a leading underscore so that it clashes with no
installed package nor with the script itself; `python3 scripts/soak.py` finds it (the
scripts folder is first on sys.path).
"""
