// In-place MPI_Allreduce as an XLA FFI custom call (research/comm/inplace.py).
//
// mpi4jax's allreduce hands MPI distinct send and receive buffers, so MPICH
// first copies the input into the output: one extra pass over every byte. Here
// the jitted program aliases the operand to the result (input_output_aliases),
// and the handler sums in place with MPI_IN_PLACE. Where XLA could not alias
// (the operand is still needed elsewhere) it passes two buffers; the handler
// then copies once itself, which is what MPICH would have done.
#include <cstring>

#include <mpi.h>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

// The tokens order this call with mpi4jax's (one ordered effect for both).
static ffi::Error AllreduceInPlace(ffi::AnyBuffer x, ffi::Token,
                                   ffi::Result<ffi::AnyBuffer> out,
                                   ffi::Result<ffi::Token>, int64_t comm,
                                   int64_t dtype, int64_t op) {
  void* dst = out->untyped_data();
  const void* src = x.untyped_data();
  size_t nbytes = x.size_bytes();
  if (dst != src && nbytes) std::memcpy(dst, src, nbytes);
  int type_size = 0;
  MPI_Datatype mpi_dtype = static_cast<MPI_Datatype>(dtype);
  MPI_Type_size(mpi_dtype, &type_size);
  if (type_size <= 0) return ffi::Error::InvalidArgument("bad MPI datatype");
  size_t count = nbytes / static_cast<size_t>(type_size);
  if (count > 0x7fffffff) return ffi::Error::InvalidArgument("buffer too large");
  int rc = MPI_Allreduce(MPI_IN_PLACE, dst, static_cast<int>(count), mpi_dtype,
                         static_cast<MPI_Op>(op), static_cast<MPI_Comm>(comm));
  if (rc != MPI_SUCCESS) return ffi::Error::Internal("MPI_Allreduce failed");
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(research_allreduce_inplace, AllreduceInPlace,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Token>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::Token>()
                                  .Attr<int64_t>("comm")
                                  .Attr<int64_t>("dtype")
                                  .Attr<int64_t>("op"));
