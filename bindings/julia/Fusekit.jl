"""
    Fusekit

Julia bindings for fusekit (fused elementwise GPU kernels with a CPU fallback)
through its C ABI (`include/fusekit.h`).

Two layers:

- **Raw**: one Julia function per C entry point, same name and argument order
  (`fk_add(a, b, out, stream)`), each a single `ccall` returning the C result
  (an `Int32` status for most). Handles are `Ptr{fk_context}`, `Ptr{fk_stream}`,
  `Ptr{fk_buffer}`; the wrapper objects below convert to them automatically.
  This layer, the `FK_*` constants and the C structs are generated from the C
  header into `abi_gen.jl` (`python scripts/gen_bindings.py`), which this file
  includes.
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

# ------------------------------------------------------------------ the C ABI (generated)

# abi_gen.jl is generated from include/fusekit.h by scripts/gen_bindings.py: every
# FK_* constant, the C types (opaque handles `fk_context`, `fk_stream`, `fk_buffer`,
# `fk_event`, `fk_comm`; the by-value structs `FkScalar`, `FkMatpowReport`,
# `FkMemoryStats`) and the raw layer, one `ccall` wrapper per entry point.
include("abi_gen.jl")

FkMatpowReport() = FkMatpowReport(Int32(0), Int32(0), Int32(0), Int32(0), NaN, NaN)

FkScalar(x::Real) = FkScalar(Float64(x), 0.0)
FkScalar(z::Complex) = FkScalar(Float64(real(z)), Float64(imag(z)))
FkScalar(s::FkScalar) = s

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
last_error_message_copy() = _copy_string(fk_last_error_message_copy)

"""
    check(status)

Returns `nothing` for `FK_OK`, otherwise throws a [`FusekitError`](@ref) with the
status name and the last error message.
"""
function check(status::Integer)
    status == FK_OK && return nothing
    throw(FusekitError(Int32(status), status_string(status), last_error_message()))
end

# The out-parameters of the C call `f(args..., out...)`, one per type in `types`, after
# checking its status: the value, or a tuple of them.
function _query(f, types::Tuple, args...)
    refs = map(T -> Ref{T}(), types)
    check(f(args..., refs...))
    values = map(r -> r[], refs)
    return length(values) == 1 ? values[1] : values
end

# A string the C call `f(buf, capacity, needed)` copies out: asks its size, then copies.
function _copy_string(f)
    needed = Ref{Csize_t}(0)
    check(f(Ptr{UInt8}(C_NULL), Csize_t(0), needed))
    buf = Vector{UInt8}(undef, needed[])
    check(f(buf, Csize_t(length(buf)), needed))
    return String(buf[1:end-1])  # drop the NUL
end

# Releases the C handle `x.ptr` with `destroy` once (then C_NULL): the body of `destroy!`.
function _release!(x, destroy)
    if x.ptr != C_NULL
        destroy(x.ptr)
        x.ptr = C_NULL
    end
    return nothing
end

# ------------------------------------------------------------------ versions, dtypes, devices

abi_version() = fk_abi_version()
version() = unsafe_string(fk_version_string())

"""Number of usable CUDA devices (0 when there is no driver or GPU)."""
device_count() = Int(_query(fk_device_count, (Int32,)))

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

dtype_size(dtype::Integer) = Int(_query(fk_dtype_size, (Csize_t,), Int32(dtype)))

# ------------------------------------------------------------------ Context

"""
    Context(kind = FK_DEVICE_AUTO, ordinal = 0)

A device context (`fk_context_create`). `kind` is `FK_DEVICE_CPU`,
`FK_DEVICE_CUDA` or `FK_DEVICE_AUTO`. Released by its finalizer or `destroy!`.
"""
mutable struct Context
    ptr::Ptr{fk_context}
    function Context(kind::Integer = FK_DEVICE_AUTO, ordinal::Integer = 0)
        ptr = _query(fk_context_create, (Ptr{fk_context},), UInt32(FK_ABI_VERSION), Int32(kind), Int32(ordinal))
        return finalizer(destroy!, new(ptr))
    end
end

Base.unsafe_convert(::Type{Ptr{fk_context}}, c::Context) = c.ptr

destroy!(c::Context) = _release!(c, fk_context_destroy)

const _CPU_CONTEXT = Ref{Union{Context,Nothing}}(nothing)
"""A process-wide CPU context, created on first use (used for Julia arrays)."""
function cpu_context()
    if _CPU_CONTEXT[] === nothing
        _CPU_CONTEXT[] = Context(FK_DEVICE_CPU)
    end
    return _CPU_CONTEXT[]::Context
end

"""`(kind, ordinal)` of the context's device."""
device(c::Context) = Int.(_query(fk_context_device, (Int32, Int32), c))

is_cuda(c::Context) = device(c)[1] == FK_DEVICE_CUDA

"""The device's name, e.g. `"NVIDIA H100 80GB HBM3"`."""
name(c::Context) = _copy_string((buf, cap, needed) -> fk_context_name(c, buf, cap, needed))

"""`(major, minor)`; `(0, 0)` on the CPU."""
compute_capability(c::Context) = Int.(_query(fk_context_compute_capability, (Int32, Int32), c))

"""`(free_bytes, total_bytes)` of the context's device."""
memory(c::Context) = _query(fk_context_memory, (UInt64, UInt64), c)

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
    Stream(ctx::Context) = finalizer(destroy!, new(_query(fk_stream_create, (Ptr{fk_stream},), ctx), ctx))
    Stream(ctx::Context, cu_stream::Ptr{Cvoid}) =
        finalizer(destroy!, new(_query(fk_stream_wrap, (Ptr{fk_stream},), ctx, cu_stream), ctx))
end

Base.unsafe_convert(::Type{Ptr{fk_stream}}, s::Stream) = s.ptr

destroy!(s::Stream) = _release!(s, fk_stream_destroy)

synchronize(s::Stream) = (check(fk_stream_synchronize(s)); nothing)

"""The raw CUstream (C_NULL for the legacy default stream and on the CPU)."""
handle(s::Stream) = _query(fk_stream_handle, (Ptr{Cvoid},), s)

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
    Buffer(ptr::Ptr{fk_buffer}, ctx::Union{Context,Nothing}, owner) = finalizer(destroy!, new(ptr, ctx, owner))
end

Base.unsafe_convert(::Type{Ptr{fk_buffer}}, b::Buffer) = b.ptr

function destroy!(b::Buffer)
    _release!(b, fk_buffer_destroy)
    b.owner = nothing
    return nothing
end

# A buffer the C call `f(args..., out)` makes on `ctx`, owning its memory or keeping `owner` alive.
_new_buffer(f, ctx::Context, owner, args...) = Buffer(_query(f, (Ptr{fk_buffer},), args...), ctx, owner)

function Buffer(ctx::Context, ::Type{T}, dims::Integer...; stream::Union{Stream,Nothing} = nothing) where {T}
    shape = Int64[reverse(dims)...]
    return _new_buffer(fk_buffer_create, ctx, nothing, ctx, dtype_of(T), Int32(length(shape)), shape, _sptr(stream))
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
    return GC.@preserve A _new_buffer(fk_buffer_wrap, ctx, A, ctx, Ptr{Cvoid}(pointer(A)), dtype_of(T), Int32(ndims(A)),
                                      shape, strd)
end

"""
    wrap(ctx, ptr, T, dims; strides = nothing)

Wraps raw memory (e.g. a device pointer from CUDA.jl: `pointer(cuarray)`) as a
buffer. `dims` and `strides` are in Julia (column-major) order.
"""
function wrap(ctx::Context, ptr::Ptr, ::Type{T}, dims::Dims; strides::Union{Dims,Nothing} = nothing) where {T}
    shape = Int64[reverse(dims)...]
    strd = strides === nothing ? Int64[reverse(Base.size_to_strides(1, dims...))...] : Int64[reverse(strides)...]
    return _new_buffer(fk_buffer_wrap, ctx, nothing, ctx, Ptr{Cvoid}(ptr), dtype_of(T), Int32(length(shape)), shape, strd)
end

"""Imports a `DLManagedTensorVersioned*`; on success the buffer owns it."""
from_dlpack(ctx::Context, managed::Ptr{Cvoid}) = _new_buffer(fk_buffer_from_dlpack, ctx, nothing, ctx, managed)

"""Exports a new `DLManagedTensorVersioned*` (the consumer must call its deleter once)."""
to_dlpack(b::Buffer) = _query(fk_buffer_to_dlpack, (Ptr{Cvoid},), b)

dtype(b::Buffer) = _query(fk_buffer_dtype, (Int32,), b)

Base.eltype(b::Buffer) = julia_type(dtype(b))

Base.ndims(b::Buffer) = Int(_query(fk_buffer_ndim, (Int32,), b))

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

Base.length(b::Buffer) = Int(_query(fk_buffer_numel, (Int64,), b))

Base.sizeof(b::Buffer) = Int(_query(fk_buffer_nbytes, (Csize_t,), b))

is_contiguous(b::Buffer) = _query(fk_buffer_is_contiguous, (Int32,), b) != 0

"""Address of the first element (host or device)."""
data(b::Buffer) = _query(fk_buffer_data, (Ptr{Cvoid},), b)

"""`(kind, ordinal)` of the buffer's memory."""
device(b::Buffer) = Int.(_query(fk_buffer_device, (Int32, Int32), b))

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
linear_aux_size(act::Integer, ::Type{T}, m::Integer, n::Integer) where {T} =
    Int(_query(fk_linear_aux_size, (Csize_t,), Int32(act), dtype_of(T), Int64(m), Int64(n)))

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

# ------------------------------------------------------------------ multi-layer perceptron on buffers

# The C array of handles of `bufs` (`nothing` entries are NULL); an empty vector passes NULL.
_bptrs(bufs::AbstractVector) = Ptr{fk_buffer}[b === nothing ? Ptr{fk_buffer}(C_NULL) : b.ptr for b in bufs]
_arrptr(v::Vector{Ptr{fk_buffer}}) = isempty(v) ? Ptr{Ptr{fk_buffer}}(C_NULL) : pointer(v)

"""Bytes of the `saved` buffer `mlp_forward!` fills, for `widths = [k_0, n_0, ..., n_{L-1}]` over `rows` rows."""
mlp_saved_size(ctx::Context, widths::AbstractVector{<:Integer}, rows::Integer, ::Type{T}, hidden_act::Integer,
               out_act::Integer) where {T} =
    let w = Int64[widths...]
        Int(GC.@preserve w _query(fk_mlp_saved_size, (Csize_t,), ctx, Int32(length(w) - 1), pointer(w), Int64(rows),
                                  dtype_of(T), Int32(hidden_act), Int32(out_act)))
    end

"""`y = act_L(... act_0(x w_0^T + b_0) ...)`: `biases` empty (none) or one per layer (`nothing`: none);
`saved` (at least `mlp_saved_size` bytes) for the backward, or nothing for inference."""
function mlp_forward!(y::Buffer, x::Buffer, weights::AbstractVector, biases::AbstractVector, hidden_act::Integer,
                      out_act::Integer; saved::Union{Buffer,Nothing} = nothing, flags::Integer = 0,
                      stream::Union{Stream,Nothing} = nothing)
    w, b = _bptrs(weights), _bptrs(biases)
    GC.@preserve weights biases w b check(fk_mlp_forward(x, Int32(length(w)), _arrptr(w), _arrptr(b), Int32(hidden_act),
                                                         Int32(out_act), UInt32(flags), y, _bptr(saved), _sptr(stream)))
    return y
end

"""Backward of `mlp_forward!`: `dx` optional, `dweights` / `dbiases` empty (none) or one per layer
(`nothing`: not wanted); overwritten."""
function mlp_backward!(dy::Buffer, x::Buffer, weights::AbstractVector, hidden_act::Integer, out_act::Integer,
                       saved::Union{Buffer,Nothing}; dx::Union{Buffer,Nothing} = nothing,
                       dweights::AbstractVector = Buffer[], dbiases::AbstractVector = Buffer[], flags::Integer = 0,
                       stream::Union{Stream,Nothing} = nothing)
    w, dw, db = _bptrs(weights), _bptrs(dweights), _bptrs(dbiases)
    GC.@preserve weights dweights dbiases w dw db check(
        fk_mlp_backward(dy, x, Int32(length(w)), _arrptr(w), Int32(hidden_act), Int32(out_act), UInt32(flags),
                        _bptr(saved), _bptr(dx), _arrptr(dw), _arrptr(db), _sptr(stream)))
    return (dx, dweights, dbiases)
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
    return _new_buffer(fk_buffer_create_pinned, ctx, nothing, ctx, dtype_of(T), Int32(length(shape)), shape)
end

"""`dst .= src` between any two contiguous buffers (`fk_buffer_copy`), queued on `stream`."""
function copy_buffer!(dst::Buffer, src::Buffer; stream::Union{Stream,Nothing} = nothing)
    check(fk_buffer_copy(dst, src, _sptr(stream)))
    return dst
end

"""Whether CUDA device `device` can access memory of `peer` directly."""
can_access_peer(device::Integer, peer::Integer) = _query(fk_device_can_access_peer, (Int32,), Int32(device), Int32(peer)) != 0

"""
    Event(ctx)

An event (`fk_event_create`): `record!(e, stream)`, `wait!(stream, e)`,
`synchronize(e)`, `isdone(e)`, `elapsed_ms(start, stop)`.
"""
mutable struct Event
    ptr::Ptr{fk_event}
    ctx::Context
    Event(ctx::Context) = finalizer(destroy!, new(_query(fk_event_create, (Ptr{fk_event},), ctx), ctx))
end

Base.unsafe_convert(::Type{Ptr{fk_event}}, e::Event) = e.ptr

destroy!(e::Event) = _release!(e, fk_event_destroy)

record!(e::Event, stream::Union{Stream,Nothing} = nothing) = (check(fk_event_record(e, _sptr(stream))); e)
wait!(stream::Union{Stream,Nothing}, e::Event) = (check(fk_stream_wait_event(_sptr(stream), e)); nothing)
synchronize(e::Event) = (check(fk_event_synchronize(e)); nothing)
isdone(e::Event) = _query(fk_event_query, (Int32,), e) != 0
elapsed_ms(start::Event, stop::Event) = _query(fk_event_elapsed_ms, (Cfloat,), start, stop)

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
    Comm(ptr::Ptr{fk_comm}, ctx::Context) = finalizer(destroy!, new(ptr, ctx))
end

function Comm(ctx::Context, nranks::Integer, id::Vector{UInt8}, rank::Integer)
    length(id) == FK_COMM_ID_BYTES || throw(ArgumentError("id must have FK_COMM_ID_BYTES bytes"))
    return Comm(_query(fk_comm_init_rank, (Ptr{fk_comm},), ctx, Int32(nranks), id, Int32(rank)), ctx)
end

function comm_init_all(ctxs::Vector{Context})
    ptrs = Ptr{fk_context}[c.ptr for c in ctxs]
    out = fill(Ptr{fk_comm}(C_NULL), length(ctxs))
    GC.@preserve ctxs check(fk_comm_init_all(ptrs, Int32(length(ptrs)), out))
    return [Comm(out[i], ctxs[i]) for i in eachindex(ctxs)]
end

Base.unsafe_convert(::Type{Ptr{fk_comm}}, c::Comm) = c.ptr

destroy!(c::Comm) = _release!(c, fk_comm_destroy)

rank(c::Comm) = Int(_query(fk_comm_rank, (Int32,), c))
nranks(c::Comm) = Int(_query(fk_comm_size, (Int32,), c))

function group(f)
    check(fk_comm_group_start())
    try
        f()
    finally
        check(fk_comm_group_end())
    end
end

all_reduce!(c::Comm, send::Buffer, recv::Buffer; op::Integer = FK_REDUCE_SUM, stream::Union{Stream,Nothing} = nothing) =
    (check(fk_all_reduce(c, send, recv, Int32(op), _sptr(stream))); recv)
comm_broadcast!(c::Comm, send::Union{Buffer,Nothing}, recv::Buffer; root::Integer = 0, stream::Union{Stream,Nothing} = nothing) =
    (check(fk_broadcast(c, _bptr(send), recv, Int32(root), _sptr(stream))); recv)
all_gather!(c::Comm, send::Buffer, recv::Buffer; stream::Union{Stream,Nothing} = nothing) =
    (check(fk_all_gather(c, send, recv, _sptr(stream))); recv)
reduce_scatter!(c::Comm, send::Buffer, recv::Buffer; op::Integer = FK_REDUCE_SUM, stream::Union{Stream,Nothing} = nothing) =
    (check(fk_reduce_scatter(c, send, recv, Int32(op), _sptr(stream))); recv)

end # module Fusekit
