"""fusekit.jax.nnx: the flax.nnx wrappers compute what fusekit.jax.nn's plain
modules compute on the same parameters, take gradients through nnx.grad, and
train under nnx.jit with fusekit.jax.optim's Shampoo through nnx.Optimizer; the
friction is no nnx.Param. Skipped without flax (scripts/test.sh installs it)."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402

nnx = pytest.importorskip("flax.nnx")
optax = pytest.importorskip("optax")
import fusekit.jax.nnx as fknnx  # noqa: E402
import fusekit.jax.optim as fko  # noqa: E402


def close(got, want, tol=1e-12):
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=tol, atol=tol)


def test_wrappers_compute_the_plain_modules():
    rngs = nnx.Rngs(0)
    x = jax.random.normal(jax.random.key(1), (6, 3), jnp.float64)
    layer = fknnx.FusedLinear(3, 4, activation="gelu", rngs=rngs)
    assert set(nnx.state(layer, nnx.Param).keys()) == {"weight", "bias"}
    x32 = x.astype(jnp.float32)
    close(layer(x32), layer.spec(layer.params(), x32), 0)
    field = fknnx.GaussianField(5, dtype=jnp.float64, rngs=rngs)
    assert set(nnx.state(field, nnx.Param).keys()) == {"means", "raw_diag", "offdiag", "weights"}
    close(field(x), field.spec(field.params(), x), 0)
    close(field.covariances(), field.spec.covariances(field.params()), 0)
    flow = fknnx.LeapfrogIntegrator(3, 2, 0.1, 2, friction=0.2, dtype=jnp.float64, rngs=rngs)
    params = nnx.state(flow, nnx.Param)
    assert "mu" not in params and set(params["christoffel"].keys()) == {"U", "W"}
    np.testing.assert_array_equal(np.asarray(flow.mu[...]), 0.2)
    close(flow(x, x), flow.spec({"christoffel": flow.christoffel.params()}, x, x, mu=flow.mu[...]), 0)


def test_nnx_training_step_with_shampoo():
    """A field fit under nnx.jit, nnx.Optimizer over nnx.Param with the optax Shampoo."""
    rngs = nnx.Rngs(0)
    field = fknnx.GaussianField(16, dtype=jnp.float64, rngs=rngs)
    flow = fknnx.LeapfrogIntegrator(3, 2, 0.1, 2, friction=True, dtype=jnp.float64, rngs=rngs)
    pts = jax.random.uniform(jax.random.key(2), (128, 3), jnp.float64, -1, 1)
    target = jnp.exp(-4 * (pts ** 2).sum(-1))

    class Model(nnx.Module):
        def __init__(self):
            self.field, self.flow = field, flow

        def __call__(self, p):
            xT, _ = self.flow(p, jnp.zeros_like(p))
            return self.field(xT)

    model = Model()
    opt = nnx.Optimizer(model, fko.shampoo(0.02, epsilon=1e-6, precondition_frequency=5), wrt=nnx.Param)
    mu0 = np.asarray(flow.mu[...])

    @nnx.jit
    def step(model, opt):
        loss, g = nnx.value_and_grad(lambda m: jnp.mean((m(pts) - target) ** 2))(model)
        opt.update(model, g)
        return loss

    losses = [float(step(model, opt)) for _ in range(30)]
    assert losses[-1] < 0.5 * losses[0]
    np.testing.assert_array_equal(np.asarray(flow.mu[...]), mu0)  # the friction is not trained
