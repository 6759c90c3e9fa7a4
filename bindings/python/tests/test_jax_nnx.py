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


def test_fused_mlp_wrapper():
    """fknnx.FusedMLP: the state's paths are fusekit.nn.FusedMLP's state_dict keys,
    the parameters those of the plain module's init, the call the plain module's,
    gradients through nnx.grad those of jax.grad of the plain module, layers by
    name or index, and a fit under nnx.jit with nnx.Optimizer."""
    import fusekit.jax.nn as fknn

    model = fknnx.FusedMLP((5, 8, 7, 3), bias=(True, False, True), hidden_activation="gelu",
                           out_activation="relu", rngs=nnx.Rngs(0))
    flat = nnx.to_flat_state(nnx.state(model, nnx.Param))
    assert sorted(".".join(p) for p, _ in flat) == ["0.bias", "0.weight", "2.weight", "4.bias", "4.weight"]
    plain = fknn.FusedMLP((5, 8, 7, 3), bias=(True, False, True), hidden_activation="gelu", out_activation="relu")
    assert model.spec == plain
    params = plain.init(nnx.Rngs(0).params())
    close(model.params(), params, 0)
    x = jax.random.normal(jax.random.key(1), (2, 4, 5), jnp.float32)
    close(model(x), plain(params, x), 0)
    g = nnx.grad(lambda m: (m(x) ** 2).sum())(model)
    want = jax.grad(lambda p: (plain(p, x) ** 2).sum())(params)
    close({n: {k: v[...] for k, v in g[n].items()} for n in plain.layer_names}, want, 0)

    assert len(model) == 3 and model[1] is model["2"] and model[-1] is model["4"]
    assert isinstance(model[0], fknnx.FusedLinear) and model["2"].spec.activation == "gelu"
    assert model["4"].spec.activation == "relu" and not model["2"].spec.bias
    h = model[0](x.reshape(-1, 5))
    close(model[2](model[1](h)), model(x).reshape(-1, 3), 1e-6)  # each layer alone, chained
    with pytest.raises(KeyError, match=r"FusedMLP: no layer '1'; the layers are 0, 2, 4 \(or their indices 0 to 2\)"):
        model["1"]
    with pytest.raises(KeyError, match="no layer 3"):
        model[3]
    with pytest.raises(ValueError, match="FusedMLP: bias has 1 entries but there are 2 layers"):
        fknnx.FusedMLP((4, 3, 2), bias=(True,), rngs=nnx.Rngs(0))

    # a fit of a smooth target under nnx.jit, Adam through nnx.Optimizer
    net = fknnx.FusedMLP((2, 32, 32, 1), hidden_activation="gelu_tanh", rngs=nnx.Rngs(3))
    pts = jax.random.uniform(jax.random.key(4), (256, 2), jnp.float32, -1, 1)
    target = jnp.sin(3 * pts[:, :1]) * jnp.cos(2 * pts[:, 1:])
    opt = nnx.Optimizer(net, optax.adam(1e-2), wrt=nnx.Param)

    @nnx.jit
    def step(net, opt):
        loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(pts) - target) ** 2))(net)
        opt.update(net, grads)
        return loss

    losses = [float(step(net, opt)) for _ in range(150)]
    assert losses[-1] < 0.1 * losses[0], losses[::30]


def test_fused_mlp_wrapper_loads_a_torch_state_dict():
    """A fusekit.nn.FusedMLP's state_dict, key for key, into the nnx wrapper's state
    (nnx.update): the same outputs."""
    torch = pytest.importorskip("torch")
    import fusekit.nn as fkn

    torch.manual_seed(0)
    tmodel = fkn.FusedMLP([6, 16, 16, 2], hidden_activation="gelu_tanh")
    model = fknnx.FusedMLP((6, 16, 16, 2), hidden_activation="gelu_tanh", rngs=nnx.Rngs(0))
    state = {}
    for key, value in tmodel.state_dict().items():
        layer, name = key.split(".")
        state.setdefault(layer, {})[name] = jnp.asarray(value.numpy())
    nnx.update(model, nnx.State(state))
    x = np.random.default_rng(1).standard_normal((9, 6)).astype(np.float32)
    with torch.no_grad():
        want = tmodel(torch.from_numpy(x)).numpy()
    close(model(jnp.asarray(x)), want, 1e-5)
