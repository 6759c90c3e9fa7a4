// The geodesic flow family's torch ops (Python side: fusekit/torch/geodesic.py).
// - The plain functions' ops (fusekit.christoffel_forward, leapfrog_forward and
//   their backwards on tensors): each its C entry point one to one, every output
//   given (None = not wanted). The Python functions shape and allocate the outputs.
// - The differentiable ops fusekit::christoffel, leapfrog and their backwards
//   (autograd in Python): the inputs made contiguous, the outputs allocated, then
//   the entry point through its 1:1 op. A gradient not wanted (`want` bit clear)
//   comes back as an empty tensor.

#include "common.h"

namespace fusekit_torch {
namespace {

void christoffel_forward_out(Tensor v, Tensor U, Tensor W, double cl, int64_t flags, Tensor gamma) {
    Call k("fusekit.christoffel_forward", v);
    Buf V = k.in(v, "v"), Uh = k.in(U, "U"), Wh = k.in(W, "W"), G = k.in(gamma, "gamma");
    k.run(api().fk_christoffel_forward, V.get(), Uh.get(), Wh.get(), cl, static_cast<uint32_t>(flags), G.get());
}

void christoffel_backward_out(Tensor v, Tensor U, Tensor W, Tensor g, double cl, int64_t flags, OptTensor dv,
                              OptTensor dU, OptTensor dW) {
    Call k("fusekit.christoffel_backward", v);
    Buf V = k.in(v, "v"), Uh = k.in(U, "U"), Wh = k.in(W, "W"), G = k.in(g, "g");
    Buf DV = k.in(dv, "dv"), DU = k.in(dU, "dU"), DW = k.in(dW, "dW");
    k.run(api().fk_christoffel_backward, V.get(), Uh.get(), Wh.get(), G.get(), cl, static_cast<uint32_t>(flags),
          DV.get(), DU.get(), DW.get());
}

void leapfrog_forward_out(Tensor x0, Tensor v0, OptTensor f, Tensor U, Tensor W, OptTensor mu, double dt,
                          int64_t steps, double cl, int64_t flags, Tensor x_out, Tensor v_out, OptTensor traj) {
    Call k("fusekit.leapfrog_forward", v0);
    Buf X0 = k.in(x0, "x0"), V0 = k.in(v0, "v0"), F = k.in(f, "f"), Uh = k.in(U, "U"), Wh = k.in(W, "W");
    Buf MU = k.in(mu, "mu"), X = k.in(x_out, "x_out"), V = k.in(v_out, "v_out"), T = k.in(traj, "traj");
    k.run(api().fk_leapfrog_forward, X0.get(), V0.get(), F.get(), Uh.get(), Wh.get(), MU.get(), dt, steps, cl,
          static_cast<uint32_t>(flags), X.get(), V.get(), T.get());
}

void leapfrog_backward_out(Tensor v0, OptTensor f, Tensor U, Tensor W, OptTensor mu, double dt, int64_t steps,
                           double cl, int64_t flags, OptTensor traj, OptTensor gx, OptTensor gv, OptTensor dx0,
                           OptTensor dv0, OptTensor df, OptTensor dU, OptTensor dW) {
    Call k("fusekit.leapfrog_backward", v0);
    Buf V0 = k.in(v0, "v0"), F = k.in(f, "f"), Uh = k.in(U, "U"), Wh = k.in(W, "W"), MU = k.in(mu, "mu");
    Buf T = k.in(traj, "traj"), GX = k.in(gx, "gx"), GV = k.in(gv, "gv");
    Buf DX0 = k.in(dx0, "dx0"), DV0 = k.in(dv0, "dv0"), DF = k.in(df, "df"), DU = k.in(dU, "dU"), DW = k.in(dW, "dW");
    k.run(api().fk_leapfrog_backward, V0.get(), F.get(), Uh.get(), Wh.get(), MU.get(), dt, steps, cl,
          static_cast<uint32_t>(flags), T.get(), GX.get(), GV.get(), DX0.get(), DV0.get(), DF.get(), DU.get(),
          DW.get());
}

// flags: the forward's FK_GEO_* word (fusekit/torch/geodesic.py chooses it; the
// backwards below run with 0: the C ABI's backwards are strict IEEE).
Tensor christoffel(Tensor v, Tensor U, Tensor W, double cl, int64_t flags) {
    contig_all(v, U, W);
    Tensor gamma = new_like(v);
    christoffel_forward_out(v, U, W, cl, flags, gamma);
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
                                            double dt, int64_t steps, double cl, bool keep_traj,
                                            int64_t flags) {
    contig_all(x0, v0, U, W, f, mu);
    Tensor x = new_like(x0), v = new_like(v0);
    int64_t b = v0.dim() > 0 ? v0.size(0) : 0, d = v0.dim() > 1 ? v0.size(1) : 0;
    Tensor traj = new_tensor({keep_traj ? steps : 0, 2, b, d}, dtype_of(v0), v0);
    leapfrog_forward_out(x0, v0, f, U, W, mu, dt, steps, cl, flags, x, v, arg_if(keep_traj, traj));
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

// The family's ops: name, the rest of its schema, kernel (FK_TORCH_FAMILY in common.h).
constexpr Op kOps[] = {
    // the plain functions' entry points, 1:1 (every output given; None = not wanted)
    FK_TORCH_OP(christoffel_forward_out, "(Tensor v, Tensor U, Tensor W, float c, int flags, Tensor(a!) gamma) -> ()"),
    FK_TORCH_OP(christoffel_backward_out, "(Tensor v, Tensor U, Tensor W, Tensor g, float c, int flags, "
                                          "Tensor(a!)? dv, Tensor(b!)? dU, Tensor(c!)? dW) -> ()"),
    FK_TORCH_OP(leapfrog_forward_out, "(Tensor x0, Tensor v0, Tensor? f, Tensor U, Tensor W, Tensor? mu, float dt, "
                                      "int steps, float c, int flags, Tensor(a!) x_out, Tensor(b!) v_out, "
                                      "Tensor(c!)? traj) -> ()"),
    FK_TORCH_OP(leapfrog_backward_out, "(Tensor v0, Tensor? f, Tensor U, Tensor W, Tensor? mu, float dt, int steps, "
                                       "float c, int flags, Tensor? traj, Tensor? gx, Tensor? gv, Tensor(a!)? dx0, "
                                       "Tensor(b!)? dv0, Tensor(c!)? df, Tensor(d!)? dU, Tensor(e!)? dW) -> ()"),
    // differentiable ops (autograd registered in Python) and their backwards
    FK_TORCH_OP(christoffel, "(Tensor v, Tensor U, Tensor W, float c, int flags=0) -> Tensor"),
    FK_TORCH_OP(christoffel_backward, "(Tensor v, Tensor U, Tensor W, Tensor g, float c, int want=7) "
                                      "-> (Tensor, Tensor, Tensor)"),
    FK_TORCH_OP(leapfrog, "(Tensor x0, Tensor v0, Tensor U, Tensor W, Tensor? f, Tensor? mu, float dt, int steps, "
                          "float c, bool keep_traj=True, int flags=0) -> (Tensor, Tensor, Tensor)"),
    FK_TORCH_OP(leapfrog_backward, "(Tensor v0, Tensor U, Tensor W, Tensor? f, Tensor? mu, Tensor? traj, Tensor? gx, "
                                   "Tensor? gv, float dt, int steps, float c, int want=31) "
                                   "-> (Tensor, Tensor, Tensor, Tensor, Tensor)"),
};

}  // namespace
}  // namespace fusekit_torch

FK_TORCH_FAMILY(fusekit_torch::kOps)
