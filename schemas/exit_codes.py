"""The exit codes of the `planner` command, defined once (README, "Errors and exit codes", has the same table).

Plain constants, light on purpose: the CLI reads them at start-up for its --help text (``schemas/__init__.py``
loads its models lazily, so importing this module costs no pydantic). The errors that end a command carry
their code (``schemas.errors.PlannerError.exit_code``) with these values.
"""

from __future__ import annotations

OK = 0
CHANGED = 1  # `planner diff`: the plans differ
INFEASIBLE = 1  # no plan fits the budget (a valid request that cannot be carried out)
BAD_INPUT = 2  # a file, an option or an output path the command cannot use
INTERNAL_ERROR = 70  # a bug in planner (EX_SOFTWARE of sysexits.h)
INTERRUPTED = 130  # Ctrl-C (SIGINT), as a shell reports 128 + 2; no output file is left half-written
BROKEN_PIPE = 141  # stdout was closed early (`planner show plan.yaml | head`), as a shell reports SIGPIPE
