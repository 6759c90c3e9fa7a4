// fusekit's torch integration: the torch ops (`torch.ops.fusekit.*`) implemented in
// C++ against PyTorch's stable ABI (torch/csrc/stable, torch >= 2.10), calling the
// fusekit C ABI directly. One binary serves every torch from the version it was
// built against (TORCH_TARGET_VERSION below) onwards, CPU and CUDA builds alike; it
// needs no CUDA toolkit to build.
//
// - libfusekit is not linked: Python loads it (ctypes) and hands its path to
//   `fusekit_torch_init`, which dlopens the same file (the loader returns the
//   already-loaded library) and resolves every entry point used here. So the ctypes
//   package and these ops share one libfusekit, whatever the loader path says.
// - Tensors are borrowed, never copied: each becomes an `fk_buffer` view of its
//   memory (data pointer, sizes, strides). Outputs are allocated by torch
//   (aoti_torch_empty_strided: torch's caching allocator, so torch's CUDA-graph
//   memory pools apply to them).
// - CUDA tensors run on torch's current stream of their device
//   (aoti_torch_get_current_cuda_stream, looked up in libtorch_cuda at run time so
//   that the same binary loads under a CPU-only torch), so fusekit work orders with
//   the surrounding torch work, and is captured when torch captures that stream.
// - One fusekit context per device (CPU, cuda:i), created on first use and kept
//   for the life of the process.
// - A failing fusekit call throws `std::runtime_error("fusekit[<status>]: <message>")`;
//   torch turns it into a Python RuntimeError, which fusekit's Python layer turns
//   into the matching fusekit.Error subclass (fusekit/_torch_ext.py).
//
// The autograd formulas and the fake (meta) implementations are registered in
// Python (fusekit/torch_ops.py and the family modules) on these ops.

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include <dlfcn.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "fusekit.h"

using torch::stable::Tensor;
using OptTensor = std::optional<Tensor>;

namespace {

// ---------------------------------------------------------------- the C ABI, resolved at init

#define FK_TORCH_ENTRY_POINTS(X)                                                         \
    X(fk_abi_version) X(fk_status_string) X(fk_last_error_message) X(fk_context_create)  \
    X(fk_stream_wrap) X(fk_buffer_wrap) X(fk_buffer_destroy) X(fk_add) X(fk_sub)         \
    X(fk_mul) X(fk_div) X(fk_axpby) X(fk_scalar_add) X(fk_scalar_mul) X(fk_neg)          \
    X(fk_abs) X(fk_exp) X(fk_log) X(fk_sqrt) X(fk_sin) X(fk_cos) X(fk_tanh)              \
    X(fk_sigmoid) X(fk_relu) X(fk_copy) X(fk_linear_forward) X(fk_linear_backward)       \
    X(fk_gaussian_field_forward) X(fk_gaussian_field_backward) X(fk_mahalanobis_forward) \
    X(fk_mahalanobis_backward) X(fk_gaussian_backward_workspace_size)                     \
    X(fk_christoffel_forward) X(fk_christoffel_backward) X(fk_leapfrog_forward)          \
    X(fk_leapfrog_backward) X(fk_gemm) X(fk_kron) X(fk_matrix_power) X(fk_shampoo_stats) X(fk_shampoo_stats_ex)  \
    X(fk_shampoo_precondition) X(fk_per_sample_grads) X(fk_per_sample_grad_norms)         \
    X(fk_dp_clipped_grad_sum)

struct Api {
#define FK_TORCH_FIELD(name) decltype(&::name) name = nullptr;
    FK_TORCH_ENTRY_POINTS(FK_TORCH_FIELD)
#undef FK_TORCH_FIELD
};

Api g_api;
std::atomic<bool> g_ready{false};

const Api& api() {
    if (!g_ready.load(std::memory_order_acquire))
        throw std::runtime_error(
            "fusekit[-1]: the fusekit torch ops are not initialised: import fusekit.torch_ops (it loads "
            "libfusekit and calls fusekit_torch_init)");
    return g_api;
}

[[noreturn]] void fail(fk_status s, const char* where) {
    const char* msg = g_api.fk_last_error_message ? g_api.fk_last_error_message() : nullptr;
    std::string text = "fusekit[" + std::to_string(s) + "]: ";
    text += (msg && *msg) ? msg : where;
    throw std::runtime_error(text);
}

inline void check(fk_status s, const char* where) {
    if (s != 0) fail(s, where);
}

[[noreturn]] void bad(fk_status status, const std::string& msg) {
    throw std::runtime_error("fusekit[" + std::to_string(status) + "]: " + msg);
}

// ---------------------------------------------------------------- torch facts, looked up once

struct TorchCodes {
    int32_t cpu = 0, cuda = 1;
    int32_t f16 = 0, bf16 = 0, f32 = 0, f64 = 0, c64 = 0, c128 = 0;
    TorchCodes() {
        cpu = aoti_torch_device_type_cpu();
        cuda = aoti_torch_device_type_cuda();
        f16 = aoti_torch_dtype_float16();
        bf16 = aoti_torch_dtype_bfloat16();
        f32 = aoti_torch_dtype_float32();
        f64 = aoti_torch_dtype_float64();
        c64 = aoti_torch_dtype_complex64();
        c128 = aoti_torch_dtype_complex128();
    }
};

const TorchCodes& codes() {
    static const TorchCodes c;
    return c;
}

fk_dtype fk_dtype_of(int32_t t, const char* where, const char* arg) {
    const TorchCodes& c = codes();
    if (t == c.f32) return FK_DTYPE_F32;
    if (t == c.f64) return FK_DTYPE_F64;
    if (t == c.bf16) return FK_DTYPE_BF16;
    if (t == c.f16) return FK_DTYPE_F16;
    if (t == c.c64) return FK_DTYPE_C64;
    if (t == c.c128) return FK_DTYPE_C128;
    bad(FK_ERROR_UNSUPPORTED_DTYPE, std::string(where) + ": " + arg +
                                        " has a dtype fusekit does not take (float16, bfloat16, float32, "
                                        "float64, complex64, complex128)");
}

int32_t torch_real_of(int32_t t) {
    const TorchCodes& c = codes();
    if (t == c.c64) return c.f32;
    if (t == c.c128) return c.f64;
    return t;
}

using GetStreamFn = AOTITorchError (*)(int32_t, void**);

// torch's current CUDA stream of a device. The shim function lives in
// libtorch_cuda.so, which a CPU-only torch lacks: found at run time.
void* current_cuda_stream(int32_t device) {
    static GetStreamFn fn = []() -> GetStreamFn {
        void* h = dlopen("libtorch_cuda.so", RTLD_NOW | RTLD_NOLOAD);
        void* f = h ? dlsym(h, "aoti_torch_get_current_cuda_stream") : nullptr;
        if (!f) f = dlsym(RTLD_DEFAULT, "aoti_torch_get_current_cuda_stream");
        return reinterpret_cast<GetStreamFn>(f);
    }();
    if (!fn) bad(FK_ERROR_CUDA_UNAVAILABLE, "a CUDA tensor, but torch's CUDA library (libtorch_cuda) is not loaded");
    void* s = nullptr;
    if (fn(device, &s) != AOTI_TORCH_SUCCESS) bad(FK_ERROR_CUDA, "torch could not give its current CUDA stream");
    return s;
}

// ---------------------------------------------------------------- contexts and streams

struct Device {
    bool cuda;
    int32_t index;
};

Device device_of(const Tensor& t) {
    int32_t type = 0, index = 0;
    TORCH_ERROR_CODE_CHECK(aoti_torch_get_device_type(t.get(), &type));
    if (type == codes().cpu) return {false, 0};
    if (type != codes().cuda) bad(FK_ERROR_DEVICE_MISMATCH, "fusekit takes CPU or CUDA tensors");
    TORCH_ERROR_CODE_CHECK(aoti_torch_get_device_index(t.get(), &index));
    return {true, index};
}

constexpr int kMaxDevices = 64;

fk_context* context_for(Device d) {
    static std::mutex mu;
    static fk_context* cpu = nullptr;
    static std::array<std::atomic<fk_context*>, kMaxDevices> cuda{};
    if (d.cuda) {
        if (d.index < 0 || d.index >= kMaxDevices) bad(FK_ERROR_INVALID_ARGUMENT, "CUDA device index out of range");
        fk_context* c = cuda[d.index].load(std::memory_order_acquire);
        if (c) return c;
    }
    std::lock_guard<std::mutex> lock(mu);
    if (!d.cuda) {
        if (!cpu) check(api().fk_context_create(FK_ABI_VERSION, FK_DEVICE_CPU, 0, &cpu), "fk_context_create");
        return cpu;
    }
    fk_context* c = cuda[d.index].load(std::memory_order_acquire);
    if (!c) {
        check(api().fk_context_create(FK_ABI_VERSION, FK_DEVICE_CUDA, d.index, &c), "fk_context_create");
        cuda[d.index].store(c, std::memory_order_release);
    }
    return c;
}

// Borrowed stream handles, one per (context, CUstream), kept for the process (a
// handle is a context reference and the raw pointer; nothing else).
const fk_stream* stream_for(fk_context* ctx, Device d) {
    if (!d.cuda) return nullptr;
    void* raw = current_cuda_stream(d.index);
    thread_local fk_context* last_ctx = nullptr;
    thread_local void* last_raw = nullptr;
    thread_local fk_stream* last = nullptr;
    if (last && last_ctx == ctx && last_raw == raw) return last;
    static std::mutex mu;
    static std::unordered_map<void*, std::unordered_map<void*, fk_stream*>>* all =
        new std::unordered_map<void*, std::unordered_map<void*, fk_stream*>>();
    std::lock_guard<std::mutex> lock(mu);
    fk_stream*& s = (*all)[ctx][raw];
    if (!s) check(api().fk_stream_wrap(ctx, raw, &s), "fk_stream_wrap");
    last_ctx = ctx;
    last_raw = raw;
    last = s;
    return s;
}

// ---------------------------------------------------------------- borrowed buffers

// An fk_buffer view of a tensor (or none), destroyed with the call.
class Buf {
   public:
    Buf() = default;
    Buf(fk_context* ctx, const Tensor& t, const char* where, const char* arg) {
        int32_t dt = 0;
        TORCH_ERROR_CODE_CHECK(aoti_torch_get_dtype(t.get(), &dt));
        fk_dtype fd = fk_dtype_of(dt, where, arg);
        auto sizes = t.sizes();
        auto strides = t.strides();
        check(api().fk_buffer_wrap(ctx, t.data_ptr(), fd, static_cast<int32_t>(sizes.size()), sizes.data(),
                                   strides.data(), &h_),
              where);
    }
    Buf(fk_context* ctx, const OptTensor& t, const char* where, const char* arg) {
        if (t.has_value()) *this = Buf(ctx, *t, where, arg);
    }
    Buf(const Buf&) = delete;
    Buf& operator=(const Buf&) = delete;
    Buf(Buf&& o) noexcept : h_(o.h_) { o.h_ = nullptr; }
    Buf& operator=(Buf&& o) noexcept {
        std::swap(h_, o.h_);
        return *this;
    }
    ~Buf() {
        if (h_) g_api.fk_buffer_destroy(h_);
    }
    fk_buffer* get() const { return h_; }

   private:
    fk_buffer* h_ = nullptr;
};

// What every call needs: the device, its context and stream.
struct Call {
    const char* where;
    Device dev;
    fk_context* ctx;
    const fk_stream* stream;
    Call(const char* w, const Tensor& first) : where(w), dev(device_of(first)) {
        ctx = context_for(dev);
        stream = stream_for(ctx, dev);
    }
    Buf in(const Tensor& t, const char* arg) const {
        Device d = device_of(t);
        if (d.cuda != dev.cuda || d.index != dev.index)
            bad(FK_ERROR_DEVICE_MISMATCH, std::string(where) + ": " + arg + " is on another device than the first tensor");
        return Buf(ctx, t, where, arg);
    }
    Buf in(const OptTensor& t, const char* arg) const { return t.has_value() ? in(*t, arg) : Buf(); }
    Buf out(const Tensor& t, const char* arg) const { return Buf(ctx, t, where, arg); }
};

int32_t dtype_of(const Tensor& t) {
    int32_t dt = 0;
    TORCH_ERROR_CODE_CHECK(aoti_torch_get_dtype(t.get(), &dt));
    return dt;
}

// A new contiguous tensor of `shape` on `like`'s device, of dtype `dt`.
Tensor new_tensor(const std::vector<int64_t>& shape, int32_t dt, const Tensor& like) {
    std::vector<int64_t> strides(shape.size());
    int64_t s = 1;
    for (size_t i = shape.size(); i-- > 0;) {
        strides[i] = s;
        s *= shape[i] > 0 ? shape[i] : 1;
    }
    int32_t type = 0, index = 0;
    TORCH_ERROR_CODE_CHECK(aoti_torch_get_device_type(like.get(), &type));
    TORCH_ERROR_CODE_CHECK(aoti_torch_get_device_index(like.get(), &index));
    AtenTensorHandle h = nullptr;
    TORCH_ERROR_CODE_CHECK(aoti_torch_empty_strided(static_cast<int64_t>(shape.size()), shape.data(),
                                                    strides.data(), dt, type, index, &h));
    return Tensor(h);
}

Tensor new_like(const Tensor& t) {
    auto s = t.sizes();
    return new_tensor(std::vector<int64_t>(s.begin(), s.end()), dtype_of(t), t);
}

Tensor empty0(const Tensor& like) { return new_tensor({0}, dtype_of(like), like); }

// The fused ops take contiguous row-major tensors: a strided one is copied first
// (as torch's own kernels do), a contiguous one passes as it is.
Tensor contig(const Tensor& t) { return t.is_contiguous() ? t : torch::stable::contiguous(t); }
OptTensor contig(const OptTensor& t) { return t.has_value() ? OptTensor(contig(*t)) : t; }

template <class... T>
void contig_all(T&... ts) {
    ((ts = contig(ts)), ...);
}

std::vector<int64_t> shape_of(const Tensor& t) {
    auto s = t.sizes();
    return std::vector<int64_t>(s.begin(), s.end());
}

// NumPy broadcast of two shapes (the library reports a mismatch; here the larger
// rank's extent wins where they differ so that the call can report it).
std::vector<int64_t> broadcast(const Tensor& a, const Tensor& b) {
    auto sa = a.sizes();
    auto sb = b.sizes();
    size_t n = std::max(sa.size(), sb.size());
    std::vector<int64_t> out(n);
    for (size_t i = 0; i < n; ++i) {
        int64_t x = i < n - sa.size() ? 1 : sa[i - (n - sa.size())];
        int64_t y = i < n - sb.size() ? 1 : sb[i - (n - sb.size())];
        out[i] = x == 1 ? y : x;
    }
    return out;
}

// ---------------------------------------------------------------- elementwise

// Entry point codes shared with fusekit/_torch_ext.py (BINARY, UNARY, SCALAR).
using BinaryFn = fk_status (*)(const fk_buffer*, const fk_buffer*, fk_buffer*, const fk_stream*);
using UnaryFn = fk_status (*)(const fk_buffer*, fk_buffer*, const fk_stream*);
using ScalarFn = fk_status (*)(const fk_buffer*, fk_scalar, fk_buffer*, const fk_stream*);

BinaryFn binary_fn(int64_t op, const char** where) {
    const Api& a = api();
    switch (op) {
        case 0: *where = "fusekit.add"; return a.fk_add;
        case 1: *where = "fusekit.sub"; return a.fk_sub;
        case 2: *where = "fusekit.mul"; return a.fk_mul;
        case 3: *where = "fusekit.div"; return a.fk_div;
    }
    bad(FK_ERROR_INVALID_ARGUMENT, "fusekit::binary: unknown op " + std::to_string(op));
}

UnaryFn unary_fn(int64_t op, const char** where) {
    const Api& a = api();
    switch (op) {
        case 0: *where = "fusekit.neg"; return a.fk_neg;
        case 1: *where = "fusekit.abs"; return a.fk_abs;
        case 2: *where = "fusekit.exp"; return a.fk_exp;
        case 3: *where = "fusekit.log"; return a.fk_log;
        case 4: *where = "fusekit.sqrt"; return a.fk_sqrt;
        case 5: *where = "fusekit.sin"; return a.fk_sin;
        case 6: *where = "fusekit.cos"; return a.fk_cos;
        case 7: *where = "fusekit.tanh"; return a.fk_tanh;
        case 8: *where = "fusekit.sigmoid"; return a.fk_sigmoid;
        case 9: *where = "fusekit.relu"; return a.fk_relu;
        case 10: *where = "fusekit.copy"; return a.fk_copy;
    }
    bad(FK_ERROR_INVALID_ARGUMENT, "fusekit::unary: unknown op " + std::to_string(op));
}

ScalarFn scalar_fn(int64_t op, const char** where) {
    const Api& a = api();
    switch (op) {
        case 0: *where = "fusekit.scalar_add"; return a.fk_scalar_add;
        case 1: *where = "fusekit.scalar_mul"; return a.fk_scalar_mul;
    }
    bad(FK_ERROR_INVALID_ARGUMENT, "fusekit::scalar: unknown op " + std::to_string(op));
}

void binary_out(Tensor a, Tensor b, int64_t op, Tensor out) {
    const char* where = nullptr;
    BinaryFn fn = binary_fn(op, &where);
    Call c(where, a);
    Buf A = c.in(a, "a"), B = c.in(b, "b"), O = c.in(out, "out");
    check(fn(A.get(), B.get(), O.get(), c.stream), where);
}

Tensor binary(Tensor a, Tensor b, int64_t op) {
    Tensor out = new_tensor(broadcast(a, b), dtype_of(a), a);
    binary_out(a, b, op, out);
    return out;
}

void unary_out(Tensor a, int64_t op, Tensor out) {
    const char* where = nullptr;
    UnaryFn fn = unary_fn(op, &where);
    Call c(where, a);
    Buf A = c.in(a, "a"), O = c.in(out, "out");
    check(fn(A.get(), O.get(), c.stream), where);
}

Tensor unary(Tensor a, int64_t op) {
    int32_t dt = dtype_of(a);
    Tensor out = new_tensor(shape_of(a), op == 1 ? torch_real_of(dt) : dt, a);  // abs of complex: real
    unary_out(a, op, out);
    return out;
}

void scalar_out(Tensor a, double re, double im, int64_t op, Tensor out) {
    const char* where = nullptr;
    ScalarFn fn = scalar_fn(op, &where);
    Call c(where, a);
    Buf A = c.in(a, "a"), O = c.in(out, "out");
    check(fn(A.get(), fk_scalar{re, im}, O.get(), c.stream), where);
}

Tensor scalar(Tensor a, double re, double im, int64_t op) {
    Tensor out = new_like(a);
    scalar_out(a, re, im, op, out);
    return out;
}

void axpby_c_out(Tensor a, Tensor b, double are, double aim, double bre, double bim, Tensor out) {
    Call c("fusekit.axpby", a);
    Buf A = c.in(a, "a"), B = c.in(b, "b"), O = c.in(out, "out");
    check(api().fk_axpby(fk_scalar{are, aim}, A.get(), fk_scalar{bre, bim}, B.get(), O.get(), c.stream), c.where);
}

Tensor axpby_c(Tensor a, Tensor b, double are, double aim, double bre, double bim) {
    Tensor out = new_tensor(broadcast(a, b), dtype_of(a), a);
    axpby_c_out(a, b, are, aim, bre, bim, out);
    return out;
}

// The differentiable elementwise ops (autograd in fusekit/torch_ops.py).
Tensor axpby(Tensor a, Tensor b, double alpha, double beta) { return axpby_c(a, b, alpha, 0.0, beta, 0.0); }
Tensor scalar_mul(Tensor a, double s) { return scalar(a, s, 0.0, 1); }
Tensor relu(Tensor a) { return unary(a, 9); }

// ---------------------------------------------------------------- linear algebra and optimizer math
// The plain functions' compiled route (fusekit.gemm, kron, matrix_power, ...): the
// Python functions shape and allocate the outputs; these run the entry point on
// torch's current stream. Outputs are written in place (the `_out`/`_` ops).

void gemm_(int64_t op_a, int64_t op_b, double are, double aim, Tensor a, Tensor b, double bre, double bim, Tensor c,
           int64_t flags) {
    Call k("fusekit.gemm", c);
    Buf A = k.in(a, "a"), B = k.in(b, "b"), C = k.in(c, "c");
    check(api().fk_gemm(static_cast<fk_op>(op_a), static_cast<fk_op>(op_b), fk_scalar{are, aim}, A.get(), B.get(),
                        fk_scalar{bre, bim}, C.get(), static_cast<uint32_t>(flags), k.stream),
          k.where);
}

void kron_out(Tensor a, Tensor b, Tensor out) {
    Call k("fusekit.kron", a);
    Buf A = k.in(a, "a"), B = k.in(b, "b"), O = k.in(out, "out");
    check(api().fk_kron(A.get(), B.get(), O.get(), k.stream), k.where);
}

// report: a float64 CPU tensor [5] receiving (method, iterations, converged,
// residual, min_eigenvalue), also when the call fails with FK_ERROR_NOT_CONVERGED.
void matrix_power_out(Tensor a, double power, double eps, int64_t method, int64_t max_iter, double tol,
                      int64_t flags, Tensor out, Tensor report) {
    Call k("fusekit.matrix_power", a);
    Buf A = k.in(a, "a"), O = k.in(out, "out");
    fk_matpow_report rep{};
    fk_status s = api().fk_matrix_power(A.get(), power, eps, static_cast<fk_matpow_method>(method),
                                        static_cast<int32_t>(max_iter), tol, static_cast<uint32_t>(flags), O.get(),
                                        &rep, k.stream);
    if (report.numel() >= 5 && report.is_cpu() && dtype_of(report) == codes().f64) {
        double* r = static_cast<double*>(report.data_ptr());
        r[0] = rep.method;
        r[1] = rep.iterations;
        r[2] = rep.converged;
        r[3] = rep.residual;
        r[4] = rep.min_eigenvalue;
    }
    check(s, k.where);
}

void shampoo_stats_(Tensor grad, OptTensor l, OptTensor r, double alpha, double beta, int64_t flags) {
    Call k("fusekit.shampoo_stats", grad);
    Buf G = k.in(grad, "grad"), L = k.in(l, "l"), R = k.in(r, "r");
    check(api().fk_shampoo_stats_ex(G.get(), alpha, beta, L.get(), R.get(), static_cast<uint32_t>(flags), k.stream),
          k.where);
}

void shampoo_precondition_out(Tensor grad, OptTensor l_root, OptTensor r_root, int64_t flags, Tensor out) {
    Call k("fusekit.shampoo_precondition", grad);
    Buf G = k.in(grad, "grad"), L = k.in(l_root, "l_root"), R = k.in(r_root, "r_root"), O = k.in(out, "out");
    check(api().fk_shampoo_precondition(L.get(), G.get(), R.get(), O.get(), static_cast<uint32_t>(flags), k.stream),
          k.where);
}

void per_sample_grads_out(Tensor a, Tensor g, int64_t flags, Tensor out) {
    Call k("fusekit.per_sample_grads", a);
    Buf A = k.in(a, "a"), G = k.in(g, "g"), O = k.in(out, "out");
    check(api().fk_per_sample_grads(A.get(), G.get(), O.get(), static_cast<uint32_t>(flags), k.stream), k.where);
}

void per_sample_grad_norms_out(Tensor a, Tensor g, Tensor out) {
    Call k("fusekit.per_sample_grad_norms", a);
    Buf A = k.in(a, "a"), G = k.in(g, "g"), O = k.in(out, "sq_norms");
    check(api().fk_per_sample_grad_norms(A.get(), G.get(), O.get(), k.stream), k.where);
}

void dp_clipped_grad_sum_out(Tensor a, Tensor g, double max_norm, int64_t flags, Tensor out, OptTensor sq_norms) {
    Call k("fusekit.dp_clipped_grad_sum", a);
    Buf A = k.in(a, "a"), G = k.in(g, "g"), O = k.in(out, "out"), N = k.in(sq_norms, "sq_norms");
    check(api().fk_dp_clipped_grad_sum(A.get(), G.get(), max_norm, O.get(), N.get(), static_cast<uint32_t>(flags),
                                       k.stream),
          k.where);
}


// ---------------------------------------------------------------- the plain functions' entry points, 1:1
// fusekit.linear_forward, christoffel_forward, gaussian_field_backward, ... on torch
// tensors: each op is its C entry point with every output given (None = not
// wanted), no copies and no checks of its own (the library checks, as through
// ctypes). The Python functions shape and allocate the outputs.

void linear_forward_out(Tensor x, Tensor w, OptTensor b, int64_t act, Tensor y, OptTensor aux) {
    Call k("fusekit.linear_forward", x);
    Buf X = k.in(x, "x"), W = k.in(w, "w"), B = k.in(b, "b"), Y = k.in(y, "y"), A = k.in(aux, "aux");
    check(api().fk_linear_forward(X.get(), W.get(), B.get(), static_cast<fk_activation>(act), Y.get(), A.get(),
                                  k.stream),
          k.where);
}

void linear_backward_out(Tensor dy, Tensor x, Tensor w, int64_t act, OptTensor saved, OptTensor dx, OptTensor dw,
                         OptTensor db) {
    Call k("fusekit.linear_backward", dy);
    Buf DY = k.in(dy, "dy"), X = k.in(x, "x"), W = k.in(w, "w"), S = k.in(saved, "saved");
    Buf DX = k.in(dx, "dx"), DW = k.in(dw, "dw"), DB = k.in(db, "db");
    check(api().fk_linear_backward(DY.get(), X.get(), W.get(), static_cast<fk_activation>(act), S.get(), DX.get(),
                                   DW.get(), DB.get(), k.stream),
          k.where);
}

void christoffel_forward_out(Tensor v, Tensor U, Tensor W, double cl, int64_t flags, Tensor gamma) {
    Call k("fusekit.christoffel_forward", v);
    Buf V = k.in(v, "v"), Uh = k.in(U, "U"), Wh = k.in(W, "W"), G = k.in(gamma, "gamma");
    check(api().fk_christoffel_forward(V.get(), Uh.get(), Wh.get(), cl, static_cast<uint32_t>(flags), G.get(),
                                       k.stream),
          k.where);
}

void christoffel_backward_out(Tensor v, Tensor U, Tensor W, Tensor g, double cl, int64_t flags, OptTensor dv,
                              OptTensor dU, OptTensor dW) {
    Call k("fusekit.christoffel_backward", v);
    Buf V = k.in(v, "v"), Uh = k.in(U, "U"), Wh = k.in(W, "W"), G = k.in(g, "g");
    Buf DV = k.in(dv, "dv"), DU = k.in(dU, "dU"), DW = k.in(dW, "dW");
    check(api().fk_christoffel_backward(V.get(), Uh.get(), Wh.get(), G.get(), cl, static_cast<uint32_t>(flags),
                                        DV.get(), DU.get(), DW.get(), k.stream),
          k.where);
}

void leapfrog_forward_out(Tensor x0, Tensor v0, OptTensor f, Tensor U, Tensor W, OptTensor mu, double dt,
                          int64_t steps, double cl, int64_t flags, Tensor x_out, Tensor v_out, OptTensor traj) {
    Call k("fusekit.leapfrog_forward", v0);
    Buf X0 = k.in(x0, "x0"), V0 = k.in(v0, "v0"), F = k.in(f, "f"), Uh = k.in(U, "U"), Wh = k.in(W, "W");
    Buf MU = k.in(mu, "mu"), X = k.in(x_out, "x_out"), V = k.in(v_out, "v_out"), T = k.in(traj, "traj");
    check(api().fk_leapfrog_forward(X0.get(), V0.get(), F.get(), Uh.get(), Wh.get(), MU.get(), dt, steps, cl,
                                    static_cast<uint32_t>(flags), X.get(), V.get(), T.get(), k.stream),
          k.where);
}

void leapfrog_backward_out(Tensor v0, OptTensor f, Tensor U, Tensor W, OptTensor mu, double dt, int64_t steps,
                           double cl, int64_t flags, OptTensor traj, OptTensor gx, OptTensor gv, OptTensor dx0,
                           OptTensor dv0, OptTensor df, OptTensor dU, OptTensor dW) {
    Call k("fusekit.leapfrog_backward", v0);
    Buf V0 = k.in(v0, "v0"), F = k.in(f, "f"), Uh = k.in(U, "U"), Wh = k.in(W, "W"), MU = k.in(mu, "mu");
    Buf T = k.in(traj, "traj"), GX = k.in(gx, "gx"), GV = k.in(gv, "gv");
    Buf DX0 = k.in(dx0, "dx0"), DV0 = k.in(dv0, "dv0"), DF = k.in(df, "df"), DU = k.in(dU, "dU"), DW = k.in(dW, "dW");
    check(api().fk_leapfrog_backward(V0.get(), F.get(), Uh.get(), Wh.get(), MU.get(), dt, steps, cl,
                                     static_cast<uint32_t>(flags), T.get(), GX.get(), GV.get(), DX0.get(), DV0.get(),
                                     DF.get(), DU.get(), DW.get(), k.stream),
          k.where);
}

void mahalanobis_forward_out(Tensor points, Tensor means, Tensor chol, double eps, Tensor out) {
    Call k("fusekit.mahalanobis_forward", points);
    Buf P = k.in(points, "points"), M = k.in(means, "means"), L = k.in(chol, "chol"), O = k.in(out, "out");
    check(api().fk_mahalanobis_forward(P.get(), M.get(), L.get(), eps, O.get(), k.stream), k.where);
}

void gaussian_field_forward_out(Tensor points, Tensor means, Tensor chol, Tensor weights, double eps, Tensor out) {
    Call k("fusekit.gaussian_field_forward", points);
    Buf P = k.in(points, "points"), M = k.in(means, "means"), L = k.in(chol, "chol"), W = k.in(weights, "weights");
    Buf O = k.in(out, "out");
    check(api().fk_gaussian_field_forward(P.get(), M.get(), L.get(), W.get(), eps, O.get(), k.stream), k.where);
}

// The Gaussian backwards' workspace, from torch's allocator (0 bytes on the CPU: none).
Tensor gaussian_workspace(const Call& c, const Tensor& points, const Tensor& means) {
    size_t bytes = 0;
    fk_dtype fd = fk_dtype_of(dtype_of(points), c.where, "points");
    check(api().fk_gaussian_backward_workspace_size(c.ctx, fd, points.dim() > 0 ? points.size(0) : 0,
                                                    means.dim() > 0 ? means.size(0) : 0, &bytes),
          c.where);
    return new_tensor({static_cast<int64_t>((bytes + 3) / 4)}, codes().f32, points);
}

// workspace: the caller's, or (None) one from torch's allocator of the size the
// library asks for (none on the CPU).
Buf workspace_of(const Call& k, const OptTensor& given, const Tensor& points, const Tensor& means, Tensor& keep) {
    if (given.has_value()) return k.in(*given, "workspace");
    keep = gaussian_workspace(k, points, means);
    return keep.numel() > 0 ? k.out(keep, "workspace") : Buf();
}

void mahalanobis_backward_out(Tensor points, Tensor means, Tensor chol, double eps, Tensor g, OptTensor dpoints,
                              OptTensor dmeans, OptTensor dchol, OptTensor workspace) {
    Call k("fusekit.mahalanobis_backward", points);
    Buf P = k.in(points, "points"), M = k.in(means, "means"), L = k.in(chol, "chol"), G = k.in(g, "g");
    Buf DP = k.in(dpoints, "dpoints"), DM = k.in(dmeans, "dmeans"), DC = k.in(dchol, "dchol");
    Tensor keep;
    bool any = dpoints.has_value() || dmeans.has_value() || dchol.has_value();
    Buf WS = any ? workspace_of(k, workspace, points, means, keep) : k.in(workspace, "workspace");
    check(api().fk_mahalanobis_backward(P.get(), M.get(), L.get(), eps, G.get(), DP.get(), DM.get(), DC.get(),
                                        WS.get(), k.stream),
          k.where);
}

void gaussian_field_backward_out(Tensor points, Tensor means, Tensor chol, Tensor weights, double eps, Tensor dout,
                                 OptTensor dpoints, OptTensor dmeans, OptTensor dchol, OptTensor dweights,
                                 OptTensor workspace) {
    Call k("fusekit.gaussian_field_backward", points);
    Buf P = k.in(points, "points"), M = k.in(means, "means"), L = k.in(chol, "chol"), W = k.in(weights, "weights");
    Buf D = k.in(dout, "dout");
    Buf DP = k.in(dpoints, "dpoints"), DM = k.in(dmeans, "dmeans"), DC = k.in(dchol, "dchol");
    Buf DW = k.in(dweights, "dweights");
    Tensor keep;
    bool any = dpoints.has_value() || dmeans.has_value() || dchol.has_value() || dweights.has_value();
    Buf WS = any ? workspace_of(k, workspace, points, means, keep) : k.in(workspace, "workspace");
    check(api().fk_gaussian_field_backward(P.get(), M.get(), L.get(), W.get(), eps, D.get(), DP.get(), DM.get(),
                                           DC.get(), DW.get(), WS.get(), k.stream),
          k.where);
}


// ---------------------------------------------------------------- the differentiable ops' kernels
// What torch.ops.fusekit.linear, gaussian_field, christoffel, ... run (autograd in
// Python): the inputs made contiguous, the outputs allocated, then the entry point
// through its 1:1 op above. A gradient not wanted (`want` bit clear) comes back as
// an empty tensor and is passed to the entry point as not wanted.

constexpr int64_t kActNone = FK_ACT_NONE;
// The activations whose forward keeps the pre-activation (aux) for the backward.
bool keeps_aux(int64_t act) { return act == FK_ACT_GELU_TANH || act == FK_ACT_GELU_ERF; }

Tensor wanted_or_empty(bool want, const Tensor& like) { return want ? new_like(like) : empty0(like); }
OptTensor arg_if(bool want, const Tensor& t) { return want ? OptTensor(t) : std::nullopt; }

std::tuple<Tensor, Tensor> linear(Tensor x, Tensor w, OptTensor b, int64_t act) {
    contig_all(x, w, b);
    auto xs = x.sizes();
    std::vector<int64_t> ys(xs.begin(), xs.end());
    if (ys.empty() || w.dim() != 2) bad(FK_ERROR_SHAPE_MISMATCH, "fusekit.linear: x must be [..., k] and w [n, k]");
    ys.back() = w.size(0);
    int32_t dt = dtype_of(x);
    Tensor y = new_tensor(ys, dt, x);
    Tensor aux = keeps_aux(act) ? new_tensor(ys, dt, x) : empty0(x);
    linear_forward_out(x, w, b, act, y, arg_if(keeps_aux(act), aux));
    return {y, aux};
}

// want: bit 0 dx, bit 1 dw, bit 2 db.
std::tuple<Tensor, Tensor, Tensor> linear_backward(Tensor dy, Tensor x, Tensor w, Tensor saved, int64_t act,
                                                   int64_t want) {
    contig_all(dy, x, w, saved);
    Tensor dx = wanted_or_empty(want & 1, x), dw = wanted_or_empty(want & 2, w);
    Tensor db = want & 4 ? new_tensor({w.size(0)}, dtype_of(dy), dy) : empty0(dy);
    linear_backward_out(dy, x, w, act, arg_if(act != kActNone, saved), arg_if(want & 1, dx), arg_if(want & 2, dw),
                        arg_if(want & 4, db));
    return {dx, dw, db};
}

Tensor gaussian_field(Tensor points, Tensor means, Tensor chol, Tensor weights, double eps) {
    contig_all(points, means, chol, weights);
    Tensor out = new_tensor({points.dim() > 0 ? points.size(0) : 0}, dtype_of(points), points);
    gaussian_field_forward_out(points, means, chol, weights, eps, out);
    return out;
}

// want: bits 0..3 dpoints, dmeans, dchol, dweights.
std::tuple<Tensor, Tensor, Tensor, Tensor> gaussian_field_backward(Tensor points, Tensor means, Tensor chol,
                                                                   Tensor weights, Tensor dout, double eps,
                                                                   int64_t want) {
    contig_all(points, means, chol, weights, dout);
    Tensor dp = wanted_or_empty(want & 1, points), dm = wanted_or_empty(want & 2, means);
    Tensor dc = wanted_or_empty(want & 4, chol), dw = wanted_or_empty(want & 8, weights);
    gaussian_field_backward_out(points, means, chol, weights, eps, dout, arg_if(want & 1, dp), arg_if(want & 2, dm),
                                arg_if(want & 4, dc), arg_if(want & 8, dw), std::nullopt);
    return {dp, dm, dc, dw};
}

Tensor mahalanobis(Tensor points, Tensor means, Tensor chol, double eps) {
    contig_all(points, means, chol);
    Tensor out = new_tensor({points.dim() > 0 ? points.size(0) : 0, means.dim() > 0 ? means.size(0) : 0},
                            dtype_of(points), points);
    mahalanobis_forward_out(points, means, chol, eps, out);
    return out;
}

// want: bits 0..2 dpoints, dmeans, dchol.
std::tuple<Tensor, Tensor, Tensor> mahalanobis_backward(Tensor points, Tensor means, Tensor chol, Tensor g,
                                                        double eps, int64_t want) {
    contig_all(points, means, chol, g);
    Tensor dp = wanted_or_empty(want & 1, points), dm = wanted_or_empty(want & 2, means);
    Tensor dc = wanted_or_empty(want & 4, chol);
    mahalanobis_backward_out(points, means, chol, eps, g, arg_if(want & 1, dp), arg_if(want & 2, dm),
                             arg_if(want & 4, dc), std::nullopt);
    return {dp, dm, dc};
}

Tensor christoffel(Tensor v, Tensor U, Tensor W, double cl) {
    contig_all(v, U, W);
    Tensor gamma = new_like(v);
    christoffel_forward_out(v, U, W, cl, 0, gamma);
    return gamma;
}

// want: bits 0..2 dv, dU, dW.
std::tuple<Tensor, Tensor, Tensor> christoffel_backward(Tensor v, Tensor U, Tensor W, Tensor g, double cl,
                                                        int64_t want) {
    contig_all(v, U, W, g);
    Tensor dv = wanted_or_empty(want & 1, v), dU = wanted_or_empty(want & 2, U), dW = wanted_or_empty(want & 4, W);
    christoffel_backward_out(v, U, W, g, cl, 0, arg_if(want & 1, dv), arg_if(want & 2, dU), arg_if(want & 4, dW));
    return {dv, dU, dW};
}

std::tuple<Tensor, Tensor, Tensor> leapfrog(Tensor x0, Tensor v0, Tensor U, Tensor W, OptTensor f, OptTensor mu,
                                            double dt, int64_t steps, double cl, bool keep_traj) {
    contig_all(x0, v0, U, W, f, mu);
    Tensor x = new_like(x0), v = new_like(v0);
    int64_t b = v0.dim() > 0 ? v0.size(0) : 0, d = v0.dim() > 1 ? v0.size(1) : 0;
    Tensor traj = new_tensor({keep_traj ? steps : 0, 2, b, d}, dtype_of(v0), v0);
    leapfrog_forward_out(x0, v0, f, U, W, mu, dt, steps, cl, 0, x, v, arg_if(keep_traj, traj));
    return {x, v, traj};
}

// want: bits 0..4 dx0, dv0, df, dU, dW.
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> leapfrog_backward(Tensor v0, Tensor U, Tensor W, OptTensor f,
                                                                     OptTensor mu, OptTensor traj, OptTensor gx,
                                                                     OptTensor gv, double dt, int64_t steps,
                                                                     double cl, int64_t want) {
    contig_all(v0, U, W, f, mu, traj, gx, gv);
    Tensor dx0 = wanted_or_empty(want & 1, v0), dv0 = wanted_or_empty(want & 2, v0);
    Tensor df = wanted_or_empty(want & 4, v0), dU = wanted_or_empty(want & 8, U), dW = wanted_or_empty(want & 16, W);
    leapfrog_backward_out(v0, f, U, W, mu, dt, steps, cl, 0, traj, gx, gv, arg_if(want & 1, dx0),
                          arg_if(want & 2, dv0), arg_if(want & 4, df), arg_if(want & 8, dU), arg_if(want & 16, dW));
    return {dx0, dv0, df, dU, dW};
}

}  // namespace

// ---------------------------------------------------------------- init (called once from Python)

// Resolves the C ABI in the libfusekit at `path` (already loaded by the ctypes
// package). Returns 0, or -1 with a message in `err`.
extern "C" __attribute__((visibility("default"))) int fusekit_torch_init(const char* path, char* err, size_t errlen) {
    auto say = [&](const std::string& m) {
        if (err && errlen) {
            std::strncpy(err, m.c_str(), errlen - 1);
            err[errlen - 1] = 0;
        }
        return -1;
    };
    if (g_ready.load(std::memory_order_acquire)) return 0;
    void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) return say(std::string("dlopen failed: ") + dlerror());
    Api a;
#define FK_TORCH_RESOLVE(name)                                                        \
    a.name = reinterpret_cast<decltype(&::name)>(dlsym(h, #name));                  \
    if (!a.name) return say(std::string(path) + " lacks the entry point " #name " (older than these bindings)");
    FK_TORCH_ENTRY_POINTS(FK_TORCH_RESOLVE)
#undef FK_TORCH_RESOLVE
    uint32_t abi = a.fk_abi_version();
    if (abi / 1000 != FK_ABI_VERSION / 1000 || abi < FK_ABI_VERSION)
        return say(std::string(path) + " has ABI version " + std::to_string(abi) + ", the torch ops were built for " +
                   std::to_string(FK_ABI_VERSION));
    g_api = a;
    g_ready.store(true, std::memory_order_release);
    return 0;
}

// Which torch stable-ABI version the binary was built for (for diagnostics).
extern "C" __attribute__((visibility("default"))) uint64_t fusekit_torch_target_version() {
    return TORCH_FEATURE_VERSION;
}

// ---------------------------------------------------------------- schemas and kernels

STABLE_TORCH_LIBRARY(fusekit, m) {
    // plain elementwise ops on tensors (fusekit.add(...) etc.; not differentiable)
    m.def("binary(Tensor a, Tensor b, int op) -> Tensor");
    m.def("binary_out(Tensor a, Tensor b, int op, Tensor(a!) out) -> ()");
    m.def("unary(Tensor a, int op) -> Tensor");
    m.def("unary_out(Tensor a, int op, Tensor(a!) out) -> ()");
    m.def("scalar(Tensor a, float re, float im, int op) -> Tensor");
    m.def("scalar_out(Tensor a, float re, float im, int op, Tensor(a!) out) -> ()");
    m.def("axpby_c(Tensor a, Tensor b, float alpha_re, float alpha_im, float beta_re, float beta_im) -> Tensor");
    m.def("axpby_c_out(Tensor a, Tensor b, float alpha_re, float alpha_im, float beta_re, float beta_im, "
          "Tensor(a!) out) -> ()");
    // differentiable ops (autograd registered in Python) and their backwards
    m.def("axpby(Tensor a, Tensor b, float alpha, float beta) -> Tensor");
    m.def("scalar_mul(Tensor a, float s) -> Tensor");
    m.def("relu(Tensor a) -> Tensor");
    m.def("linear(Tensor x, Tensor w, Tensor? b, int act) -> (Tensor, Tensor)");
    m.def("linear_backward(Tensor dy, Tensor x, Tensor w, Tensor saved, int act, int want=7) "
          "-> (Tensor, Tensor, Tensor)");
    m.def("gaussian_field(Tensor points, Tensor means, Tensor chol, Tensor weights, float eps) -> Tensor");
    m.def("gaussian_field_backward(Tensor points, Tensor means, Tensor chol, Tensor weights, Tensor dout, "
          "float eps, int want=15) -> (Tensor, Tensor, Tensor, Tensor)");
    m.def("mahalanobis(Tensor points, Tensor means, Tensor chol, float eps) -> Tensor");
    m.def("mahalanobis_backward(Tensor points, Tensor means, Tensor chol, Tensor g, float eps, int want=7) "
          "-> (Tensor, Tensor, Tensor)");
    m.def("christoffel(Tensor v, Tensor U, Tensor W, float c) -> Tensor");
    m.def("christoffel_backward(Tensor v, Tensor U, Tensor W, Tensor g, float c, int want=7) "
          "-> (Tensor, Tensor, Tensor)");
    m.def("leapfrog(Tensor x0, Tensor v0, Tensor U, Tensor W, Tensor? f, Tensor? mu, float dt, int steps, "
          "float c, bool keep_traj=True) -> (Tensor, Tensor, Tensor)");
    // linear algebra and optimizer math (the plain functions' compiled route)
    m.def("gemm_(int op_a, int op_b, float alpha_re, float alpha_im, Tensor a, Tensor b, float beta_re, "
          "float beta_im, Tensor(a!) c, int flags) -> ()");
    m.def("kron_out(Tensor a, Tensor b, Tensor(a!) out) -> ()");
    m.def("matrix_power_out(Tensor a, float power, float eps, int method, int max_iter, float tol, int flags, "
          "Tensor(a!) out, Tensor(b!) report) -> ()");
    m.def("shampoo_stats_(Tensor grad, Tensor(a!)? l, Tensor(b!)? r, float alpha, float beta, int flags) -> ()");
    m.def("shampoo_precondition_out(Tensor grad, Tensor? l_root, Tensor? r_root, int flags, Tensor(a!) out) -> ()");
    m.def("per_sample_grads_out(Tensor a, Tensor g, int flags, Tensor(a!) out) -> ()");
    m.def("per_sample_grad_norms_out(Tensor a, Tensor g, Tensor(a!) out) -> ()");
    m.def("dp_clipped_grad_sum_out(Tensor a, Tensor g, float max_norm, int flags, Tensor(a!) out, "
          "Tensor(b!)? sq_norms) -> ()");
    // the plain functions' entry points, 1:1 (every output given; None = not wanted)
    m.def("linear_forward_out(Tensor x, Tensor w, Tensor? b, int act, Tensor(a!) y, Tensor(b!)? aux) -> ()");
    m.def("linear_backward_out(Tensor dy, Tensor x, Tensor w, int act, Tensor? saved, Tensor(a!)? dx, "
          "Tensor(b!)? dw, Tensor(c!)? db) -> ()");
    m.def("christoffel_forward_out(Tensor v, Tensor U, Tensor W, float c, int flags, Tensor(a!) gamma) -> ()");
    m.def("christoffel_backward_out(Tensor v, Tensor U, Tensor W, Tensor g, float c, int flags, Tensor(a!)? dv, "
          "Tensor(b!)? dU, Tensor(c!)? dW) -> ()");
    m.def("leapfrog_forward_out(Tensor x0, Tensor v0, Tensor? f, Tensor U, Tensor W, Tensor? mu, float dt, "
          "int steps, float c, int flags, Tensor(a!) x_out, Tensor(b!) v_out, Tensor(c!)? traj) -> ()");
    m.def("leapfrog_backward_out(Tensor v0, Tensor? f, Tensor U, Tensor W, Tensor? mu, float dt, int steps, "
          "float c, int flags, Tensor? traj, Tensor? gx, Tensor? gv, Tensor(a!)? dx0, Tensor(b!)? dv0, "
          "Tensor(c!)? df, Tensor(d!)? dU, Tensor(e!)? dW) -> ()");
    m.def("mahalanobis_forward_out(Tensor points, Tensor means, Tensor chol, float eps, Tensor(a!) out) -> ()");
    m.def("gaussian_field_forward_out(Tensor points, Tensor means, Tensor chol, Tensor weights, float eps, "
          "Tensor(a!) out) -> ()");
    m.def("mahalanobis_backward_out(Tensor points, Tensor means, Tensor chol, float eps, Tensor g, "
          "Tensor(a!)? dpoints, Tensor(b!)? dmeans, Tensor(c!)? dchol, Tensor(d!)? workspace) -> ()");
    m.def("gaussian_field_backward_out(Tensor points, Tensor means, Tensor chol, Tensor weights, float eps, "
          "Tensor dout, Tensor(a!)? dpoints, Tensor(b!)? dmeans, Tensor(c!)? dchol, Tensor(d!)? dweights, "
          "Tensor(e!)? workspace) -> ()");
    m.def("leapfrog_backward(Tensor v0, Tensor U, Tensor W, Tensor? f, Tensor? mu, Tensor? traj, Tensor? gx, "
          "Tensor? gv, float dt, int steps, float c, int want=31) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
}

#define FK_TORCH_IMPLS(m)                                                              \
    m.impl("binary", TORCH_BOX(&binary));                                              \
    m.impl("binary_out", TORCH_BOX(&binary_out));                                      \
    m.impl("unary", TORCH_BOX(&unary));                                                \
    m.impl("unary_out", TORCH_BOX(&unary_out));                                        \
    m.impl("scalar", TORCH_BOX(&scalar));                                              \
    m.impl("scalar_out", TORCH_BOX(&scalar_out));                                      \
    m.impl("axpby_c", TORCH_BOX(&axpby_c));                                            \
    m.impl("axpby_c_out", TORCH_BOX(&axpby_c_out));                                    \
    m.impl("axpby", TORCH_BOX(&axpby));                                                \
    m.impl("scalar_mul", TORCH_BOX(&scalar_mul));                                      \
    m.impl("relu", TORCH_BOX(&relu));                                                  \
    m.impl("linear", TORCH_BOX(&linear));                                              \
    m.impl("linear_backward", TORCH_BOX(&linear_backward));                            \
    m.impl("gaussian_field", TORCH_BOX(&gaussian_field));                              \
    m.impl("gaussian_field_backward", TORCH_BOX(&gaussian_field_backward));            \
    m.impl("mahalanobis", TORCH_BOX(&mahalanobis));                                    \
    m.impl("mahalanobis_backward", TORCH_BOX(&mahalanobis_backward));                  \
    m.impl("christoffel", TORCH_BOX(&christoffel));                                    \
    m.impl("christoffel_backward", TORCH_BOX(&christoffel_backward));                  \
    m.impl("leapfrog", TORCH_BOX(&leapfrog));                                          \
    m.impl("leapfrog_backward", TORCH_BOX(&leapfrog_backward));                        \
    m.impl("gemm_", TORCH_BOX(&gemm_));                                                \
    m.impl("kron_out", TORCH_BOX(&kron_out));                                          \
    m.impl("matrix_power_out", TORCH_BOX(&matrix_power_out));                          \
    m.impl("shampoo_stats_", TORCH_BOX(&shampoo_stats_));                              \
    m.impl("shampoo_precondition_out", TORCH_BOX(&shampoo_precondition_out));          \
    m.impl("per_sample_grads_out", TORCH_BOX(&per_sample_grads_out));                  \
    m.impl("per_sample_grad_norms_out", TORCH_BOX(&per_sample_grad_norms_out));        \
    m.impl("dp_clipped_grad_sum_out", TORCH_BOX(&dp_clipped_grad_sum_out));          \
    m.impl("linear_forward_out", TORCH_BOX(&linear_forward_out));                      \
    m.impl("linear_backward_out", TORCH_BOX(&linear_backward_out));                    \
    m.impl("christoffel_forward_out", TORCH_BOX(&christoffel_forward_out));            \
    m.impl("christoffel_backward_out", TORCH_BOX(&christoffel_backward_out));          \
    m.impl("leapfrog_forward_out", TORCH_BOX(&leapfrog_forward_out));                  \
    m.impl("leapfrog_backward_out", TORCH_BOX(&leapfrog_backward_out));                \
    m.impl("mahalanobis_forward_out", TORCH_BOX(&mahalanobis_forward_out));            \
    m.impl("gaussian_field_forward_out", TORCH_BOX(&gaussian_field_forward_out));      \
    m.impl("mahalanobis_backward_out", TORCH_BOX(&mahalanobis_backward_out));          \
    m.impl("gaussian_field_backward_out", TORCH_BOX(&gaussian_field_backward_out));

STABLE_TORCH_LIBRARY_IMPL(fusekit, CPU, m) { FK_TORCH_IMPLS(m) }
STABLE_TORCH_LIBRARY_IMPL(fusekit, CUDA, m) { FK_TORCH_IMPLS(m) }
