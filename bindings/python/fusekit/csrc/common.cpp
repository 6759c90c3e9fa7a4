// The shared part of the torch ops (common.h): the resolved C ABI, errors, torch's
// dtype and device codes, contexts and streams, tensor views; `fusekit_torch_init`,
// which Python calls once; and the definition of the `fusekit` namespace, whose ops
// the family files (<family>.cpp) add as fragments.

#include "common.h"

#include <dlfcn.h>

#include <array>
#include <atomic>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <unordered_map>

namespace fusekit_torch {

Api g_api;

namespace {
std::atomic<bool> g_ready{false};
}

const Api& api() {
    if (!g_ready.load(std::memory_order_acquire))
        throw std::runtime_error(
            "fusekit[-1]: the fusekit torch ops are not initialised: import fusekit.torch's op modules (they load "
            "libfusekit and call fusekit_torch_init)");
    return g_api;
}

void fail(fk_status s, const char* where) {
    const char* msg = g_api.fk_last_error_message ? g_api.fk_last_error_message() : nullptr;
    std::string text = "fusekit[" + std::to_string(s) + "]: ";
    text += (msg && *msg) ? msg : where;
    throw std::runtime_error(text);
}

void bad(fk_status status, const std::string& msg) {
    throw std::runtime_error("fusekit[" + std::to_string(status) + "]: " + msg);
}

std::string where_of(const char* entry) {
    return std::string("fusekit.") + (std::strncmp(entry, "fk_", 3) == 0 ? entry + 3 : entry);
}

// ---------------------------------------------------------------- torch facts, looked up once

TorchCodes::TorchCodes() {
    cpu = aoti_torch_device_type_cpu();
    cuda = aoti_torch_device_type_cuda();
    f16 = aoti_torch_dtype_float16();
    bf16 = aoti_torch_dtype_bfloat16();
    f32 = aoti_torch_dtype_float32();
    f64 = aoti_torch_dtype_float64();
    c64 = aoti_torch_dtype_complex64();
    c128 = aoti_torch_dtype_complex128();
}

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

namespace {

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

constexpr int kMaxDevices = 64;

}  // namespace

// ---------------------------------------------------------------- contexts and streams

Device device_of(const Tensor& t) {
    int32_t type = 0, index = 0;
    TORCH_ERROR_CODE_CHECK(aoti_torch_get_device_type(t.get(), &type));
    if (type == codes().cpu) return {false, 0};
    if (type != codes().cuda) bad(FK_ERROR_DEVICE_MISMATCH, "fusekit takes CPU or CUDA tensors");
    TORCH_ERROR_CODE_CHECK(aoti_torch_get_device_index(t.get(), &index));
    return {true, index};
}

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

Buf::Buf(fk_context* ctx, const Tensor& t, const char* where, const char* arg) {
    int32_t dt = 0;
    TORCH_ERROR_CODE_CHECK(aoti_torch_get_dtype(t.get(), &dt));
    fk_dtype fd = fk_dtype_of(dt, where, arg);
    auto sizes = t.sizes();
    auto strides = t.strides();
    check(api().fk_buffer_wrap(ctx, t.data_ptr(), fd, static_cast<int32_t>(sizes.size()), sizes.data(),
                               strides.data(), &h_),
          where);
}

Call::Call(const char* w, const Tensor& first) : where(w), dev(device_of(first)) {
    ctx = context_for(dev);
    stream = stream_for(ctx, dev);
}

Buf Call::in(const Tensor& t, const char* arg) const {
    Device d = device_of(t);
    if (d.cuda != dev.cuda || d.index != dev.index)
        bad(FK_ERROR_DEVICE_MISMATCH, std::string(where) + ": " + arg + " is on another device than the first tensor");
    return Buf(ctx, t, where, arg);
}

// ---------------------------------------------------------------- tensors

int32_t dtype_of(const Tensor& t) {
    int32_t dt = 0;
    TORCH_ERROR_CODE_CHECK(aoti_torch_get_dtype(t.get(), &dt));
    return dt;
}

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

Tensor new_like(const Tensor& t) { return new_tensor(shape_of(t), dtype_of(t), t); }

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

}  // namespace fusekit_torch

// ---------------------------------------------------------------- init (called once from Python)

// Resolves the C ABI in the libfusekit at `path` (already loaded by the ctypes
// package). Returns 0, or -1 with a message in `err`.
extern "C" __attribute__((visibility("default"))) int fusekit_torch_init(const char* path, char* err, size_t errlen) {
    using fusekit_torch::Api;
    auto say = [&](const std::string& m) {
        if (err && errlen) {
            std::strncpy(err, m.c_str(), errlen - 1);
            err[errlen - 1] = 0;
        }
        return -1;
    };
    if (fusekit_torch::g_ready.load(std::memory_order_acquire)) return 0;
    void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) return say(std::string("dlopen failed: ") + dlerror());
    Api a;
#define FK_TORCH_RESOLVE(name)                                                        \
    a.name = reinterpret_cast<decltype(&::name)>(dlsym(h, #name));                  \
    if (!a.name) return say(std::string(path) + " lacks the entry point " #name " (older than these bindings)");
    FK_ABI_ENTRY_POINTS(FK_TORCH_RESOLVE)
#undef FK_TORCH_RESOLVE
    uint32_t abi = a.fk_abi_version();
    if (abi / 1000 != FK_ABI_VERSION / 1000 || abi < FK_ABI_VERSION)
        return say(std::string(path) + " has ABI version " + std::to_string(abi) + ", the torch ops were built for " +
                   std::to_string(FK_ABI_VERSION));
    fusekit_torch::g_api = a;
    fusekit_torch::g_ready.store(true, std::memory_order_release);
    return 0;
}

// Which torch stable-ABI version the binary was built for (for diagnostics).
extern "C" __attribute__((visibility("default"))) uint64_t fusekit_torch_target_version() {
    return TORCH_FEATURE_VERSION;
}

// The `fusekit` namespace (exactly one definition): each family adds its ops with
// STABLE_TORCH_LIBRARY_FRAGMENT(fusekit, m) in <family>.cpp.
STABLE_TORCH_LIBRARY(fusekit, m) { (void)m; }
