"""``python -m planner.cli``: the same command as ``planner``."""

from planner.cli.app import main

main()
