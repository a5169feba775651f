"""The logic of the paper studies behind ``python -m experiments.NAME``.

Each experiment module keeps its docstring, flags and ``main``; the work lives
here, importable by tests and scripts without starting MPI, under the
experiment's name (``eager_sgd``, ``deepfreeze``, ``overlap``, ``sparcml``,
``scalability``, ``adaptive``, ``network``): the arms and their runs, the run
folders read back. Each experiment's ``<name>_page`` module renders its part
of ``docs/results/<name>.md`` (tables, checks, the README's paragraph) from
the run folder's JSON alone, what the run prints and what ``python -m
scripts.results`` renders again from the data kept beside the page;
``intervals`` is the one helper every check is decided with (PASS, FAIL or
UNDECIDED on a 90% interval); ``presets`` is what the entry points share (the
parser's frame, ``--model`` presets and ``--paper-scale``, the run folder, the
compilation cache).
"""
