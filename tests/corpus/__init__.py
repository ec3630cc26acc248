"""The bad-input corpus: table-driven cases, one module per area, run by tests/test_corpus.py.

Each area module defines ``CASES``: a list of ``CliCase`` (a `planner` command line and the
files it reads) or ``ApiCase`` (a Python call, e.g. a runtime call sequence, that must raise).
Every case names its expected exit code (CLI) or exception type (API) and fragments of its
message; none may print a traceback.
"""
