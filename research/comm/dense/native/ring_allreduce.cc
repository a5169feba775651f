// A segmented ring allreduce as an XLA FFI custom call (research/comm/dense/ring.py).
//
// The fused path's collective. Three things make it cheaper than handing each
// buffer to MPI_Allreduce (mpi4jax's path), measured in research/comm/dense/averagers.py:
//
// * no copy of the input: the first reduce-scatter step reads the caller's
//   buffer, later steps the result buffer, so input and result may be distinct
//   (XLA gives a fresh result; nothing copies the input into it first) or the
//   same buffer (operand aliased to the result: summed in place);
// * the mean costs no pass of its own: the division by the world size is
//   folded into the last reduction step, on the chunk this rank owns, and the
//   allgather then spreads the divided chunks (the same result on every rank);
// * no temporary as large as the message: peers' partial sums arrive in
//   segments of `segment_bytes` into one small buffer per thread that stays in
//   cache, where MPICH's large-message algorithm maps a temporary of half the
//   message afresh on every call and reads it back from memory.
//
// Ring (Patarasuk and Yuan's bandwidth-optimal allreduce, as in Baidu's and
// Horovod's): the buffer is cut into `size` chunks; in P-1 reduce-scatter steps
// each rank sends one chunk's partial sum to its successor and adds its own
// contribution to the one arriving from its predecessor; then P-1 allgather
// steps pass the finished chunks around. Other operations, dtypes and small
// buffers (below `ring_min_bytes`, where 2(P-1) latencies would dominate) go to
// MPI_Allreduce in place, divided afterwards.
#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include <mpi.h>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// MPI handles travel as int64 attributes: ints in MPICH, pointers elsewhere.
template <typename H>
H FromHandle(int64_t v) {
  if constexpr (std::is_pointer_v<H>) {
    return reinterpret_cast<H>(static_cast<intptr_t>(v));
  } else {
    return static_cast<H>(v);
  }
}

// Calls that took the ring (not MPI_Allreduce): tests read it to tell the
// ring from its fallback, which cannot move it.
std::atomic<int64_t> g_ring_calls{0};
// What the communication watchdog (research/comm/faults/traffic.py) reads while a ring
// runs, inside jit too: bytes received so far (after every piece), and the
// neighbours of the ring in progress (prev << 32 | next; -1: none).
std::atomic<int64_t> g_ring_bytes{0};
std::atomic<int64_t> g_ring_peers{-1};

// Marks the ring's neighbours for as long as one ring runs in this scope.
struct PeersMark {
  PeersMark(int prev, int next) {
    g_ring_peers.store((static_cast<int64_t>(prev) << 32) | next,
                       std::memory_order_relaxed);
  }
  ~PeersMark() { g_ring_peers.store(-1, std::memory_order_relaxed); }
};

bool IsPowerOfTwo(int64_t d) { return d > 0 && (d & (d - 1)) == 0; }

// out[i] = (a[i] + b[i]) / divisor; out may be a (in place). A power-of-two
// divisor becomes a multiplication by its reciprocal: exact, bit for bit.
template <typename T>
void AddDivide(T* out, const T* a, const T* b, size_t n, int64_t divisor) {
  if (divisor <= 1) {
    for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
  } else if (IsPowerOfTwo(divisor)) {
    const T r = T(1) / static_cast<T>(divisor);
    for (size_t i = 0; i < n; ++i) out[i] = (a[i] + b[i]) * r;
  } else {
    const T d = static_cast<T>(divisor);
    for (size_t i = 0; i < n; ++i) out[i] = (a[i] + b[i]) / d;
  }
}

template <typename T>
void Divide(T* p, size_t n, int64_t divisor) {
  if (divisor <= 1) return;
  if (IsPowerOfTwo(divisor)) {
    const T r = T(1) / static_cast<T>(divisor);
    for (size_t i = 0; i < n; ++i) p[i] *= r;
  } else {
    const T d = static_cast<T>(divisor);
    for (size_t i = 0; i < n; ++i) p[i] /= d;
  }
}

struct Kind {
  size_t size;  // bytes per element
  void (*add_divide)(void*, const void*, const void*, size_t, int64_t);
  void (*divide)(void*, size_t, int64_t);
};

template <typename T>
Kind KindOf() {
  return {sizeof(T),
          [](void* o, const void* a, const void* b, size_t n, int64_t d) {
            AddDivide(static_cast<T*>(o), static_cast<const T*>(a),
                      static_cast<const T*>(b), n, d);
          },
          [](void* p, size_t n, int64_t d) { Divide(static_cast<T*>(p), n, d); }};
}

// The ring's element types: sums it computes itself. nullptr: not one of them.
const Kind* RingKind(MPI_Datatype t) {
  static const Kind f32 = KindOf<float>(), f64 = KindOf<double>(),
                    i32 = KindOf<int32_t>(), i64 = KindOf<int64_t>();
  if (t == MPI_FLOAT) return &f32;
  if (t == MPI_DOUBLE) return &f64;
  if (t == MPI_INT32_T || t == MPI_INT) return &i32;
  if (t == MPI_INT64_T || t == MPI_LONG) return &i64;
  return nullptr;
}

int Ring(const char* src, char* dst, size_t count, MPI_Datatype t,
         const Kind& k, MPI_Comm comm, int64_t divisor, size_t segment_bytes) {
  int size = 1, rank = 0;
  MPI_Comm_size(comm, &size);
  MPI_Comm_rank(comm, &rank);
  g_ring_calls.fetch_add(1, std::memory_order_relaxed);
  const size_t es = k.size;
  std::vector<size_t> cnt(size), off(size);
  for (int r = 0; r < size; ++r) {
    cnt[r] = count / size + (static_cast<size_t>(r) < count % size ? 1 : 0);
    off[r] = r ? off[r - 1] + cnt[r - 1] : 0;
  }
  const size_t seg = std::max<size_t>(1, segment_bytes / es);
  // Every rank cuts every step into the same number of segments (the largest
  // chunk's), so each Sendrecv has a partner; the tail ones may be empty.
  const size_t nseg = std::max<size_t>(1, (cnt[0] + seg - 1) / seg);
  thread_local std::vector<char> tmp;
  if (tmp.size() < seg * es) tmp.resize(seg * es);
  const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
  PeersMark mark(prev, next);
  auto chunk = [size](int c) { return ((c % size) + size) % size; };

  // Reduce-scatter: after step s, this rank holds chunk (rank-s-1)'s partial
  // sum of s+2 contributions; after P-1 steps chunk rank+1 is complete.
  for (int s = 0; s < size - 1; ++s) {
    const int sc = chunk(rank - s), rc = chunk(rank - s - 1);
    const char* send = (s == 0 ? src : dst) + off[sc] * es;
    const char* own = src + off[rc] * es;
    char* out = dst + off[rc] * es;
    const int64_t d = s == size - 2 ? divisor : 1;
    for (size_t j = 0; j < nseg; ++j) {
      const size_t s0 = std::min(cnt[sc], j * seg), s1 = std::min(cnt[sc], s0 + seg);
      const size_t r0 = std::min(cnt[rc], j * seg), r1 = std::min(cnt[rc], r0 + seg);
      int rc_ = MPI_Sendrecv(send + s0 * es, static_cast<int>(s1 - s0), t, next, 0,
                             tmp.data(), static_cast<int>(r1 - r0), t, prev, 0, comm,
                             MPI_STATUS_IGNORE);
      if (rc_ != MPI_SUCCESS) return rc_;
      g_ring_bytes.fetch_add(static_cast<int64_t>((r1 - r0) * es),
                             std::memory_order_relaxed);
      k.add_divide(out + r0 * es, own + r0 * es, tmp.data(), r1 - r0, d);
    }
  }
  // Allgather: pass the finished chunks on, straight into the result.
  for (int s = 0; s < size - 1; ++s) {
    const int sc = chunk(rank + 1 - s), rc = chunk(rank - s);
    int rc_ = MPI_Sendrecv(dst + off[sc] * es, static_cast<int>(cnt[sc]), t, next, 1,
                           dst + off[rc] * es, static_cast<int>(cnt[rc]), t, prev, 1,
                           comm, MPI_STATUS_IGNORE);
    if (rc_ != MPI_SUCCESS) return rc_;
    g_ring_bytes.fetch_add(static_cast<int64_t>(cnt[rc] * es),
                           std::memory_order_relaxed);
  }
  return MPI_SUCCESS;
}

// Sums `nbytes` of `src` into `dst` (which may be `src`); 0 or an MPI error
// code, or -1 with `*why` set for bad arguments.
// Complex sums are sums of the real and imaginary parts: a complex buffer
// travels as twice as many reals (a divisor divides both parts alike).
// mpi4jax hands complex64/128 over as the Fortran MPI_COMPLEX/DOUBLE_COMPLEX.
MPI_Datatype RealOf(MPI_Datatype t) {
  if (t == MPI_DATATYPE_NULL) return t;
  if (t == MPI_COMPLEX || t == MPI_C_FLOAT_COMPLEX || t == MPI_C_COMPLEX ||
      t == MPI_CXX_FLOAT_COMPLEX)
    return MPI_FLOAT;
  if (t == MPI_DOUBLE_COMPLEX || t == MPI_C_DOUBLE_COMPLEX ||
      t == MPI_CXX_DOUBLE_COMPLEX)
    return MPI_DOUBLE;
  return t;
}

// One piece of at most max_count elements (MPI counts are int).
int AllreducePiece(const char* src, char* dst, size_t count, size_t es,
                   MPI_Datatype t, const Kind* kind, MPI_Op op, MPI_Comm comm,
                   int64_t divisor, int64_t segment_bytes, int64_t ring_min_bytes) {
  const size_t nbytes = count * es;
  int size = 1;
  MPI_Comm_size(comm, &size);
  if (kind != nullptr && op == MPI_SUM && size > 1 &&
      nbytes >= static_cast<size_t>(ring_min_bytes) &&
      count >= static_cast<size_t>(size)) {
    return Ring(src, dst, count, t, *kind, comm, divisor,
                static_cast<size_t>(segment_bytes));
  }
  if (dst != src) std::memcpy(dst, src, nbytes);
  int rc = MPI_Allreduce(MPI_IN_PLACE, dst, static_cast<int>(count), t, op, comm);
  if (rc == MPI_SUCCESS && divisor > 1) kind->divide(dst, count, divisor);
  return rc;
}

int Allreduce(const char* src, char* dst, size_t nbytes, MPI_Datatype t, MPI_Op op,
              MPI_Comm comm, int64_t divisor, int64_t segment_bytes,
              int64_t ring_min_bytes, int64_t max_count, const char** why) {
  const MPI_Datatype real = RealOf(t);
  if (real != t && op != MPI_SUM) return *why = "complex buffers need SUM", -1;
  t = real;
  int type_size = 0;
  MPI_Type_size(t, &type_size);
  if (type_size <= 0) return *why = "bad MPI datatype", -1;
  if (segment_bytes < 1) return *why = "segment_bytes must be >= 1", -1;
  if (max_count < 1 || max_count > INT_MAX)
    return *why = "max_count must be in [1, INT_MAX]", -1;
  const size_t es = static_cast<size_t>(type_size);
  const size_t count = nbytes / es;
  const Kind* kind = RingKind(t);
  const bool floating = t == MPI_FLOAT || t == MPI_DOUBLE;
  if (divisor > 1 && !(floating && op == MPI_SUM))
    return *why = "divisor needs a float32/float64 SUM", -1;
  // Larger buffers go in pieces: every rank cuts the same pieces.
  for (size_t start = 0; start < count; start += static_cast<size_t>(max_count)) {
    const size_t n = std::min(count - start, static_cast<size_t>(max_count));
    int rc = AllreducePiece(src + start * es, dst + start * es, n, es, t, kind, op,
                            comm, divisor, segment_bytes, ring_min_bytes);
    if (rc != MPI_SUCCESS) return rc;
  }
  return MPI_SUCCESS;
}

std::string Describe(int rc, const char* why) {
  if (rc == -1) return std::string("ring allreduce: ") + why;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  // The words before MPI's own string tell a rank's failure record that MPI
  // failed (research.comm.faults.failures.RING_MPI_ERROR): raised through XLA, the
  // error has no type of its own to tell it by.
  return std::string("ring allreduce: MPI error: ") + std::string(msg, len);
}

ffi::Error RingAllreduce(ffi::AnyBuffer x, ffi::Token, ffi::Result<ffi::AnyBuffer> out,
                         ffi::Result<ffi::Token>, int64_t comm_handle,
                         int64_t dtype_handle, int64_t op_handle, int64_t divisor,
                         int64_t segment_bytes, int64_t ring_min_bytes,
                         int64_t max_count) {
  const char* why = "";
  int rc = Allreduce(static_cast<const char*>(x.untyped_data()),
                     static_cast<char*>(out->untyped_data()), x.size_bytes(),
                     FromHandle<MPI_Datatype>(dtype_handle), FromHandle<MPI_Op>(op_handle),
                     FromHandle<MPI_Comm>(comm_handle), divisor, segment_bytes,
                     ring_min_bytes, max_count, &why);
  if (rc == -1) return ffi::Error::InvalidArgument(Describe(rc, why));
  if (rc != MPI_SUCCESS) return ffi::Error::Internal(Describe(rc, why));
  return ffi::Error::Success();
}

}  // namespace

// The tokens order this call with mpi4jax's (one ordered effect for both).
XLA_FFI_DEFINE_HANDLER_SYMBOL(research_ring_allreduce, RingAllreduce,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Token>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::Token>()
                                  .Attr<int64_t>("comm")
                                  .Attr<int64_t>("dtype")
                                  .Attr<int64_t>("op")
                                  .Attr<int64_t>("divisor")
                                  .Attr<int64_t>("segment_bytes")
                                  .Attr<int64_t>("ring_min_bytes")
                                  .Attr<int64_t>("max_count"));

// The same for host buffers (research.comm.dense.ring.host_allreduce, via ctypes):
// 0 on success; else 2 (bad arguments) or 1 (MPI failed), with a message of at
// most `msg_len` bytes in `msg`.
extern "C" int research_ring_allreduce_host(const void* src, void* dst,
                                            int64_t nbytes, int64_t comm_handle,
                                            int64_t dtype_handle, int64_t op_handle,
                                            int64_t divisor, int64_t segment_bytes,
                                            int64_t ring_min_bytes,
                                            int64_t max_count, char* msg,
                                            int64_t msg_len) {
  const char* why = "";
  int rc = Allreduce(static_cast<const char*>(src), static_cast<char*>(dst),
                     static_cast<size_t>(nbytes), FromHandle<MPI_Datatype>(dtype_handle),
                     FromHandle<MPI_Op>(op_handle), FromHandle<MPI_Comm>(comm_handle),
                     divisor, segment_bytes, ring_min_bytes, max_count, &why);
  if (rc != MPI_SUCCESS && msg_len > 0) {
    std::string text = Describe(rc, why);
    size_t n = std::min(text.size(), static_cast<size_t>(msg_len - 1));
    std::memcpy(msg, text.data(), n);
    msg[n] = '\0';
  }
  return rc == MPI_SUCCESS ? 0 : (rc == -1 ? 2 : 1);
}

// How many calls took the ring (see g_ring_calls).
extern "C" int64_t research_ring_calls() { return g_ring_calls.load(); }
extern "C" int64_t research_ring_bytes() { return g_ring_bytes.load(); }
extern "C" int64_t research_ring_peers() { return g_ring_peers.load(); }

#ifndef RESEARCH_BUILT_MPI
#define RESEARCH_BUILT_MPI ""
#endif
// MPI_Get_library_version() of the MPI this library was compiled for, recorded
// at build time; the loader refuses the library when mpi4py's MPI differs.
extern "C" const char* research_ring_built_mpi() { return RESEARCH_BUILT_MPI; }
