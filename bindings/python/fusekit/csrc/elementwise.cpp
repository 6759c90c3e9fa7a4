// The elementwise family's torch ops (Python side: fusekit/torch/elementwise.py).
// - The plain functions' ops: fusekit::binary / unary / scalar / axpby_c (a new
//   output) and their *_out ops (the caller's), choosing the entry point by its op
//   code (FK_TORCH_BINARY_OPS, FK_TORCH_UNARY_OPS, FK_TORCH_SCALAR_OPS).
// - The differentiable ops fusekit::axpby, scalar_mul, relu (autograd in Python).

#include "common.h"

#include <string_view>

namespace fusekit_torch {
namespace {

using BinaryFn = fk_status (*)(const fk_buffer*, const fk_buffer*, fk_buffer*, const fk_stream*);
using UnaryFn = fk_status (*)(const fk_buffer*, fk_buffer*, const fk_stream*);
using ScalarFn = fk_status (*)(const fk_buffer*, fk_scalar, fk_buffer*, const fk_stream*);

// The entry point of an op code, and its Python name for errors.
#define FK_TORCH_CASE(code, name)                             \
    case code: {                                              \
        static const std::string w = where_of(#name);         \
        *where = w.c_str();                                   \
        return a.name;                                        \
    }

BinaryFn binary_fn(int64_t op, const char** where) {
    const Api& a = api();
    switch (op) { FK_TORCH_BINARY_OPS(FK_TORCH_CASE) }
    bad(FK_ERROR_INVALID_ARGUMENT, "fusekit::binary: unknown op " + std::to_string(op));
}

UnaryFn unary_fn(int64_t op, const char** where) {
    const Api& a = api();
    switch (op) { FK_TORCH_UNARY_OPS(FK_TORCH_CASE) }
    bad(FK_ERROR_INVALID_ARGUMENT, "fusekit::unary: unknown op " + std::to_string(op));
}

ScalarFn scalar_fn(int64_t op, const char** where) {
    const Api& a = api();
    switch (op) { FK_TORCH_SCALAR_OPS(FK_TORCH_CASE) }
    bad(FK_ERROR_INVALID_ARGUMENT, "fusekit::scalar: unknown op " + std::to_string(op));
}

#undef FK_TORCH_CASE

// The op code of an entry point in a list (-1 when absent): fk_abs (whose complex
// input gives a real output), and the codes the differentiable ops run.
#define FK_TORCH_CODE(code, name) \
    if (entry == #name) return code;
constexpr int64_t unary_code(std::string_view entry) {
    FK_TORCH_UNARY_OPS(FK_TORCH_CODE)
    return -1;
}
constexpr int64_t scalar_code(std::string_view entry) {
    FK_TORCH_SCALAR_OPS(FK_TORCH_CODE)
    return -1;
}
#undef FK_TORCH_CODE

constexpr int64_t kAbs = unary_code("fk_abs");
constexpr int64_t kRelu = unary_code("fk_relu");
constexpr int64_t kScalarMul = scalar_code("fk_scalar_mul");
static_assert(kAbs >= 0 && kRelu >= 0 && kScalarMul >= 0, "an op code list lacks fk_abs, fk_relu or fk_scalar_mul");

void binary_out(Tensor a, Tensor b, int64_t op, Tensor out) {
    const char* where = nullptr;
    BinaryFn fn = binary_fn(op, &where);
    Call c(where, a);
    Buf A = c.in(a, "a"), B = c.in(b, "b"), O = c.in(out, "out");
    c.run(fn, A.get(), B.get(), O.get());
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
    c.run(fn, A.get(), O.get());
}

Tensor unary(Tensor a, int64_t op) {
    int32_t dt = dtype_of(a);
    Tensor out = new_tensor(shape_of(a), op == kAbs ? torch_real_of(dt) : dt, a);  // abs of complex: real
    unary_out(a, op, out);
    return out;
}

void scalar_out(Tensor a, double re, double im, int64_t op, Tensor out) {
    const char* where = nullptr;
    ScalarFn fn = scalar_fn(op, &where);
    Call c(where, a);
    Buf A = c.in(a, "a"), O = c.in(out, "out");
    c.run(fn, A.get(), fk_scalar{re, im}, O.get());
}

Tensor scalar(Tensor a, double re, double im, int64_t op) {
    Tensor out = new_like(a);
    scalar_out(a, re, im, op, out);
    return out;
}

void axpby_c_out(Tensor a, Tensor b, double are, double aim, double bre, double bim, Tensor out) {
    Call c("fusekit.axpby", a);
    Buf A = c.in(a, "a"), B = c.in(b, "b"), O = c.in(out, "out");
    c.run(api().fk_axpby, fk_scalar{are, aim}, A.get(), fk_scalar{bre, bim}, B.get(), O.get());
}

Tensor axpby_c(Tensor a, Tensor b, double are, double aim, double bre, double bim) {
    Tensor out = new_tensor(broadcast(a, b), dtype_of(a), a);
    axpby_c_out(a, b, are, aim, bre, bim, out);
    return out;
}

// The differentiable elementwise ops (autograd in fusekit/torch/elementwise.py).
Tensor axpby(Tensor a, Tensor b, double alpha, double beta) { return axpby_c(a, b, alpha, 0.0, beta, 0.0); }
Tensor scalar_mul(Tensor a, double s) { return scalar(a, s, 0.0, kScalarMul); }
Tensor relu(Tensor a) { return unary(a, kRelu); }

// The family's ops: name, the rest of its schema, kernel (FK_TORCH_FAMILY in common.h).
constexpr Op kOps[] = {
    // plain elementwise ops on tensors (fusekit.add(...) etc.; not differentiable)
    FK_TORCH_OP(binary, "(Tensor a, Tensor b, int op) -> Tensor"),
    FK_TORCH_OP(binary_out, "(Tensor a, Tensor b, int op, Tensor(a!) out) -> ()"),
    FK_TORCH_OP(unary, "(Tensor a, int op) -> Tensor"),
    FK_TORCH_OP(unary_out, "(Tensor a, int op, Tensor(a!) out) -> ()"),
    FK_TORCH_OP(scalar, "(Tensor a, float re, float im, int op) -> Tensor"),
    FK_TORCH_OP(scalar_out, "(Tensor a, float re, float im, int op, Tensor(a!) out) -> ()"),
    FK_TORCH_OP(axpby_c, "(Tensor a, Tensor b, float alpha_re, float alpha_im, float beta_re, float beta_im)"
                         " -> Tensor"),
    FK_TORCH_OP(axpby_c_out, "(Tensor a, Tensor b, float alpha_re, float alpha_im, float beta_re, float beta_im, "
                             "Tensor(a!) out) -> ()"),
    // differentiable ops (autograd registered in Python)
    FK_TORCH_OP(axpby, "(Tensor a, Tensor b, float alpha, float beta) -> Tensor"),
    FK_TORCH_OP(scalar_mul, "(Tensor a, float s) -> Tensor"),
    FK_TORCH_OP(relu, "(Tensor a) -> Tensor"),
};

}  // namespace
}  // namespace fusekit_torch

FK_TORCH_FAMILY(fusekit_torch::kOps)
