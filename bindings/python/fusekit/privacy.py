"""DP-SGD with ghost clipping for models whose trainable layers are linear
(docs/privacy.md).

::

    import fusekit.privacy
    dp = fusekit.privacy.DPSGD(model, optimizer, max_grad_norm=1.0, noise_multiplier=1.1)
    for x, y in batches:
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)   # mean over the batch
        dp.step(loss)                         # instead of loss.backward(); optimizer.step()

Every trainable layer must be ``torch.nn.Linear`` or ``fusekit.nn.FusedLinear``;
any other module holding a trainable parameter is refused when :class:`DPSGD` is
made, by name, and so is a trainable ``fusekit.nn.FusedMLP`` (its layers are one
op, with no per-layer input and output gradient to take; its ``to_sequential()``
is a model DPSGD takes). Forward hooks record each layer's input ``a`` and
output; the backward of :meth:`DPSGD.backward` asks autograd for the gradients
of the layer outputs only (``g``, so no weight gradient is computed by
autograd), takes every sample's gradient norm from ``a`` and ``g`` (ghost norms: fusekit's
:func:`fusekit.per_sample_grad_norms` for the weights, ``|sum_t g_t|^2`` for the
biases), clips each sample's whole gradient to ``max_grad_norm`` (flat clipping),
and writes ``p.grad = (sum_i min(1, C/|G_i|) G_i + N(0, (sigma C)^2)) / B`` with
one GEMM per weight. Per-sample gradients are never materialised.
``clipping="per_layer"`` clips each parameter to its own norm instead (weights
through fusekit's fused :func:`fusekit.dp_clipped_grad_sum`).

This module imports torch only when a :class:`DPSGD` is made (``import fusekit``
and ``import fusekit.privacy`` work without torch). Privacy accounting is not
included.
"""

from __future__ import annotations

import math
import numbers

__all__ = ["DPSGD", "SUPPORTED_LAYERS"]

#: Names of the layer classes whose parameters DP-SGD handles.
SUPPORTED_LAYERS = ("Linear", "FusedLinear")

_WHERE = "fusekit.privacy"
_FUSED_ACTS = ("none", "relu", "gelu", "gelu_tanh")


def _fused_classes():
    """``(fusekit.torch.nn.FusedLinear, fusekit.torch.nn.FusedMLP)`` when that module
    imports (torch and the compiled ops present), else ``(None, None)``."""
    try:
        from .torch.nn import FusedLinear, FusedMLP
    except ImportError:
        return None, None
    return FusedLinear, FusedMLP


def _positive(value, name: str, allow_zero: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{_WHERE}: {name} must be a real number, got {type(value).__name__}")
    v = float(value)
    if not math.isfinite(v) or v < 0 or (v == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{_WHERE}: {name} must be finite and {bound}, got {value!r}")
    return v


def _activation(module) -> str:
    act = getattr(module, "activation", "none")
    return "none" if act is None else str(act)


class DPSGD:
    """Differentially private SGD (Abadi et al. 2016) for ``model`` with ghost
    clipping: per-sample gradients clipped to ``max_grad_norm`` in their total L2
    norm over all trainable parameters, summed, Gaussian noise of standard
    deviation ``noise_multiplier * max_grad_norm`` added to the sum, divided by the
    batch size.

    Args:
        model: the ``torch.nn.Module``; every module holding a parameter with
            ``requires_grad`` must be ``nn.Linear`` or ``fusekit.nn.FusedLinear``
            (ValueError naming the first other one; a ``fusekit.nn.FusedMLP`` with a
            trainable parameter is refused too). Frozen parameters are ignored.
        optimizer: the optimizer :meth:`step` calls after writing the private
            gradients (None: use :meth:`backward` and step it yourself).
        max_grad_norm: the clipping norm ``C`` (finite, > 0). With
            ``clipping="per_layer"`` also a sequence, one norm per trainable
            parameter in :attr:`params` order.
        noise_multiplier: ``sigma`` (finite, >= 0; 0 gives the clipped mean, no noise).
        expected_batch_size: the divisor of the noisy sum (with Poisson sampling,
            the expected batch size ``q N``); None divides by each batch's size.
        loss_reduction: ``"mean"`` (the loss is a mean over the batch's samples,
            as ``F.cross_entropy``'s default) or ``"sum"``.
        generator: a ``torch.Generator`` on the parameters' device for the noise;
            ``seed``: make one with this seed. Neither: torch's default generator.
        clipping: ``"flat"`` (each sample's whole gradient clipped to ``C``) or
            ``"per_layer"`` (each parameter tensor's per-sample gradient clipped to
            its own ``C_p``, weights through fusekit's fused clipped-sum op; the noise
            is then ``sigma * sqrt(sum_p C_p^2)``, as Opacus's per-layer clipping).
        cuda_graph: run the clipping, the weighted gradient GEMMs and the noise
            (everything after autograd's backward to the layer outputs) as a CUDA
            graph, captured at the first step of each set of input shapes and
            replayed after copying the step's layer inputs and output gradients into
            the graph's buffers: one launch instead of a few dozen Python-level torch
            calls, for small models where the host is slower than the GPU. CUDA
            parameters only. ``per_sample_norms`` and ``clip_factors`` are then the
            graph's tensors, overwritten at every step (clone them to keep them).

    After :meth:`backward`: ``per_sample_norms`` ``[B]`` (the norms of the whole
    per-sample gradients before clipping) and, for flat clipping, ``clip_factors``
    ``[B]`` (``min(1, C / norm)``) of that batch.

    The layers' forward hooks record inputs and outputs while autograd is enabled
    and the output requires grad; :meth:`backward` consumes the records (a forward
    with grad enabled and no :meth:`backward` after it is kept until the next
    one: run evaluation under ``torch.no_grad()``). A layer called several times
    in one forward is handled exactly (its calls are one sequence per sample).
    Inputs are batch-first: ``[B, in]``, ``[B, T, in]`` or ``[B, ..., in]``.
    """

    def __init__(self, model, optimizer=None, *, max_grad_norm, noise_multiplier, expected_batch_size=None,
                 loss_reduction="mean", generator=None, seed=None, clipping="flat", cuda_graph=False):
        import torch

        if clipping not in ("flat", "per_layer"):
            raise ValueError(f"{_WHERE}: clipping must be 'flat' or 'per_layer', got {clipping!r}")
        self.clipping = clipping
        per_param_norms = None
        if clipping == "per_layer" and isinstance(max_grad_norm, (list, tuple)):
            per_param_norms = [_positive(c, f"max_grad_norm[{i}]", allow_zero=False)
                               for i, c in enumerate(max_grad_norm)]
            max_grad_norm = math.sqrt(sum(c * c for c in per_param_norms))
        self.max_grad_norm = _positive(max_grad_norm, "max_grad_norm", allow_zero=False)
        self.noise_multiplier = _positive(noise_multiplier, "noise_multiplier", allow_zero=True)
        if expected_batch_size is not None:
            if isinstance(expected_batch_size, bool) or not isinstance(expected_batch_size, numbers.Real) \
                    or not expected_batch_size > 0:
                raise ValueError(f"{_WHERE}: expected_batch_size must be a number > 0 or None, "
                                 f"got {expected_batch_size!r}")
            expected_batch_size = float(expected_batch_size)
        self.expected_batch_size = expected_batch_size
        if loss_reduction not in ("mean", "sum"):
            raise ValueError(f"{_WHERE}: loss_reduction must be 'mean' or 'sum', got {loss_reduction!r}")
        self.loss_reduction = loss_reduction
        if generator is not None and seed is not None:
            raise ValueError(f"{_WHERE}: give generator or seed, not both")
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"{_WHERE}: model must be a torch.nn.Module, got {type(model).__name__}")
        self.model = model
        self.optimizer = optimizer

        fused, fused_mlp = _fused_classes()
        self._layers = []  # (name, module, activation or None for nn.Linear)
        for name, module in model.named_modules():
            label = name or "<model>"
            if fused_mlp is not None and isinstance(module, fused_mlp) \
                    and any(p.requires_grad for p in module.parameters()):
                # its nn.Linear children are never called: their hooks would record nothing
                raise ValueError(f"{_WHERE}: layer {label!r} (FusedMLP) runs its {len(module.layers)} layers as one "
                                 f"fused op, which keeps no per-layer inputs and output gradients for ghost "
                                 f"clipping; use an nn.Sequential of nn.Linear or FusedLinear layers instead "
                                 f"(FusedMLP.to_sequential() makes one with the same parameters), or freeze it")
            own = [p for p in module.parameters(recurse=False) if p.requires_grad]
            if not own:
                continue
            if fused is not None and isinstance(module, fused):
                act = _activation(module)
                if act not in _FUSED_ACTS:
                    raise ValueError(f"{_WHERE}: layer {label!r} (FusedLinear) has activation {act!r}; "
                                     f"supported: {', '.join(_FUSED_ACTS)}")
            elif isinstance(module, torch.nn.Linear):
                act = None
            else:
                raise ValueError(f"{_WHERE}: layer {label!r} ({type(module).__name__}) has trainable parameters "
                                 f"and is not supported; supported: {', '.join(SUPPORTED_LAYERS)}")
            extra = [n for n, p in module.named_parameters(recurse=False) if p.requires_grad
                     and n not in ("weight", "bias")]
            if extra:
                raise ValueError(f"{_WHERE}: layer {label!r} ({type(module).__name__}) has trainable parameters "
                                 f"{extra} besides weight and bias; not supported")
            self._layers.append((label, module, act))
        if not self._layers:
            raise ValueError(f"{_WHERE}: the model has no trainable parameters")
        #: The trainable parameters, in the order of ``max_grad_norm`` for per-layer clipping.
        self.params = [p for _, m, _ in self._layers for p in (m.weight, m.bias) if p is not None and p.requires_grad]
        if clipping == "per_layer":
            if per_param_norms is None:
                per_param_norms = [self.max_grad_norm] * len(self.params)
                self.max_grad_norm = self.max_grad_norm * math.sqrt(len(self.params))
            elif len(per_param_norms) != len(self.params):
                raise ValueError(f"{_WHERE}: max_grad_norm has {len(per_param_norms)} norms for "
                                 f"{len(self.params)} trainable parameters")
            #: per-layer clipping: each parameter's clip norm ``C_p``; ``max_grad_norm``
            #: is then ``sqrt(sum_p C_p^2)``, the sensitivity the noise is scaled to.
            self.clip_norms = {id(p): c for p, c in zip(self.params, per_param_norms)}
        if generator is None and seed is not None:
            generator = torch.Generator(device=self.params[0].device)
            generator.manual_seed(int(seed))
        self.generator = generator
        if not isinstance(cuda_graph, bool):
            raise TypeError(f"{_WHERE}: cuda_graph must be a bool, got {type(cuda_graph).__name__}")
        if cuda_graph:
            where = [p.device for p in self.params if p.device.type != "cuda"]
            if where:
                raise ValueError(f"{_WHERE}: cuda_graph=True needs CUDA parameters; one is on {where[0]}")
        self.cuda_graph = cuda_graph
        self._graphs = {}  # input shapes -> (CUDA graph, static inputs, its norms, its clip factors)

        self._records = []  # (layer index, input, output) per call
        self._index = {id(m): i for i, (_, m, _) in enumerate(self._layers)}
        self._handles = [m.register_forward_hook(self._hook, with_kwargs=True) for _, m, _ in self._layers]
        self.per_sample_norms = None
        self.clip_factors = None
        self._flat, self._views = [], None  # the gradient buffers (see _buffers)

    # -- hooks ---------------------------------------------------------------

    def _hook(self, module, args, kwargs, output):
        import torch

        if self._handles is None or not torch.is_grad_enabled() or not output.requires_grad:
            return
        a = args[0] if args else next(iter(kwargs.values()))  # forward(input) / forward(x), either way
        self._records.append((self._index[id(module)], a.detach(), output))

    def remove(self) -> None:
        """Removes the forward hooks and drops any recorded forward (the model is
        then the plain model again)."""
        for h in self._handles or ():
            h.remove()
        self._handles = None
        self._records = []

    def clear(self) -> None:
        """Drops the recorded forward passes (e.g. after a forward whose loss is not
        to be stepped)."""
        self._records = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()

    # -- the private gradient -------------------------------------------------

    def backward(self, loss) -> None:
        """Writes the private gradient into ``p.grad`` of every trainable parameter
        from the recorded forward passes that led to ``loss`` (a scalar). Use it
        instead of ``loss.backward()``. ``p.grad`` is replaced, not accumulated: it
        becomes a view of a buffer this object keeps and overwrites at each call
        (clone it to keep it)."""
        import torch

        if self._handles is None:
            raise RuntimeError(f"{_WHERE}: this DPSGD was removed")
        records, self._records = self._records, []
        if not records:
            raise RuntimeError(f"{_WHERE}: no forward pass recorded: run the model with autograd enabled "
                               f"before backward()/step(), and call it instead of loss.backward()")
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise ValueError(f"{_WHERE}: loss must be a scalar tensor (reduce it with loss_reduction="
                             f"{self.loss_reduction!r})")
        grads = torch.autograd.grad(loss, [r[2] for r in records], allow_unused=True)

        # one (a, g) per layer: [B, in] / [B, out] for a single 2-D call, else [B, T, .]
        calls = [[] for _ in self._layers]
        batch = None
        for (i, a, y), gy in zip(records, grads):
            if gy is None:
                continue
            label, module, act = self._layers[i]
            if a.dim() < 2:
                raise ValueError(f"{_WHERE}: layer {label!r} got an input of shape {tuple(a.shape)}; "
                                 f"DP-SGD needs a batch dimension first ([B, ..., in])")
            if batch is None:
                batch = a.shape[0]
            elif a.shape[0] != batch:
                raise ValueError(f"{_WHERE}: layer {label!r} got a batch of {a.shape[0]} samples, another layer "
                                 f"{batch}: the recorded forward passes do not belong to one batch (run evaluation "
                                 f"under torch.no_grad(), or clear())")
            calls[i].append((a, self._pre_activation_grad(module, act, a, y, gy)))
        if batch is None:
            raise RuntimeError(f"{_WHERE}: the loss does not depend on any recorded layer output")

        layers = []
        for i, cs in enumerate(calls):
            if not cs:
                continue
            if len(cs) == 1 and cs[0][0].dim() == 2:
                a, g = cs[0]
            else:
                a = torch.cat([c[0].reshape(batch, -1, c[0].shape[-1]) for c in cs], dim=1)
                g = torch.cat([c[1].reshape(batch, -1, c[1].shape[-1]) for c in cs], dim=1)
            layers.append((self._layers[i][1], a, g))

        # per-sample squared norms of the whole gradient (of sum-reduced losses)
        scale = float(batch) if self.loss_reduction == "mean" else 1.0
        acc = torch.float64 if any(g.dtype == torch.float64 for _, _, g in layers) else torch.float32
        denom = self.expected_batch_size if self.expected_batch_size is not None else float(batch)
        self._buffers()
        if batch == 0:  # an empty (Poisson-sampled) batch: noise only
            self._fill(self.noise_multiplier * self.max_grad_norm / denom)
            self.per_sample_norms = torch.zeros(0, dtype=acc, device=layers[0][2].device)
            self.clip_factors = None if self.clipping == "per_layer" else self.per_sample_norms
            return
        clip = self._per_layer if self.clipping == "per_layer" else self._flat_clip
        if self.cuda_graph:
            self._graphed(clip, layers, batch, scale, denom, acc)
        else:
            clip(layers, batch, scale, denom, acc)

    def _graphed(self, clip, layers, *args):
        """``clip(layers, *args)`` as a CUDA graph: captured at the first step with
        these input shapes (after an eager warm-up on a side stream, whose result is
        this step's), then replayed on copies of the step's ``a`` and ``g``."""
        import torch

        inputs = [t for _, a, g in layers for t in (a, g)]
        key = (args, tuple((id(m), tuple(a.shape), a.dtype, tuple(g.shape), g.dtype) for m, a, g in layers))
        entry = self._graphs.get(key)
        if entry is not None:
            graph, static, norms, factors = entry
            torch._foreach_copy_(static, inputs)
            graph.replay()
            self.per_sample_norms, self.clip_factors = norms, factors
            return
        static = [t.clone() for t in inputs]
        slayers = [(m, static[2 * i], static[2 * i + 1]) for i, (m, _, _) in enumerate(layers)]
        side = torch.cuda.Stream(device=static[0].device)
        side.wait_stream(torch.cuda.current_stream(static[0].device))
        with torch.cuda.stream(side):  # warm-up: cuBLAS, fusekit's modules; this step's gradient
            clip(slayers, *args)
        torch.cuda.current_stream(static[0].device).wait_stream(side)
        now = self.per_sample_norms, self.clip_factors
        graph = torch.cuda.CUDAGraph()
        if self.generator is not None:
            graph.register_generator_state(self.generator)  # fresh noise at every replay
        with torch.cuda.graph(graph):
            clip(slayers, *args)
        self._graphs[key] = (graph, static, self.per_sample_norms, self.clip_factors)
        self.per_sample_norms, self.clip_factors = now

    def _flat_clip(self, layers, batch, scale, denom, acc):
        """Flat clipping: every sample's whole gradient clipped to ``max_grad_norm``."""
        import torch

        parts, bias_grads = [], []
        for module, a, g in layers:
            if module.weight.requires_grad:
                parts.append(_as(_weight_sq_norms(a, g), acc))
            gb = None
            if module.bias is not None and module.bias.requires_grad:
                gb = g if g.dim() == 2 else g.sum(1)  # sample i's bias gradient: sum_t g_it
                parts.append(torch.linalg.vector_norm(gb, dim=1, dtype=acc).square_())  # one read of gb
            bias_grads.append(gb)
        sq = parts[0] if len(parts) == 1 else torch.stack(parts).sum(0)
        norms = sq.sqrt().mul_(scale)
        c = self.max_grad_norm
        factors = norms.clamp_min(c).reciprocal_().mul_(c)  # min(1, C / |G_i|) = C / max(|G_i|, C)
        weights = factors * (scale / denom)  # the loss scale and 1/D ride along
        self.per_sample_norms, self.clip_factors = norms, factors

        grads = self._fill(self.noise_multiplier * c / denom)
        for (module, a, g), gb in zip(layers, bias_grads):
            if module.weight.requires_grad:
                buf = grads[id(module.weight)]
                gs = g * _as(weights, g.dtype).reshape((batch,) + (1,) * (g.dim() - 1))
                buf.addmm_(_as(gs.reshape(-1, gs.shape[-1]).t(), buf.dtype), _as(a.reshape(-1, a.shape[-1]), buf.dtype))
            if gb is not None:
                buf = grads[id(module.bias)]
                buf.addmv_(_as(gb.t(), buf.dtype), _as(weights, buf.dtype))

    def _per_layer(self, layers, batch, scale, denom, acc):
        """Per-layer clipping: each weight through fusekit's ``dp_clipped_grad_sum``
        (norms and scaled rows in one kernel, then one GEMM), each bias by its own
        norm; noise scaled to ``sqrt(sum_p C_p^2)``."""
        import torch

        from .ops.optim import dp_clipped_grad_sum

        grads = self._fill(self.noise_multiplier * self.max_grad_norm / denom)
        k = scale / denom
        sq = torch.zeros(batch, dtype=acc, device=layers[0][2].device)
        for module, a, g in layers:
            if module.weight.requires_grad:
                buf = grads[id(module.weight)]
                dt = _norm_dtype(g)
                # sample i's gradient is scale * g_i^T a_i: clip g_i^T a_i at C_p / scale
                clipped, sqn = dp_clipped_grad_sum(_as(a, dt).contiguous(), _as(g, dt).contiguous(),
                                                   self.clip_norms[id(module.weight)] / scale, sq_norms=True)
                buf.add_(_as(clipped, buf.dtype), alpha=k)
                sq.add_(_as(sqn, acc), alpha=scale * scale)
            if module.bias is not None and module.bias.requires_grad:
                buf = grads[id(module.bias)]
                gb = g if g.dim() == 2 else g.sum(1)
                nb = torch.linalg.vector_norm(gb, dim=1, dtype=acc).mul_(scale)
                cb = self.clip_norms[id(module.bias)]
                fb = nb.clamp_min(cb).reciprocal_().mul_(cb * k)
                buf.addmv_(_as(gb.t(), buf.dtype), _as(fb, buf.dtype))
                sq.add_(nb.square())
        self.per_sample_norms, self.clip_factors = sq.sqrt_(), None

    def _buffers(self):
        """Sets every trainable parameter's ``p.grad`` to its view of one flat buffer
        per (device, dtype), kept across steps (every step: ``zero_grad`` may have set
        them to None). Returns {id(p): p.grad}."""
        import torch

        views = self._views
        if views is None or any(views[id(p)].device != p.device or views[id(p)].dtype != p.dtype
                                for p in self.params):
            groups = {}
            for p in self.params:
                groups.setdefault((p.device, p.dtype), []).append(p)
            self._flat, views = [], {}
            for (device, dtype), ps in groups.items():
                flat = torch.empty(sum(p.numel() for p in ps), device=device, dtype=dtype)
                self._flat.append(flat)
                offset = 0
                for p in ps:
                    views[id(p)] = flat[offset:offset + p.numel()].view(p.shape)
                    offset += p.numel()
            self._views = views
            self._graphs = {}  # captured with the old buffers
        for p in self.params:
            v = views[id(p)]
            if p.grad is not v:
                p.grad = v
        return views

    def _fill(self, std):
        """Fills the gradient buffers with N(0, std^2) (zeros for ``std = 0``): one
        random-number call per buffer. Returns {id(p): p.grad}."""
        for flat in self._flat:
            if std:
                flat.normal_(0.0, std, generator=self.generator)
            else:
                flat.zero_()
        return self._views

    @staticmethod
    def _pre_activation_grad(module, act, a, y, gy):
        """The gradient of the loss with respect to the layer's pre-activation
        ``z = a W^T + b`` (``gy`` for nn.Linear and activation "none")."""
        import torch

        if act is None or act == "none":
            return gy
        if act == "relu":
            return gy * (y > 0).to(gy.dtype)
        with torch.no_grad():  # gelu: the pre-activation is recomputed (one GEMM)
            z = torch.nn.functional.linear(a, module.weight, module.bias).to(gy.dtype)
        if act == "gelu":  # erf form: Phi(z) + z phi(z)
            cdf = 0.5 * (1.0 + torch.erf(z * (1.0 / math.sqrt(2.0))))
            pdf = torch.exp(-0.5 * z * z) * (1.0 / math.sqrt(2.0 * math.pi))
            return gy * (cdf + z * pdf)
        k = math.sqrt(2.0 / math.pi)  # gelu_tanh: 0.5 (1 + t) + 0.5 z (1 - t^2) k (1 + 3 0.044715 z^2)
        t = torch.tanh(k * (z + 0.044715 * z * z * z))
        return gy * (0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * z * z))

    def step(self, loss=None):
        """:meth:`backward` (when ``loss`` is given), then ``optimizer.step()``."""
        if self.optimizer is None:
            raise RuntimeError(f"{_WHERE}: no optimizer was given; call backward(loss) and step your optimizer")
        if loss is not None:
            self.backward(loss)
        return self.optimizer.step()

    def __repr__(self) -> str:
        return (f"DPSGD(layers={[n for n, _, _ in self._layers]}, max_grad_norm={self.max_grad_norm}, "
                f"noise_multiplier={self.noise_multiplier}, expected_batch_size={self.expected_batch_size}, "
                f"loss_reduction={self.loss_reduction!r}, clipping={self.clipping!r}, cuda_graph={self.cuda_graph})")


def _weight_sq_norms(a, g):
    """``|g_i^T a_i|_F^2`` ``[B]`` (float64 for float64 inputs, else float32) through fusekit's per-sample norm op:
    ``|a_i|^2 |g_i|^2`` for ``[B, in]``/``[B, out]``, the Gram form
    ``<a_i a_i^T, g_i g_i^T>`` for sequences ``[B, T, .]``."""
    import torch

    from .ops.optim import per_sample_grad_norms

    dt = _norm_dtype(g)
    return per_sample_grad_norms(_as(a, dt).contiguous(), _as(g, dt).contiguous())


def _as(t, dtype):
    """``t`` in ``dtype`` (itself when it already is: no conversion call on the hot path)."""
    return t if t.dtype == dtype else t.to(dtype)


def _norm_dtype(g):
    """The dtype fusekit's per-sample ops run in for output gradients ``g``: theirs
    for float32/float64, float32 otherwise."""
    import torch

    return g.dtype if g.dtype in (torch.float32, torch.float64) else torch.float32
