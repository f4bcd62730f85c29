"""API precision check: replay recorded API calls on a trusted backend in higher precision and
grade each against a standard that knows the operation and the dtype.

- :mod:`probe.checker.apis`: which function a dump name is, whether it replays, what kind of operation;
- :mod:`probe.checker.standards`: how much error a call's output may carry;
- :mod:`probe.checker.grade`: the measures and the verdict of one call;
- :mod:`probe.checker.replay`: replay one call on the golden backend and grade it;
- :mod:`probe.checker.calls`: the recorded calls of a tensor dump, in execution order;
- :mod:`probe.checker.report`: the table, check_api.csv/.parquet and summary.json.

It imports torch; ``compare/`` (which never does) stays apart.
"""
