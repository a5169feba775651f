"""What a rank sets up for its own process before MPI and JAX start.

``env``: what the launcher told this process, read without MPI; ``malloc``: the
heap kept between steps; ``devices``: the accelerator this rank uses. Nothing
here imports MPI, so a launcher may use it before it relaunches.
"""
