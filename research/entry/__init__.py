"""What starts things: a command line, ranks, a failed job again, one run.

``cli`` turns an experiment's command line into its typed config; ``launch``
relaunches an experiment under ``mpiexec`` with ``--np`` ranks; ``restart``
runs a job again on the nodes left when it fails (``--max-restarts``, and
``python -m research.entry.restart after-failure`` for batch templates);
``run`` is one training run inside an MPI world. Importing this package
imports none of them (a launcher must not start MPI).
"""
