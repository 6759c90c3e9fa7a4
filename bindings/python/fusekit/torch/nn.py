"""Drop-in ``torch.nn`` modules on fusekit's compiled torch ops.

Import it explicitly (it imports torch and loads the compiled ops; ``import
fusekit`` alone does neither); ``fusekit.nn`` is the same module::

    import fusekit.nn as fnn                  # or: import fusekit.torch.nn as fnn
    layer = fnn.FusedLinear(256, 128, activation="gelu")       # like nn.Linear + F.gelu
    field = fnn.GaussianField(512, volume_size=2.0)             # density at [B,3] points
    flow = fnn.LeapfrogIntegrator(64, 8, dt=0.1, steps=4)      # (x, v) -> (x_T, v_T)

Every module runs on the CPU and on CUDA (the device of its parameters), is
differentiable through fusekit's fused backward kernels, and traces under
``torch.compile(fullgraph=True)`` and CUDA graph capture (the ops are
``torch.ops.fusekit.*`` custom ops with fake implementations). docs/nn.md describes
each module; docs/ops.md gives the exact formulas of the ops underneath.

- :class:`FusedLinear`: ``act(x W^T + b)`` in one fused op; ``weight``/``bias`` and
  ``state_dict`` as ``nn.Linear`` (float16, bfloat16, float32).
- :class:`GaussianField`: a learnable field of 3-D Gaussians, ``density [B]`` at
  ``points [B,3]`` (float32, float64).
- :class:`LowRankChristoffel`: the clamped low-rank Christoffel map ``Gamma(v)``.
- :class:`LeapfrogIntegrator`: ``steps`` fused kick-drift-kick steps of the geodesic
  flow of a :class:`LowRankChristoffel` (float32, float64).
"""

from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple, Union

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from .._args import ACTIVATIONS  # noqa: F401 - the activations of FusedLinear (re-exported)
from .._args import check_activation as _activation
from .._args import check_bool as _bool
from .._args import check_float as _float
from .._args import check_int as _int
from .._args import check_volume as _volume
from ..ops import gaussian as _gaussian
from ..ops import geodesic as _geodesic
from .gaussian import gaussian_field  # (the family modules load the compiled ops: ImportError when not built)
from .geodesic import _check_precision, christoffel, leapfrog
from .linalg import linear
from .mlp import mlp

__all__ = [
    "ACTIVATIONS", "DEFAULT_FRICTION", "FusedLinear", "FusedMLP", "GaussianField", "LowRankChristoffel", "LeapfrogIntegrator",
]


_LINEAR_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_FIELD_DTYPES = (torch.float32, torch.float64)

# ----------------------------------------------------------------------------- argument checks


def _dtype(where: str, dtype, allowed) -> torch.dtype:
    d = torch.get_default_dtype() if dtype is None else dtype
    if not isinstance(d, torch.dtype) or d not in allowed:
        names = ", ".join(str(a).replace("torch.", "") for a in allowed)
        raise TypeError(f"{where}: dtype must be one of {names}, not {d}")
    return d


def _check_input(where: str, name: str, t, like: Tensor, shape_ok: bool, expected: str) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"{where}: {name} must be a torch.Tensor, not {type(t).__name__}")
    if not shape_ok:
        raise ValueError(f"{where}: {name} must be {expected}, got shape {tuple(t.shape)}")
    if t.dtype != like.dtype:
        raise TypeError(f"{where}: {name} is {t.dtype} but the module's parameters are {like.dtype}")
    if t.device != like.device:
        raise ValueError(f"{where}: {name} is on {t.device} but the module's parameters are on {like.device}")


# ----------------------------------------------------------------------------- FusedLinear


class FusedLinear(nn.Module):
    """``y = act(x W^T + b)`` in one fused fusekit op (``torch.ops.fusekit.linear``):
    the GEMM, bias and activation in one kernel forward, and one fused backward.

    A drop-in for ``nn.Linear`` followed by the activation: the parameters are
    ``weight`` ``[out_features, in_features]`` and ``bias`` ``[out_features]`` (None
    with ``bias=False``), initialised as ``nn.Linear`` initialises them (the same
    values for the same RNG state), so the two modules load each other's
    ``state_dict``. :meth:`from_linear` converts an ``nn.Linear``.

    Args:
        in_features: size of the input's last dimension (>= 1).
        out_features: size of the output's last dimension (>= 1).
        bias: whether the layer has a learnable bias.
        activation: one of :data:`ACTIVATIONS`: ``"relu"`` (default), ``"gelu"``
            (exact erf GELU, ``F.gelu(z)``), ``"gelu_tanh"`` (``F.gelu(z,
            approximate="tanh")``) or ``"none"``.
        device, dtype: of the parameters; float16, bfloat16 or float32 (fusekit's
            fused layer has no float64 kernel; use ``nn.Linear`` there).

    Input ``[..., in_features]`` (any leading shape) of the parameters' dtype and
    device; output ``[..., out_features]``. Products accumulate in float32 and the
    bias and activation are applied in float32 before one rounding (docs/ops.md 2.4).
    """

    __constants__ = ["in_features", "out_features", "activation"]

    def __init__(self, in_features: int, out_features: int, bias: bool = True, activation: str = "relu",
                 device=None, dtype=None):
        super().__init__()
        where = "FusedLinear"
        self.in_features = _int(where, "in_features", in_features, 1)
        self.out_features = _int(where, "out_features", out_features, 1)
        _bool(where, "bias", bias)
        self.activation = _activation(where, activation)
        kw = {"device": device, "dtype": _dtype(where, dtype, _LINEAR_DTYPES)}
        self.weight = nn.Parameter(torch.empty((self.out_features, self.in_features), **kw))
        if bias:
            self.bias = nn.Parameter(torch.empty(self.out_features, **kw))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """``nn.Linear``'s initialisation (Kaiming-uniform weight, uniform bias in
        ``+-1/sqrt(in_features)``)."""
        nn.Linear.reset_parameters(self)

    @classmethod
    def from_linear(cls, linear: nn.Linear, activation: str = "relu") -> "FusedLinear":
        """A FusedLinear with a copy of ``linear``'s weight and bias (same device,
        dtype and ``requires_grad``), computing ``activation(linear(x))``."""
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"FusedLinear.from_linear: linear must be a torch.nn.Linear, not {type(linear).__name__}")
        w, b = linear.weight, linear.bias
        m = cls(linear.in_features, linear.out_features, bias=b is not None, activation=activation,
                device=w.device, dtype=w.dtype)
        with torch.no_grad():
            m.weight.copy_(w)
            m.weight.requires_grad_(w.requires_grad)
            if b is not None:
                m.bias.copy_(b)
                m.bias.requires_grad_(b.requires_grad)
        return m

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.bias, self.activation)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, activation={self.activation!r}")


class FusedMLP(nn.Module):
    """A multi-layer perceptron ``Linear -> act -> ... -> Linear [-> out act]`` as
    one fused fusekit op each way (``torch.ops.fusekit.mlp`` / ``mlp_backward``:
    ``fk_mlp_forward`` / ``fk_mlp_backward``, every layer's GEMM, bias and
    activation in one call, the backward's weight gradients overlapped on CUDA):
    one autograd node and one compiled-op call per direction, whatever the depth.

    The layers are ``nn.Linear`` children named as ``nn.Sequential(Linear, ReLU,
    Linear, ..., Linear)`` names them (``"0"``, ``"2"``, ``"4"``, ...; ``"0"``,
    ``"1"``, ... when ``hidden_activation="none"``), so the parameters are
    ``0.weight``, ``0.bias``, ``2.weight``, ... and the two load each other's
    ``state_dict``; they are initialised as that Sequential initialises them (the
    same values for the same RNG state). :meth:`from_sequential` converts such a
    Sequential, :meth:`to_sequential` goes back.

    Args:
        widths: ``[in_features, hidden_1, ..., out_features]`` (2 to 65 entries,
            each >= 1): one layer per consecutive pair.
        bias: whether the layers have biases (a bool for all, or one per layer).
        hidden_activation: the activation after every layer but the last, one of
            :data:`ACTIVATIONS` (default ``"relu"``).
        out_activation: the activation after the last layer (default ``"none"``).
        allow_tf32: let float32 products use TF32 tensor cores on CUDA.
        device, dtype: of the parameters; float16, bfloat16 or float32.

    Input ``[..., in_features]`` of the parameters' dtype and device; output
    ``[..., out_features]``. Each layer accumulates in float32, applies bias and
    activation in float32 and rounds once to the dtype (docs/ops.md section 6).
    The forward keeps for the backward only ReLU's one-bit masks (the GELUs'
    pre-activations) and the hidden outputs.
    """

    __constants__ = ["widths", "hidden_activation", "out_activation", "allow_tf32"]

    def __init__(self, widths: Sequence[int], bias: Union[bool, Sequence[bool]] = True,
                 hidden_activation: str = "relu", out_activation: str = "none", allow_tf32: bool = False,
                 device=None, dtype=None):
        super().__init__()
        where = "FusedMLP"
        if isinstance(widths, (str, bytes)) or not isinstance(widths, Sequence):
            raise TypeError(f"{where}: widths must be a sequence of ints, not {type(widths).__name__}")
        if not 2 <= len(widths) <= 65:
            raise ValueError(f"{where}: widths must have 2 to 65 entries (1 to 64 layers), got {len(widths)}")
        self.widths = tuple(_int(where, f"widths[{i}]", w, 1) for i, w in enumerate(widths))
        n = len(self.widths) - 1
        biases = [bias] * n if isinstance(bias, bool) else list(bias)
        if len(biases) != n:
            raise ValueError(f"{where}: bias has {len(biases)} entries but there are {n} layers")
        for i, b in enumerate(biases):
            _bool(where, f"bias[{i}]", b)
        self.hidden_activation = _activation(where, hidden_activation)
        self.out_activation = _activation(where, out_activation)
        self.allow_tf32 = _bool(where, "allow_tf32", allow_tf32)
        kw = {"device": device, "dtype": _dtype(where, dtype, _LINEAR_DTYPES)}
        stride = 1 if self.hidden_activation == "none" else 2
        self._layer_names = [str(stride * i) for i in range(n)]
        for name, k, m, b in zip(self._layer_names, self.widths[:-1], self.widths[1:], biases):
            self.add_module(name, nn.Linear(k, m, bias=b, **kw))

    @property
    def layers(self) -> list:
        """The ``nn.Linear`` layers, in order."""
        return [getattr(self, name) for name in self._layer_names]

    def reset_parameters(self) -> None:
        """``nn.Linear``'s initialisation of every layer."""
        for layer in self.layers:
            layer.reset_parameters()

    @classmethod
    def from_sequential(cls, seq: nn.Sequential, allow_tf32: bool = False) -> "FusedMLP":
        """A FusedMLP with copies of the parameters of ``seq`` = ``nn.Sequential(Linear,
        act, Linear, act, ..., Linear[, out_act])`` (the same activation between all
        layers: ``nn.ReLU``, ``nn.GELU`` of either approximation, or none at all;
        same device, dtype and ``requires_grad``)."""
        where = "FusedMLP.from_sequential"
        if not isinstance(seq, nn.Sequential):
            raise TypeError(f"{where}: seq must be a torch.nn.Sequential, not {type(seq).__name__}")
        mods = list(seq)
        linears, acts = [], []  # acts[i]: the activation module after linear i (None: none)
        i = 0
        while i < len(mods):
            if not isinstance(mods[i], nn.Linear):
                raise ValueError(f"{where}: module {i} is a {type(mods[i]).__name__}, expected nn.Linear")
            linears.append(mods[i])
            act = None
            if i + 1 < len(mods) and not isinstance(mods[i + 1], nn.Linear):
                act = _module_activation(where, i + 1, mods[i + 1])
                i += 1
            acts.append(act)
            i += 1
        if not linears:
            raise ValueError(f"{where}: seq holds no nn.Linear")
        hidden = set(acts[:-1])
        if len(hidden) > 1:
            raise ValueError(f"{where}: the hidden layers' activations differ ({sorted(map(str, hidden))}); "
                             "FusedMLP applies one activation between all layers")
        hidden_act = hidden.pop() if hidden else "relu"
        hidden_act = hidden_act or "none"
        w0 = linears[0].weight
        m = cls([linears[0].in_features] + [lin.out_features for lin in linears],
                bias=[lin.bias is not None for lin in linears], hidden_activation=hidden_act,
                out_activation=acts[-1] or "none", allow_tf32=allow_tf32, device=w0.device, dtype=w0.dtype)
        for i, lin in enumerate(linears):
            if lin.in_features != m.widths[i]:
                raise ValueError(f"{where}: layer {i} takes {lin.in_features} inputs but layer {i - 1} gives "
                                 f"{m.widths[i]}")
        with torch.no_grad():
            for src, dst in zip(linears, m.layers):
                for name in ("weight", "bias"):
                    s, t = getattr(src, name), getattr(dst, name)
                    if s is not None:
                        t.copy_(s)
                        t.requires_grad_(s.requires_grad)
        return m

    def to_sequential(self) -> nn.Sequential:
        """The equivalent ``nn.Sequential`` (copies of the parameters, with their
        ``requires_grad``: a frozen layer stays frozen, as in :meth:`from_sequential`)."""
        mods = []
        for i, layer in enumerate(self.layers):
            lin = nn.Linear(layer.in_features, layer.out_features, bias=layer.bias is not None,
                            device=layer.weight.device, dtype=layer.weight.dtype)
            lin.load_state_dict(layer.state_dict())
            for name, p in lin.named_parameters():
                p.requires_grad_(getattr(layer, name).requires_grad)
            mods.append(lin)
            act = self.out_activation if i == len(self._layer_names) - 1 else self.hidden_activation
            if act != "none":
                mods.append(_ACTIVATION_MODULES[act]())
        return nn.Sequential(*mods)

    def forward(self, x: Tensor) -> Tensor:
        layers = self.layers
        biases = [layer.bias for layer in layers]
        return mlp(x, [layer.weight for layer in layers], biases if any(b is not None for b in biases) else None,
                   self.hidden_activation, self.out_activation, allow_tf32=self.allow_tf32)

    def extra_repr(self) -> str:
        return (f"widths={list(self.widths)}, hidden_activation={self.hidden_activation!r}, "
                f"out_activation={self.out_activation!r}")


_ACTIVATION_MODULES = {"relu": nn.ReLU, "gelu": nn.GELU, "gelu_tanh": lambda: nn.GELU(approximate="tanh")}


def _module_activation(where: str, index: int, mod) -> str:
    if isinstance(mod, nn.ReLU):
        return "relu"
    if isinstance(mod, nn.GELU):
        return "gelu_tanh" if mod.approximate == "tanh" else "gelu"
    raise ValueError(f"{where}: module {index} is a {type(mod).__name__}; FusedMLP takes nn.ReLU or nn.GELU "
                     "between the nn.Linear layers")


# ----------------------------------------------------------------------------- GaussianField


class GaussianField(nn.Module):
    """A learnable field of ``num_gaussians`` unnormalised 3-D Gaussians::

        density(p) = sum_n w_n exp(-0.5 (p - mu_n)^T Sigma_n^-1 (p - mu_n)),
        Sigma_n = M_n M_n^T,  M_n = L_n + eps I

    evaluated by fusekit's fused field op (``torch.ops.fusekit.gaussian_field``: no
    ``[B, N]`` array, forward or backward; docs/ops.md section 3).

    Parameters (all learnable):

    - ``means`` ``[N, 3]``: the centres ``mu_n``, initialised uniformly in the volume;
    - ``raw_diag`` ``[N, 3]``: the diagonal of each Cholesky factor ``L_n`` is
      ``softplus(raw_diag)`` (always positive); initialised so that every Gaussian
      has standard deviation half the mean spacing ``(volume / N)^(1/3)`` along
      each axis;
    - ``offdiag`` ``[N, 3]`` (``full_covariance=True`` only): the strictly lower
      entries ``L[1,0], L[2,0], L[2,1]``, initialised to 0 (axis-aligned Gaussians
      to start from). With ``full_covariance=False`` the factors, hence the
      covariances, are diagonal;
    - ``weights`` ``[N]``: the amplitudes ``w_n`` (unconstrained), initialised to 1.

    :meth:`cholesky` gives the factors ``L_n``; :meth:`covariances` the covariances
    ``Sigma_n`` the field evaluates (with ``eps``).

    Args:
        num_gaussians: N >= 1.
        volume_size: edge length of the box ``[-s/2, s/2]^3`` the means start in (a
            float, or three floats for a box of edges ``(sx, sy, sz)``); > 0.
        full_covariance: full (True) or diagonal (False) covariances.
        eps: added to the diagonal of each ``L_n`` by the op (>= 0; default 1e-6,
            fusekit's ``FK_GAUSSIAN_DEFAULT_EPS``).
        device, dtype: of the parameters; float32 or float64.

    ``forward(points)``: ``points`` ``[B, 3]`` of the parameters' dtype and device;
    returns the density ``[B]``, differentiable with respect to ``points`` and every
    parameter.
    """

    def __init__(self, num_gaussians: int, volume_size: Union[float, Sequence[float]] = 2.0,
                 full_covariance: bool = True, eps: float = _gaussian.DEFAULT_EPS, device=None, dtype=None):
        super().__init__()
        where = "GaussianField"
        self.num_gaussians = _int(where, "num_gaussians", num_gaussians, 1)
        self.volume_size = _volume(where, volume_size)
        self.full_covariance = _bool(where, "full_covariance", full_covariance)
        self.eps = _float(where, "eps", eps, nonnegative=True)
        kw = {"device": device, "dtype": _dtype(where, dtype, _FIELD_DTYPES)}
        n = self.num_gaussians
        self.means = nn.Parameter(torch.empty((n, 3), **kw))
        self.raw_diag = nn.Parameter(torch.empty((n, 3), **kw))
        if self.full_covariance:
            self.offdiag = nn.Parameter(torch.empty((n, 3), **kw))
        else:
            self.register_parameter("offdiag", None)
        self.weights = nn.Parameter(torch.empty(n, **kw))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Means uniform in the volume, standard deviations half the mean spacing,
        no correlation, unit weights."""
        size = torch.tensor(self.volume_size, dtype=torch.float64)
        sigma = 0.5 * (float(size.prod()) / self.num_gaussians) ** (1.0 / 3.0)
        with torch.no_grad():
            u = torch.rand(self.means.shape, dtype=torch.float64)
            self.means.copy_((u - 0.5) * size)
            self.raw_diag.fill_(math.log(math.expm1(sigma)))  # softplus^-1(sigma)
            if self.offdiag is not None:
                self.offdiag.zero_()
            self.weights.fill_(1.0)

    def cholesky(self) -> Tensor:
        """The lower-triangular factors ``L_n`` ``[N, 3, 3]`` (positive diagonal;
        differentiable). The op adds ``eps`` to their diagonal."""
        d0, d1, d2 = F.softplus(self.raw_diag).unbind(-1)
        z = torch.zeros_like(d0)
        a, b, c = self.offdiag.unbind(-1) if self.offdiag is not None else (z, z, z)
        return torch.stack((d0, z, z, a, d1, z, b, c, d2), dim=-1).view(-1, 3, 3)

    def covariances(self) -> Tensor:
        """The covariances ``Sigma_n = (L_n + eps I)(L_n + eps I)^T`` ``[N, 3, 3]``
        the field evaluates (differentiable)."""
        m = self.cholesky() + self.eps * torch.eye(3, dtype=self.means.dtype, device=self.means.device)
        return m @ m.transpose(-1, -2)

    def forward(self, points: Tensor) -> Tensor:
        _check_input("GaussianField", "points", points, self.means,
                     isinstance(points, Tensor) and points.dim() == 2 and points.shape[-1] == 3, "[B, 3]")
        return gaussian_field(points, self.means, self.cholesky(), self.weights, self.eps)

    def extra_repr(self) -> str:
        size = self.volume_size[0] if len(set(self.volume_size)) == 1 else self.volume_size
        return (f"num_gaussians={self.num_gaussians}, volume_size={size}, "
                f"full_covariance={self.full_covariance}, eps={self.eps}")


# ----------------------------------------------------------------------------- geodesic flow


class LowRankChristoffel(nn.Module):
    """The clamped low-rank Christoffel map of fusekit's geodesic flow
    (``torch.ops.fusekit.christoffel``; docs/ops.md 5.1)::

        Gamma(v) = clamp(((v U) * (v U)) W^T, -clamp, clamp)     v [B, dim] -> [B, dim]

    Parameters ``U`` and ``W`` ``[dim, rank]``, initialised normal with standard
    deviations ``1/sqrt(dim)`` (so ``v U`` is of the order of 1 for a velocity of
    unit-scale entries) and ``0.1/sqrt(rank)`` (a gently curved flow at the start:
    ``Gamma`` of such a velocity is about 0.2).

    Args:
        dim: D >= 1, the feature dimension.
        rank: R >= 1.
        clamp: the bound ``c`` >= 0 of the clamp (``math.inf``: none); default 5.0.
        precision: of the f32 forward on CUDA: None (default: follow
            ``torch.get_float32_matmul_precision()``, read at each call, or when
            torch.compile traces it), "strict", "tf32" or "tf32x3" (strict here: the
            op has no 3xTF32); see ``fusekit.torch.geodesic`` and docs/geodesic.md.
            The attribute ``precision`` can be set later (checked when set).
        device, dtype: of the parameters; float32 or float64.
    """

    def __init__(self, dim: int, rank: int, clamp: float = _geodesic.DEFAULT_C, device=None, dtype=None,
                 precision: Optional[str] = None):
        super().__init__()
        where = "LowRankChristoffel"
        self.dim = _int(where, "dim", dim, 1)
        self.rank = _int(where, "rank", rank, 1)
        self.clamp = _float(where, "clamp", clamp, nonnegative=True, allow_inf=True)
        self.precision = precision
        kw = {"device": device, "dtype": _dtype(where, dtype, _FIELD_DTYPES)}
        self.U = nn.Parameter(torch.empty((self.dim, self.rank), **kw))
        self.W = nn.Parameter(torch.empty((self.dim, self.rank), **kw))
        self.reset_parameters()

    @property
    def precision(self) -> Optional[str]:
        """None (follow torch), "strict", "tf32x3" or "tf32"; checked when set."""
        return self._precision

    @precision.setter
    def precision(self, value: Optional[str]) -> None:
        self._precision = None if value is None else _check_precision(type(self).__name__, value)

    def reset_parameters(self) -> None:
        with torch.no_grad():
            nn.init.normal_(self.U, std=self.dim ** -0.5)
            nn.init.normal_(self.W, std=0.1 * self.rank ** -0.5)

    def forward(self, v: Tensor) -> Tensor:
        _check_input("LowRankChristoffel", "v", v, self.U,
                     isinstance(v, Tensor) and v.dim() == 2 and v.shape[-1] == self.dim, f"[B, {self.dim}]")
        return christoffel(v, self.U, self.W, self.clamp, precision=self.precision)

    def extra_repr(self) -> str:
        prec = "" if self.precision is None else f", precision={self.precision!r}"
        return f"dim={self.dim}, rank={self.rank}, clamp={self.clamp}{prec}"


#: The per-feature friction coefficient ``friction=True`` starts from.
DEFAULT_FRICTION = 0.1


class LeapfrogIntegrator(nn.Module):
    """``steps`` kick-drift-kick steps of the geodesic flow in one fused op
    (``torch.ops.fusekit.leapfrog``; docs/ops.md 5.3), with ``h = dt/2``::

        vh = v  + h (f - Gamma(v)  - mu v)
        x  = x  + dt vh
        v  = vh + h (f - Gamma(vh) - mu vh)

    ``Gamma`` is the submodule ``christoffel`` (a :class:`LowRankChristoffel`; its
    ``U`` and ``W`` are this module's learnable parameters, ``christoffel.U`` and
    ``christoffel.W`` in the ``state_dict``).

    Args:
        dim, rank, clamp: of ``Gamma`` (see :class:`LowRankChristoffel`).
        dt: the step (finite float).
        steps: T >= 1 steps per call.
        friction: False (no friction term), True (a per-feature friction ``mu``
            ``[dim]`` starting at :data:`DEFAULT_FRICTION`) or a float >= 0 (``mu``
            starting at that value). ``mu`` is a buffer, not a parameter: fusekit's
            fused leapfrog backward gives no gradient for it. Set it with
            ``integrator.mu.copy_(...)``; it is saved in the ``state_dict``.
        save_traj: the trajectory policy of ``fusekit.torch.geodesic.leapfrog``:
            None (default) writes the ``[steps, 2, B, dim]`` trajectory exactly
            when a gradient can be asked for (grad mode on and an input or
            parameter requiring grad), and the backward reads it; False never
            writes it (the backward recomputes it on chip: no extra memory, about
            1.3x the backward's time); True always writes it.
        precision: of the f32 forward on CUDA: None (default: follow
            ``torch.get_float32_matmul_precision()``: "highest" strict, "high" and
            "medium" 3xTF32; read at each call, or when torch.compile traces it),
            "strict", "tf32x3" (3xTF32, f32-level accuracy) or "tf32" (TF32, about
            1e-4 relative error); see ``fusekit.torch.geodesic`` and
            docs/geodesic.md. The backward is strict. The attribute
            ``precision`` (checked when set) is the submodule ``christoffel``'s:
            one setting for both.
        device, dtype: of the parameters; float32 or float64.

    ``forward(x, v, force=None) -> (x_T, v_T)``: ``x``, ``v`` and the optional
    constant force ``force`` are ``[B, dim]`` of the parameters' dtype and device;
    differentiable with respect to ``x``, ``v``, ``force``, ``U`` and ``W``.
    """

    def __init__(self, dim: int, rank: int, dt: float, steps: int, friction: Union[bool, float] = False,
                 clamp: float = _geodesic.DEFAULT_C, save_traj: Optional[bool] = None, device=None, dtype=None,
                 precision: Optional[str] = None):
        super().__init__()
        where = "LeapfrogIntegrator"
        self.christoffel = LowRankChristoffel(dim, rank, clamp, device=device, dtype=dtype)
        self.precision = precision
        self.dt = _float(where, "dt", dt)
        self.steps = _int(where, "steps", steps, 1)
        if save_traj is not None:
            _bool(where, "save_traj", save_traj)
        self.save_traj = save_traj
        if isinstance(friction, bool):
            mu0 = DEFAULT_FRICTION if friction else None
        else:
            mu0 = _float(where, "friction", friction, nonnegative=True)
        if mu0 is None:
            self.register_buffer("mu", None)
        else:
            self.register_buffer("mu", torch.full((self.christoffel.dim,), mu0, dtype=self.christoffel.U.dtype,
                                                  device=self.christoffel.U.device))

    @property
    def precision(self) -> Optional[str]:
        """The submodule ``christoffel``'s precision (one setting for both); checked when set."""
        return self.christoffel.precision

    @precision.setter
    def precision(self, value: Optional[str]) -> None:
        self.christoffel._precision = None if value is None else _check_precision(type(self).__name__, value)

    @property
    def dim(self) -> int:
        return self.christoffel.dim

    @property
    def rank(self) -> int:
        return self.christoffel.rank

    def forward(self, x: Tensor, v: Tensor, force: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        where, U = "LeapfrogIntegrator", self.christoffel.U
        expected = f"[B, {self.dim}]"
        _check_input(where, "v", v, U, isinstance(v, Tensor) and v.dim() == 2 and v.shape[-1] == self.dim, expected)
        _check_input(where, "x", x, U, isinstance(x, Tensor) and x.shape == v.shape, f"{tuple(v.shape)} (v's shape)")
        if force is not None:
            _check_input(where, "force", force, U, isinstance(force, Tensor) and force.shape == v.shape,
                         f"{tuple(v.shape)} (v's shape)")
        return leapfrog(x, v, U, self.christoffel.W, self.dt, self.steps, f=force, mu=self.mu,
                        c=self.christoffel.clamp, save_traj=self.save_traj, precision=self.precision)

    def extra_repr(self) -> str:
        mu = "False" if self.mu is None else "True"
        prec = "" if self.precision is None else f", precision={self.precision!r}"
        return f"dt={self.dt}, steps={self.steps}, friction={mu}, save_traj={self.save_traj}{prec}"
