"""One module per paper, each runnable as ``python -m experiments.NAME``."""
