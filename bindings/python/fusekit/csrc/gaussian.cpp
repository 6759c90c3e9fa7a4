// The Gaussian field family's torch ops (Python side: fusekit/torch/gaussian.py).
// - The plain functions' ops (fusekit.mahalanobis_forward, gaussian_field_forward
//   and their backwards on tensors): each its C entry point one to one, every
//   output given (None = not wanted), no copies and no checks of its own (the
//   library checks, as through ctypes). The Python functions shape and allocate
//   the outputs.
// - The differentiable ops fusekit::gaussian_field, mahalanobis and their backwards
//   (autograd in Python): the inputs made contiguous, the outputs allocated, then
//   the entry point through its 1:1 op. A gradient not wanted (`want` bit clear)
//   comes back as an empty tensor.

#include "common.h"

namespace fusekit_torch {
namespace {

void mahalanobis_forward_out(Tensor points, Tensor means, Tensor chol, double eps, Tensor out) {
    Call k("fusekit.mahalanobis_forward", points);
    Buf P = k.in(points, "points"), M = k.in(means, "means"), L = k.in(chol, "chol"), O = k.in(out, "out");
    k.run(api().fk_mahalanobis_forward, P.get(), M.get(), L.get(), eps, O.get());
}

void gaussian_field_forward_out(Tensor points, Tensor means, Tensor chol, Tensor weights, double eps, Tensor out) {
    Call k("fusekit.gaussian_field_forward", points);
    Buf P = k.in(points, "points"), M = k.in(means, "means"), L = k.in(chol, "chol"), W = k.in(weights, "weights");
    Buf O = k.in(out, "out");
    k.run(api().fk_gaussian_field_forward, P.get(), M.get(), L.get(), W.get(), eps, O.get());
}

// The Gaussian backwards' workspace, from torch's allocator (0 bytes on the CPU: none).
Tensor gaussian_workspace(const Call& c, const Tensor& points, const Tensor& means) {
    size_t bytes = 0;
    fk_dtype fd = fk_dtype_of(dtype_of(points), c.where, "points");
    check(api().fk_gaussian_backward_workspace_size(c.ctx, fd, dim0(points), dim0(means), &bytes), c.where);
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
    k.run(api().fk_mahalanobis_backward, P.get(), M.get(), L.get(), eps, G.get(), DP.get(), DM.get(), DC.get(),
          WS.get());
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
    k.run(api().fk_gaussian_field_backward, P.get(), M.get(), L.get(), W.get(), eps, D.get(), DP.get(), DM.get(),
          DC.get(), DW.get(), WS.get());
}

Tensor gaussian_field(Tensor points, Tensor means, Tensor chol, Tensor weights, double eps) {
    contig_all(points, means, chol, weights);
    Tensor out = new_tensor({dim0(points)}, dtype_of(points), points);
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
    Tensor out = new_tensor({dim0(points), dim0(means)}, dtype_of(points), points);
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

// The family's ops: name, the rest of its schema, kernel (FK_TORCH_FAMILY in common.h).
constexpr Op kOps[] = {
    // the plain functions' entry points, 1:1 (every output given; None = not wanted)
    FK_TORCH_OP(mahalanobis_forward_out, "(Tensor points, Tensor means, Tensor chol, float eps, Tensor(a!) out) -> ()"),
    FK_TORCH_OP(gaussian_field_forward_out, "(Tensor points, Tensor means, Tensor chol, Tensor weights, float eps, "
                                            "Tensor(a!) out) -> ()"),
    FK_TORCH_OP(mahalanobis_backward_out, "(Tensor points, Tensor means, Tensor chol, float eps, Tensor g, "
                                          "Tensor(a!)? dpoints, Tensor(b!)? dmeans, Tensor(c!)? dchol, "
                                          "Tensor(d!)? workspace) -> ()"),
    FK_TORCH_OP(gaussian_field_backward_out, "(Tensor points, Tensor means, Tensor chol, Tensor weights, float eps, "
                                             "Tensor dout, Tensor(a!)? dpoints, Tensor(b!)? dmeans, "
                                             "Tensor(c!)? dchol, Tensor(d!)? dweights, Tensor(e!)? workspace) -> ()"),
    // differentiable ops (autograd registered in Python) and their backwards
    FK_TORCH_OP(gaussian_field, "(Tensor points, Tensor means, Tensor chol, Tensor weights, float eps) -> Tensor"),
    FK_TORCH_OP(gaussian_field_backward, "(Tensor points, Tensor means, Tensor chol, Tensor weights, Tensor dout, "
                                         "float eps, int want=15) -> (Tensor, Tensor, Tensor, Tensor)"),
    FK_TORCH_OP(mahalanobis, "(Tensor points, Tensor means, Tensor chol, float eps) -> Tensor"),
    FK_TORCH_OP(mahalanobis_backward, "(Tensor points, Tensor means, Tensor chol, Tensor g, float eps, int want=7)"
                                      " -> (Tensor, Tensor, Tensor)"),
};

}  // namespace
}  // namespace fusekit_torch

FK_TORCH_FAMILY(fusekit_torch::kOps)
