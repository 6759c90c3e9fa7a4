// The linear algebra family's torch ops (Python side: fusekit/torch/linalg.py).
// - The plain functions' ops (fusekit.gemm, kron, linear_forward, linear_backward
//   on tensors): the Python functions shape and allocate the outputs; these run the
//   entry point on torch's current stream, one to one (every output given; None =
//   not wanted), writing in place (the `_out`/`_` ops).
// - The differentiable fused linear layer, fusekit::linear and its backward
//   (autograd in Python): the inputs made contiguous, the outputs allocated, then
//   the entry point through its 1:1 op.

#include "common.h"

namespace fusekit_torch {
namespace {

void gemm_(int64_t op_a, int64_t op_b, double are, double aim, Tensor a, Tensor b, double bre, double bim, Tensor c,
           int64_t flags) {
    Call k("fusekit.gemm", c);
    Buf A = k.in(a, "a"), B = k.in(b, "b"), C = k.in(c, "c");
    k.run(api().fk_gemm, static_cast<fk_op>(op_a), static_cast<fk_op>(op_b), fk_scalar{are, aim}, A.get(), B.get(),
          fk_scalar{bre, bim}, C.get(), static_cast<uint32_t>(flags));
}

void kron_out(Tensor a, Tensor b, Tensor out) {
    Call k("fusekit.kron", a);
    Buf A = k.in(a, "a"), B = k.in(b, "b"), O = k.in(out, "out");
    k.run(api().fk_kron, A.get(), B.get(), O.get());
}

void linear_forward_out(Tensor x, Tensor w, OptTensor b, int64_t act, Tensor y, OptTensor aux) {
    Call k("fusekit.linear_forward", x);
    Buf X = k.in(x, "x"), W = k.in(w, "w"), B = k.in(b, "b"), Y = k.in(y, "y"), A = k.in(aux, "aux");
    k.run(api().fk_linear_forward, X.get(), W.get(), B.get(), static_cast<fk_activation>(act), Y.get(), A.get());
}

void linear_backward_out(Tensor dy, Tensor x, Tensor w, int64_t act, OptTensor saved, OptTensor dx, OptTensor dw,
                         OptTensor db) {
    Call k("fusekit.linear_backward", dy);
    Buf DY = k.in(dy, "dy"), X = k.in(x, "x"), W = k.in(w, "w"), S = k.in(saved, "saved");
    Buf DX = k.in(dx, "dx"), DW = k.in(dw, "dw"), DB = k.in(db, "db");
    k.run(api().fk_linear_backward, DY.get(), X.get(), W.get(), static_cast<fk_activation>(act), S.get(), DX.get(),
          DW.get(), DB.get());
}

constexpr int64_t kActNone = FK_ACT_NONE;
// The activations whose forward keeps the pre-activation (aux) for the backward.
bool keeps_aux(int64_t act) { return act == FK_ACT_GELU_TANH || act == FK_ACT_GELU_ERF; }

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

// The family's ops: name, the rest of its schema, kernel (FK_TORCH_FAMILY in common.h).
constexpr Op kOps[] = {
    // the plain functions' entry points, 1:1 (every output given; None = not wanted)
    FK_TORCH_OP(gemm_, "(int op_a, int op_b, float alpha_re, float alpha_im, Tensor a, Tensor b, float beta_re, "
                       "float beta_im, Tensor(a!) c, int flags) -> ()"),
    FK_TORCH_OP(kron_out, "(Tensor a, Tensor b, Tensor(a!) out) -> ()"),
    FK_TORCH_OP(linear_forward_out, "(Tensor x, Tensor w, Tensor? b, int act, Tensor(a!) y, Tensor(b!)? aux) -> ()"),
    FK_TORCH_OP(linear_backward_out, "(Tensor dy, Tensor x, Tensor w, int act, Tensor? saved, Tensor(a!)? dx, "
                                     "Tensor(b!)? dw, Tensor(c!)? db) -> ()"),
    // differentiable (autograd registered in Python) and its backward
    FK_TORCH_OP(linear, "(Tensor x, Tensor w, Tensor? b, int act) -> (Tensor, Tensor)"),
    FK_TORCH_OP(linear_backward, "(Tensor dy, Tensor x, Tensor w, Tensor saved, int act, int want=7) "
                                 "-> (Tensor, Tensor, Tensor)"),
};

}  // namespace
}  // namespace fusekit_torch

FK_TORCH_FAMILY(fusekit_torch::kOps)
