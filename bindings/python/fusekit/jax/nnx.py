"""``flax.nnx`` versions of :mod:`fusekit.jax.nn`'s modules, for models written
with flax's NNX API. Each is a thin ``nnx.Module`` around the plain module: the
parameters are ``nnx.Param`` attributes under the plain module's names, and the
call is the plain module's, so the numbers are the same (:class:`FusedMLP` holds
one :class:`FusedLinear` child per layer, under ``fusekit.nn.FusedMLP``'s child
names)::

    from flax import nnx
    import fusekit.jax.nnx as fknnx

    layer = fknnx.FusedLinear(784, 512, activation="gelu", rngs=nnx.Rngs(0))
    y = layer(x)                                  # fusekit.jax.linear
    opt = nnx.Optimizer(layer, fusekit.jax.optim.shampoo(1e-3), wrt=nnx.Param)

Needs flax (``pip install flax``); :mod:`fusekit.jax.nn` does not. The
leapfrog friction ``mu`` is a :class:`Friction` variable, not an ``nnx.Param``:
fusekit's backward gives it no gradient, and an optimizer over ``nnx.Param``
leaves it alone (as ``fusekit.nn`` keeps it a buffer).
"""

from __future__ import annotations

try:
    from flax import nnx
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("fusekit.jax.nnx needs flax: pip install flax (fusekit.jax.nn needs nothing more than jax)") \
        from e

import jax.numpy as jnp

from . import nn as _nn

__all__ = ["Friction", "FusedLinear", "FusedMLP", "GaussianField", "LowRankChristoffel", "LeapfrogIntegrator"]


class Friction(nnx.Variable):
    """The leapfrog friction ``mu`` ``[dim]``: state, not a parameter."""


class _Wrapped(nnx.Module):
    """Holds the plain module (``spec``, static) and its parameters as ``nnx.Param``s."""

    def _adopt(self, spec, params: dict) -> None:
        self.spec = spec
        self._names = tuple(params)
        for k, v in params.items():
            setattr(self, k, nnx.Param(v))

    def params(self) -> dict:
        """The parameters as the plain module takes them (arrays, by name)."""
        return {k: getattr(self, k)[...] for k in self._names}


class FusedLinear(_Wrapped):
    """:class:`fusekit.jax.nn.FusedLinear` as an ``nnx.Module``: ``weight``,
    ``bias`` (``nnx.Param``); ``layer(x)``."""

    def __init__(self, in_features: int, out_features: int, *, bias: bool = True, activation: str = "relu",
                 dtype=jnp.float32, rngs: nnx.Rngs):
        spec = _nn.FusedLinear(in_features, out_features, bias, activation, dtype)
        self._adopt(spec, spec.init(rngs.params()))

    def __call__(self, x):
        return self.spec(self.params(), x)


class _MLPLayer(FusedLinear):
    """A :class:`FusedLinear` of a :class:`FusedMLP`, holding the parameters the
    network drew for it."""

    def __init__(self, spec, params: dict):
        self._adopt(spec, params)


class FusedMLP(nnx.Module):
    """:class:`fusekit.jax.nn.FusedMLP` as an ``nnx.Module``: one child per layer,
    a :class:`FusedLinear` (``weight``, ``bias`` as ``nnx.Param``; no ``bias`` for
    a layer without) under ``fusekit.nn.FusedMLP``'s child names, so the state's
    paths are a torch ``state_dict``'s keys (``("2", "weight")`` is
    ``"2.weight"``); ``model["2"]`` (or ``model[1]``, by layer index) is that
    layer. ``model(x)`` is the whole network as one fused op each way
    (``fusekit.jax.mlp``); the parameters are drawn as the plain module's
    ``init(rngs.params())`` draws them. A layer called alone applies its own
    activation (the hidden one, or ``out_activation`` for the last)."""

    def __init__(self, widths, *, bias=True, hidden_activation: str = "relu", out_activation: str = "none",
                 dtype=jnp.float32, precision=None, rngs: nnx.Rngs):
        self.spec = spec = _nn.FusedMLP(widths, bias, hidden_activation, out_activation, dtype, precision)
        params = spec.init(rngs.params())
        names = spec.layer_names
        for i, name in enumerate(names):
            act = spec.out_activation if i == len(names) - 1 else spec.hidden_activation
            layer = _nn.FusedLinear(spec.widths[i], spec.widths[i + 1], spec.bias[i], act, spec.dtype)
            setattr(self, name, _MLPLayer(layer, params[name]))

    def __getitem__(self, key) -> FusedLinear:
        names = self.spec.layer_names
        if isinstance(key, int) and not isinstance(key, bool) and -len(names) <= key < len(names):
            key = names[key]
        if key not in names:
            raise KeyError(f"FusedMLP: no layer {key!r}; the layers are {', '.join(names)} "
                           f"(or their indices 0 to {len(names) - 1})")
        return getattr(self, key)

    def __len__(self) -> int:
        return len(self.spec.layer_names)

    def params(self) -> dict:
        """The parameters as the plain module takes them (``{"0": {"weight": ...}, ...}``)."""
        return {n: getattr(self, n).params() for n in self.spec.layer_names}

    def __call__(self, x):
        return self.spec(self.params(), x)


class GaussianField(_Wrapped):
    """:class:`fusekit.jax.nn.GaussianField` as an ``nnx.Module``: ``means``,
    ``raw_diag``, ``offdiag`` (full covariances), ``weights``; ``field(points)``,
    :meth:`cholesky`, :meth:`covariances`."""

    def __init__(self, num_gaussians: int, volume_size=2.0, *, full_covariance: bool = True,
                 eps: float = _nn.DEFAULT_EPS, dtype=jnp.float32, rngs: nnx.Rngs):
        spec = _nn.GaussianField(num_gaussians, volume_size, full_covariance, eps, dtype)
        self._adopt(spec, spec.init(rngs.params()))

    def cholesky(self):
        return self.spec.cholesky(self.params())

    def covariances(self):
        return self.spec.covariances(self.params())

    def __call__(self, points):
        return self.spec(self.params(), points)


class LowRankChristoffel(_Wrapped):
    """:class:`fusekit.jax.nn.LowRankChristoffel` as an ``nnx.Module``: ``U``,
    ``W``; ``gamma(v)``."""

    def __init__(self, dim: int, rank: int, *, clamp: float = _nn.DEFAULT_C, dtype=jnp.float32, rngs: nnx.Rngs):
        spec = _nn.LowRankChristoffel(dim, rank, clamp, dtype)
        self._adopt(spec, spec.init(rngs.params()))

    def __call__(self, v):
        return self.spec(self.params(), v)


class LeapfrogIntegrator(nnx.Module):
    """:class:`fusekit.jax.nn.LeapfrogIntegrator` as an ``nnx.Module``: the
    submodule ``christoffel`` (a :class:`LowRankChristoffel`) and ``mu``, a
    :class:`Friction` (None without friction); ``flow(x, v, force=None) -> (x_T, v_T)``."""

    def __init__(self, dim: int, rank: int, dt: float, steps: int, *, friction=False, clamp: float = _nn.DEFAULT_C,
                 save_traj: bool = True, dtype=jnp.float32, rngs: nnx.Rngs):
        self.spec = _nn.LeapfrogIntegrator(dim, rank, dt, steps, friction, clamp, save_traj, dtype)
        self.christoffel = LowRankChristoffel(dim, rank, clamp=clamp, dtype=dtype, rngs=rngs)
        mu = self.spec.mu()
        self.mu = None if mu is None else Friction(mu)

    def __call__(self, x, v, force=None):
        mu = None if self.mu is None else self.mu[...]
        return self.spec({"christoffel": self.christoffel.params()}, x, v, force, mu=mu)
