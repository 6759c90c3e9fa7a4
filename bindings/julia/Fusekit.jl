"""
    Fusekit

Julia bindings for fusekit (fused elementwise GPU kernels with a CPU fallback)
through its C ABI (`include/fusekit.h`).

Two layers:

- **Raw**: one Julia function per C entry point, same name and argument order
  (`fk_add(a, b, out, stream)`), each a single `ccall` returning the C result
  (an `Int32` status for most). Handles are `Ptr{fk_context}`, `Ptr{fk_stream}`,
  `Ptr{fk_buffer}`; the wrapper objects below convert to them automatically.
- **Idiomatic**: `Context`, `Stream` and `Buffer` mutable structs whose finalizers
  release the C handle (call `destroy!` to release early), `check(status)`
  throwing `FusekitError`, element type mapping for `Float16`, `Float32`,
  `Float64`, `ComplexF32`, `ComplexF64`, and ops on buffers (`add!(out, a, b)`)
  and on Julia arrays (`add!(out, a, b)`, `add(a, b)`, CPU context).

# Column-major arrays

fusekit shapes are row-major (C order). A Julia array of size `(d1, ..., dn)`
with strides `(s1, ..., sn)` is passed as a buffer of **reversed** shape
`[dn, ..., d1]` and reversed strides `[sn, ..., s1]` (same memory, no copy), and
`size(buf)` / `Array(buf)` reverse back. Element `A[i, j]` is therefore buffer
element `[j-1, i-1]`. Because fusekit broadcasts NumPy-style (dimensions aligned
from the right) on the reversed shapes, this matches Julia's broadcasting
(dimensions aligned from the left): `Fusekit.add(A, v)` with `A` of size `(m, n)`
and `v` of size `(m,)` equals `A .+ v`. Strided views such as
`view(A, 1:2:m, :)` are passed with their strides, without a copy; only
`StridedArray`s are accepted (a lazy `transpose` or `PermutedDimsArray` is not
one: `copy` it first).

The array-level ops (`Fusekit.add`, `Fusekit.exp`, `Fusekit.abs`, ...) are not
exported and deliberately shadow the Base names inside the module: call them
qualified.

# Library location

`libfusekit` is `ENV["FUSEKIT_LIBRARY"]` when set at load time (a full path to
`libfusekit.so`), else `"libfusekit"` found through the system loader
(`LD_LIBRARY_PATH`, `DL_LOAD_PATH`).

```julia
include("bindings/julia/Fusekit.jl"); using .Fusekit
ctx = Fusekit.Context(Fusekit.FK_DEVICE_AUTO)
x = Fusekit.Buffer(ctx, Float32, 1024, 1024); copyto!(x, rand(Float32, 1024, 1024))
y = Fusekit.Buffer(ctx, Float32, 1024, 1024)
Fusekit.exp!(y, x); Array(y)
```
"""
module Fusekit

using Libdl

export FusekitError, Context, Stream, Buffer, check, destroy!

# ------------------------------------------------------------------ library

"""Path or name of the shared library (`ENV["FUSEKIT_LIBRARY"]`, else `"libfusekit"`)."""
const libfusekit = get(ENV, "FUSEKIT_LIBRARY", "libfusekit")

"""True when the library can be loaded (e.g. `FUSEKIT_LIBRARY` points at it)."""
is_available() = Libdl.dlopen(libfusekit; throw_error = false) !== nothing

# ------------------------------------------------------------------ constants (fusekit.h)

const FK_ABI_VERSION = 1002
const FK_MAX_DIMS = 8

const FK_DEVICE_AUTO = 0
const FK_DEVICE_CPU = 1
const FK_DEVICE_CUDA = 2
const FK_DEVICE_CUDA_HOST = 3

const FK_COMM_ID_BYTES = 128
const FK_REDUCE_SUM = 0
const FK_REDUCE_PROD = 1
const FK_REDUCE_MAX = 2
const FK_REDUCE_MIN = 3

const FK_DTYPE_F16 = 1
const FK_DTYPE_BF16 = 2
const FK_DTYPE_F32 = 3
const FK_DTYPE_F64 = 4
const FK_DTYPE_C64 = 5
const FK_DTYPE_C128 = 6

const FK_OK = 0
const FK_ERROR_INVALID_ARGUMENT = 1
const FK_ERROR_NULL_POINTER = 2
const FK_ERROR_UNSUPPORTED_DTYPE = 3
const FK_ERROR_SHAPE_MISMATCH = 4
const FK_ERROR_DEVICE_MISMATCH = 5
const FK_ERROR_ALIASING = 6
const FK_ERROR_OUT_OF_MEMORY = 7
const FK_ERROR_CUDA_UNAVAILABLE = 8
const FK_ERROR_LIBRARY_NOT_FOUND = 9
const FK_ERROR_KERNEL_COMPILE = 10
const FK_ERROR_CUDA = 11
const FK_ERROR_ABI_MISMATCH = 12
const FK_ERROR_BUFFER_TOO_SMALL = 13
const FK_ERROR_UNSUPPORTED = 14
const FK_ERROR_INTERNAL = 15
const FK_ERROR_IO = 16
const FK_ERROR_DTYPE_MISMATCH = 17
const FK_ERROR_NOT_CONVERGED = 18

# linear algebra (fk_op, fk_activation, fk_gemm flags)
const FK_OP_N = 0
const FK_OP_T = 1
const FK_OP_C = 2
const FK_ACT_NONE = 0
const FK_ACT_RELU = 1
const FK_ACT_GELU_TANH = 2   # GELU, tanh approximation (torch's gelu(approximate="tanh"))
const FK_ACT_GELU_ERF = 3    # GELU, exact: 0.5 z (1 + erf(z / sqrt 2)) (torch's default gelu)
const FK_GEMM_ALLOW_TF32 = 1

const FK_GAUSSIAN_DEFAULT_EPS = 1e-6

const FK_GEO_ALLOW_TF32 = 1
const FK_GEO_FORCE_GENERIC = 2
const FK_GEO_ALLOW_TF32X3 = 4

# optimizer math (fk_matpow_method; the flags are FK_GEMM_ALLOW_TF32)
const FK_MATPOW_AUTO = 0
const FK_MATPOW_EIGH = 1
const FK_MATPOW_NEWTON = 2

# ------------------------------------------------------------------ C types

"""Opaque C handle types; only `Ptr`s to them exist."""
struct fk_context end
struct fk_stream end
struct fk_buffer end
struct fk_event end
struct fk_comm end

"""`fk_memory_stats` (`fk_context_memory_stats`): `size` is set by the caller to
`sizeof(FkMemoryStats)`; all counts in bytes unless named otherwise."""
struct FkMemoryStats
    size::Csize_t
    allocated_bytes::UInt64
    peak_allocated_bytes::UInt64
    reserved_bytes::UInt64
    peak_reserved_bytes::UInt64
    pool_used_bytes::UInt64
    live_allocations::UInt64
    device_free_bytes::UInt64
    device_total_bytes::UInt64
    release_threshold_bytes::UInt64
    pinned_bytes::UInt64
    pinned_allocations::UInt64
end

"""`fk_matpow_report` (`fk_matrix_power`'s optional out-parameter): the method that
produced the result (`FK_MATPOW_EIGH` or `FK_MATPOW_NEWTON`), Newton iterations run,
`converged` (1 or 0), `reserved` (always 0), Newton's residual `max |M - I|` (NaN
when unchecked and for eigh) and eigh's smallest eigenvalue of `A + eps I` (NaN for
Newton)."""
struct FkMatpowReport
    method::Int32
    iterations::Int32
    converged::Int32
    reserved::Int32
    residual::Float64
    min_eigenvalue::Float64
end
FkMatpowReport() = FkMatpowReport(Int32(0), Int32(0), Int32(0), Int32(0), NaN, NaN)

"""`fk_scalar`: a complex number `re + i*im` passed by value (`im` must be 0 for real dtypes)."""
struct FkScalar
    re::Float64
    im::Float64
end
FkScalar(x::Real) = FkScalar(Float64(x), 0.0)
FkScalar(z::Complex) = FkScalar(Float64(real(z)), Float64(imag(z)))
FkScalar(s::FkScalar) = s

# ------------------------------------------------------------------ raw layer: one ccall per C function

fk_abi_version() = ccall((:fk_abi_version, libfusekit), UInt32, ())
fk_version_string() = ccall((:fk_version_string, libfusekit), Cstring, ())
fk_status_string(status) = ccall((:fk_status_string, libfusekit), Cstring, (Int32,), status)
fk_last_error_message() = ccall((:fk_last_error_message, libfusekit), Cstring, ())
fk_last_error_message_copy(buf, capacity, needed) =
    ccall((:fk_last_error_message_copy, libfusekit), Int32, (Ptr{UInt8}, Csize_t, Ptr{Csize_t}), buf, capacity, needed)
fk_dtype_size(dtype, out) = ccall((:fk_dtype_size, libfusekit), Int32, (Int32, Ptr{Csize_t}), dtype, out)
fk_device_count(out) = ccall((:fk_device_count, libfusekit), Int32, (Ptr{Int32},), out)

fk_context_create(abi_version, kind, ordinal, out) =
    ccall((:fk_context_create, libfusekit), Int32, (UInt32, Int32, Int32, Ptr{Ptr{fk_context}}), abi_version, kind, ordinal, out)
fk_context_destroy(ctx) = ccall((:fk_context_destroy, libfusekit), Int32, (Ptr{fk_context},), ctx)
fk_context_device(ctx, kind, ordinal) =
    ccall((:fk_context_device, libfusekit), Int32, (Ptr{fk_context}, Ptr{Int32}, Ptr{Int32}), ctx, kind, ordinal)
fk_context_name(ctx, buf, capacity, needed) =
    ccall((:fk_context_name, libfusekit), Int32, (Ptr{fk_context}, Ptr{UInt8}, Csize_t, Ptr{Csize_t}), ctx, buf, capacity, needed)
fk_context_compute_capability(ctx, major, minor) =
    ccall((:fk_context_compute_capability, libfusekit), Int32, (Ptr{fk_context}, Ptr{Int32}, Ptr{Int32}), ctx, major, minor)
fk_context_memory(ctx, free_bytes, total_bytes) =
    ccall((:fk_context_memory, libfusekit), Int32, (Ptr{fk_context}, Ptr{UInt64}, Ptr{UInt64}), ctx, free_bytes, total_bytes)
fk_context_warmup(ctx) = ccall((:fk_context_warmup, libfusekit), Int32, (Ptr{fk_context},), ctx)

fk_stream_create(ctx, out) = ccall((:fk_stream_create, libfusekit), Int32, (Ptr{fk_context}, Ptr{Ptr{fk_stream}}), ctx, out)
fk_stream_wrap(ctx, cu_stream, out) =
    ccall((:fk_stream_wrap, libfusekit), Int32, (Ptr{fk_context}, Ptr{Cvoid}, Ptr{Ptr{fk_stream}}), ctx, cu_stream, out)
fk_stream_destroy(stream) = ccall((:fk_stream_destroy, libfusekit), Int32, (Ptr{fk_stream},), stream)
fk_stream_synchronize(stream) = ccall((:fk_stream_synchronize, libfusekit), Int32, (Ptr{fk_stream},), stream)
fk_stream_handle(stream, out) = ccall((:fk_stream_handle, libfusekit), Int32, (Ptr{fk_stream}, Ptr{Ptr{Cvoid}}), stream, out)

fk_buffer_create(ctx, dtype, ndim, shape, stream, out) =
    ccall((:fk_buffer_create, libfusekit), Int32,
          (Ptr{fk_context}, Int32, Int32, Ptr{Int64}, Ptr{fk_stream}, Ptr{Ptr{fk_buffer}}),
          ctx, dtype, ndim, shape, stream, out)
fk_buffer_wrap(ctx, data, dtype, ndim, shape, strides, out) =
    ccall((:fk_buffer_wrap, libfusekit), Int32,
          (Ptr{fk_context}, Ptr{Cvoid}, Int32, Int32, Ptr{Int64}, Ptr{Int64}, Ptr{Ptr{fk_buffer}}),
          ctx, data, dtype, ndim, shape, strides, out)
fk_buffer_destroy(buf) = ccall((:fk_buffer_destroy, libfusekit), Int32, (Ptr{fk_buffer},), buf)
fk_buffer_from_dlpack(ctx, managed, out) =
    ccall((:fk_buffer_from_dlpack, libfusekit), Int32, (Ptr{fk_context}, Ptr{Cvoid}, Ptr{Ptr{fk_buffer}}), ctx, managed, out)
fk_buffer_to_dlpack(buf, out) = ccall((:fk_buffer_to_dlpack, libfusekit), Int32, (Ptr{fk_buffer}, Ptr{Ptr{Cvoid}}), buf, out)
fk_buffer_copy_from_host(buf, src, bytes, stream) =
    ccall((:fk_buffer_copy_from_host, libfusekit), Int32, (Ptr{fk_buffer}, Ptr{Cvoid}, Csize_t, Ptr{fk_stream}), buf, src, bytes, stream)
fk_buffer_copy_from_host_async(buf, src, bytes, stream) =
    ccall((:fk_buffer_copy_from_host_async, libfusekit), Int32, (Ptr{fk_buffer}, Ptr{Cvoid}, Csize_t, Ptr{fk_stream}), buf, src, bytes, stream)
fk_buffer_copy_to_host(buf, dst, bytes, stream) =
    ccall((:fk_buffer_copy_to_host, libfusekit), Int32, (Ptr{fk_buffer}, Ptr{Cvoid}, Csize_t, Ptr{fk_stream}), buf, dst, bytes, stream)
fk_buffer_copy_to_host_async(buf, dst, bytes, stream) =
    ccall((:fk_buffer_copy_to_host_async, libfusekit), Int32, (Ptr{fk_buffer}, Ptr{Cvoid}, Csize_t, Ptr{fk_stream}), buf, dst, bytes, stream)
fk_buffer_dtype(buf, out) = ccall((:fk_buffer_dtype, libfusekit), Int32, (Ptr{fk_buffer}, Ptr{Int32}), buf, out)
fk_buffer_ndim(buf, out) = ccall((:fk_buffer_ndim, libfusekit), Int32, (Ptr{fk_buffer}, Ptr{Int32}), buf, out)
fk_buffer_shape(buf, out) = ccall((:fk_buffer_shape, libfusekit), Int32, (Ptr{fk_buffer}, Ptr{Int64}), buf, out)
fk_buffer_strides(buf, out) = ccall((:fk_buffer_strides, libfusekit), Int32, (Ptr{fk_buffer}, Ptr{Int64}), buf, out)
fk_buffer_data(buf, out) = ccall((:fk_buffer_data, libfusekit), Int32, (Ptr{fk_buffer}, Ptr{Ptr{Cvoid}}), buf, out)
fk_buffer_device(buf, kind, ordinal) =
    ccall((:fk_buffer_device, libfusekit), Int32, (Ptr{fk_buffer}, Ptr{Int32}, Ptr{Int32}), buf, kind, ordinal)
fk_buffer_numel(buf, out) = ccall((:fk_buffer_numel, libfusekit), Int32, (Ptr{fk_buffer}, Ptr{Int64}), buf, out)
fk_buffer_nbytes(buf, out) = ccall((:fk_buffer_nbytes, libfusekit), Int32, (Ptr{fk_buffer}, Ptr{Csize_t}), buf, out)
fk_buffer_is_contiguous(buf, out) = ccall((:fk_buffer_is_contiguous, libfusekit), Int32, (Ptr{fk_buffer}, Ptr{Int32}), buf, out)

fk_add(a, b, out, stream) =
    ccall((:fk_add, libfusekit), Int32, (Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_stream}), a, b, out, stream)
fk_sub(a, b, out, stream) =
    ccall((:fk_sub, libfusekit), Int32, (Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_stream}), a, b, out, stream)
fk_mul(a, b, out, stream) =
    ccall((:fk_mul, libfusekit), Int32, (Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_stream}), a, b, out, stream)
fk_div(a, b, out, stream) =
    ccall((:fk_div, libfusekit), Int32, (Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_stream}), a, b, out, stream)
fk_axpby(alpha, a, beta, b, out, stream) =
    ccall((:fk_axpby, libfusekit), Int32,
          (FkScalar, Ptr{fk_buffer}, FkScalar, Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_stream}),
          alpha, a, beta, b, out, stream)
fk_scalar_add(a, s, out, stream) =
    ccall((:fk_scalar_add, libfusekit), Int32, (Ptr{fk_buffer}, FkScalar, Ptr{fk_buffer}, Ptr{fk_stream}), a, s, out, stream)
fk_scalar_mul(a, s, out, stream) =
    ccall((:fk_scalar_mul, libfusekit), Int32, (Ptr{fk_buffer}, FkScalar, Ptr{fk_buffer}, Ptr{fk_stream}), a, s, out, stream)
fk_neg(a, out, stream) = ccall((:fk_neg, libfusekit), Int32, (Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_stream}), a, out, stream)
fk_abs(a, out, stream) = ccall((:fk_abs, libfusekit), Int32, (Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_stream}), a, out, stream)
fk_exp(a, out, stream) = ccall((:fk_exp, libfusekit), Int32, (Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_stream}), a, out, stream)
fk_log(a, out, stream) = ccall((:fk_log, libfusekit), Int32, (Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_stream}), a, out, stream)
fk_sqrt(a, out, stream) = ccall((:fk_sqrt, libfusekit), Int32, (Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_stream}), a, out, stream)
fk_sin(a, out, stream) = ccall((:fk_sin, libfusekit), Int32, (Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_stream}), a, out, stream)
fk_cos(a, out, stream) = ccall((:fk_cos, libfusekit), Int32, (Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_stream}), a, out, stream)
fk_tanh(a, out, stream) = ccall((:fk_tanh, libfusekit), Int32, (Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_stream}), a, out, stream)
fk_sigmoid(a, out, stream) = ccall((:fk_sigmoid, libfusekit), Int32, (Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_stream}), a, out, stream)
fk_relu(a, out, stream) = ccall((:fk_relu, libfusekit), Int32, (Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_stream}), a, out, stream)
fk_copy(a, out, stream) = ccall((:fk_copy, libfusekit), Int32, (Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_stream}), a, out, stream)

# runtime: memory, pinned buffers, copies, peers, events, communicators
fk_context_memory_stats(ctx, stats) =
    ccall((:fk_context_memory_stats, libfusekit), Int32, (Ptr{fk_context}, Ptr{FkMemoryStats}), ctx, stats)
fk_context_set_release_threshold(ctx, bytes) =
    ccall((:fk_context_set_release_threshold, libfusekit), Int32, (Ptr{fk_context}, UInt64), ctx, bytes)
fk_context_trim(ctx, keep_bytes) = ccall((:fk_context_trim, libfusekit), Int32, (Ptr{fk_context}, UInt64), ctx, keep_bytes)
fk_buffer_create_pinned(ctx, dtype, ndim, shape, out) =
    ccall((:fk_buffer_create_pinned, libfusekit), Int32,
          (Ptr{fk_context}, Int32, Int32, Ptr{Int64}, Ptr{Ptr{fk_buffer}}), ctx, dtype, ndim, shape, out)
fk_buffer_copy(dst, src, stream) =
    ccall((:fk_buffer_copy, libfusekit), Int32, (Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_stream}), dst, src, stream)
fk_device_can_access_peer(device, peer, out) =
    ccall((:fk_device_can_access_peer, libfusekit), Int32, (Int32, Int32, Ptr{Int32}), device, peer, out)
fk_event_create(ctx, out) = ccall((:fk_event_create, libfusekit), Int32, (Ptr{fk_context}, Ptr{Ptr{fk_event}}), ctx, out)
fk_event_destroy(event) = ccall((:fk_event_destroy, libfusekit), Int32, (Ptr{fk_event},), event)
fk_event_record(event, stream) = ccall((:fk_event_record, libfusekit), Int32, (Ptr{fk_event}, Ptr{fk_stream}), event, stream)
fk_stream_wait_event(stream, event) =
    ccall((:fk_stream_wait_event, libfusekit), Int32, (Ptr{fk_stream}, Ptr{fk_event}), stream, event)
fk_event_synchronize(event) = ccall((:fk_event_synchronize, libfusekit), Int32, (Ptr{fk_event},), event)
fk_event_query(event, done) = ccall((:fk_event_query, libfusekit), Int32, (Ptr{fk_event}, Ptr{Int32}), event, done)
fk_event_elapsed_ms(start, stop, ms) =
    ccall((:fk_event_elapsed_ms, libfusekit), Int32, (Ptr{fk_event}, Ptr{fk_event}, Ptr{Cfloat}), start, stop, ms)
fk_comm_unique_id(out) = ccall((:fk_comm_unique_id, libfusekit), Int32, (Ptr{UInt8},), out)
fk_comm_init_rank(ctx, nranks, id, rank, out) =
    ccall((:fk_comm_init_rank, libfusekit), Int32,
          (Ptr{fk_context}, Int32, Ptr{UInt8}, Int32, Ptr{Ptr{fk_comm}}), ctx, nranks, id, rank, out)
fk_comm_init_all(ctxs, n, comms_out) =
    ccall((:fk_comm_init_all, libfusekit), Int32, (Ptr{Ptr{fk_context}}, Int32, Ptr{Ptr{fk_comm}}), ctxs, n, comms_out)
fk_comm_destroy(comm) = ccall((:fk_comm_destroy, libfusekit), Int32, (Ptr{fk_comm},), comm)
fk_comm_rank(comm, out) = ccall((:fk_comm_rank, libfusekit), Int32, (Ptr{fk_comm}, Ptr{Int32}), comm, out)
fk_comm_size(comm, out) = ccall((:fk_comm_size, libfusekit), Int32, (Ptr{fk_comm}, Ptr{Int32}), comm, out)
fk_comm_group_start() = ccall((:fk_comm_group_start, libfusekit), Int32, ())
fk_comm_group_end() = ccall((:fk_comm_group_end, libfusekit), Int32, ())
fk_all_reduce(comm, send, recv, op, stream) =
    ccall((:fk_all_reduce, libfusekit), Int32,
          (Ptr{fk_comm}, Ptr{fk_buffer}, Ptr{fk_buffer}, Int32, Ptr{fk_stream}), comm, send, recv, op, stream)
fk_broadcast(comm, send, recv, root, stream) =
    ccall((:fk_broadcast, libfusekit), Int32,
          (Ptr{fk_comm}, Ptr{fk_buffer}, Ptr{fk_buffer}, Int32, Ptr{fk_stream}), comm, send, recv, root, stream)
fk_all_gather(comm, send, recv, stream) =
    ccall((:fk_all_gather, libfusekit), Int32,
          (Ptr{fk_comm}, Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_stream}), comm, send, recv, stream)
fk_reduce_scatter(comm, send, recv, op, stream) =
    ccall((:fk_reduce_scatter, libfusekit), Int32,
          (Ptr{fk_comm}, Ptr{fk_buffer}, Ptr{fk_buffer}, Int32, Ptr{fk_stream}), comm, send, recv, op, stream)

# linear algebra (row-major buffers: see `gemm!` for Julia's column-major arrays)
fk_gemm(op_a, op_b, alpha, a, b, beta, c, flags, stream) =
    ccall((:fk_gemm, libfusekit), Int32,
          (Int32, Int32, FkScalar, Ptr{fk_buffer}, Ptr{fk_buffer}, FkScalar, Ptr{fk_buffer}, UInt32, Ptr{fk_stream}),
          op_a, op_b, alpha, a, b, beta, c, flags, stream)
fk_gemm_chunked(op_a, op_b, alpha, a, b, beta, c, device_budget_bytes, flags, stream) =
    ccall((:fk_gemm_chunked, libfusekit), Int32,
          (Int32, Int32, FkScalar, Ptr{fk_buffer}, Ptr{fk_buffer}, FkScalar, Ptr{fk_buffer}, UInt64, UInt32, Ptr{fk_stream}),
          op_a, op_b, alpha, a, b, beta, c, device_budget_bytes, flags, stream)
fk_linear_aux_size(act, dtype, m, n, bytes) =
    ccall((:fk_linear_aux_size, libfusekit), Int32, (Int32, Int32, Int64, Int64, Ptr{Csize_t}), act, dtype, m, n, bytes)
fk_linear_forward(x, w, b, act, y, aux, stream) =
    ccall((:fk_linear_forward, libfusekit), Int32,
          (Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_buffer}, Int32, Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_stream}),
          x, w, b, act, y, aux, stream)
fk_linear_backward(dy, x, w, act, saved, dx, dw, db, stream) =
    ccall((:fk_linear_backward, libfusekit), Int32,
          (Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_buffer}, Int32, Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_buffer},
           Ptr{fk_buffer}, Ptr{fk_stream}),
          dy, x, w, act, saved, dx, dw, db, stream)
fk_kron(a, b, out, stream) =
    ccall((:fk_kron, libfusekit), Int32, (Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_stream}), a, b, out, stream)

# Gaussian field (docs/ops.md section 3, docs/gaussian.md); NULL (C_NULL) for an unwanted gradient.
fk_mahalanobis_forward(points, means, chol, eps, out, stream) =
    ccall((:fk_mahalanobis_forward, libfusekit), Int32,
          (Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_buffer}, Cdouble, Ptr{fk_buffer}, Ptr{fk_stream}),
          points, means, chol, eps, out, stream)
fk_mahalanobis_backward(points, means, chol, eps, g, dpoints, dmeans, dchol, workspace, stream) =
    ccall((:fk_mahalanobis_backward, libfusekit), Int32,
          (Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_buffer}, Cdouble, Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_buffer},
           Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_stream}),
          points, means, chol, eps, g, dpoints, dmeans, dchol, workspace, stream)
fk_gaussian_field_forward(points, means, chol, weights, eps, out, stream) =
    ccall((:fk_gaussian_field_forward, libfusekit), Int32,
          (Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_buffer}, Cdouble, Ptr{fk_buffer}, Ptr{fk_stream}),
          points, means, chol, weights, eps, out, stream)
fk_gaussian_field_backward(points, means, chol, weights, eps, dout, dpoints, dmeans, dchol, dweights, workspace, stream) =
    ccall((:fk_gaussian_field_backward, libfusekit), Int32,
          (Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_buffer}, Cdouble, Ptr{fk_buffer}, Ptr{fk_buffer},
           Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_stream}),
          points, means, chol, weights, eps, dout, dpoints, dmeans, dchol, dweights, workspace, stream)
fk_gaussian_backward_workspace_size(ctx, dtype, num_points, num_gaussians, bytes) =
    ccall((:fk_gaussian_backward_workspace_size, libfusekit), Int32,
          (Ptr{fk_context}, Int32, Int64, Int64, Ptr{Csize_t}), ctx, dtype, num_points, num_gaussians, bytes)

# Geodesic flow ops (docs/geodesic.md). fusekit's row-major [B, D] is a Julia (D, B)
# matrix (one geodesic per column); U, W [D, R] are Julia (R, D) matrices. Optional
# buffers are C_NULL.
fk_christoffel_forward(v, U, W, c, flags, gamma, stream) =
    ccall((:fk_christoffel_forward, libfusekit), Int32,
          (Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_buffer}, Cdouble, UInt32, Ptr{fk_buffer}, Ptr{fk_stream}),
          v, U, W, c, flags, gamma, stream)
fk_christoffel_backward(v, U, W, g, c, flags, dv, dU, dW, stream) =
    ccall((:fk_christoffel_backward, libfusekit), Int32,
          (Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_buffer}, Cdouble, UInt32,
           Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_stream}),
          v, U, W, g, c, flags, dv, dU, dW, stream)
fk_leapfrog_forward(x0, v0, f, U, W, mu, dt, steps, c, flags, x_out, v_out, traj, stream) =
    ccall((:fk_leapfrog_forward, libfusekit), Int32,
          (Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_buffer},
           Cdouble, Int64, Cdouble, UInt32, Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_stream}),
          x0, v0, f, U, W, mu, dt, steps, c, flags, x_out, v_out, traj, stream)
fk_leapfrog_backward(v0, f, U, W, mu, dt, steps, c, flags, traj, gx, gv, dx0, dv0, df, dU, dW, stream) =
    ccall((:fk_leapfrog_backward, libfusekit), Int32,
          (Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_buffer},
           Cdouble, Int64, Cdouble, UInt32, Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_buffer},
           Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_stream}),
          v0, f, U, W, mu, dt, steps, c, flags, traj, gx, gv, dx0, dv0, df, dU, dW, stream)

# Optimizer math (docs/ops.md section 4, src/abi/optim.rs). Optional buffers (and the
# report) are C_NULL. Shapes are row-major: see the buffer-level wrappers below.
fk_matrix_power(a, power, eps, method, max_iter, tol, flags, out, report, stream) =
    ccall((:fk_matrix_power, libfusekit), Int32,
          (Ptr{fk_buffer}, Cdouble, Cdouble, Int32, Int32, Cdouble, UInt32, Ptr{fk_buffer}, Ptr{FkMatpowReport},
           Ptr{fk_stream}),
          a, power, eps, method, max_iter, tol, flags, out, report, stream)
fk_shampoo_stats(grad, alpha, beta, l, r, stream) =
    ccall((:fk_shampoo_stats, libfusekit), Int32,
          (Ptr{fk_buffer}, Cdouble, Cdouble, Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_stream}),
          grad, alpha, beta, l, r, stream)
fk_shampoo_stats_ex(grad, alpha, beta, l, r, flags, stream) =
    ccall((:fk_shampoo_stats_ex, libfusekit), Int32,
          (Ptr{fk_buffer}, Cdouble, Cdouble, Ptr{fk_buffer}, Ptr{fk_buffer}, UInt32, Ptr{fk_stream}),
          grad, alpha, beta, l, r, flags, stream)
fk_shampoo_precondition(l_root, grad, r_root, out, flags, stream) =
    ccall((:fk_shampoo_precondition, libfusekit), Int32,
          (Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_buffer}, UInt32, Ptr{fk_stream}),
          l_root, grad, r_root, out, flags, stream)
fk_per_sample_grads(a, g, out, flags, stream) =
    ccall((:fk_per_sample_grads, libfusekit), Int32,
          (Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_buffer}, UInt32, Ptr{fk_stream}), a, g, out, flags, stream)
fk_per_sample_grad_norms(a, g, sq_norms, stream) =
    ccall((:fk_per_sample_grad_norms, libfusekit), Int32,
          (Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_buffer}, Ptr{fk_stream}), a, g, sq_norms, stream)
fk_dp_clipped_grad_sum(a, g, max_norm, out, sq_norms, flags, stream) =
    ccall((:fk_dp_clipped_grad_sum, libfusekit), Int32,
          (Ptr{fk_buffer}, Ptr{fk_buffer}, Cdouble, Ptr{fk_buffer}, Ptr{fk_buffer}, UInt32, Ptr{fk_stream}),
          a, g, max_norm, out, sq_norms, flags, stream)

# ------------------------------------------------------------------ errors

"""
    FusekitError(status, name, message)

A failed fusekit call: `status` (an `FK_ERROR_*` value), its `name`
(e.g. `"FK_ERROR_SHAPE_MISMATCH"`) and the library's `message`
(`"<function>: <cause>"`, naming the argument at fault).
"""
struct FusekitError <: Exception
    status::Int32
    name::String
    message::String
end

Base.showerror(io::IO, e::FusekitError) = print(io, "FusekitError: ", e.name, ": ", e.message)

"""Static name of a status, e.g. `status_string(4) == "FK_ERROR_SHAPE_MISMATCH"`."""
status_string(status::Integer) = unsafe_string(fk_status_string(Int32(status)))

"""This thread's last error message (empty when no call has failed)."""
last_error_message() = unsafe_string(fk_last_error_message())

"""The same message through the copy form (`fk_last_error_message_copy`)."""
function last_error_message_copy()
    needed = Ref{Csize_t}(0)
    fk_last_error_message_copy(Ptr{UInt8}(C_NULL), Csize_t(0), needed)  # size query, always FK_OK
    buf = Vector{UInt8}(undef, needed[])
    fk_last_error_message_copy(buf, Csize_t(length(buf)), needed)
    return String(buf[1:end-1])  # drop the NUL
end

"""
    check(status)

Returns `nothing` for `FK_OK`, otherwise throws a [`FusekitError`](@ref) with the
status name and the last error message.
"""
function check(status::Integer)
    status == FK_OK && return nothing
    throw(FusekitError(Int32(status), status_string(status), last_error_message()))
end

# ------------------------------------------------------------------ versions, dtypes, devices

abi_version() = fk_abi_version()
version() = unsafe_string(fk_version_string())

"""Number of usable CUDA devices (0 when there is no driver or GPU)."""
function device_count()
    n = Ref{Int32}(0)
    check(fk_device_count(n))
    return Int(n[])
end

"""Element types with a fusekit dtype. (bfloat16 has no Base type: use raw buffers.)"""
const FkElement = Union{Float16,Float32,Float64,ComplexF32,ComplexF64}

dtype_of(::Type{Float16}) = Int32(FK_DTYPE_F16)
dtype_of(::Type{Float32}) = Int32(FK_DTYPE_F32)
dtype_of(::Type{Float64}) = Int32(FK_DTYPE_F64)
dtype_of(::Type{ComplexF32}) = Int32(FK_DTYPE_C64)
dtype_of(::Type{ComplexF64}) = Int32(FK_DTYPE_C128)
dtype_of(::Type{T}) where {T} = throw(ArgumentError("fusekit has no dtype for element type $T"))

function julia_type(dtype::Integer)
    dtype == FK_DTYPE_F16 && return Float16
    dtype == FK_DTYPE_F32 && return Float32
    dtype == FK_DTYPE_F64 && return Float64
    dtype == FK_DTYPE_C64 && return ComplexF32
    dtype == FK_DTYPE_C128 && return ComplexF64
    dtype == FK_DTYPE_BF16 && return UInt16  # raw bit patterns
    throw(ArgumentError("unknown fusekit dtype $dtype"))
end

function dtype_size(dtype::Integer)
    n = Ref{Csize_t}(0)
    check(fk_dtype_size(Int32(dtype), n))
    return Int(n[])
end

# ------------------------------------------------------------------ Context

"""
    Context(kind = FK_DEVICE_AUTO, ordinal = 0)

A device context (`fk_context_create`). `kind` is `FK_DEVICE_CPU`,
`FK_DEVICE_CUDA` or `FK_DEVICE_AUTO`. Released by its finalizer or `destroy!`.
"""
mutable struct Context
    ptr::Ptr{fk_context}
    function Context(kind::Integer = FK_DEVICE_AUTO, ordinal::Integer = 0)
        out = Ref{Ptr{fk_context}}(C_NULL)
        check(fk_context_create(UInt32(FK_ABI_VERSION), Int32(kind), Int32(ordinal), out))
        c = new(out[])
        finalizer(destroy!, c)
        return c
    end
end

Base.unsafe_convert(::Type{Ptr{fk_context}}, c::Context) = c.ptr

function destroy!(c::Context)
    if c.ptr != C_NULL
        fk_context_destroy(c.ptr)
        c.ptr = C_NULL
    end
    return nothing
end

const _CPU_CONTEXT = Ref{Union{Context,Nothing}}(nothing)
"""A process-wide CPU context, created on first use (used for Julia arrays)."""
function cpu_context()
    if _CPU_CONTEXT[] === nothing
        _CPU_CONTEXT[] = Context(FK_DEVICE_CPU)
    end
    return _CPU_CONTEXT[]::Context
end

"""`(kind, ordinal)` of the context's device."""
function device(c::Context)
    k = Ref{Int32}(0)
    o = Ref{Int32}(0)
    check(fk_context_device(c, k, o))
    return (Int(k[]), Int(o[]))
end

is_cuda(c::Context) = device(c)[1] == FK_DEVICE_CUDA

function _copy_string(f)
    needed = Ref{Csize_t}(0)
    check(f(Ptr{UInt8}(C_NULL), Csize_t(0), needed))
    buf = Vector{UInt8}(undef, needed[])
    check(f(buf, Csize_t(length(buf)), needed))
    return String(buf[1:end-1])
end

"""The device's name, e.g. `"NVIDIA H100 80GB HBM3"`."""
name(c::Context) = _copy_string((buf, cap, needed) -> fk_context_name(c, buf, cap, needed))

function compute_capability(c::Context)
    major = Ref{Int32}(0)
    minor = Ref{Int32}(0)
    check(fk_context_compute_capability(c, major, minor))
    return (Int(major[]), Int(minor[]))
end

"""`(free_bytes, total_bytes)` of the context's device."""
function memory(c::Context)
    f = Ref{UInt64}(0)
    t = Ref{UInt64}(0)
    check(fk_context_memory(c, f, t))
    return (f[], t[])
end

"""Compiles every kernel module now (no-op on the CPU)."""
warmup(c::Context) = (check(fk_context_warmup(c)); nothing)

# ------------------------------------------------------------------ Stream

"""
    Stream(ctx)                 # owned by fusekit
    Stream(ctx, cu_stream)      # borrows a CUstream (Ptr{Cvoid}; C_NULL = legacy default)

Released by its finalizer or `destroy!`. A borrowed CUstream must outlive it.
"""
mutable struct Stream
    ptr::Ptr{fk_stream}
    ctx::Context
    function Stream(ctx::Context)
        out = Ref{Ptr{fk_stream}}(C_NULL)
        check(fk_stream_create(ctx, out))
        s = new(out[], ctx)
        finalizer(destroy!, s)
        return s
    end
    function Stream(ctx::Context, cu_stream::Ptr{Cvoid})
        out = Ref{Ptr{fk_stream}}(C_NULL)
        check(fk_stream_wrap(ctx, cu_stream, out))
        s = new(out[], ctx)
        finalizer(destroy!, s)
        return s
    end
end

Base.unsafe_convert(::Type{Ptr{fk_stream}}, s::Stream) = s.ptr

function destroy!(s::Stream)
    if s.ptr != C_NULL
        fk_stream_destroy(s.ptr)
        s.ptr = C_NULL
    end
    return nothing
end

synchronize(s::Stream) = (check(fk_stream_synchronize(s)); nothing)

"""The raw CUstream (C_NULL for the legacy default stream and on the CPU)."""
function handle(s::Stream)
    p = Ref{Ptr{Cvoid}}(C_NULL)
    check(fk_stream_handle(s, p))
    return p[]
end

# `stream = nothing` means the default stream (a NULL fk_stream*).
_sptr(::Nothing) = Ptr{fk_stream}(C_NULL)
_sptr(s::Stream) = s

# ------------------------------------------------------------------ Buffer

"""
    Buffer(ctx, T, dims...; stream = nothing)   # owned, uninitialised
    borrow(ctx, A)                               # view of a Julia array (no copy)

A fusekit buffer. `size(buf)` is in Julia order (the reverse of the C shape, see
the module docs). `owner` keeps a borrowed array alive as long as the buffer.
Released by its finalizer or `destroy!`.
"""
mutable struct Buffer
    ptr::Ptr{fk_buffer}
    ctx::Union{Context,Nothing}
    owner::Any
    function Buffer(ptr::Ptr{fk_buffer}, ctx::Union{Context,Nothing}, owner)
        b = new(ptr, ctx, owner)
        finalizer(destroy!, b)
        return b
    end
end

Base.unsafe_convert(::Type{Ptr{fk_buffer}}, b::Buffer) = b.ptr

function destroy!(b::Buffer)
    if b.ptr != C_NULL
        fk_buffer_destroy(b.ptr)
        b.ptr = C_NULL
    end
    b.owner = nothing
    return nothing
end

function Buffer(ctx::Context, ::Type{T}, dims::Integer...; stream::Union{Stream,Nothing} = nothing) where {T}
    shape = Int64[reverse(dims)...]
    out = Ref{Ptr{fk_buffer}}(C_NULL)
    check(fk_buffer_create(ctx, dtype_of(T), Int32(length(shape)), shape, _sptr(stream), out))
    return Buffer(out[], ctx, nothing)
end

"""
    borrow(ctx, A::StridedArray)

Wraps the memory of `A` (no copy) as a buffer of reversed shape and strides.
Host arrays need a CPU context (a CUDA context accepts only device, managed or
pinned memory).
"""
function borrow(ctx::Context, A::StridedArray{T}) where {T<:FkElement}
    shape = Int64[reverse(size(A))...]
    strd = Int64[reverse(strides(A))...]
    out = Ref{Ptr{fk_buffer}}(C_NULL)
    GC.@preserve A begin
        check(fk_buffer_wrap(ctx, Ptr{Cvoid}(pointer(A)), dtype_of(T), Int32(ndims(A)), shape, strd, out))
    end
    return Buffer(out[], ctx, A)
end

"""
    wrap(ctx, ptr, T, dims; strides = nothing)

Wraps raw memory (e.g. a device pointer from CUDA.jl: `pointer(cuarray)`) as a
buffer. `dims` and `strides` are in Julia (column-major) order.
"""
function wrap(ctx::Context, ptr::Ptr, ::Type{T}, dims::Dims; strides::Union{Dims,Nothing} = nothing) where {T}
    shape = Int64[reverse(dims)...]
    strd = strides === nothing ? Int64[reverse(Base.size_to_strides(1, dims...))...] : Int64[reverse(strides)...]
    out = Ref{Ptr{fk_buffer}}(C_NULL)
    check(fk_buffer_wrap(ctx, Ptr{Cvoid}(ptr), dtype_of(T), Int32(length(shape)), shape, strd, out))
    return Buffer(out[], ctx, nothing)
end

"""Imports a `DLManagedTensorVersioned*`; on success the buffer owns it."""
function from_dlpack(ctx::Context, managed::Ptr{Cvoid})
    out = Ref{Ptr{fk_buffer}}(C_NULL)
    check(fk_buffer_from_dlpack(ctx, managed, out))
    return Buffer(out[], ctx, nothing)
end

"""Exports a new `DLManagedTensorVersioned*` (the consumer must call its deleter once)."""
function to_dlpack(b::Buffer)
    p = Ref{Ptr{Cvoid}}(C_NULL)
    check(fk_buffer_to_dlpack(b, p))
    return p[]
end

function dtype(b::Buffer)
    r = Ref{Int32}(0)
    check(fk_buffer_dtype(b, r))
    return r[]
end

Base.eltype(b::Buffer) = julia_type(dtype(b))

function Base.ndims(b::Buffer)
    r = Ref{Int32}(0)
    check(fk_buffer_ndim(b, r))
    return Int(r[])
end

"""The C (row-major) shape."""
function shape(b::Buffer)
    v = zeros(Int64, ndims(b))
    check(fk_buffer_shape(b, v))
    return v
end

"""The C strides in elements (row-major order of dimensions)."""
function cstrides(b::Buffer)
    v = zeros(Int64, ndims(b))
    check(fk_buffer_strides(b, v))
    return v
end

"""Size in Julia order (reverse of `shape`)."""
Base.size(b::Buffer) = Tuple(Int.(reverse(shape(b))))
"""Strides in Julia order (reverse of `cstrides`)."""
Base.strides(b::Buffer) = Tuple(Int.(reverse(cstrides(b))))

function Base.length(b::Buffer)
    r = Ref{Int64}(0)
    check(fk_buffer_numel(b, r))
    return Int(r[])
end

function Base.sizeof(b::Buffer)
    r = Ref{Csize_t}(0)
    check(fk_buffer_nbytes(b, r))
    return Int(r[])
end

function is_contiguous(b::Buffer)
    r = Ref{Int32}(0)
    check(fk_buffer_is_contiguous(b, r))
    return r[] != 0
end

"""Address of the first element (host or device)."""
function data(b::Buffer)
    r = Ref{Ptr{Cvoid}}(C_NULL)
    check(fk_buffer_data(b, r))
    return r[]
end

function device(b::Buffer)
    k = Ref{Int32}(0)
    o = Ref{Int32}(0)
    check(fk_buffer_device(b, k, o))
    return (Int(k[]), Int(o[]))
end

function _check_eltype(b::Buffer, ::Type{T}) where {T}
    d = dtype(b)
    d == dtype_of(T) || throw(ArgumentError("buffer has dtype $(julia_type(d)) but the array has element type $T"))
    return nothing
end

"""Copies a host array into a contiguous buffer and waits (`async = true` only queues it)."""
function Base.copyto!(b::Buffer, A::Array{T}; stream::Union{Stream,Nothing} = nothing, async::Bool = false) where {T<:FkElement}
    _check_eltype(b, T)
    f = async ? fk_buffer_copy_from_host_async : fk_buffer_copy_from_host
    check(f(b, A, Csize_t(sizeof(A)), _sptr(stream)))
    return b
end

"""Copies a contiguous buffer into a host array and waits (`async = true` only queues it)."""
function Base.copyto!(A::Array{T}, b::Buffer; stream::Union{Stream,Nothing} = nothing, async::Bool = false) where {T<:FkElement}
    _check_eltype(b, T)
    f = async ? fk_buffer_copy_to_host_async : fk_buffer_copy_to_host
    check(f(b, A, Csize_t(sizeof(A)), _sptr(stream)))
    return A
end

"""The buffer's contents as a Julia `Array` of size `size(b)`."""
function Base.Array(b::Buffer; stream::Union{Stream,Nothing} = nothing)
    A = Array{eltype(b)}(undef, size(b)...)
    check(fk_buffer_copy_to_host(b, A, Csize_t(sizeof(A)), _sptr(stream)))
    return A
end

# ------------------------------------------------------------------ ops on buffers

const _BINARY = ((:add!, :fk_add), (:sub!, :fk_sub), (:mul!, :fk_mul), (:div!, :fk_div))
const _UNARY = ((:neg!, :fk_neg), (:abs!, :fk_abs), (:exp!, :fk_exp), (:log!, :fk_log),
                (:sqrt!, :fk_sqrt), (:sin!, :fk_sin), (:cos!, :fk_cos), (:tanh!, :fk_tanh),
                (:sigmoid!, :fk_sigmoid), (:relu!, :fk_relu), (:copy!, :fk_copy))

for (jl, raw) in _BINARY
    @eval function $jl(out::Buffer, a::Buffer, b::Buffer; stream::Union{Stream,Nothing} = nothing)
        check($raw(a, b, out, _sptr(stream)))
        return out
    end
end

for (jl, raw) in _UNARY
    @eval function $jl(out::Buffer, a::Buffer; stream::Union{Stream,Nothing} = nothing)
        check($raw(a, out, _sptr(stream)))
        return out
    end
end

"""`out = alpha*a + beta*b` in one pass."""
function axpby!(out::Buffer, alpha::Number, a::Buffer, beta::Number, b::Buffer; stream::Union{Stream,Nothing} = nothing)
    check(fk_axpby(FkScalar(alpha), a, FkScalar(beta), b, out, _sptr(stream)))
    return out
end

"""`out = a + s`."""
function scalar_add!(out::Buffer, a::Buffer, s::Number; stream::Union{Stream,Nothing} = nothing)
    check(fk_scalar_add(a, FkScalar(s), out, _sptr(stream)))
    return out
end

"""`out = a * s`."""
function scalar_mul!(out::Buffer, a::Buffer, s::Number; stream::Union{Stream,Nothing} = nothing)
    check(fk_scalar_mul(a, FkScalar(s), out, _sptr(stream)))
    return out
end

# ------------------------------------------------------------------ linear algebra on buffers
#
# Buffers are row-major: a buffer `[m, k]` is a matrix with m rows. (A Julia array
# borrowed as a buffer is its transpose: see `gemm!` on arrays below.)

_bptr(::Nothing) = Ptr{fk_buffer}(C_NULL)
_bptr(b::Buffer) = b

"""`c = alpha op(a) op(b) + beta c` (`op_*` in FK_OP_N, FK_OP_T, FK_OP_C; batched `[batch, rows, cols]`)."""
function gemm!(c::Buffer, a::Buffer, b::Buffer; op_a::Integer = FK_OP_N, op_b::Integer = FK_OP_N,
               alpha::Number = 1, beta::Number = 0, flags::Integer = 0, stream::Union{Stream,Nothing} = nothing)
    check(fk_gemm(Int32(op_a), Int32(op_b), FkScalar(alpha), a, b, FkScalar(beta), c, UInt32(flags), _sptr(stream)))
    return c
end

"""`gemm!` in tiles under `budget` bytes of device staging; operands may be pinned host memory."""
function gemm_chunked!(c::Buffer, a::Buffer, b::Buffer, budget::Integer; op_a::Integer = FK_OP_N,
                       op_b::Integer = FK_OP_N, alpha::Number = 1, beta::Number = 0, flags::Integer = 0,
                       stream::Union{Stream,Nothing} = nothing)
    check(fk_gemm_chunked(Int32(op_a), Int32(op_b), FkScalar(alpha), a, b, FkScalar(beta), c, UInt64(budget),
                          UInt32(flags), _sptr(stream)))
    return c
end

"""Bytes of the aux buffer `linear_forward!` fills for `act` (the pre-activation for the GELUs, else 0)."""
function linear_aux_size(act::Integer, ::Type{T}, m::Integer, n::Integer) where {T}
    r = Ref{Csize_t}(0)
    check(fk_linear_aux_size(Int32(act), dtype_of(T), Int64(m), Int64(n), r))
    return Int(r[])
end

"""`y = act(x w^T + b)` (x `[..., k]`, w `[n, k]`, b `[n]` or nothing; aux: the GELUs' pre-activation or nothing)."""
function linear_forward!(y::Buffer, x::Buffer, w::Buffer, b::Union{Buffer,Nothing}, act::Integer;
                         aux::Union{Buffer,Nothing} = nothing, stream::Union{Stream,Nothing} = nothing)
    check(fk_linear_forward(x, w, _bptr(b), Int32(act), y, _bptr(aux), _sptr(stream)))
    return y
end

"""Backward of `linear_forward!` (`saved`: y for relu, aux for the GELUs; each gradient optional)."""
function linear_backward!(dy::Buffer, x::Buffer, w::Buffer, act::Integer, saved::Union{Buffer,Nothing};
                          dx::Union{Buffer,Nothing} = nothing, dw::Union{Buffer,Nothing} = nothing,
                          db::Union{Buffer,Nothing} = nothing, stream::Union{Stream,Nothing} = nothing)
    check(fk_linear_backward(dy, x, w, Int32(act), _bptr(saved), _bptr(dx), _bptr(dw), _bptr(db), _sptr(stream)))
    return (dx, dw, db)
end

"""`out = kron(a, b)`, batched over a leading dimension."""
function kron!(out::Buffer, a::Buffer, b::Buffer; stream::Union{Stream,Nothing} = nothing)
    check(fk_kron(a, b, out, _sptr(stream)))
    return out
end

# ------------------------------------------------------------------ optimizer math on buffers
#
# Row-major buffers as for linear algebra. A Julia matrix borrowed as a buffer is
# its transpose: harmless for the symmetric matrices of `matrix_power!` and the
# Shampoo statistics; for the per-sample ops, build the buffers with C shapes
# `[B, in]` / `[B, T, in]` (a Julia `(in, B)` / `(in, T, B)` array).

"""Default Newton tolerance of `matrix_power!` for `a`'s dtype and `flags`."""
function _matpow_tol(a::Buffer, flags::Integer)
    dtype(a) == FK_DTYPE_F64 && return 1e-12
    return (flags & FK_GEMM_ALLOW_TF32) != 0 ? 3e-2 : 1e-5
end

"""
    matrix_power!(out, a, power; eps = 0, method = FK_MATPOW_AUTO, max_iter = 100, tol = nothing,
                  flags = 0, stream = nothing, throw_not_converged = true) -> (out, report)

`out = (a + eps I)^power` for symmetric PSD matrices `[n, n]` or `[batch, n, n]`
(Float32 or Float64); `report` is an `FkMatpowReport`. `tol = nothing` picks 1e-12
for Float64, 1e-5 for Float32, 3e-2 with `FK_GEMM_ALLOW_TF32`; `tol <= 0` runs
`max_iter` Newton iterations unchecked. When Newton misses `tol`,
FK_ERROR_NOT_CONVERGED is thrown as a `FusekitError`, or with
`throw_not_converged = false` returned normally with `report.converged == 0`
(`out` holds the last iterate).
"""
function matrix_power!(out::Buffer, a::Buffer, power::Real; eps::Real = 0, method::Integer = FK_MATPOW_AUTO,
                       max_iter::Integer = 100, tol::Union{Real,Nothing} = nothing, flags::Integer = 0,
                       stream::Union{Stream,Nothing} = nothing, throw_not_converged::Bool = true)
    t = tol === nothing ? _matpow_tol(a, flags) : Float64(tol)
    report = Ref(FkMatpowReport())
    st = fk_matrix_power(a, Float64(power), Float64(eps), Int32(method), Int32(max_iter), t, UInt32(flags), out,
                         report, _sptr(stream))
    if !(st == FK_ERROR_NOT_CONVERGED && !throw_not_converged)
        check(st)
    end
    return (out, report[])
end

"""
    shampoo_stats!(grad; l = nothing, r = nothing, alpha = 1, beta = 1, flags = 0, stream = nothing) -> (l, r)

In place: `l = beta l + alpha grad grad^T` `[(batch,) m, m]` and
`r = beta r + alpha grad^T grad` `[(batch,) n, n]` for `grad` `[(batch,) m, n]`
(C shapes); each of `l`, `r` optional, not both. `flags`: 0 or FK_GEMM_ALLOW_TF32.
"""
function shampoo_stats!(grad::Buffer; l::Union{Buffer,Nothing} = nothing, r::Union{Buffer,Nothing} = nothing,
                        alpha::Real = 1, beta::Real = 1, flags::Integer = 0, stream::Union{Stream,Nothing} = nothing)
    check(fk_shampoo_stats_ex(grad, Float64(alpha), Float64(beta), _bptr(l), _bptr(r), UInt32(flags), _sptr(stream)))
    return (l, r)
end

"""`out = l_root grad r_root` (each root optional: `nothing` is the identity); `flags`: 0 or FK_GEMM_ALLOW_TF32."""
function shampoo_precondition!(out::Buffer, grad::Buffer; l_root::Union{Buffer,Nothing} = nothing,
                               r_root::Union{Buffer,Nothing} = nothing, flags::Integer = 0,
                               stream::Union{Stream,Nothing} = nothing)
    check(fk_shampoo_precondition(_bptr(l_root), grad, _bptr(r_root), out, UInt32(flags), _sptr(stream)))
    return out
end

"""Per-sample gradients `out[b] = g_b^T a_b` (C shapes: a `[B, (T,) in]`, g `[B, (T,) out]`, out `[B, out, in]`)."""
function per_sample_grads!(out::Buffer, a::Buffer, g::Buffer; flags::Integer = 0,
                           stream::Union{Stream,Nothing} = nothing)
    check(fk_per_sample_grads(a, g, out, UInt32(flags), _sptr(stream)))
    return out
end

"""Squared Frobenius norms `[B]` of the per-sample gradients, not materialised."""
function per_sample_grad_norms!(sq_norms::Buffer, a::Buffer, g::Buffer; stream::Union{Stream,Nothing} = nothing)
    check(fk_per_sample_grad_norms(a, g, sq_norms, _sptr(stream)))
    return sq_norms
end

"""DP-SGD clipped sum `out = sum_b min(1, max_norm / |G_b|) G_b` `[out, in]`; `sq_norms` `[B]` optional."""
function dp_clipped_grad_sum!(out::Buffer, a::Buffer, g::Buffer, max_norm::Real;
                              sq_norms::Union{Buffer,Nothing} = nothing, flags::Integer = 0,
                              stream::Union{Stream,Nothing} = nothing)
    check(fk_dp_clipped_grad_sum(a, g, Float64(max_norm), out, _bptr(sq_norms), UInt32(flags), _sptr(stream)))
    return (out, sq_norms)
end

# ------------------------------------------------------------------ ops on Julia arrays (CPU)

# Borrows each array on `ctx`, runs f(buffers...), then releases the views at once.
function _with_borrowed(f, ctx::Context, arrays...)
    bufs = map(A -> borrow(ctx, A), arrays)
    try
        return f(bufs...)
    finally
        foreach(destroy!, bufs)
    end
end

for (jl, _) in _BINARY
    @eval function $jl(out::StridedArray, a::StridedArray, b::StridedArray; ctx::Context = cpu_context())
        _with_borrowed((o, x, y) -> $jl(o, x, y), ctx, out, a, b)
        return out
    end
end

for (jl, _) in _UNARY
    @eval function $jl(out::StridedArray, a::StridedArray; ctx::Context = cpu_context())
        _with_borrowed((o, x) -> $jl(o, x), ctx, out, a)
        return out
    end
end

function axpby!(out::StridedArray, alpha::Number, a::StridedArray, beta::Number, b::StridedArray; ctx::Context = cpu_context())
    _with_borrowed((o, x, y) -> axpby!(o, alpha, x, beta, y), ctx, out, a, b)
    return out
end
function scalar_add!(out::StridedArray, a::StridedArray, s::Number; ctx::Context = cpu_context())
    _with_borrowed((o, x) -> scalar_add!(o, x, s), ctx, out, a)
    return out
end
function scalar_mul!(out::StridedArray, a::StridedArray, s::Number; ctx::Context = cpu_context())
    _with_borrowed((o, x) -> scalar_mul!(o, x, s), ctx, out, a)
    return out
end

"""
    gemm!(C, A, B; alpha = 1, beta = 0, ctx = cpu_context())

`C = alpha*A*B + beta*C` on Julia matrices. A column-major matrix is the row-major
buffer of its transpose, so this runs `C^T = B^T A^T` (fusekit's `a` is `B`).
"""
function gemm!(C::StridedMatrix{T}, A::StridedMatrix{T}, B::StridedMatrix{T}; alpha::Number = 1, beta::Number = 0,
               ctx::Context = cpu_context()) where {T<:FkElement}
    _with_borrowed((c, a, b) -> gemm!(c, b, a; alpha = alpha, beta = beta), ctx, C, A, B)
    return C
end

"""`kron(A, B)` on Julia matrices (`kron(A, B)^T = kron(A^T, B^T)`, so the buffers need no reordering)."""
function kron(A::StridedMatrix{T}, B::StridedMatrix{T}; ctx::Context = cpu_context()) where {T<:FkElement}
    out = Array{T}(undef, size(A, 1) * size(B, 1), size(A, 2) * size(B, 2))
    _with_borrowed((o, a, b) -> kron!(o, a, b), ctx, out, A, B)
    return out
end

# Allocating versions: the result has Julia's broadcast size (which fusekit's
# broadcasting of the reversed shapes reproduces).
_bsize(a, b) = Base.Broadcast.broadcast_shape(size(a), size(b))

add(a::StridedArray{T}, b::StridedArray{T}) where {T<:FkElement} = add!(Array{T}(undef, _bsize(a, b)), a, b)
sub(a::StridedArray{T}, b::StridedArray{T}) where {T<:FkElement} = sub!(Array{T}(undef, _bsize(a, b)), a, b)
mul(a::StridedArray{T}, b::StridedArray{T}) where {T<:FkElement} = mul!(Array{T}(undef, _bsize(a, b)), a, b)
div(a::StridedArray{T}, b::StridedArray{T}) where {T<:FkElement} = div!(Array{T}(undef, _bsize(a, b)), a, b)
axpby(alpha::Number, a::StridedArray{T}, beta::Number, b::StridedArray{T}) where {T<:FkElement} =
    axpby!(Array{T}(undef, _bsize(a, b)), alpha, a, beta, b)
scalar_add(a::StridedArray{T}, s::Number) where {T<:FkElement} = scalar_add!(similar(a, T, size(a)), a, s)
scalar_mul(a::StridedArray{T}, s::Number) where {T<:FkElement} = scalar_mul!(similar(a, T, size(a)), a, s)
"""`|a|`; complex input gives the real magnitude."""
abs(a::StridedArray{T}) where {T<:FkElement} = abs!(Array{real(T)}(undef, size(a)), a)
for (jl, fn) in ((:neg!, :neg), (:exp!, :exp), (:log!, :log), (:sqrt!, :sqrt), (:sin!, :sin), (:cos!, :cos),
                 (:tanh!, :tanh), (:sigmoid!, :sigmoid), (:relu!, :relu), (:copy!, :copy))
    @eval $fn(a::StridedArray{T}) where {T<:FkElement} = $jl(Array{T}(undef, size(a)), a)
end

# ------------------------------------------------------------------ runtime

"""The context's memory statistics as an `FkMemoryStats` (`fk_context_memory_stats`)."""
function memory_stats(c::Context)
    r = Ref(FkMemoryStats(Csize_t(sizeof(FkMemoryStats)), zeros(UInt64, 11)...))
    check(fk_context_memory_stats(c, r))
    return r[]
end

"""Bytes the context's pool keeps reserved at a synchronisation (`typemax(UInt64)` at first)."""
set_release_threshold!(c::Context, bytes::Integer) = (check(fk_context_set_release_threshold(c, UInt64(bytes))); nothing)

"""Returns unused pool memory until at most `keep_bytes` stay reserved."""
trim!(c::Context, keep_bytes::Integer = 0) = (check(fk_context_trim(c, UInt64(keep_bytes))); nothing)

"""
    pinned(ctx, T, dims...)

A buffer of page-locked host memory (`fk_buffer_create_pinned`): a copy endpoint
that ops refuse; an ordinary host buffer on a CPU context.
"""
function pinned(ctx::Context, ::Type{T}, dims::Integer...) where {T}
    shape = Int64[reverse(dims)...]
    out = Ref{Ptr{fk_buffer}}(C_NULL)
    check(fk_buffer_create_pinned(ctx, dtype_of(T), Int32(length(shape)), shape, out))
    return Buffer(out[], ctx, nothing)
end

"""`dst .= src` between any two contiguous buffers (`fk_buffer_copy`), queued on `stream`."""
function copy_buffer!(dst::Buffer, src::Buffer; stream::Union{Stream,Nothing} = nothing)
    check(fk_buffer_copy(dst, src, _sptr(stream)))
    return dst
end

"""Whether CUDA device `device` can access memory of `peer` directly."""
function can_access_peer(device::Integer, peer::Integer)
    v = Ref{Int32}(0)
    check(fk_device_can_access_peer(Int32(device), Int32(peer), v))
    return v[] != 0
end

"""
    Event(ctx)

An event (`fk_event_create`): `record!(e, stream)`, `wait!(stream, e)`,
`synchronize(e)`, `isdone(e)`, `elapsed_ms(start, stop)`.
"""
mutable struct Event
    ptr::Ptr{fk_event}
    ctx::Context
    function Event(ctx::Context)
        out = Ref{Ptr{fk_event}}(C_NULL)
        check(fk_event_create(ctx, out))
        e = new(out[], ctx)
        finalizer(destroy!, e)
        return e
    end
end

Base.unsafe_convert(::Type{Ptr{fk_event}}, e::Event) = e.ptr

function destroy!(e::Event)
    if e.ptr != C_NULL
        fk_event_destroy(e.ptr)
        e.ptr = C_NULL
    end
    return nothing
end

record!(e::Event, stream::Union{Stream,Nothing} = nothing) = (check(fk_event_record(e, _sptr(stream))); e)
wait!(stream::Union{Stream,Nothing}, e::Event) = (check(fk_stream_wait_event(_sptr(stream), e)); nothing)
synchronize(e::Event) = (check(fk_event_synchronize(e)); nothing)
function isdone(e::Event)
    d = Ref{Int32}(0)
    check(fk_event_query(e, d))
    return d[] != 0
end
function elapsed_ms(start::Event, stop::Event)
    ms = Ref{Cfloat}(0)
    check(fk_event_elapsed_ms(start, stop, ms))
    return ms[]
end

"""A new unique id for `Comm(ctx, nranks, id, rank)` (needs NCCL)."""
function comm_unique_id()
    id = zeros(UInt8, FK_COMM_ID_BYTES)
    check(fk_comm_unique_id(id))
    return id
end

"""
    Comm(ctx, nranks, id, rank)   # fk_comm_init_rank
    comm_init_all(ctxs)           # fk_comm_init_all: one Comm per context

One rank of a communicator. Collectives: `all_reduce!`, `comm_broadcast!`,
`all_gather!`, `reduce_scatter!`; `group(f)` runs `f` between
`fk_comm_group_start` and `fk_comm_group_end`.
"""
mutable struct Comm
    ptr::Ptr{fk_comm}
    ctx::Context
    function Comm(ptr::Ptr{fk_comm}, ctx::Context)
        c = new(ptr, ctx)
        finalizer(destroy!, c)
        return c
    end
end

function Comm(ctx::Context, nranks::Integer, id::Vector{UInt8}, rank::Integer)
    length(id) == FK_COMM_ID_BYTES || throw(ArgumentError("id must have FK_COMM_ID_BYTES bytes"))
    out = Ref{Ptr{fk_comm}}(C_NULL)
    check(fk_comm_init_rank(ctx, Int32(nranks), id, Int32(rank), out))
    return Comm(out[], ctx)
end

function comm_init_all(ctxs::Vector{Context})
    ptrs = Ptr{fk_context}[c.ptr for c in ctxs]
    out = fill(Ptr{fk_comm}(C_NULL), length(ctxs))
    GC.@preserve ctxs check(fk_comm_init_all(ptrs, Int32(length(ptrs)), out))
    return [Comm(out[i], ctxs[i]) for i in eachindex(ctxs)]
end

Base.unsafe_convert(::Type{Ptr{fk_comm}}, c::Comm) = c.ptr

function destroy!(c::Comm)
    if c.ptr != C_NULL
        fk_comm_destroy(c.ptr)
        c.ptr = C_NULL
    end
    return nothing
end

function rank(c::Comm)
    r = Ref{Int32}(0)
    check(fk_comm_rank(c, r))
    return Int(r[])
end
function nranks(c::Comm)
    n = Ref{Int32}(0)
    check(fk_comm_size(c, n))
    return Int(n[])
end

function group(f)
    check(fk_comm_group_start())
    try
        f()
    finally
        check(fk_comm_group_end())
    end
end

_bptr(::Nothing) = Ptr{fk_buffer}(C_NULL)
_bptr(b::Buffer) = b.ptr

all_reduce!(c::Comm, send::Buffer, recv::Buffer; op::Integer = FK_REDUCE_SUM, stream::Union{Stream,Nothing} = nothing) =
    (check(fk_all_reduce(c, send, recv, Int32(op), _sptr(stream))); recv)
comm_broadcast!(c::Comm, send::Union{Buffer,Nothing}, recv::Buffer; root::Integer = 0, stream::Union{Stream,Nothing} = nothing) =
    (check(fk_broadcast(c, _bptr(send), recv, Int32(root), _sptr(stream))); recv)
all_gather!(c::Comm, send::Buffer, recv::Buffer; stream::Union{Stream,Nothing} = nothing) =
    (check(fk_all_gather(c, send, recv, _sptr(stream))); recv)
reduce_scatter!(c::Comm, send::Buffer, recv::Buffer; op::Integer = FK_REDUCE_SUM, stream::Union{Stream,Nothing} = nothing) =
    (check(fk_reduce_scatter(c, send, recv, Int32(op), _sptr(stream))); recv)

end # module Fusekit
