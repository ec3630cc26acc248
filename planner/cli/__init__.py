"""The ``planner`` command (``app``) and what only the command line needs: output files, views
(show, chart, explain), strict options, exit-code notes."""
