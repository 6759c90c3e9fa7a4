// fusekit.hpp: header-only C++17 RAII wrapper over the fusekit C ABI (fusekit.h).
//
//   #include "fusekit.hpp"               // needs include/ and bindings/cpp/ on the path
//   fusekit::Context ctx = fusekit::Context::automatic();
//   auto a = fusekit::Buffer::owned<float>(ctx, {2, 3});
//   a.copy_from_host(host.data(), host.size());
//   fusekit::add(a, b, out);                        // default stream
//   fusekit::add(a, b, out, stream);                // or a fusekit::Stream
//
// Every failing C call becomes a fusekit::Error (status, status name, message).
// Context, Stream, Buffer, Event and Comm own exactly one C handle each, are
// move-only, and release it in their destructor. Link with -lfusekit.
//
// Runtime (pool, pinned buffers, copies, events, collectives):
//   auto pin = fusekit::Buffer::pinned<float>(ctx, {n});     // page-locked host memory
//   dev.copy_from(pin, stream);                              // fk_buffer_copy, async
//   fusekit::Event done(ctx); done.record(stream); other.wait(done);
//   auto comms = fusekit::Comm::init_all({&ctx0, &ctx1});
//   { fusekit::Group g; for (...) fusekit::all_reduce(comms[r], x[r], x[r], fusekit::ReduceOp::Sum, s[r]); }
//
// Optimizer math (Shampoo, per-sample gradients, DP-SGD):
//   fk_matpow_report rep = fusekit::matrix_power(l_stats, -0.25, 1e-6, l_root);   // (L + eps I)^(-1/4)
//   fusekit::shampoo_precondition(&l_root, grad, &r_root, out);
//   fusekit::dp_clipped_grad_sum(a, g, 1.0, sum, &sq_norms);
#ifndef FUSEKIT_HPP
#define FUSEKIT_HPP

#include "fusekit.h"

#include <array>
#include <complex>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace fusekit {

// ------------------------------------------------------------------ errors

/// A failed fusekit call: the status, its name and the library's message
/// ("<function>: <cause>"). `what()` is "<STATUS_NAME>: <message>".
class Error : public std::runtime_error {
public:
    Error(fk_status status, std::string message)
        : std::runtime_error(std::string(fk_status_string(status)) + ": " + message),
          status_(status), message_(std::move(message)) {}

    fk_status status() const noexcept { return status_; }
    /// Static name of the status, e.g. "FK_ERROR_SHAPE_MISMATCH".
    const char* status_name() const noexcept { return fk_status_string(status_); }
    /// The library's message (without the status name).
    const std::string& message() const noexcept { return message_; }

private:
    fk_status status_;
    std::string message_;
};

/// This thread's last error message (copy form of fk_last_error_message).
inline std::string last_error_message() {
    std::size_t needed = 0;
    if (fk_last_error_message_copy(nullptr, 0, &needed) != FK_OK || needed == 0) return {};
    std::string s(needed, '\0');
    if (fk_last_error_message_copy(&s[0], s.size(), &needed) != FK_OK) return {};
    s.resize(needed - 1);
    return s;
}

/// This thread's last error message as the library's own string
/// (fk_last_error_message): no allocation, never NULL, valid until the next
/// failing fusekit call on this thread. For noexcept paths (destructors, logging
/// in a catch-all); last_error_message() is the owning form.
inline const char* last_error_c_str() noexcept { return fk_last_error_message(); }

/// Throws fusekit::Error with the last message when `status` is not FK_OK.
inline void check(fk_status status) {
    if (status != FK_OK) throw Error(status, last_error_message());
}

namespace detail {
/// What the C call `fn(args..., &out)` gives through its last parameter, checked.
template <class T, class Fn, class... Args>
T query(Fn fn, Args... args) {
    T out{};
    check(fn(args..., &out));
    return out;
}
}  // namespace detail

// ------------------------------------------------------------------ versions, dtypes

inline std::uint32_t abi_version() noexcept { return fk_abi_version(); }
inline std::string version() { return fk_version_string(); }

/// Number of usable CUDA devices (0 without a driver or GPU).
inline int device_count() { return detail::query<std::int32_t>(fk_device_count); }

inline std::size_t dtype_size(fk_dtype dtype) {
    return detail::query<std::size_t>(fk_dtype_size, dtype);
}

/// IEEE binary16 stored as its bit pattern (arithmetic is up to the caller).
struct half {
    std::uint16_t bits;
};
/// bfloat16 stored as its bit pattern.
struct bfloat16 {
    std::uint16_t bits;
};

/// Maps a C++ element type to its fk_dtype: `dtype_of<float>::value == FK_DTYPE_F32`.
template <class T>
struct dtype_of;  // undefined for unsupported types
template <>
struct dtype_of<half> : std::integral_constant<fk_dtype, FK_DTYPE_F16> {};
template <>
struct dtype_of<bfloat16> : std::integral_constant<fk_dtype, FK_DTYPE_BF16> {};
template <>
struct dtype_of<float> : std::integral_constant<fk_dtype, FK_DTYPE_F32> {};
template <>
struct dtype_of<double> : std::integral_constant<fk_dtype, FK_DTYPE_F64> {};
template <>
struct dtype_of<std::complex<float>> : std::integral_constant<fk_dtype, FK_DTYPE_C64> {};
template <>
struct dtype_of<std::complex<double>> : std::integral_constant<fk_dtype, FK_DTYPE_C128> {};

template <class T>
inline constexpr fk_dtype dtype_v = dtype_of<std::remove_cv_t<T>>::value;

static_assert(sizeof(half) == 2 && sizeof(bfloat16) == 2, "half types must be 2 bytes");
static_assert(sizeof(std::complex<float>) == 8 && sizeof(std::complex<double>) == 16,
              "std::complex must be interleaved (re, im)");

/// Device kinds (values of fk_device_kind).
enum class DeviceKind : fk_device_kind {
    Auto = FK_DEVICE_AUTO,
    Cpu = FK_DEVICE_CPU,
    Cuda = FK_DEVICE_CUDA,
    /// Pinned host memory of a CUDA context (reported by Buffer::device() only).
    CudaHost = FK_DEVICE_CUDA_HOST,
};

struct Device {
    DeviceKind kind;
    int ordinal;
};

struct MemoryInfo {
    std::uint64_t free_bytes;
    std::uint64_t total_bytes;
};

// ------------------------------------------------------------------ DLPack

/// DLPack 1.1 structures (layout of dlpack.h), for to_dlpack/from_dlpack.
namespace dl {
struct DLPackVersion {
    std::uint32_t major;
    std::uint32_t minor;
};
struct DLDevice {
    std::int32_t device_type;  // 1 = kDLCPU, 2 = kDLCUDA
    std::int32_t device_id;
};
struct DLDataType {
    std::uint8_t code;  // 2 = kDLFloat, 4 = kDLBfloat, 5 = kDLComplex
    std::uint8_t bits;
    std::uint16_t lanes;
};
struct DLTensor {
    void* data;
    DLDevice device;
    std::int32_t ndim;
    DLDataType dtype;
    std::int64_t* shape;
    std::int64_t* strides;
    std::uint64_t byte_offset;
};
struct DLManagedTensorVersioned {
    DLPackVersion version;
    void* manager_ctx;
    void (*deleter)(DLManagedTensorVersioned* self);
    std::uint64_t flags;
    DLTensor dl_tensor;
};
}  // namespace dl

// ------------------------------------------------------------------ handles

namespace detail {
/// Owns one C handle; move-only.
template <class H, fk_status (*Destroy)(H*)>
class Handle {
public:
    Handle() noexcept = default;
    explicit Handle(H* h) noexcept : h_(h) {}
    Handle(const Handle&) = delete;
    Handle& operator=(const Handle&) = delete;
    Handle(Handle&& o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
    Handle& operator=(Handle&& o) noexcept {
        if (this != &o) {
            reset();
            h_ = std::exchange(o.h_, nullptr);
        }
        return *this;
    }
    ~Handle() { reset(); }

    H* get() const noexcept { return h_; }
    explicit operator bool() const noexcept { return h_ != nullptr; }
    /// Gives up ownership: the caller must destroy the returned handle.
    H* release() noexcept { return std::exchange(h_, nullptr); }
    void reset() noexcept {
        if (h_ != nullptr) (void)Destroy(std::exchange(h_, nullptr));
    }

private:
    H* h_ = nullptr;
};

inline void require(const void* h, const char* what) {
    if (h == nullptr)
        throw Error(FK_ERROR_NULL_POINTER, std::string(what) + " is empty (moved-from or default)");
}

/// The handle-owning part of Context, Stream, Buffer, Event and Comm (`Derived`):
/// `adopt`, `get`, `bool`, `release`; move-only.
template <class Derived, class H, fk_status (*Destroy)(H*)>
class Owner {
public:
    /// Takes ownership of a raw handle.
    static Derived adopt(H* h) noexcept {
        Derived x;
        static_cast<Owner&>(x).h_ = Handle<H, Destroy>(h);
        return x;
    }
    H* get() const noexcept { return h_.get(); }
    explicit operator bool() const noexcept { return bool(h_); }
    /// Gives up ownership: the caller must destroy the returned handle.
    H* release() noexcept { return h_.release(); }

protected:
    Owner() noexcept = default;
    explicit Owner(H* h) noexcept : h_(h) {}
    Handle<H, Destroy> h_;
};
}  // namespace detail

/// A device context (fk_context). Move-only.
class Context : public detail::Owner<Context, fk_context, fk_context_destroy> {
public:
    Context() noexcept = default;
    /// fk_context_create(FK_ABI_VERSION, kind, ordinal).
    explicit Context(DeviceKind kind, int ordinal = 0)
        : Owner(detail::query<fk_context*>(fk_context_create, FK_ABI_VERSION, static_cast<fk_device_kind>(kind),
                                           ordinal)) {}
    static Context cpu() { return Context(DeviceKind::Cpu); }
    static Context cuda(int ordinal = 0) { return Context(DeviceKind::Cuda, ordinal); }
    /// CUDA `ordinal` when a GPU is usable, else the CPU.
    static Context automatic(int ordinal = 0) { return Context(DeviceKind::Auto, ordinal); }

    Device device() const {
        fk_device_kind k = 0;
        std::int32_t o = 0;
        check(fk_context_device(checked(), &k, &o));
        return Device{static_cast<DeviceKind>(k), o};
    }
    DeviceKind kind() const { return device().kind; }
    bool is_cuda() const { return kind() == DeviceKind::Cuda; }
    std::string name() const {
        std::size_t needed = 0;
        check(fk_context_name(checked(), nullptr, 0, &needed));
        std::string s(needed, '\0');
        check(fk_context_name(checked(), &s[0], s.size(), &needed));
        s.resize(needed - 1);
        return s;
    }
    /// (major, minor); (0, 0) on the CPU.
    std::pair<int, int> compute_capability() const {
        std::int32_t major = 0, minor = 0;
        check(fk_context_compute_capability(checked(), &major, &minor));
        return {major, minor};
    }
    MemoryInfo memory() const {
        MemoryInfo m{0, 0};
        check(fk_context_memory(checked(), &m.free_bytes, &m.total_bytes));
        return m;
    }
    /// Compiles every kernel module now (no-op on the CPU).
    void warmup() const { check(fk_context_warmup(checked())); }

    /// The context's memory statistics (fk_context_memory_stats).
    fk_memory_stats memory_stats() const {
        fk_memory_stats m{};
        m.size = sizeof(fk_memory_stats);
        check(fk_context_memory_stats(checked(), &m));
        return m;
    }
    /// Bytes the pool keeps reserved at a synchronisation (UINT64_MAX at first).
    void set_release_threshold(std::uint64_t bytes) const {
        check(fk_context_set_release_threshold(checked(), bytes));
    }
    /// Returns unused pool memory until at most `keep_bytes` stay reserved.
    void trim(std::uint64_t keep_bytes = 0) const { check(fk_context_trim(checked(), keep_bytes)); }

private:
    const fk_context* checked() const {
        detail::require(h_.get(), "fusekit::Context");
        return h_.get();
    }
};

/// A stream (fk_stream): owned by fusekit (`Stream(ctx)`) or wrapping a caller's
/// CUstream / cudaStream_t (`Stream::wrap`). Move-only.
class Stream : public detail::Owner<Stream, fk_stream, fk_stream_destroy> {
public:
    Stream() noexcept = default;
    /// A new stream owned by fusekit (fk_stream_create).
    explicit Stream(const Context& ctx) : Owner(detail::query<fk_stream*>(fk_stream_create, ctx.get())) {}
    /// Borrows `cu_stream` (nullptr = the legacy default stream) without owning it;
    /// it must outlive this object. CUDA contexts only.
    static Stream wrap(const Context& ctx, void* cu_stream) {
        return adopt(detail::query<fk_stream*>(fk_stream_wrap, ctx.get(), cu_stream));
    }

    void synchronize() const { check(fk_stream_synchronize(h_.get())); }
    /// The raw CUstream (nullptr for the legacy default stream and on the CPU).
    void* handle() const { return detail::query<void*>(fk_stream_handle, h_.get()); }
};

/// Where an op or copy is queued: a Stream, or nothing (the default stream).
/// Implicitly made from `const Stream&`, `nullptr` or a raw `const fk_stream*`.
class StreamRef {
public:
    StreamRef() noexcept = default;
    StreamRef(std::nullptr_t) noexcept {}
    StreamRef(const Stream& s) noexcept : p_(s.get()) {}
    StreamRef(const fk_stream* s) noexcept : p_(s) {}
    const fk_stream* get() const noexcept { return p_; }

private:
    const fk_stream* p_ = nullptr;
};

/// A buffer (fk_buffer): owned memory (`Buffer::owned`), a borrowed view of caller
/// memory (`Buffer::borrowed`, no copy) or a DLPack import. Move-only.
class Buffer : public detail::Owner<Buffer, fk_buffer, fk_buffer_destroy> {
public:
    Buffer() noexcept = default;

    /// Allocates an uninitialised contiguous buffer (fk_buffer_create), stream-ordered
    /// on `stream` for CUDA.
    static Buffer owned(const Context& ctx, fk_dtype dtype, const std::vector<std::int64_t>& shape,
                        StreamRef stream = {}) {
        return adopt(detail::query<fk_buffer*>(fk_buffer_create, ctx.get(), dtype,
                                               static_cast<std::int32_t>(shape.size()),
                                               shape.empty() ? nullptr : shape.data(), stream.get()));
    }
    template <class T>
    static Buffer owned(const Context& ctx, const std::vector<std::int64_t>& shape,
                        StreamRef stream = {}) {
        return owned(ctx, dtype_v<T>, shape, stream);
    }

    /// Wraps caller memory without copying (fk_buffer_wrap); `data` must outlive the
    /// buffer. `strides` in elements; empty = contiguous. Host memory for a CPU
    /// context, device memory for a CUDA context.
    static Buffer borrowed(const Context& ctx, void* data, fk_dtype dtype,
                           const std::vector<std::int64_t>& shape,
                           const std::vector<std::int64_t>& strides = {}) {
        if (!strides.empty() && strides.size() != shape.size())
            throw Error(FK_ERROR_INVALID_ARGUMENT,
                        "fusekit::Buffer::borrowed: strides has " + std::to_string(strides.size()) +
                            " entries but shape has " + std::to_string(shape.size()));
        return adopt(detail::query<fk_buffer*>(fk_buffer_wrap, ctx.get(), data, dtype,
                                               static_cast<std::int32_t>(shape.size()),
                                               shape.empty() ? nullptr : shape.data(),
                                               strides.empty() ? nullptr : strides.data()));
    }
    template <class T>
    static Buffer borrowed(const Context& ctx, T* data, const std::vector<std::int64_t>& shape,
                           const std::vector<std::int64_t>& strides = {}) {
        return borrowed(ctx, static_cast<void*>(const_cast<std::remove_cv_t<T>*>(data)), dtype_v<T>,
                        shape, strides);
    }

    /// Page-locked host memory (fk_buffer_create_pinned): a copy endpoint, refused by
    /// ops; an ordinary host buffer on a CPU context.
    static Buffer pinned(const Context& ctx, fk_dtype dtype, const std::vector<std::int64_t>& shape) {
        return adopt(detail::query<fk_buffer*>(fk_buffer_create_pinned, ctx.get(), dtype,
                                               static_cast<std::int32_t>(shape.size()),
                                               shape.empty() ? nullptr : shape.data()));
    }
    template <class T>
    static Buffer pinned(const Context& ctx, const std::vector<std::int64_t>& shape) {
        return pinned(ctx, dtype_v<T>, shape);
    }

    /// Copies `src` into this buffer (fk_buffer_copy: any two contiguous buffers of
    /// one dtype and element count, host, pinned or device, across GPUs too), queued
    /// on `stream`.
    void copy_from(const Buffer& src, StreamRef stream = {}) const {
        check(fk_buffer_copy(h_.get(), src.get(), stream.get()));
    }

    /// Imports a DLManagedTensorVersioned; on success the buffer owns it.
    static Buffer from_dlpack(const Context& ctx, dl::DLManagedTensorVersioned* managed) {
        return adopt(detail::query<fk_buffer*>(fk_buffer_from_dlpack, ctx.get(), managed));
    }

    fk_dtype dtype() const { return detail::query<fk_dtype>(fk_buffer_dtype, h_.get()); }
    int ndim() const { return detail::query<std::int32_t>(fk_buffer_ndim, h_.get()); }
    std::vector<std::int64_t> shape() const {
        std::vector<std::int64_t> v(static_cast<std::size_t>(ndim()));
        check(fk_buffer_shape(h_.get(), v.empty() ? nullptr : v.data()));
        return v;
    }
    /// In elements.
    std::vector<std::int64_t> strides() const {
        std::vector<std::int64_t> v(static_cast<std::size_t>(ndim()));
        check(fk_buffer_strides(h_.get(), v.empty() ? nullptr : v.data()));
        return v;
    }
    std::int64_t numel() const { return detail::query<std::int64_t>(fk_buffer_numel, h_.get()); }
    std::size_t nbytes() const { return detail::query<std::size_t>(fk_buffer_nbytes, h_.get()); }
    bool is_contiguous() const { return detail::query<std::int32_t>(fk_buffer_is_contiguous, h_.get()) != 0; }
    /// Address of the first element (host or device).
    void* data() const { return detail::query<void*>(fk_buffer_data, h_.get()); }
    Device device() const {
        fk_device_kind k = 0;
        std::int32_t o = 0;
        check(fk_buffer_device(h_.get(), &k, &o));
        return Device{static_cast<DeviceKind>(k), o};
    }

    /// Copies `count` elements of type T from host memory (blocking). T must match
    /// the buffer's dtype and `count` its number of elements.
    template <class T>
    void copy_from_host(const T* src, std::size_t count, StreamRef stream = {}) const {
        require_dtype<T>("copy_from_host");
        check(fk_buffer_copy_from_host(h_.get(), src, count * sizeof(T), stream.get()));
    }
    template <class T>
    void copy_from_host(const std::vector<T>& src, StreamRef stream = {}) const {
        copy_from_host(src.data(), src.size(), stream);
    }
    /// Queues the copy only: `src` must stay valid until the stream reaches it.
    template <class T>
    void copy_from_host_async(const T* src, std::size_t count, StreamRef stream = {}) const {
        require_dtype<T>("copy_from_host_async");
        check(fk_buffer_copy_from_host_async(h_.get(), src, count * sizeof(T), stream.get()));
    }
    /// Copies the buffer into `count` elements of host memory (blocking).
    template <class T>
    void copy_to_host(T* dst, std::size_t count, StreamRef stream = {}) const {
        require_dtype<T>("copy_to_host");
        check(fk_buffer_copy_to_host(h_.get(), dst, count * sizeof(T), stream.get()));
    }
    /// Queues the copy only: synchronise the stream before reading `dst`.
    template <class T>
    void copy_to_host_async(T* dst, std::size_t count, StreamRef stream = {}) const {
        require_dtype<T>("copy_to_host_async");
        check(fk_buffer_copy_to_host_async(h_.get(), dst, count * sizeof(T), stream.get()));
    }
    /// The buffer's elements as a vector (blocking copy).
    template <class T>
    std::vector<T> to_vector(StreamRef stream = {}) const {
        std::vector<T> v(static_cast<std::size_t>(numel()));
        copy_to_host(v.data(), v.size(), stream);
        return v;
    }

    /// Exports as a new DLPack 1.1 managed tensor. The caller must call its
    /// `deleter` exactly once; the memory stays valid until then.
    dl::DLManagedTensorVersioned* to_dlpack() const {
        return static_cast<dl::DLManagedTensorVersioned*>(detail::query<void*>(fk_buffer_to_dlpack, h_.get()));
    }

private:
    template <class T>
    void require_dtype(const char* what) const {
        fk_dtype d = dtype();
        if (d != dtype_v<T>)
            throw Error(FK_ERROR_DTYPE_MISMATCH,
                        std::string("fusekit::Buffer::") + what + ": host element type has dtype " +
                            std::to_string(dtype_v<T>) + " but the buffer has dtype " +
                            std::to_string(d));
    }
};

// ------------------------------------------------------------------ ops

/// A scalar for axpby / scalar_add / scalar_mul: real or complex.
class Scalar {
public:
    Scalar(double re, double im = 0.0) noexcept : v_{re, im} {}
    Scalar(std::complex<double> z) noexcept : v_{z.real(), z.imag()} {}
    Scalar(std::complex<float> z) noexcept : v_{z.real(), z.imag()} {}
    fk_scalar get() const noexcept { return v_; }

private:
    fk_scalar v_;
};

#define FUSEKIT_BINARY_OP(NAME)                                                                \
    /** out = fk_##NAME(a, b), queued on `stream` (default stream when omitted). */          \
    inline void NAME(const Buffer& a, const Buffer& b, Buffer& out, StreamRef stream = {}) { \
        check(fk_##NAME(a.get(), b.get(), out.get(), stream.get()));                         \
    }
#define FUSEKIT_UNARY_OP(NAME)                                                      \
    /** out = fk_##NAME(a), queued on `stream` (default stream when omitted). */ \
    inline void NAME(const Buffer& a, Buffer& out, StreamRef stream = {}) {       \
        check(fk_##NAME(a.get(), out.get(), stream.get()));                       \
    }

FUSEKIT_BINARY_OP(add)
FUSEKIT_BINARY_OP(sub)
FUSEKIT_BINARY_OP(mul)
FUSEKIT_BINARY_OP(div)
FUSEKIT_UNARY_OP(neg)
FUSEKIT_UNARY_OP(abs)
FUSEKIT_UNARY_OP(exp)
FUSEKIT_UNARY_OP(log)
FUSEKIT_UNARY_OP(sqrt)
FUSEKIT_UNARY_OP(sin)
FUSEKIT_UNARY_OP(cos)
FUSEKIT_UNARY_OP(tanh)
FUSEKIT_UNARY_OP(sigmoid)
FUSEKIT_UNARY_OP(relu)
FUSEKIT_UNARY_OP(copy)

#undef FUSEKIT_BINARY_OP
#undef FUSEKIT_UNARY_OP

/// out = alpha*a + beta*b in one pass.
inline void axpby(Scalar alpha, const Buffer& a, Scalar beta, const Buffer& b, Buffer& out,
                  StreamRef stream = {}) {
    check(fk_axpby(alpha.get(), a.get(), beta.get(), b.get(), out.get(), stream.get()));
}
/// out = a + s.
inline void scalar_add(const Buffer& a, Scalar s, Buffer& out, StreamRef stream = {}) {
    check(fk_scalar_add(a.get(), s.get(), out.get(), stream.get()));
}
/// out = a * s.
inline void scalar_mul(const Buffer& a, Scalar s, Buffer& out, StreamRef stream = {}) {
    check(fk_scalar_mul(a.get(), s.get(), out.get(), stream.get()));
}

// ------------------------------------------------------------------ runtime

/// Whether CUDA device `device` can access memory of `peer` directly.
inline bool can_access_peer(int device, int peer) {
    return detail::query<std::int32_t>(fk_device_can_access_peer, device, peer) != 0;
}

/// An event (fk_event): a CUDA event, or a host timestamp on the CPU. Move-only.
class Event : public detail::Owner<Event, fk_event, fk_event_destroy> {
public:
    Event() noexcept = default;
    explicit Event(const Context& ctx) : Owner(detail::query<fk_event*>(fk_event_create, ctx.get())) {}

    void record(StreamRef stream = {}) const { check(fk_event_record(h_.get(), stream.get())); }
    void synchronize() const { check(fk_event_synchronize(h_.get())); }
    bool query() const { return detail::query<std::int32_t>(fk_event_query, h_.get()) != 0; }
    /// Milliseconds from this event to `end` (waits for `end`).
    float elapsed_ms(const Event& end) const {
        return detail::query<float>(fk_event_elapsed_ms, h_.get(), end.get());
    }
};

/// Makes work queued on `stream` after this call wait for `event`.
inline void wait(StreamRef stream, const Event& event) {
    check(fk_stream_wait_event(stream.get(), event.get()));
}

/// Reductions of all_reduce / reduce_scatter.
enum class ReduceOp : fk_reduce_op {
    Sum = FK_REDUCE_SUM,
    Prod = FK_REDUCE_PROD,
    Max = FK_REDUCE_MAX,
    Min = FK_REDUCE_MIN,
};

using CommId = std::array<std::uint8_t, FK_COMM_ID_BYTES>;

/// A new unique id for Comm::init_rank (needs NCCL).
inline CommId comm_unique_id() {
    CommId id{};
    check(fk_comm_unique_id(id.data()));
    return id;
}

/// One rank of a communicator (fk_comm). Move-only.
class Comm : public detail::Owner<Comm, fk_comm, fk_comm_destroy> {
public:
    Comm() noexcept = default;
    /// Rank `rank` of `nranks` (blocks until all ranks joined, unless in a Group).
    static Comm init_rank(const Context& ctx, int nranks, const CommId& id, int rank) {
        return adopt(detail::query<fk_comm*>(fk_comm_init_rank, ctx.get(), nranks, id.data(), rank));
    }
    /// One rank per context, rank i on ctxs[i] (distinct GPUs, or one CPU context).
    static std::vector<Comm> init_all(const std::vector<const Context*>& ctxs) {
        std::vector<const fk_context*> raw;
        for (const Context* c : ctxs) raw.push_back(c ? c->get() : nullptr);
        std::vector<fk_comm*> out(ctxs.size(), nullptr);
        check(fk_comm_init_all(raw.empty() ? nullptr : raw.data(),
                               static_cast<std::int32_t>(raw.size()),
                               out.empty() ? nullptr : out.data()));
        std::vector<Comm> v;
        for (fk_comm* c : out) v.push_back(adopt(c));
        return v;
    }
    int rank() const { return detail::query<std::int32_t>(fk_comm_rank, h_.get()); }
    int size() const { return detail::query<std::int32_t>(fk_comm_size, h_.get()); }
};

/// fk_comm_group_start in the constructor, fk_comm_group_end in close() or the
/// destructor (which cannot report an error: call close() to see it).
class Group {
public:
    Group() { check(fk_comm_group_start()); }
    Group(const Group&) = delete;
    Group& operator=(const Group&) = delete;
    void close() {
        if (open_) {
            open_ = false;
            check(fk_comm_group_end());
        }
    }
    ~Group() {
        if (open_) (void)fk_comm_group_end();
    }

private:
    bool open_ = true;
};

inline void all_reduce(const Comm& comm, const Buffer& send, const Buffer& recv, ReduceOp op,
                       StreamRef stream = {}) {
    check(fk_all_reduce(comm.get(), send.get(), recv.get(), static_cast<fk_reduce_op>(op),
                        stream.get()));
}
/// `send` may be nullptr on ranks other than `root`.
inline void broadcast(const Comm& comm, const Buffer* send, const Buffer& recv, int root,
                      StreamRef stream = {}) {
    check(fk_broadcast(comm.get(), send ? send->get() : nullptr, recv.get(), root, stream.get()));
}
inline void all_gather(const Comm& comm, const Buffer& send, const Buffer& recv,
                       StreamRef stream = {}) {
    check(fk_all_gather(comm.get(), send.get(), recv.get(), stream.get()));
}
inline void reduce_scatter(const Comm& comm, const Buffer& send, const Buffer& recv, ReduceOp op,
                           StreamRef stream = {}) {
    check(fk_reduce_scatter(comm.get(), send.get(), recv.get(), static_cast<fk_reduce_op>(op),
                            stream.get()));
}

// ------------------------------------------------------------------ linear algebra

/// Operation on a GEMM operand.
enum class Op : fk_op { N = FK_OP_N, T = FK_OP_T, C = FK_OP_C };
/// Activation of the fused linear layer: GeluErf is the exact GELU (torch's default
/// `gelu`), GeluTanh the tanh approximation (`gelu(approximate="tanh")`).
enum class Act : fk_activation {
    None = FK_ACT_NONE,
    Relu = FK_ACT_RELU,
    GeluTanh = FK_ACT_GELU_TANH,
    GeluErf = FK_ACT_GELU_ERF
};

namespace detail {
inline fk_buffer* opt(const Buffer* b) noexcept { return b ? b->get() : nullptr; }
}  // namespace detail

/// c = alpha op_a(a) op_b(b) + beta c (row-major; batched [batch, rows, cols]).
/// `flags`: 0 or FK_GEMM_ALLOW_TF32.
inline void gemm(const Buffer& a, const Buffer& b, Buffer& c, Op op_a = Op::N, Op op_b = Op::N,
                 Scalar alpha = 1.0, Scalar beta = 0.0, std::uint32_t flags = 0, StreamRef stream = {}) {
    check(fk_gemm(static_cast<fk_op>(op_a), static_cast<fk_op>(op_b), alpha.get(), a.get(), b.get(),
                  beta.get(), c.get(), flags, stream.get()));
}

/// gemm in tiles under `device_budget_bytes` of staging; operands may be pinned host memory.
inline void gemm_chunked(const Buffer& a, const Buffer& b, Buffer& c, std::uint64_t device_budget_bytes,
                         Op op_a = Op::N, Op op_b = Op::N, Scalar alpha = 1.0, Scalar beta = 0.0,
                         std::uint32_t flags = 0, StreamRef stream = {}) {
    check(fk_gemm_chunked(static_cast<fk_op>(op_a), static_cast<fk_op>(op_b), alpha.get(), a.get(), b.get(),
                          beta.get(), c.get(), device_budget_bytes, flags, stream.get()));
}

/// Bytes of the aux buffer linear_forward fills (GELUs: the pre-activation; else 0).
inline std::size_t linear_aux_size(Act act, fk_dtype dtype, std::int64_t m, std::int64_t n) {
    return detail::query<std::size_t>(fk_linear_aux_size, static_cast<fk_activation>(act), dtype, m, n);
}

/// y = act(x w^T + b): x [..., k], w [n, k], b [n] (nullptr: none), aux (GELUs only) or nullptr.
inline void linear_forward(const Buffer& x, const Buffer& w, const Buffer* b, Act act, Buffer& y,
                           Buffer* aux = nullptr, StreamRef stream = {}) {
    check(fk_linear_forward(x.get(), w.get(), detail::opt(b), static_cast<fk_activation>(act), y.get(),
                            detail::opt(aux), stream.get()));
}

/// Backward of linear_forward: `saved` is y (relu), aux (GELUs) or nullptr (none);
/// dx, dw, db each optional (nullptr).
inline void linear_backward(const Buffer& dy, const Buffer& x, const Buffer& w, Act act, const Buffer* saved,
                            Buffer* dx, Buffer* dw, Buffer* db, StreamRef stream = {}) {
    check(fk_linear_backward(dy.get(), x.get(), w.get(), static_cast<fk_activation>(act), detail::opt(saved),
                             detail::opt(dx), detail::opt(dw), detail::opt(db), stream.get()));
}

/// out = kron(a, b), batched.
inline void kron(const Buffer& a, const Buffer& b, Buffer& out, StreamRef stream = {}) {
    check(fk_kron(a.get(), b.get(), out.get(), stream.get()));
}

// ------------------------------------------------------------------ multi-layer perceptron

namespace detail {
/// The C array of handles of `bufs` (nullptr entries stay NULL).
inline std::vector<fk_buffer*> handles(const std::vector<const Buffer*>& bufs) {
    std::vector<fk_buffer*> h(bufs.size());
    for (std::size_t i = 0; i < bufs.size(); ++i) h[i] = opt(bufs[i]);
    return h;
}
inline std::vector<fk_buffer*> handles(const std::vector<Buffer*>& bufs) {
    std::vector<fk_buffer*> h(bufs.size());
    for (std::size_t i = 0; i < bufs.size(); ++i) h[i] = opt(bufs[i]);
    return h;
}
/// nullptr for an empty vector (the C call then sees "no array").
inline fk_buffer* const* data_or_null(const std::vector<fk_buffer*>& v) noexcept {
    return v.empty() ? nullptr : v.data();
}
}  // namespace detail

/// Bytes of the `saved` buffer mlp_forward fills for mlp_backward, for
/// `widths` = {k_0, n_0, ..., n_{L-1}} over `rows` rows in `dtype` on `ctx`'s backend.
inline std::size_t mlp_saved_size(const Context& ctx, const std::vector<std::int64_t>& widths, std::int64_t rows,
                                  fk_dtype dtype, Act hidden_act, Act out_act) {
    return detail::query<std::size_t>(fk_mlp_saved_size, ctx.get(), static_cast<std::int32_t>(widths.size()) - 1,
                                      widths.data(), rows, dtype, static_cast<fk_activation>(hidden_act),
                                      static_cast<fk_activation>(out_act));
}

/// y = act_L(... act_0(x w_0^T + b_0) ...): `weights` one per layer, `biases` empty (no
/// layer has one) or one per layer with nullptr entries for none; `saved` nullptr for
/// inference, else at least mlp_saved_size bytes. `flags`: 0 or FK_GEMM_ALLOW_TF32.
inline void mlp_forward(const Buffer& x, const std::vector<const Buffer*>& weights,
                        const std::vector<const Buffer*>& biases, Act hidden_act, Act out_act, Buffer& y,
                        Buffer* saved = nullptr, std::uint32_t flags = 0, StreamRef stream = {}) {
    const auto w = detail::handles(weights), b = detail::handles(biases);
    check(fk_mlp_forward(x.get(), static_cast<std::int32_t>(weights.size()), detail::data_or_null(w),
                         detail::data_or_null(b), static_cast<fk_activation>(hidden_act),
                         static_cast<fk_activation>(out_act), flags, y.get(), detail::opt(saved), stream.get()));
}

/// Backward of mlp_forward given dy: `dx` optional (nullptr), `dweights` / `dbiases`
/// empty (none wanted) or one entry per layer (nullptr: not wanted); overwritten.
inline void mlp_backward(const Buffer& dy, const Buffer& x, const std::vector<const Buffer*>& weights,
                         Act hidden_act, Act out_act, const Buffer* saved, Buffer* dx,
                         const std::vector<Buffer*>& dweights, const std::vector<Buffer*>& dbiases,
                         std::uint32_t flags = 0, StreamRef stream = {}) {
    const auto w = detail::handles(weights), dw = detail::handles(dweights), db = detail::handles(dbiases);
    check(fk_mlp_backward(dy.get(), x.get(), static_cast<std::int32_t>(weights.size()), detail::data_or_null(w),
                          static_cast<fk_activation>(hidden_act), static_cast<fk_activation>(out_act), flags,
                          detail::opt(saved), detail::opt(dx), detail::data_or_null(dw), detail::data_or_null(db),
                          stream.get()));
}

// ------------------------------------------------------------------ Gaussian field

/// Bytes of workspace the Gaussian backwards need on `ctx` (0 on the CPU).
inline std::size_t gaussian_backward_workspace_size(const Context& ctx, fk_dtype dtype, std::int64_t num_points,
                                                    std::int64_t num_gaussians) {
    return detail::query<std::size_t>(fk_gaussian_backward_workspace_size, ctx.get(), dtype, num_points,
                                      num_gaussians);
}
/// m[b,n] = |(L_n + eps I)^-1 (p_b - mu_n)|^2, out [B,N].
inline void mahalanobis_forward(const Buffer& points, const Buffer& means, const Buffer& chol, double eps,
                                Buffer& out, StreamRef stream = {}) {
    check(fk_mahalanobis_forward(points.get(), means.get(), chol.get(), eps, out.get(), stream.get()));
}
/// Gradients of the Mahalanobis op given g = dL/dm [B,N]; outputs optional (nullptr).
inline void mahalanobis_backward(const Buffer& points, const Buffer& means, const Buffer& chol, double eps,
                                 const Buffer& g, Buffer* dpoints, Buffer* dmeans, Buffer* dchol,
                                 Buffer* workspace, StreamRef stream = {}) {
    check(fk_mahalanobis_backward(points.get(), means.get(), chol.get(), eps, g.get(), detail::opt(dpoints),
                                  detail::opt(dmeans), detail::opt(dchol), detail::opt(workspace), stream.get()));
}
/// out[b] = sum_n weights[n] exp(-0.5 m[b,n]), fused (no [B,N] array).
inline void gaussian_field_forward(const Buffer& points, const Buffer& means, const Buffer& chol,
                                   const Buffer& weights, double eps, Buffer& out, StreamRef stream = {}) {
    check(fk_gaussian_field_forward(points.get(), means.get(), chol.get(), weights.get(), eps, out.get(),
                                    stream.get()));
}
/// Gradients of the field given dout [B]; outputs optional (nullptr); deterministic.
inline void gaussian_field_backward(const Buffer& points, const Buffer& means, const Buffer& chol,
                                    const Buffer& weights, double eps, const Buffer& dout, Buffer* dpoints,
                                    Buffer* dmeans, Buffer* dchol, Buffer* dweights, Buffer* workspace,
                                    StreamRef stream = {}) {
    check(fk_gaussian_field_backward(points.get(), means.get(), chol.get(), weights.get(), eps, dout.get(),
                                     detail::opt(dpoints), detail::opt(dmeans), detail::opt(dchol),
                                     detail::opt(dweights), detail::opt(workspace), stream.get()));
}

// ------------------------------------------------------------------ geodesic flow

/// gamma = clamp((v U)^2 W^T, -c, c) [B,D]; `flags`: 0 or FK_GEO_*.
inline void christoffel_forward(const Buffer& v, const Buffer& U, const Buffer& W, double c, Buffer& gamma,
                                std::uint32_t flags = 0, StreamRef stream = {}) {
    check(fk_christoffel_forward(v.get(), U.get(), W.get(), c, flags, gamma.get(), stream.get()));
}
/// Gradients given g = dL/dgamma; dv, dU, dW optional (nullptr).
inline void christoffel_backward(const Buffer& v, const Buffer& U, const Buffer& W, const Buffer& g, double c,
                                 Buffer* dv, Buffer* dU, Buffer* dW, std::uint32_t flags = 0,
                                 StreamRef stream = {}) {
    check(fk_christoffel_backward(v.get(), U.get(), W.get(), g.get(), c, flags, detail::opt(dv), detail::opt(dU),
                                  detail::opt(dW), stream.get()));
}
/// `steps` fused kick-drift-kick steps; f, mu, traj optional (nullptr).
inline void leapfrog_forward(const Buffer& x0, const Buffer& v0, const Buffer* f, const Buffer& U, const Buffer& W,
                             const Buffer* mu, double dt, std::int64_t steps, double c, Buffer& x_out,
                             Buffer& v_out, Buffer* traj = nullptr, std::uint32_t flags = 0,
                             StreamRef stream = {}) {
    check(fk_leapfrog_forward(x0.get(), v0.get(), detail::opt(f), U.get(), W.get(), detail::opt(mu), dt, steps, c,
                              flags, x_out.get(), v_out.get(), detail::opt(traj), stream.get()));
}
/// Gradients of a loss on (x_T, v_T) w.r.t. x0, v0, f, U, W (each optional);
/// `traj` from the forward, or nullptr to recompute.
inline void leapfrog_backward(const Buffer& v0, const Buffer* f, const Buffer& U, const Buffer& W,
                              const Buffer* mu, double dt, std::int64_t steps, double c, const Buffer* traj,
                              const Buffer& gx, const Buffer& gv, Buffer* dx0, Buffer* dv0, Buffer* df, Buffer* dU,
                              Buffer* dW, std::uint32_t flags = 0, StreamRef stream = {}) {
    check(fk_leapfrog_backward(v0.get(), detail::opt(f), U.get(), W.get(), detail::opt(mu), dt, steps, c, flags,
                               detail::opt(traj), gx.get(), gv.get(), detail::opt(dx0), detail::opt(dv0),
                               detail::opt(df), detail::opt(dU), detail::opt(dW), stream.get()));
}

// ------------------------------------------------------------------ optimizer math

/// Method of matrix_power (values of fk_matpow_method).
enum class MatpowMethod : fk_matpow_method {
    /// Newton for inverse roots of matrices larger than 32 on CUDA (falling back
    /// to the eigendecomposition when it does not converge), else Eigh.
    Auto = FK_MATPOW_AUTO,
    /// Eigendecomposition: any real power.
    Eigh = FK_MATPOW_EIGH,
    /// Coupled Newton iteration: inverse roots (power = -1/p) only.
    Newton = FK_MATPOW_NEWTON,
};

/// Thrown by matrix_power for FK_ERROR_NOT_CONVERGED (a fusekit::Error with that
/// status): `report()` says how far the iteration got; `out` holds the last iterate.
class NotConverged : public Error {
public:
    NotConverged(std::string message, const fk_matpow_report& report)
        : Error(FK_ERROR_NOT_CONVERGED, std::move(message)), report_(report) {}
    const fk_matpow_report& report() const noexcept { return report_; }

private:
    fk_matpow_report report_;
};

/// Newton tolerance matrix_power uses when none is given: 1e-12 for f64, 1e-5 for
/// f32, 3e-2 for f32 with FK_GEMM_ALLOW_TF32 (the strict residual of a TF32 result).
inline double default_matpow_tol(fk_dtype dtype, std::uint32_t flags) {
    if (dtype == FK_DTYPE_F64) return 1e-12;
    return (flags & FK_GEMM_ALLOW_TF32) ? 3e-2 : 1e-5;
}

/// out = (a + eps I)^power for symmetric PSD a [n, n] or [batch, n, n] (f32/f64);
/// returns the report. `tol`: Newton's bound on max|M - I| (default
/// default_matpow_tol; <= 0 runs max_iter iterations unchecked). Throws
/// NotConverged (with the report) when Newton misses tol, fusekit::Error otherwise.
inline fk_matpow_report matrix_power(const Buffer& a, double power, double eps, Buffer& out,
                                     MatpowMethod method = MatpowMethod::Auto, std::int32_t max_iter = 100,
                                     std::optional<double> tol = std::nullopt, std::uint32_t flags = 0,
                                     StreamRef stream = {}) {
    const double t = tol ? *tol : default_matpow_tol(a.dtype(), flags);
    fk_matpow_report report{};
    fk_status st = fk_matrix_power(a.get(), power, eps, static_cast<fk_matpow_method>(method), max_iter, t, flags,
                                   out.get(), &report, stream.get());
    if (st == FK_ERROR_NOT_CONVERGED) throw NotConverged(last_error_message(), report);
    check(st);
    return report;
}

/// Shampoo statistics in place: l = beta l + alpha grad grad^T, r = beta r + alpha
/// grad^T grad; each of l, r optional (nullptr), not both. `flags`: 0 or
/// FK_GEMM_ALLOW_TF32 (f32 on CUDA: the statistics of the TF32-rounded gradient).
inline void shampoo_stats(const Buffer& grad, double alpha, double beta, Buffer* l, Buffer* r,
                          std::uint32_t flags = 0, StreamRef stream = {}) {
    check(fk_shampoo_stats_ex(grad.get(), alpha, beta, detail::opt(l), detail::opt(r), flags, stream.get()));
}

/// out = l_root grad r_root; each root optional (nullptr = the identity).
/// `flags`: 0 or FK_GEMM_ALLOW_TF32.
inline void shampoo_precondition(const Buffer* l_root, const Buffer& grad, const Buffer* r_root, Buffer& out,
                                 std::uint32_t flags = 0, StreamRef stream = {}) {
    check(fk_shampoo_precondition(detail::opt(l_root), grad.get(), detail::opt(r_root), out.get(), flags,
                                  stream.get()));
}

/// Per-sample gradients out[b] = g_b^T a_b [B, out, in] (a [B, (T,) in], g [B, (T,) out]).
inline void per_sample_grads(const Buffer& a, const Buffer& g, Buffer& out, std::uint32_t flags = 0,
                             StreamRef stream = {}) {
    check(fk_per_sample_grads(a.get(), g.get(), out.get(), flags, stream.get()));
}

/// Squared Frobenius norms [B] of the per-sample gradients, without materialising them.
inline void per_sample_grad_norms(const Buffer& a, const Buffer& g, Buffer& sq_norms, StreamRef stream = {}) {
    check(fk_per_sample_grad_norms(a.get(), g.get(), sq_norms.get(), stream.get()));
}

/// DP-SGD clipped sum out = sum_b min(1, max_norm / |G_b|) G_b [out, in];
/// sq_norms [B] optional (nullptr).
inline void dp_clipped_grad_sum(const Buffer& a, const Buffer& g, double max_norm, Buffer& out,
                                Buffer* sq_norms = nullptr, std::uint32_t flags = 0, StreamRef stream = {}) {
    check(fk_dp_clipped_grad_sum(a.get(), g.get(), max_norm, out.get(), detail::opt(sq_norms), flags,
                                 stream.get()));
}

}  // namespace fusekit

#endif  // FUSEKIT_HPP
