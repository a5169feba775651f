"""The logic of the paper studies behind ``python -m experiments.NAME``.

Each experiment module keeps its docstring, flags and ``main``; the work lives
here, importable by tests and scripts without starting MPI:

* ``eager_sgd``: eager-SGD's arms, run folders read back, table and checks;
* ``deepfreeze``: DeepFreeze's interleaved checkpointing job, table and targets;
* ``presets``: what both entry points share (the parser's frame, ``--model``
  presets and ``--paper-scale``, the run folder, the compilation cache).
"""
