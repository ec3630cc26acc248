"""The cost model: a layer's compute and link time (``layer``), the step's timeline of copies and compute
(``timeline``), a placement's and a plan's predictions (``placement``, ``predict``), and which predictions
a command is about (``predicted``)."""
