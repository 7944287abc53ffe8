"""The pieces of scripts/bench_trackers.py (its docstring says what the benchmark does and
how to run it), one job a module:

* `measures`: the identity measures TrackEval does not give (ids per object, restarts and
  take-overs among the ID switches, objects never given an id), pure functions.
* `inputs`: the drive and the run read, each camera's frames as the scorer sees them.
* `runs`: the trackers run on a run's boxes (the peers, our tracker again, re-tracking).
* `report`: each tracker scored and measured, the tables and the JSON.

The folder is named after its script with a leading underscore so that it clashes with no
installed package; `python3 scripts/bench_trackers.py` finds it (the scripts folder is first
on sys.path).
"""
