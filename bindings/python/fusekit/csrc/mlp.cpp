// The multi-layer perceptron family's torch ops (Python side: fusekit/torch/mlp.py),
// the differentiable network behind fusekit.nn.FusedMLP: one op per direction, each
// one fusekit call (fk_mlp_forward / fk_mlp_backward) on torch's current stream.
//
// - fusekit::mlp(x, weights, biases, hidden_act, out_act, flags) -> (y, saved):
//   `weights` a Tensor[] (one per layer), `biases` a Tensor[] (empty: no layer has
//   one; an entry with no elements: that layer has none. Not a Tensor?[]: torch's
//   register_autograd does not track the tensors of a list holding None). `saved` is a float32 tensor of
//   ceil(fk_mlp_saved_size / 4) elements (what the backward reads; 0 elements when
//   the network needs nothing), allocated by torch (its caching allocator and
//   CUDA-graph pools apply).
// - fusekit::mlp_infer(x, weights, biases, hidden_act, out_act, flags) -> y: the
//   forward without saved (fk_mlp_forward with saved NULL: nothing kept for a
//   backward, the hidden activations in the call's scratch), for inference.
// - fusekit::mlp_backward(dy, x, weights, saved, hidden_act, out_act, flags, want)
//   -> (dx, dweights, dbiases): `want` has one entry for x then one per layer (bit 0:
//   its weight gradient, bit 1: its bias gradient); a gradient not wanted comes back
//   as an empty tensor and is not computed.
//
// PyTorch's stable ABI (torch >= 2.10) boxes Tensor[] / int[] arguments
// as std::vector and Tensor[] results from std::vector, so the whole network is one
// op call each way, capturable in CUDA graphs and traceable by torch.compile.

#include <cstdlib>

#include "common.h"

namespace fusekit_torch {
namespace {

constexpr size_t kMaxLayers = FK_MLP_MAX_LAYERS;

size_t saved_bytes(const Call& k, const Tensor& x, const std::vector<Tensor>& weights, int64_t hidden_act,
                   int64_t out_act) {
    std::vector<int64_t> widths{x.dim() > 0 ? x.size(x.dim() - 1) : 0};
    for (const Tensor& w : weights) widths.push_back(w.dim() == 2 ? w.size(0) : 0);
    int64_t rows = 1;
    for (int64_t i = 0; i + 1 < x.dim(); ++i) rows *= x.size(i);
    size_t bytes = 0;
    check(api().fk_mlp_saved_size(k.ctx, static_cast<int32_t>(weights.size()), widths.data(), rows,
                                  fk_dtype_of(dtype_of(x), k.where, "x"), static_cast<fk_activation>(hidden_act),
                                  static_cast<fk_activation>(out_act), &bytes),
          k.where);
    return bytes;
}

std::string indexed(const char* name, size_t i) { return std::string(name) + "[" + std::to_string(i) + "]"; }

// The forward: y, and `saved` (keep) or nothing kept (an empty `saved`).
std::tuple<Tensor, Tensor> forward(Tensor x, std::vector<Tensor> weights, std::vector<Tensor> biases,
                                   int64_t hidden_act, int64_t out_act, int64_t flags, bool keep) {
    const char* where = "fusekit.mlp_forward";
    if (weights.empty() || weights.size() > kMaxLayers)
        bad(FK_ERROR_INVALID_ARGUMENT, std::string(where) + ": n_layers = " + std::to_string(weights.size()) +
                                           " is outside 1..=64 (FK_MLP_MAX_LAYERS)");
    if (!biases.empty() && biases.size() != weights.size())
        bad(FK_ERROR_INVALID_ARGUMENT, std::string(where) + ": biases has " + std::to_string(biases.size()) +
                                           " entries but weights has " + std::to_string(weights.size()));
    x = contig(x);
    for (Tensor& w : weights) w = contig(w);
    for (Tensor& b : biases) b = contig(b);
    Call k(where, x);
    std::vector<int64_t> ys = shape_of(x);
    if (ys.empty()) bad(FK_ERROR_SHAPE_MISMATCH, std::string(where) + ": x must be [..., k]");
    ys.back() = dim0(weights.back());
    Tensor y = new_tensor(ys, dtype_of(x), x);
    const size_t bytes = keep ? saved_bytes(k, x, weights, hidden_act, out_act) : 0;
    Tensor saved = new_tensor({static_cast<int64_t>((bytes + 3) / 4)}, codes().f32, x);

    Buf X = k.in(x, "x"), Y = k.in(y, "y");
    Buf S = bytes > 0 ? k.in(saved, "saved") : Buf();
    std::vector<Buf> W, B;
    std::vector<fk_buffer*> wh, bh;
    for (size_t i = 0; i < weights.size(); ++i) {
        W.push_back(k.in(weights[i], indexed("weights", i).c_str()));
        wh.push_back(W.back().get());
    }
    for (size_t i = 0; i < biases.size(); ++i) {
        B.push_back(biases[i].numel() > 0 ? k.in(biases[i], indexed("biases", i).c_str()) : Buf());
        bh.push_back(B.back().get());
    }
    k.run(api().fk_mlp_forward, X.get(), static_cast<int32_t>(wh.size()), wh.data(), bh.empty() ? nullptr : bh.data(),
          static_cast<fk_activation>(hidden_act), static_cast<fk_activation>(out_act), static_cast<uint32_t>(flags),
          Y.get(), S.get());
    return {y, saved};
}

std::tuple<Tensor, Tensor> mlp(Tensor x, std::vector<Tensor> weights, std::vector<Tensor> biases,
                               int64_t hidden_act, int64_t out_act, int64_t flags) {
    return forward(std::move(x), std::move(weights), std::move(biases), hidden_act, out_act, flags, true);
}

Tensor mlp_infer(Tensor x, std::vector<Tensor> weights, std::vector<Tensor> biases, int64_t hidden_act,
                 int64_t out_act, int64_t flags) {
    return std::get<0>(
        forward(std::move(x), std::move(weights), std::move(biases), hidden_act, out_act, flags, false));
}

std::tuple<Tensor, std::vector<Tensor>, std::vector<Tensor>> mlp_backward(
    Tensor dy, Tensor x, std::vector<Tensor> weights, Tensor saved, int64_t hidden_act, int64_t out_act,
    int64_t flags, std::vector<int64_t> want) {
    const char* where = "fusekit.mlp_backward";
    const size_t n = weights.size();
    if (want.size() != n + 1)
        bad(FK_ERROR_INVALID_ARGUMENT, std::string(where) + ": want has " + std::to_string(want.size()) +
                                           " entries but needs 1 + one per layer (" + std::to_string(n + 1) + ")");
    contig_all(dy, x, saved);
    for (Tensor& w : weights) w = contig(w);
    Call k(where, dy);
    Tensor dx = wanted_or_empty(want[0] != 0, x);
    std::vector<Tensor> dws, dbs;
    std::vector<Buf> bufs;
    std::vector<fk_buffer*> wh, dwh, dbh;
    bool any_w = false, any_b = false;
    for (size_t i = 0; i < n; ++i) {
        const bool ww = (want[i + 1] & 1) != 0, wb = (want[i + 1] & 2) != 0;
        dws.push_back(wanted_or_empty(ww, weights[i]));
        dbs.push_back(wb ? new_tensor({dim0(weights[i])}, dtype_of(dy), dy) : empty0(dy));
        any_w |= ww;
        any_b |= wb;
        bufs.push_back(k.in(weights[i], indexed("weights", i).c_str()));
        wh.push_back(bufs.back().get());
        bufs.push_back(ww ? k.in(dws[i], indexed("dweights", i).c_str()) : Buf());
        dwh.push_back(bufs.back().get());
        bufs.push_back(wb ? k.in(dbs[i], indexed("dbiases", i).c_str()) : Buf());
        dbh.push_back(bufs.back().get());
    }
    Buf DY = k.in(dy, "dy"), X = k.in(x, "x");
    Buf S = saved.numel() > 0 ? k.in(saved, "saved") : Buf();
    Buf DX = want[0] != 0 ? k.in(dx, "dx") : Buf();
    k.run(api().fk_mlp_backward, DY.get(), X.get(), static_cast<int32_t>(n), wh.empty() ? nullptr : wh.data(),
          static_cast<fk_activation>(hidden_act), static_cast<fk_activation>(out_act), static_cast<uint32_t>(flags),
          S.get(), DX.get(), any_w ? dwh.data() : nullptr, any_b ? dbh.data() : nullptr);
    return {dx, dws, dbs};
}

// The family's ops: name, the rest of its schema, kernel (FK_TORCH_FAMILY in common.h).
constexpr Op kOps[] = {
    // differentiable (autograd registered in Python) and its backward
    FK_TORCH_OP(mlp, "(Tensor x, Tensor[] weights, Tensor[] biases, int hidden_act, int out_act, int flags) "
                     "-> (Tensor, Tensor)"),
    FK_TORCH_OP(mlp_infer, "(Tensor x, Tensor[] weights, Tensor[] biases, int hidden_act, int out_act, int flags) "
                           "-> Tensor"),
    FK_TORCH_OP(mlp_backward, "(Tensor dy, Tensor x, Tensor[] weights, Tensor saved, int hidden_act, int out_act, "
                              "int flags, int[] want) -> (Tensor, Tensor[], Tensor[])"),
};

}  // namespace
}  // namespace fusekit_torch

FK_TORCH_FAMILY(fusekit_torch::kOps)
