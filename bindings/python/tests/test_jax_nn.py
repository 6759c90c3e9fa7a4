"""fusekit.jax.nn: the plain-function modules against jax.numpy references written
here (float64 where the op has it), their gradients against jax.grad of those
references, jit with the module as a static object, and every bad argument.
Skipped without jax."""

import math

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402

import fusekit.jax.nn as fknn  # noqa: E402

HP = jax.lax.Precision.HIGHEST


def close(got, want, tol):
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=tol, atol=tol)


def randn(key, *shape, dtype=jnp.float64, scale=1.0):
    return scale * jax.random.normal(key, shape, dtype)


# ---------------------------------------------------------------- FusedLinear

ACT = {"relu": jax.nn.relu, "gelu": lambda z: jax.nn.gelu(z, approximate=False), "gelu_tanh": jax.nn.gelu,
       "none": lambda z: z}


@pytest.mark.parametrize("activation", fknn.ACTIVATIONS)
def test_fused_linear_matches_jnp_with_gradients(activation):
    layer = fknn.FusedLinear(24, 10, activation=activation)
    params = layer.init(jax.random.key(0))
    assert set(params) == {"weight", "bias"} and params["weight"].shape == (10, 24) and params["bias"].shape == (10,)
    x = randn(jax.random.key(1), 3, 5, 24, dtype=jnp.float32)

    def ref(p, x):
        return ACT[activation](jnp.matmul(x, p["weight"].T, precision=HP) + p["bias"])

    y = jax.jit(layer)(params, x)
    assert y.shape == (3, 5, 10) and y.dtype == jnp.float32
    close(y, ref(params, x), 2e-5)
    loss = lambda f: lambda p, x: (f(p, x) ** 2).sum()  # noqa: E731
    close(jax.grad(loss(layer), argnums=(0, 1))(params, x), jax.grad(loss(ref), argnums=(0, 1))(params, x), 2e-4)


def test_fused_linear_init_and_options():
    layer = fknn.FusedLinear(100, 50, bias=False, activation="none", dtype=jnp.bfloat16)
    p = layer.init(jax.random.key(3))
    assert list(p) == ["weight"] and p["weight"].dtype == jnp.bfloat16
    w = np.asarray(fknn.FusedLinear(100, 50).init(jax.random.key(3))["weight"])
    bound = 1 / math.sqrt(100)  # nn.Linear's: uniform in +-1/sqrt(in_features)
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.9 * bound and abs(w.mean()) < 0.1 * bound
    assert fknn.FusedLinear(4, 3) == fknn.FusedLinear(4, 3) and hash(fknn.FusedLinear(4, 3)) == hash(
        fknn.FusedLinear(4, 3))
    x = jnp.ones((2, 100), jnp.bfloat16)
    assert layer(p, x).dtype == jnp.bfloat16


def test_fused_linear_errors():
    with pytest.raises(ValueError,
                       match="FusedLinear: activation must be one of relu, gelu, gelu_tanh, none, got 'swish'"):
        fknn.FusedLinear(4, 3, activation="swish")
    with pytest.raises(TypeError, match="FusedLinear: dtype must be one of float16, bfloat16, float32, not float64"):
        fknn.FusedLinear(4, 3, dtype=jnp.float64)
    with pytest.raises(ValueError, match="FusedLinear: in_features must be >= 1, got 0"):
        fknn.FusedLinear(0, 3)
    with pytest.raises(TypeError, match="FusedLinear: bias must be a bool"):
        fknn.FusedLinear(4, 3, bias=1)
    layer = fknn.FusedLinear(4, 3)
    with pytest.raises(ValueError, match="w must be"):
        layer(layer.init(jax.random.key(0)), jnp.ones((2, 5), jnp.float32))


# ---------------------------------------------------------------- GaussianField


def field_ref(field, p, points):
    L = field.cholesky(p) + field.eps * jnp.eye(3)
    d = points[:, None, :] - p["means"][None]
    z = jax.scipy.linalg.solve_triangular(L[None], d[..., None], lower=True)[..., 0]
    return (p["weights"] * jnp.exp(-0.5 * (z ** 2).sum(-1))).sum(-1)


@pytest.mark.parametrize("full", [True, False])
def test_gaussian_field_matches_jnp_with_gradients(full):
    field = fknn.GaussianField(12, volume_size=(2.0, 1.5, 1.0), full_covariance=full, eps=1e-3, dtype=jnp.float64)
    p = field.init(jax.random.key(0))
    assert set(p) == ({"means", "raw_diag", "offdiag", "weights"} if full else {"means", "raw_diag", "weights"})
    if full:
        p["offdiag"] = randn(jax.random.key(5), 12, 3, scale=0.1)
    p["weights"] = randn(jax.random.key(6), 12)
    pts = randn(jax.random.key(1), 40, 3)
    close(jax.jit(field)(p, pts), field_ref(field, p, pts), 1e-12)
    g = jax.grad(lambda q, x: field(q, x).sum(), argnums=(0, 1))(p, pts)
    want = jax.grad(lambda q, x: field_ref(field, q, x).sum(), argnums=(0, 1))(p, pts)
    close(g, want, 1e-10)


def test_gaussian_field_init_and_factors():
    field = fknn.GaussianField(64, volume_size=2.0, dtype=jnp.float64)
    p = field.init(jax.random.key(2))
    m = np.asarray(p["means"])
    assert np.all(np.abs(m) <= 1.0) and m.std() > 0.4
    sigma = 0.5 * (8.0 / 64) ** (1 / 3)
    L = np.asarray(field.cholesky(p))
    np.testing.assert_allclose(np.diagonal(L, axis1=1, axis2=2), sigma, rtol=1e-12)
    assert np.all(np.triu(L, 1) == 0)
    M = L + 1e-6 * np.eye(3)
    close(field.covariances(p), M @ np.swapaxes(M, 1, 2), 1e-14)
    np.testing.assert_array_equal(np.asarray(p["weights"]), 1.0)


def test_gaussian_field_errors():
    with pytest.raises(ValueError, match="GaussianField: num_gaussians must be >= 1"):
        fknn.GaussianField(0)
    with pytest.raises(ValueError, match="GaussianField: volume_size must be > 0"):
        fknn.GaussianField(3, volume_size=-1.0)
    with pytest.raises(TypeError, match="volume_size must be a float or three floats"):
        fknn.GaussianField(3, volume_size=(1.0, 2.0))
    with pytest.raises(ValueError, match="GaussianField: eps must be >= 0"):
        fknn.GaussianField(3, eps=-1.0)
    with pytest.raises(TypeError, match="GaussianField: dtype must be one of float32, float64"):
        fknn.GaussianField(3, dtype=jnp.float16)
    field = fknn.GaussianField(3)
    with pytest.raises(ValueError, match=r"GaussianField: points must be \[B, 3\], got shape \(5, 2\)"):
        field(field.init(jax.random.key(0)), jnp.ones((5, 2), jnp.float32))
    with pytest.raises(TypeError, match="points has dtype float64 but means has dtype float32"):
        field(field.init(jax.random.key(0)), jnp.ones((5, 3), jnp.float64))


# ---------------------------------------------------------------- geodesic flow


def chr_ref(v, U, W, c):
    return jnp.clip(jnp.matmul(jnp.matmul(v, U, precision=HP) ** 2, W.T, precision=HP), -c, c)


def leapfrog_ref(flow, p, x, v, f, mu):
    U, W = p["christoffel"]["U"], p["christoffel"]["W"]
    h = flow.dt / 2
    f = jnp.zeros_like(v) if f is None else f
    mu = jnp.zeros(v.shape[-1]) if mu is None else mu
    for _ in range(flow.steps):
        vh = v + h * (f - chr_ref(v, U, W, flow.clamp) - mu * v)
        x = x + flow.dt * vh
        v = vh + h * (f - chr_ref(vh, U, W, flow.clamp) - mu * vh)
    return x, v


def test_christoffel_matches_jnp_with_gradients():
    gamma = fknn.LowRankChristoffel(8, 3, clamp=0.5, dtype=jnp.float64)
    p = gamma.init(jax.random.key(0))
    p = jax.tree_util.tree_map(lambda a: 4 * a, p)  # curved enough to reach the clamp
    v = randn(jax.random.key(1), 10, 8)
    want = chr_ref(v, p["U"], p["W"], 0.5)
    assert float(jnp.abs(want).max()) == 0.5
    close(gamma(p, v), want, 1e-12)
    g = jax.grad(lambda q, v: (gamma(q, v) ** 2).sum(), argnums=(0, 1))(p, v)
    close(g, jax.grad(lambda q, v: (chr_ref(v, q["U"], q["W"], 0.5) ** 2).sum(), argnums=(0, 1))(p, v), 1e-10)


def test_christoffel_init_scales():
    p = fknn.LowRankChristoffel(400, 50, dtype=jnp.float64).init(jax.random.key(0))
    assert np.asarray(p["U"]).std() == pytest.approx(400 ** -0.5, rel=0.05)
    assert np.asarray(p["W"]).std() == pytest.approx(0.1 * 50 ** -0.5, rel=0.05)


@pytest.mark.parametrize("friction", [False, True, 0.3])
@pytest.mark.parametrize("save_traj", [True, False])
def test_leapfrog_matches_jnp_with_gradients(friction, save_traj):
    flow = fknn.LeapfrogIntegrator(6, 2, dt=0.1, steps=3, friction=friction, save_traj=save_traj, dtype=jnp.float64)
    p = flow.init(jax.random.key(0))
    assert set(p) == {"christoffel"} and set(p["christoffel"]) == {"U", "W"}
    mu = flow.mu()
    assert (mu is None) == (friction is False)
    if friction is not False:
        np.testing.assert_array_equal(np.asarray(mu), 0.1 if friction is True else 0.3)
    k = jax.random.split(jax.random.key(1), 3)
    x, v, f = randn(k[0], 5, 6), randn(k[1], 5, 6, scale=0.5), randn(k[2], 5, 6, scale=0.3)
    close(jax.jit(flow)(p, x, v, f), leapfrog_ref(flow, p, x, v, f, mu), 1e-12)

    def loss(run):
        def fn(q, x, v, f):
            xT, vT = run(q, x, v, f)
            return (xT ** 2).sum() + (vT * jnp.arange(6.0)).sum()
        return fn

    g = jax.grad(loss(flow), argnums=(0, 1, 2, 3))(p, x, v, f)
    want = jax.grad(loss(lambda q, x, v, f: leapfrog_ref(flow, q, x, v, f, mu)), argnums=(0, 1, 2, 3))(p, x, v, f)
    close(g, want, 1e-10)


def test_leapfrog_mu_override_and_errors():
    flow = fknn.LeapfrogIntegrator(4, 2, dt=0.05, steps=2, dtype=jnp.float64)
    p = flow.init(jax.random.key(0))
    x = randn(jax.random.key(1), 3, 4)
    mu = jnp.asarray([0.0, 0.1, 0.2, 0.3])
    close(flow(p, x, x, mu=mu), leapfrog_ref(flow, p, x, x, None, mu), 1e-12)
    with pytest.raises(ValueError, match=r"LeapfrogIntegrator: mu must be \[4\], got shape \(3,\)"):
        flow(p, x, x, mu=jnp.zeros(3))
    with pytest.raises(ValueError, match=r"LeapfrogIntegrator: v must be \[B, 4\], got shape \(3, 5\)"):
        flow(p, x, jnp.ones((3, 5)))
    with pytest.raises(ValueError, match=r"LeapfrogIntegrator: x must be \(3, 4\) \(v's shape\)"):
        flow(p, jnp.ones((2, 4)), x)
    with pytest.raises(ValueError, match=r"LeapfrogIntegrator: force must be \(3, 4\)"):
        flow(p, x, x, jnp.ones((3, 3)))
    with pytest.raises(ValueError, match="LeapfrogIntegrator: steps must be >= 1"):
        fknn.LeapfrogIntegrator(4, 2, dt=0.1, steps=0)
    with pytest.raises(ValueError, match="LeapfrogIntegrator: friction must be >= 0"):
        fknn.LeapfrogIntegrator(4, 2, dt=0.1, steps=1, friction=-0.1)
    with pytest.raises(ValueError, match="LeapfrogIntegrator: dt must be finite"):
        fknn.LeapfrogIntegrator(4, 2, dt=math.inf, steps=1)
    with pytest.raises(ValueError, match="LowRankChristoffel: rank must be >= 1"):
        fknn.LeapfrogIntegrator(4, 0, dt=0.1, steps=1)


def test_modules_in_one_jitted_training_step():
    """The modules compose in one jitted loss (the module objects static), and
    gradients reach every parameter."""
    field = fknn.GaussianField(8, dtype=jnp.float32)
    layer = fknn.FusedLinear(3, 3, activation="gelu_tanh")
    flow = fknn.LeapfrogIntegrator(3, 2, dt=0.1, steps=2, friction=True)
    k = jax.random.split(jax.random.key(0), 3)
    params = {"field": field.init(k[0]), "layer": layer.init(k[1]), "flow": flow.init(k[2])}
    pts = jax.random.normal(jax.random.key(4), (16, 3), jnp.float32)

    @jax.jit
    def loss(p, pts):
        h = layer(p["layer"], pts)
        xT, _ = flow(p["flow"], h, h)
        return (field(p["field"], xT) ** 2).mean()

    g = jax.grad(loss)(params, pts)
    assert jax.tree_util.tree_structure(g) == jax.tree_util.tree_structure(params)
    for name, leaf in jax.tree_util.tree_leaves_with_path(g):
        assert bool(jnp.isfinite(leaf).all()), name
    assert any(float(jnp.abs(leaf).max()) > 0 for leaf in jax.tree_util.tree_leaves(g["flow"]))
