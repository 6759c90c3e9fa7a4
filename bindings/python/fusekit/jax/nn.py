"""Modules for JAX users on :mod:`fusekit.jax`'s ops, as plain functions on pytrees.

A module here is a frozen, hashable description of a layer (its sizes and
options, no arrays): ``init(key)`` makes its parameters, a dict of arrays, and
calling it with those parameters applies it::

    import jax, jax.numpy as jnp
    import fusekit.jax.nn as fknn

    layer = fknn.FusedLinear(784, 512, activation="gelu")
    params = layer.init(jax.random.key(0))        # {"weight": [512, 784], "bias": [512]}
    y = jax.jit(layer)(params, x)                 # fusekit.jax.linear: one fused op each way
    g = jax.grad(lambda p: layer(p, x).sum())(params)

The parameters are an ordinary pytree, so ``jax.grad``, ``jax.jit``, ``vmap``,
optax (``fusekit.jax.optim.shampoo`` among them), checkpointing and any JAX
library take them as they are; the module object is static (close over it, or
pass it as a static argument). docs/jax.md, "Modules", says why these are plain
functions and not flax modules, and how to use them from ``flax.nnx``.

The modules mirror ``fusekit.nn`` (docs/nn.md): the same parameters under the
same names (a torch ``state_dict`` converts key for key, ``"christoffel.U"``
becoming ``params["christoffel"]["U"]``), drawn from the same distributions,
and the same formulas through the same fused kernels:

- :class:`FusedLinear`: ``act(x W^T + b)`` (``fusekit.jax.linear``; float16,
  bfloat16, float32).
- :class:`FusedMLP`: a stack of such layers in one fused op each way
  (``fusekit.jax.mlp``; the parameters named as ``fusekit.nn.FusedMLP``'s).
- :class:`GaussianField`: a learnable field of 3-D Gaussians, ``density [B]`` at
  ``points [B, 3]`` (``fusekit.jax.gaussian_field``; float32, float64).
- :class:`LowRankChristoffel`: ``clamp((v U)^2 W^T, -c, c)``
  (``fusekit.jax.christoffel``).
- :class:`LeapfrogIntegrator`: ``steps`` kick-drift-kick steps of that flow
  (``fusekit.jax.leapfrog``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np

from .. import _lib
from .._args import ACTIVATIONS as _ACTIVATIONS
from .._args import check_activation as _activation
from .._args import check_bool as _bool
from .._args import check_float as _float
from .._args import check_int as _int
from .._args import check_volume as _volume
from . import DEFAULT_C, christoffel, gaussian_field, leapfrog, linear, mlp

__all__ = ["ACTIVATIONS", "DEFAULT_EPS", "DEFAULT_FRICTION", "FusedLinear", "FusedMLP", "GaussianField",
           "LowRankChristoffel", "LeapfrogIntegrator"]

#: The activations of :class:`FusedLinear`, named as ``fusekit.nn`` (torch) names
#: them: ``"gelu"`` is the exact (erf) GELU, ``jax.nn.gelu(z, approximate=False)``;
#: ``"gelu_tanh"`` the tanh approximation, ``jax.nn.gelu(z)``.
ACTIVATIONS = _ACTIVATIONS
#: :class:`GaussianField`'s default ``eps`` (fusekit's ``FK_GAUSSIAN_DEFAULT_EPS``).
DEFAULT_EPS = 1e-6
#: The per-feature friction ``friction=True`` gives (as ``fusekit.nn.DEFAULT_FRICTION``).
DEFAULT_FRICTION = 0.1

_LINEAR_DTYPES = (jnp.float16, jnp.bfloat16, jnp.float32)
_FIELD_DTYPES = (jnp.float32, jnp.float64)


# ----------------------------------------------------------------------------- argument checks


def _dtype(where: str, dtype, allowed) -> np.dtype:
    try:
        d = np.dtype(dtype)
    except TypeError:
        d = None
    if d is None or d not in [np.dtype(a) for a in allowed]:
        names = ", ".join(np.dtype(a).name for a in allowed)
        raise TypeError(f"{where}: dtype must be one of {names}, not {dtype if d is None else d.name}")
    return d


def _rows(where: str, name: str, x, width: int, expected: str):
    """``x`` as a jax array of shape ``[B, width]`` (ValueError naming the module otherwise)."""
    x = jnp.asarray(x)
    if x.ndim != 2 or x.shape[-1] != width:
        raise ValueError(f"{where}: {name} must be {expected}, got shape {tuple(x.shape)}")
    return x


def _set(obj, **fields) -> None:
    """Sets the checked fields of a frozen dataclass in its ``__post_init__``."""
    for k, v in fields.items():
        object.__setattr__(obj, k, v)


# ----------------------------------------------------------------------------- FusedLinear


@dataclasses.dataclass(frozen=True)
class FusedLinear:
    """``y = act(x W^T + b)`` as one fused fusekit op each way (``fusekit.jax.linear``).

    ``init(key)`` gives ``{"weight": [out_features, in_features], "bias":
    [out_features]}`` (no ``"bias"`` with ``bias=False``), drawn as ``nn.Linear``
    draws them: both uniform in ``+-1/sqrt(in_features)``. ``layer(params, x)``:
    ``x [..., in_features]`` of the parameters' dtype gives ``[..., out_features]``,
    differentiable through fusekit's fused backward.

    Args:
        in_features, out_features: ints >= 1.
        bias: whether the layer has a bias.
        activation: one of :data:`ACTIVATIONS` (default ``"relu"``, as ``fusekit.nn``).
        dtype: of the parameters: float16, bfloat16 or float32 (fusekit's fused
            layer has no float64 kernel). Products accumulate in float32; bias and
            activation are applied in float32 before one rounding.
    """

    in_features: int
    out_features: int
    bias: bool = True
    activation: str = "relu"
    dtype: object = jnp.float32

    def __post_init__(self):
        where = "FusedLinear"
        _set(self, in_features=_int(where, "in_features", self.in_features, 1),
             out_features=_int(where, "out_features", self.out_features, 1),
             bias=_bool(where, "bias", self.bias), activation=_activation(where, self.activation),
             dtype=_dtype(where, self.dtype, _LINEAR_DTYPES))

    def init(self, key) -> dict:
        bound = 1.0 / math.sqrt(self.in_features)
        kw, kb = jax.random.split(key)
        params = {"weight": jax.random.uniform(kw, (self.out_features, self.in_features), self.dtype, -bound, bound)}
        if self.bias:
            params["bias"] = jax.random.uniform(kb, (self.out_features,), self.dtype, -bound, bound)
        return params

    def __call__(self, params, x):
        return linear(x, params["weight"], params["bias"] if self.bias else None, self.activation)

    apply = __call__


# ----------------------------------------------------------------------------- FusedMLP


@dataclasses.dataclass(frozen=True)
class FusedMLP:
    """A multi-layer perceptron as one fused fusekit op each way
    (``fusekit.jax.mlp``: ``fk_mlp_forward`` / ``fk_mlp_backward``).

    ``init(key)`` gives one ``{"weight": [n_i, k_i], "bias": [n_i]}`` per layer
    (no ``"bias"`` for a layer without), keyed as ``fusekit.nn.FusedMLP`` names its
    ``nn.Linear`` children: ``"0"``, ``"2"``, ``"4"``, ... (``"0"``, ``"1"``, ...
    when ``hidden_activation="none"``), so a torch ``state_dict`` converts key for
    key (``"2.weight"`` is ``params["2"]["weight"]``); each drawn as
    :class:`FusedLinear` draws it. ``net(params, x)``: ``x [..., widths[0]]`` of the
    parameters' dtype gives ``[..., widths[-1]]``.

    Args:
        widths: ``(in_features, hidden_1, ..., out_features)``, 2 to 65 ints >= 1
            (1 to 64 layers).
        bias: whether the layers have biases (a bool for all, or one per layer).
        hidden_activation: after every layer but the last, one of :data:`ACTIVATIONS`.
        out_activation: after the last layer (default ``"none"``).
        dtype: of the parameters: float16, bfloat16 or float32.
        precision: f32 products strict or TF32 on CUDA (see
            ``fusekit.jax.allow_tf32``); None follows ``jax_default_matmul_precision``.
    """

    widths: Tuple[int, ...]
    bias: Union[bool, Tuple[bool, ...]] = True
    hidden_activation: str = "relu"
    out_activation: str = "none"
    dtype: object = jnp.float32
    precision: object = None

    def __post_init__(self):
        where = "FusedMLP"
        if isinstance(self.widths, (str, bytes)) or not hasattr(self.widths, "__len__"):
            raise TypeError(f"{where}: widths must be a sequence of ints, not {type(self.widths).__name__}")
        most = _lib.MLP_MAX_LAYERS
        if not 2 <= len(self.widths) <= most + 1:
            raise ValueError(f"{where}: widths must have 2 to {most + 1} entries (1 to {most} layers), "
                             f"got {len(self.widths)}")
        widths = tuple(_int(where, f"widths[{i}]", w, 1) for i, w in enumerate(self.widths))
        n = len(widths) - 1
        bias = (self.bias,) * n if isinstance(self.bias, bool) else self.bias
        if isinstance(bias, (str, bytes)) or not hasattr(bias, "__len__"):
            raise TypeError(f"{where}: bias must be a bool or a sequence of bools, not {type(self.bias).__name__}")
        if len(bias) != n:
            raise ValueError(f"{where}: bias has {len(bias)} entries but there are {n} layers")
        _set(self, widths=widths, bias=tuple(_bool(where, f"bias[{i}]", b) for i, b in enumerate(bias)),
             hidden_activation=_activation(where, self.hidden_activation),
             out_activation=_activation(where, self.out_activation),
             dtype=_dtype(where, self.dtype, _LINEAR_DTYPES))

    @property
    def layer_names(self) -> tuple:
        """The parameters' keys, one per layer (``fusekit.nn.FusedMLP``'s child names)."""
        stride = 1 if self.hidden_activation == "none" else 2
        return tuple(str(stride * i) for i in range(len(self.widths) - 1))

    def init(self, key) -> dict:
        layers = zip(self.layer_names, self.widths[:-1], self.widths[1:], self.bias)
        keys = jax.random.split(key, len(self.widths) - 1)
        return {name: FusedLinear(k, m, bias=b, dtype=self.dtype).init(kl)
                for (name, k, m, b), kl in zip(layers, keys)}

    def __call__(self, params, x):
        names = self.layer_names
        return mlp(x, [params[n]["weight"] for n in names],
                   [params[n]["bias"] if b else None for n, b in zip(names, self.bias)],
                   self.hidden_activation, self.out_activation, precision=self.precision)

    apply = __call__


# ----------------------------------------------------------------------------- GaussianField


@dataclasses.dataclass(frozen=True)
class GaussianField:
    """A learnable field of ``num_gaussians`` unnormalised 3-D Gaussians::

        density(p) = sum_n w_n exp(-0.5 (p - mu_n)^T Sigma_n^-1 (p - mu_n)),
        Sigma_n = M_n M_n^T,  M_n = L_n + eps I

    evaluated by fusekit's fused field op (``fusekit.jax.gaussian_field``: no
    ``[B, N]`` array, forward or backward).

    ``init(key)`` gives, as ``fusekit.nn.GaussianField``'s parameters:
    ``"means"`` ``[N, 3]`` uniform in the box ``[-s/2, s/2]^3``; ``"raw_diag"``
    ``[N, 3]`` with ``diag(L_n) = softplus(raw_diag)``, every Gaussian starting at
    standard deviation half the mean spacing ``(volume / N)^(1/3)``; ``"offdiag"``
    ``[N, 3]`` (``L[1,0], L[2,0], L[2,1]``, zeros; only with ``full_covariance``);
    ``"weights"`` ``[N]``, ones. ``field(params, points)``: ``points [B, 3]`` of the
    parameters' dtype gives the density ``[B]``, differentiable with respect to the
    points and every parameter. :meth:`cholesky` and :meth:`covariances` give the
    factors ``L_n`` and the covariances ``Sigma_n`` (with ``eps``).

    Args:
        num_gaussians: N >= 1.
        volume_size: edge of the box the means start in (> 0), or three edges.
        full_covariance: full (True) or diagonal (False) covariances.
        eps: added to the diagonal of each ``L_n`` by the op (>= 0; default 1e-6).
        dtype: float32 or float64.
    """

    num_gaussians: int
    volume_size: Union[float, Tuple[float, float, float]] = 2.0
    full_covariance: bool = True
    eps: float = DEFAULT_EPS
    dtype: object = jnp.float32

    def __post_init__(self):
        where = "GaussianField"
        _set(self, num_gaussians=_int(where, "num_gaussians", self.num_gaussians, 1),
             volume_size=_volume(where, self.volume_size),
             full_covariance=_bool(where, "full_covariance", self.full_covariance),
             eps=_float(where, "eps", self.eps, nonnegative=True), dtype=_dtype(where, self.dtype, _FIELD_DTYPES))

    def init(self, key) -> dict:
        n = self.num_gaussians
        size = np.asarray(self.volume_size)
        sigma = 0.5 * (float(size.prod()) / n) ** (1.0 / 3.0)
        u = jax.random.uniform(key, (n, 3), self.dtype)
        params = {
            "means": (u - 0.5) * jnp.asarray(size, self.dtype),
            "raw_diag": jnp.full((n, 3), math.log(math.expm1(sigma)), self.dtype),  # softplus^-1(sigma)
        }
        if self.full_covariance:
            params["offdiag"] = jnp.zeros((n, 3), self.dtype)
        params["weights"] = jnp.ones((n,), self.dtype)
        return params

    def cholesky(self, params):
        """The lower-triangular factors ``L_n`` ``[N, 3, 3]`` (positive diagonal;
        differentiable). The op adds ``eps`` to their diagonal."""
        d = jax.nn.softplus(params["raw_diag"])
        z = jnp.zeros_like(d[:, 0])
        a, b, c = (params["offdiag"][:, i] for i in range(3)) if self.full_covariance else (z, z, z)
        rows = (d[:, 0], z, z, a, d[:, 1], z, b, c, d[:, 2])
        return jnp.stack(rows, axis=-1).reshape(-1, 3, 3)

    def covariances(self, params):
        """``Sigma_n = (L_n + eps I)(L_n + eps I)^T`` ``[N, 3, 3]``, what the field evaluates."""
        m = self.cholesky(params) + self.eps * jnp.eye(3, dtype=params["means"].dtype)
        return jnp.matmul(m, jnp.swapaxes(m, -1, -2), precision=jax.lax.Precision.HIGHEST)

    def __call__(self, params, points):
        points = _rows("GaussianField", "points", points, 3, "[B, 3]")
        return gaussian_field(points, params["means"], self.cholesky(params), params["weights"], self.eps)

    apply = __call__


# ----------------------------------------------------------------------------- geodesic flow


@dataclasses.dataclass(frozen=True)
class LowRankChristoffel:
    """The clamped low-rank Christoffel map ``Gamma(v) = clamp((v U)^2 W^T, -c, c)``
    (``fusekit.jax.christoffel``), ``v [B, dim] -> [B, dim]``.

    ``init(key)`` gives ``{"U": [dim, rank], "W": [dim, rank]}``, normal with
    standard deviations ``1/sqrt(dim)`` and ``0.1/sqrt(rank)`` (as
    ``fusekit.nn.LowRankChristoffel``: a gently curved flow to start from).

    Args:
        dim, rank: ints >= 1.
        clamp: the bound ``c`` >= 0 (``math.inf``: no clamp); default 5.0.
        dtype: float32 or float64.
    """

    dim: int
    rank: int
    clamp: float = DEFAULT_C
    dtype: object = jnp.float32

    def __post_init__(self):
        where = "LowRankChristoffel"
        _set(self, dim=_int(where, "dim", self.dim, 1), rank=_int(where, "rank", self.rank, 1),
             clamp=_float(where, "clamp", self.clamp, nonnegative=True, allow_inf=True),
             dtype=_dtype(where, self.dtype, _FIELD_DTYPES))

    def init(self, key) -> dict:
        ku, kw = jax.random.split(key)
        shape = (self.dim, self.rank)
        return {"U": jax.random.normal(ku, shape, self.dtype) * self.dim ** -0.5,
                "W": jax.random.normal(kw, shape, self.dtype) * (0.1 * self.rank ** -0.5)}

    def __call__(self, params, v):
        v = _rows("LowRankChristoffel", "v", v, self.dim, f"[B, {self.dim}]")
        return christoffel(v, params["U"], params["W"], self.clamp)

    apply = __call__


@dataclasses.dataclass(frozen=True)
class LeapfrogIntegrator:
    """``steps`` kick-drift-kick steps of the geodesic flow in one fused op
    (``fusekit.jax.leapfrog``), with ``h = dt/2``::

        vh = v  + h (f - Gamma(v)  - mu v)
        x  = x  + dt vh
        v  = vh + h (f - Gamma(vh) - mu vh)

    ``Gamma`` is :attr:`christoffel` (a :class:`LowRankChristoffel`); ``init(key)``
    gives ``{"christoffel": {"U": ..., "W": ...}}``, the learnable parameters.
    ``flow(params, x, v, force=None, mu=None) -> (x_T, v_T)``: ``x``, ``v`` and
    the optional constant force are ``[B, dim]``; differentiable with respect to
    ``x``, ``v``, ``force``, ``U`` and ``W``.

    The friction ``mu`` ``[dim]`` is not a parameter (fusekit's fused backward
    has no gradient for it, so an optimizer would only decay it): it is
    :meth:`mu`, ``friction`` in every feature, unless ``mu=`` is passed to the
    call (any ``[dim]`` array, which gets no gradient).

    Args:
        dim, rank, clamp: of ``Gamma``.
        dt: the step (finite). steps: T >= 1.
        friction: False (no friction term), True (:data:`DEFAULT_FRICTION`) or a
            float >= 0.
        save_traj: ``fusekit.jax.leapfrog``'s: True (default) lets the
            differentiated forward write the ``[steps, 2, B, dim]`` trajectory for
            the backward (a forward without gradient writes none); False makes
            the backward recompute it (no extra memory, about 1.3x the time).
        dtype: float32 or float64.
    """

    dim: int
    rank: int
    dt: float
    steps: int
    friction: Union[bool, float] = False
    clamp: float = DEFAULT_C
    save_traj: bool = True
    dtype: object = jnp.float32

    def __post_init__(self):
        where = "LeapfrogIntegrator"
        if isinstance(self.friction, bool):
            friction = DEFAULT_FRICTION if self.friction else None
        else:
            friction = _float(where, "friction", self.friction, nonnegative=True)
        _set(self, dt=_float(where, "dt", self.dt), steps=_int(where, "steps", self.steps, 1),
             save_traj=_bool(where, "save_traj", self.save_traj), friction=friction)
        _set(self, christoffel=LowRankChristoffel(self.dim, self.rank, self.clamp, self.dtype))
        _set(self, dim=self.christoffel.dim, rank=self.christoffel.rank, clamp=self.christoffel.clamp,
             dtype=self.christoffel.dtype)

    def init(self, key) -> dict:
        return {"christoffel": self.christoffel.init(key)}

    def mu(self) -> Optional[jax.Array]:
        """The friction ``[dim]`` the call uses by default (None: no friction term)."""
        return None if self.friction is None else jnp.full((self.dim,), self.friction, self.dtype)

    def __call__(self, params, x, v, force=None, mu=None):
        where = "LeapfrogIntegrator"
        expected = f"[B, {self.dim}]"
        v = _rows(where, "v", v, self.dim, expected)
        x = _rows(where, "x", x, self.dim, expected)
        if x.shape != v.shape:
            raise ValueError(f"{where}: x must be {tuple(v.shape)} (v's shape), got shape {tuple(x.shape)}")
        if force is not None:
            force = jnp.asarray(force)
            if force.shape != v.shape:
                raise ValueError(f"{where}: force must be {tuple(v.shape)} (v's shape), got shape {tuple(force.shape)}")
        if mu is None:
            mu = self.mu()
        elif jnp.shape(mu) != (self.dim,):
            raise ValueError(f"{where}: mu must be [{self.dim}], got shape {tuple(jnp.shape(mu))}")
        p = params["christoffel"]
        return leapfrog(x, v, p["U"], p["W"], self.dt, self.steps, f=force, mu=mu, c=self.clamp,
                        save_traj=self.save_traj)

    apply = __call__
