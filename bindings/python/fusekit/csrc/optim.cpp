// The optimizer-math family's torch ops (Python side: fusekit/torch/optim.py): the
// plain functions' compiled route (fusekit.matrix_power, shampoo_stats, ...). The
// Python functions shape and allocate the outputs; these run the entry point on
// torch's current stream, writing in place (the `_out`/`_` ops). No autograd.

#include "common.h"

namespace fusekit_torch {
namespace {

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
    k.run(api().fk_shampoo_stats_ex, G.get(), alpha, beta, L.get(), R.get(), static_cast<uint32_t>(flags));
}

void shampoo_precondition_out(Tensor grad, OptTensor l_root, OptTensor r_root, int64_t flags, Tensor out) {
    Call k("fusekit.shampoo_precondition", grad);
    Buf G = k.in(grad, "grad"), L = k.in(l_root, "l_root"), R = k.in(r_root, "r_root"), O = k.in(out, "out");
    k.run(api().fk_shampoo_precondition, L.get(), G.get(), R.get(), O.get(), static_cast<uint32_t>(flags));
}

void per_sample_grads_out(Tensor a, Tensor g, int64_t flags, Tensor out) {
    Call k("fusekit.per_sample_grads", a);
    Buf A = k.in(a, "a"), G = k.in(g, "g"), O = k.in(out, "out");
    k.run(api().fk_per_sample_grads, A.get(), G.get(), O.get(), static_cast<uint32_t>(flags));
}

void per_sample_grad_norms_out(Tensor a, Tensor g, Tensor out) {
    Call k("fusekit.per_sample_grad_norms", a);
    Buf A = k.in(a, "a"), G = k.in(g, "g"), O = k.in(out, "sq_norms");
    k.run(api().fk_per_sample_grad_norms, A.get(), G.get(), O.get());
}

void dp_clipped_grad_sum_out(Tensor a, Tensor g, double max_norm, int64_t flags, Tensor out, OptTensor sq_norms) {
    Call k("fusekit.dp_clipped_grad_sum", a);
    Buf A = k.in(a, "a"), G = k.in(g, "g"), O = k.in(out, "out"), N = k.in(sq_norms, "sq_norms");
    k.run(api().fk_dp_clipped_grad_sum, A.get(), G.get(), max_norm, O.get(), N.get(), static_cast<uint32_t>(flags));
}

// The family's ops: name, the rest of its schema, kernel (FK_TORCH_FAMILY in common.h).
constexpr Op kOps[] = {
    FK_TORCH_OP(matrix_power_out, "(Tensor a, float power, float eps, int method, int max_iter, float tol, "
                                  "int flags, Tensor(a!) out, Tensor(b!) report) -> ()"),
    FK_TORCH_OP(shampoo_stats_, "(Tensor grad, Tensor(a!)? l, Tensor(b!)? r, float alpha, float beta, int flags)"
                                " -> ()"),
    FK_TORCH_OP(shampoo_precondition_out, "(Tensor grad, Tensor? l_root, Tensor? r_root, int flags, Tensor(a!) out)"
                                          " -> ()"),
    FK_TORCH_OP(per_sample_grads_out, "(Tensor a, Tensor g, int flags, Tensor(a!) out) -> ()"),
    FK_TORCH_OP(per_sample_grad_norms_out, "(Tensor a, Tensor g, Tensor(a!) out) -> ()"),
    FK_TORCH_OP(dp_clipped_grad_sum_out, "(Tensor a, Tensor g, float max_norm, int flags, Tensor(a!) out, "
                                         "Tensor(b!)? sq_norms) -> ()"),
};

}  // namespace
}  // namespace fusekit_torch

FK_TORCH_FAMILY(fusekit_torch::kOps)
