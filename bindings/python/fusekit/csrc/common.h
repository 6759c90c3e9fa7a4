// fusekit's torch integration, shared by every op family: the torch ops
// (`torch.ops.fusekit.*`) are implemented in C++ against PyTorch's stable ABI
// (torch/csrc/stable, torch >= 2.10), calling the fusekit C ABI directly. One
// binary serves every torch from the version it was built against
// (TORCH_TARGET_VERSION, setup.py) onwards, CPU and CUDA builds alike; it needs no
// CUDA toolkit to build. Every csrc/*.cpp is compiled into the one library
// `_fusekit_torch` (setup.py).
//
// - common.cpp: this header's definitions, `fusekit_torch_init` (the C ABI
//   resolved from the libfusekit Python loaded) and the one
//   STABLE_TORCH_LIBRARY(fusekit) that defines the namespace.
// - <family>.cpp (elementwise, linalg, gaussian, geodesic, optim: the families of
//   the C ABI): the family's kernels and its table of ops (FK_TORCH_OP rows: name,
//   schema, kernel), which FK_TORCH_FAMILY below turns into a
//   STABLE_TORCH_LIBRARY_FRAGMENT(fusekit) of its schemas and its kernels for CPU
//   and CUDA tensors. Its Python side (fakes, autograd, the plain functions' route)
//   is fusekit/torch/<family>.py.
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
//   into the matching fusekit.Error subclass (fusekit/torch/_ext.py).

#pragma once

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "fusekit.h"

// The C ABI's lists, generated from include/fusekit.h by scripts/gen_bindings.py:
// FK_ABI_ENTRY_POINTS(X) (every entry point; all are resolved at init) and the op
// codes of fusekit::binary, unary and scalar, FK_TORCH_BINARY_OPS(X),
// FK_TORCH_UNARY_OPS(X), FK_TORCH_SCALAR_OPS(X) as X(code, entry point) (Python's
// copy: TORCH_*_OPS in fusekit/_abi.py).
#include "fk_abi.h"

// A family's ops: `ops` is its table of FK_TORCH_OP rows (a constexpr array of
// fusekit_torch::Op). Each row's schema goes into the family's
// STABLE_TORCH_LIBRARY_FRAGMENT, its kernel serves CPU and CUDA tensors alike (the
// tensors' device picks the backend).
#define FK_TORCH_FAMILY(ops)                                                              \
    STABLE_TORCH_LIBRARY_FRAGMENT(fusekit, m) { fusekit_torch::define_ops(m, ops); }      \
    STABLE_TORCH_LIBRARY_IMPL(fusekit, CPU, m) { fusekit_torch::impl_ops(m, ops); }       \
    STABLE_TORCH_LIBRARY_IMPL(fusekit, CUDA, m) { fusekit_torch::impl_ops(m, ops); }

// One row of a family's table: the kernel `fn` (a function of the family's file)
// under the op name `fn`, with `schema` the rest of its schema after the name,
// e.g. FK_TORCH_OP(kron_out, "(Tensor a, Tensor b, Tensor(a!) out) -> ()").
#define FK_TORCH_OP(fn, schema) fusekit_torch::Op{#fn, #fn schema, TORCH_BOX(&fn)}

namespace fusekit_torch {

using torch::stable::Tensor;
using OptTensor = std::optional<Tensor>;
using Library = torch::stable::detail::StableLibrary;

// ---------------------------------------------------------------- op registration

// A torch op of a family (FK_TORCH_OP): its name, its whole schema, its boxed kernel.
struct Op {
    const char* name;
    const char* schema;
    void (*kernel)(StableIValue*, uint64_t, uint64_t);
};

template <size_t N>
void define_ops(Library& m, const Op (&ops)[N]) {
    for (const Op& op : ops) m.def(op.schema);
}

template <size_t N>
void impl_ops(Library& m, const Op (&ops)[N]) {
    for (const Op& op : ops) m.impl(op.name, op.kernel);
}

// ---------------------------------------------------------------- the resolved C ABI

struct Api {
#define FK_TORCH_FIELD(name) decltype(&::name) name = nullptr;
    FK_ABI_ENTRY_POINTS(FK_TORCH_FIELD)
#undef FK_TORCH_FIELD
};

extern Api g_api;

// The resolved entry points (throws until fusekit_torch_init has run).
const Api& api();

// ---------------------------------------------------------------- errors

// Throws the library's last error of a failed call as "fusekit[<status>]: <message>".
[[noreturn]] void fail(fk_status s, const char* where);

inline void check(fk_status s, const char* where) {
    if (s != 0) fail(s, where);
}

// Throws "fusekit[<status>]: <msg>" for a mistake found here.
[[noreturn]] void bad(fk_status status, const std::string& msg);

// "fusekit.add" for "fk_add": the Python name a failing call reports.
std::string where_of(const char* entry);

// ---------------------------------------------------------------- torch facts

struct TorchCodes {
    int32_t cpu = 0, cuda = 1;
    int32_t f16 = 0, bf16 = 0, f32 = 0, f64 = 0, c64 = 0, c128 = 0;
    TorchCodes();
};

const TorchCodes& codes();

fk_dtype fk_dtype_of(int32_t torch_dtype, const char* where, const char* arg);
int32_t torch_real_of(int32_t torch_dtype);  // complex -> its real dtype

// ---------------------------------------------------------------- devices, contexts, streams

struct Device {
    bool cuda;
    int32_t index;
};

Device device_of(const Tensor& t);
fk_context* context_for(Device d);
// torch's current stream of a CUDA device as a borrowed fk_stream (NULL on the CPU).
const fk_stream* stream_for(fk_context* ctx, Device d);

// ---------------------------------------------------------------- borrowed buffers

// An fk_buffer view of a tensor (or none), destroyed with the call.
class Buf {
   public:
    Buf() = default;
    Buf(fk_context* ctx, const Tensor& t, const char* where, const char* arg);
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

// What every call needs: the device of its first tensor, its context and stream.
struct Call {
    const char* where;
    Device dev;
    fk_context* ctx;
    const fk_stream* stream;
    Call(const char* w, const Tensor& first);
    Buf in(const Tensor& t, const char* arg) const;  // on the first tensor's device
    Buf in(const OptTensor& t, const char* arg) const { return t.has_value() ? in(*t, arg) : Buf(); }
    Buf out(const Tensor& t, const char* arg) const { return Buf(ctx, t, where, arg); }
    // Calls the entry point `fn` with `args` and this call's stream; throws its error.
    template <class Fn, class... Args>
    void run(Fn fn, Args... args) const {
        check(fn(args..., stream), where);
    }
};

// ---------------------------------------------------------------- tensors

int32_t dtype_of(const Tensor& t);
// A new contiguous tensor of `shape` on `like`'s device, of dtype `dt`.
Tensor new_tensor(const std::vector<int64_t>& shape, int32_t dt, const Tensor& like);
Tensor new_like(const Tensor& t);
inline Tensor empty0(const Tensor& like) { return new_tensor({0}, dtype_of(like), like); }

// The fused ops take contiguous row-major tensors: a strided one is copied first
// (as torch's own kernels do), a contiguous one passes as it is.
inline Tensor contig(const Tensor& t) { return t.is_contiguous() ? t : torch::stable::contiguous(t); }
inline OptTensor contig(const OptTensor& t) { return t.has_value() ? OptTensor(contig(*t)) : t; }

template <class... T>
void contig_all(T&... ts) {
    ((ts = contig(ts)), ...);
}

inline std::vector<int64_t> shape_of(const Tensor& t) {
    auto s = t.sizes();
    return std::vector<int64_t>(s.begin(), s.end());
}

inline int64_t dim0(const Tensor& t) { return t.dim() > 0 ? t.size(0) : 0; }

// NumPy broadcast of two shapes (the library reports a mismatch; here the larger
// rank's extent wins where they differ so that the call can report it).
std::vector<int64_t> broadcast(const Tensor& a, const Tensor& b);

// The differentiable ops' outputs: a gradient not wanted (`want` bit clear) comes
// back as an empty tensor and is passed to the entry point as not wanted.
inline Tensor wanted_or_empty(bool want, const Tensor& like) { return want ? new_like(like) : empty0(like); }
inline OptTensor arg_if(bool want, const Tensor& t) { return want ? OptTensor(t) : std::nullopt; }

}  // namespace fusekit_torch
