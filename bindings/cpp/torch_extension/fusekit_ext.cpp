// fusekit_ext: a PyTorch C++ extension that runs fusekit's elementwise kernels on
// torch tensors, through the header-only C++ wrapper (bindings/cpp/fusekit.hpp).
//
// - Inputs are borrowed, not copied: each tensor becomes a fusekit::Buffer view of
//   its memory (data pointer, sizes and strides), so strided, transposed and
//   expanded (stride-0) tensors work as they are.
// - Outputs are allocated with torch (at::empty) and written by fusekit.
// - CUDA tensors run on PyTorch's current CUDA stream (borrowed with
//   fk_stream_wrap), so they order with the surrounding torch work exactly like a
//   native op; CPU tensors run on a CPU context.
// - fusekit errors become `fusekit_ext.FusekitError` (a RuntimeError) whose
//   message is "<STATUS_NAME>: <function>: <cause>".
//
// Build with build.py (torch.utils.cpp_extension.load); FUSEKIT_WITH_CUDA is
// defined there when torch has CUDA and a CUDA toolkit is found.
#include <torch/extension.h>

#include <pybind11/complex.h>

#ifdef FUSEKIT_WITH_CUDA
#include <c10/cuda/CUDAStream.h>  // c10::cuda::getCurrentCUDAStream (= at::cuda::getCurrentCUDAStream)
#endif

#include <complex>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "fusekit.hpp"

namespace {

fk_dtype to_fk_dtype(at::ScalarType t) {
    switch (t) {
        case at::kHalf: return FK_DTYPE_F16;
        case at::kBFloat16: return FK_DTYPE_BF16;
        case at::kFloat: return FK_DTYPE_F32;
        case at::kDouble: return FK_DTYPE_F64;
        case at::kComplexFloat: return FK_DTYPE_C64;
        case at::kComplexDouble: return FK_DTYPE_C128;
        default: TORCH_CHECK(false, "fusekit_ext: unsupported dtype ", t,
                             " (float16, bfloat16, float32, float64, complex64, complex128)");
    }
    return 0;
}

// One fusekit context per device, created on first use and kept for the life of
// the process (never destroyed: tearing CUDA state down at interpreter exit is
// not worth the risk).
fusekit::Context& context_for(const at::Device& device) {
    static std::mutex mu;
    static fusekit::Context* cpu = nullptr;
    static auto* cuda = new std::unordered_map<int, fusekit::Context*>();
    std::lock_guard<std::mutex> lock(mu);
    if (device.is_cpu()) {
        if (cpu == nullptr) cpu = new fusekit::Context(fusekit::Context::cpu());
        return *cpu;
    }
    TORCH_CHECK(device.is_cuda(), "fusekit_ext: tensors must be on the CPU or a CUDA device, not ", device);
#ifdef FUSEKIT_WITH_CUDA
    int index = device.has_index() ? device.index() : c10::cuda::current_device();
    auto it = cuda->find(index);
    if (it == cuda->end())
        it = cuda->emplace(index, new fusekit::Context(fusekit::Context::cuda(index))).first;
    return *it->second;
#else
    TORCH_CHECK(false, "fusekit_ext was built without CUDA support (rebuild with a CUDA-enabled torch "
                       "and a CUDA toolkit); got a tensor on ", device);
#endif
}

// The stream an op on `device` runs on: PyTorch's current stream for CUDA (a
// borrowed handle, never destroyed by fusekit), nothing (= immediate) on the CPU.
fusekit::Stream stream_for(const fusekit::Context& ctx, const at::Device& device) {
#ifdef FUSEKIT_WITH_CUDA
    if (device.is_cuda()) {
        cudaStream_t s = c10::cuda::getCurrentCUDAStream(device.index()).stream();
        return fusekit::Stream::wrap(ctx, static_cast<void*>(s));
    }
#else
    (void)ctx;
    (void)device;
#endif
    return fusekit::Stream();
}

// A fusekit view of a tensor's memory (no copy).
fusekit::Buffer borrow(const fusekit::Context& ctx, const at::Tensor& t) {
    std::vector<std::int64_t> shape(t.sizes().begin(), t.sizes().end());
    std::vector<std::int64_t> strides(t.strides().begin(), t.strides().end());
    return fusekit::Buffer::borrowed(ctx, t.data_ptr(), to_fk_dtype(t.scalar_type()), shape, strides);
}

void same_device(const at::Tensor& a, const at::Tensor& b) {
    TORCH_CHECK(a.device() == b.device(), "fusekit_ext: a is on ", a.device(), " but b is on ", b.device());
}

// Everything an op call needs, for tensors on one device.
struct Launch {
    fusekit::Context& ctx;
    fusekit::Stream stream;
    explicit Launch(const at::Tensor& t) : ctx(context_for(t.device())), stream(stream_for(ctx, t.device())) {}
};

using BinaryFn = void (*)(const fusekit::Buffer&, const fusekit::Buffer&, fusekit::Buffer&, fusekit::StreamRef);
using UnaryFn = void (*)(const fusekit::Buffer&, fusekit::Buffer&, fusekit::StreamRef);

at::Tensor binary(BinaryFn fn, const at::Tensor& a, const at::Tensor& b) {
    same_device(a, b);
    at::Tensor out = at::empty(at::infer_size(a.sizes(), b.sizes()), a.options());
    Launch l(out);
    fusekit::Buffer fa = borrow(l.ctx, a), fb = borrow(l.ctx, b), fo = borrow(l.ctx, out);
    fn(fa, fb, fo, l.stream);
    return out;
}

at::Tensor unary(UnaryFn fn, const at::Tensor& a) {
    at::Tensor out = at::empty(a.sizes(), a.options());
    Launch l(out);
    fusekit::Buffer fa = borrow(l.ctx, a), fo = borrow(l.ctx, out);
    fn(fa, fo, l.stream);
    return out;
}

at::Tensor axpby(const at::Tensor& a, const at::Tensor& b, std::complex<double> alpha, std::complex<double> beta) {
    same_device(a, b);
    at::Tensor out = at::empty(at::infer_size(a.sizes(), b.sizes()), a.options());
    Launch l(out);
    fusekit::Buffer fa = borrow(l.ctx, a), fb = borrow(l.ctx, b), fo = borrow(l.ctx, out);
    fusekit::axpby(alpha, fa, beta, fb, fo, l.stream);
    return out;
}

at::Tensor scalar_op(bool mul, const at::Tensor& a, std::complex<double> s) {
    at::Tensor out = at::empty(a.sizes(), a.options());
    Launch l(out);
    fusekit::Buffer fa = borrow(l.ctx, a), fo = borrow(l.ctx, out);
    if (mul)
        fusekit::scalar_mul(fa, s, fo, l.stream);
    else
        fusekit::scalar_add(fa, s, fo, l.stream);
    return out;
}

at::Tensor abs_op(const at::Tensor& a) {
    // complex input gives the real magnitude
    at::Tensor out = at::empty(a.sizes(), a.options().dtype(c10::toRealValueType(a.scalar_type())));
    Launch l(out);
    fusekit::Buffer fa = borrow(l.ctx, a), fo = borrow(l.ctx, out);
    fusekit::abs(fa, fo, l.stream);
    return out;
}

// a += b in place (fusekit allows `out` to alias an input exactly).
at::Tensor add_(at::Tensor& a, const at::Tensor& b) {
    same_device(a, b);
    Launch l(a);
    fusekit::Buffer fa = borrow(l.ctx, a), fb = borrow(l.ctx, b), fo = borrow(l.ctx, a);
    fusekit::add(fa, fb, fo, l.stream);
    return a;
}

std::string device_name(const at::Tensor& t) { return context_for(t.device()).name(); }

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "fusekit elementwise kernels on torch tensors (example extension)";
    pybind11::register_exception<fusekit::Error>(m, "FusekitError", PyExc_RuntimeError);

    m.def("version", &fusekit::version, "fusekit library version string");
    m.def("device_name", &device_name, "name of the device fusekit uses for this tensor");

    m.def("add", [](const at::Tensor& a, const at::Tensor& b) { return binary(fusekit::add, a, b); }, "a + b (broadcasting)");
    m.def("sub", [](const at::Tensor& a, const at::Tensor& b) { return binary(fusekit::sub, a, b); }, "a - b (broadcasting)");
    m.def("mul", [](const at::Tensor& a, const at::Tensor& b) { return binary(fusekit::mul, a, b); }, "a * b (broadcasting)");
    m.def("div", [](const at::Tensor& a, const at::Tensor& b) { return binary(fusekit::div, a, b); }, "a / b (broadcasting)");
    m.def("axpby", &axpby, "alpha*a + beta*b in one pass", pybind11::arg("a"), pybind11::arg("b"),
          pybind11::arg("alpha") = std::complex<double>(1.0), pybind11::arg("beta") = std::complex<double>(1.0));
    m.def("scalar_add", [](const at::Tensor& a, std::complex<double> s) { return scalar_op(false, a, s); }, "a + s");
    m.def("scalar_mul", [](const at::Tensor& a, std::complex<double> s) { return scalar_op(true, a, s); }, "a * s");
    m.def("add_", &add_, "a += b in place (returns a)");
    m.def("abs", &abs_op, "|a| (real magnitude for complex a)");
    m.def("neg", [](const at::Tensor& a) { return unary(fusekit::neg, a); }, "-a");
    m.def("exp", [](const at::Tensor& a) { return unary(fusekit::exp, a); }, "exp(a)");
    m.def("log", [](const at::Tensor& a) { return unary(fusekit::log, a); }, "log(a)");
    m.def("sqrt", [](const at::Tensor& a) { return unary(fusekit::sqrt, a); }, "sqrt(a)");
    m.def("sin", [](const at::Tensor& a) { return unary(fusekit::sin, a); }, "sin(a)");
    m.def("cos", [](const at::Tensor& a) { return unary(fusekit::cos, a); }, "cos(a)");
    m.def("tanh", [](const at::Tensor& a) { return unary(fusekit::tanh, a); }, "tanh(a)");
    m.def("sigmoid", [](const at::Tensor& a) { return unary(fusekit::sigmoid, a); }, "sigmoid(a)");
    m.def("relu", [](const at::Tensor& a) { return unary(fusekit::relu, a); }, "max(a, 0)");
    m.def("copy", [](const at::Tensor& a) { return unary(fusekit::copy, a); }, "contiguous copy of a (any strides)");
}
