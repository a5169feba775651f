"""The ``adaptive`` strategy: dense, top-k or partial averaging, chosen while it trains.

Its modules, lowest first: ``candidates`` (the methods and the plan, read from
text options; no MPI), ``estimate`` and ``policy`` (what a window of steps
measured, and the decisions; no MPI), ``carry`` (what a switch hands on),
``call`` (``research.averaging("adaptive")``, the one-call form) and
``averager`` (the registered strategy, which builds both). Nothing is imported
here: importing MPI must stay explicit (``research.comm``'s rule).
"""
