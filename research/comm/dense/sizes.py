"""The dense mean's default sizes (numbers only: the strategies' options read
them before launch, without JAX)."""

#: Default bucket size. Below glibc's 32 MiB mmap-threshold cap, so XLA's and
#: MPICH's per-call buffers are recycled by malloc instead of faulted in anew, and
#: large enough that per-message latency is negligible (measured: dense.py).
DEFAULT_BUCKET_BYTES = 8 * 2**20
#: Leaves at least this large skip fusion in the jitted path: a whole leaf is
#: handed to MPI as it is (no concatenate, no temporary, no slicing back), and a
#: 256 KiB message is past the size where per-message latency matters. For
#: ResNet-50: 42 solo leaves (101.9 MB) and one fused bucket of 119 (1.2 MB);
#: 1 MiB (six times more bytes through pack and unpack) measured 1.0-1.4x slower.
DEFAULT_ALONE_BYTES = 2**18
