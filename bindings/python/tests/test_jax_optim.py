"""fusekit.jax.optim: the optax Shampoo against a numpy float64 reference of the
same step (docs/optim.md, "What a step does"; exact roots by eigh), jitted, over
several steps and configurations; the root schedule under jit; non-finite roots;
the argument errors. Skipped without jax or optax."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402

optax = pytest.importorskip("optax")
import fusekit  # noqa: E402
import fusekit.jax.optim as fko  # noqa: E402

SHAPES = {"w": (6, 10), "conv": (3, 4, 2), "b": (6,)}


def blocks_of(shape, max_dim):
    if len(shape) < 2:
        return None
    m, n = shape[0], int(np.prod(shape[1:]))
    cut = lambda k: [(s, min(s + max_dim, k)) for s in range(0, k, max_dim)]  # noqa: E731
    return [(r, c) for r in cut(m) for c in cut(n)]


def root(a, eps):
    lam, q = np.linalg.eigh(a + eps * np.eye(len(a)))
    return (q * lam ** -0.25) @ q.T


def reference(params, grads_seq, lr, betas, epsilon, freq, start, max_dim, grafting, gb2, geps, wd, decoupled,
              bias_correction):
    """fusekit.optim.Shampoo's step in numpy float64, one parameter at a time."""
    b1, b2 = betas
    a, b = (1.0, 1.0) if b2 == 1.0 else (1.0 - b2, b2)
    p = {k: np.array(v, np.float64) for k, v in params.items()}
    st = {}
    for k, v in p.items():
        bl = blocks_of(v.shape, max_dim)
        st[k] = {"M": np.zeros_like(v), "V": np.zeros_like(v), "blocks": [
            [np.zeros((r[1] - r[0],) * 2), np.zeros((c[1] - c[0],) * 2), np.eye(r[1] - r[0]), np.eye(c[1] - c[0])]
            for r, c in (bl or [])]}
    out = []
    for t, grads in enumerate(grads_seq, start=1):
        for k, W in p.items():
            g = np.array(grads[k], np.float64)
            if wd and not decoupled:
                g = g + wd * W
            s = st[k]
            bl = blocks_of(W.shape, max_dim)
            if bl:
                g2 = g.reshape(W.shape[0], -1)
                for (r, c), blk in zip(bl, s["blocks"]):
                    gb = g2[r[0]:r[1], c[0]:c[1]]
                    blk[0] = b * blk[0] + a * gb @ gb.T
                    blk[1] = b * blk[1] + a * gb.T @ gb
                    if t == start or (t > start and t % freq == 0):
                        c2 = 1.0 - b2 ** t if (b2 < 1.0 and bias_correction) else 1.0
                        blk[2], blk[3] = root(blk[0] / c2, epsilon), root(blk[1] / c2, epsilon)
            if b1 > 0:
                s["M"] = b1 * s["M"] + (1 - b1) * g
                gbar = s["M"] / (1 - b1 ** t) if bias_correction else s["M"]
            else:
                gbar = g
            if grafting == "adam":
                s["V"] = gb2 * s["V"] + (1 - gb2) * g * g
                pg = gbar / (np.sqrt(s["V"] / ((1 - gb2 ** t) if bias_correction else 1.0)) + geps)
            else:
                pg = gbar
            P = pg
            if bl and t >= start:
                P = np.empty_like(g).reshape(W.shape[0], -1)
                gb2d, pg2d = gbar.reshape(W.shape[0], -1), pg.reshape(W.shape[0], -1)
                for (r, c), blk in zip(bl, s["blocks"]):
                    ps = blk[2] @ gb2d[r[0]:r[1], c[0]:c[1]] @ blk[3]
                    if grafting is not None:
                        ps = ps * np.linalg.norm(pg2d[r[0]:r[1], c[0]:c[1]]) / (np.linalg.norm(ps) + 1e-16)
                    P[r[0]:r[1], c[0]:c[1]] = ps
                P = P.reshape(W.shape)
            if wd and decoupled:
                P = P + wd * W
            p[k] = W - lr * P
        out.append({k: v.copy() for k, v in p.items()})
    return out


CONFIGS = {
    "adam_decoupled": dict(betas=(0.9, 0.99), epsilon=1e-2, freq=2, start=2, max_dim=4, grafting="adam",
                           wd=1e-2, decoupled=True, bias_correction=True),
    "sgd_l2_sums": dict(betas=(0.5, 1.0), epsilon=1e-1, freq=3, start=1, max_dim=16, grafting="sgd", wd=1e-2,
                        decoupled=False, bias_correction=False),
    "no_grafting_late_start": dict(betas=(0.0, 0.9), epsilon=5e-2, freq=1, start=3, max_dim=5, grafting=None,
                                   wd=0.0, decoupled=True, bias_correction=True),
}


def problem(seed=0, steps=6):
    rng = np.random.default_rng(seed)
    params = {k: rng.standard_normal(s) for k, s in SHAPES.items()}
    grads = [{k: rng.standard_normal(s) for k, s in SHAPES.items()} for _ in range(steps)]
    return params, grads


def make(cfg, lr=0.1, iters=40):
    return fko.shampoo(lr, betas=cfg["betas"], epsilon=cfg["epsilon"], precondition_frequency=cfg["freq"],
                       start_preconditioning_step=cfg["start"], max_preconditioner_dim=cfg["max_dim"],
                       grafting=cfg["grafting"], weight_decay=cfg["wd"], decoupled_weight_decay=cfg["decoupled"],
                       bias_correction=cfg["bias_correction"], newton_iterations=iters)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_steps_match_the_float64_reference(name):
    cfg = CONFIGS[name]
    params, grads = problem()
    want = reference(params, grads, 0.1, cfg["betas"], cfg["epsilon"], cfg["freq"], cfg["start"], cfg["max_dim"],
                     cfg["grafting"], 0.999, 1e-8, cfg["wd"], cfg["decoupled"], cfg["bias_correction"])
    opt = make(cfg)
    p = {k: jnp.asarray(v) for k, v in params.items()}
    state = opt.init(p)

    @jax.jit
    def step(p, state, g):
        u, state = opt.update(g, state, p)
        return optax.apply_updates(p, u), state

    for t, (g, w) in enumerate(zip(grads, want), start=1):
        p, state = step(p, state, {k: jnp.asarray(v) for k, v in g.items()})
        for k in SHAPES:
            np.testing.assert_allclose(np.asarray(p[k]), w[k], rtol=1e-9, atol=1e-11, err_msg=f"step {t}, {k}")
    assert int(shampoo_state(state).count) == len(grads)


def shampoo_state(state):
    return [s for s in jax.tree_util.tree_leaves(state, is_leaf=lambda x: isinstance(x, fko.ShampooState))
            if isinstance(s, fko.ShampooState)][0]


def test_roots_change_only_at_due_steps_under_one_jit():
    opt = fko.scale_by_shampoo(betas=(0.0, 0.9), epsilon=1e-2, precondition_frequency=3, start_preconditioning_step=2)
    params, grads = problem(1, steps=8)
    p = {k: jnp.asarray(v) for k, v in params.items()}
    state = opt.init(p)
    st = shampoo_state(state)
    by_path = fko.blocks_of(st, p)
    assert set(by_path) == {"['w']", "['conv']"} and len(by_path["['w']"]) == 1
    assert st.graft_sq is not None and st.exp_avg is None
    update = jax.jit(opt.update)
    roots = [np.asarray(by_path["['w']"][0].L_root)]
    for g in grads:
        _, state = update({k: jnp.asarray(v) for k, v in g.items()}, state)
        roots.append(np.asarray(fko.blocks_of(state, p)["['w']"][0].L_root))
    changed = [t for t in range(1, len(roots)) if not np.array_equal(roots[t], roots[t - 1])]
    assert changed == [2, 3, 6]  # start, then every 3rd step after it
    assert update._cache_size() == 1  # one compilation for every step


def test_non_finite_roots_keep_the_previous_ones():
    """A NaN in a gradient makes its block's statistics, hence the new roots, NaN:
    the previous roots (here the identity) stay; the other blocks' roots change."""
    opt = fko.scale_by_shampoo(betas=(0.0, 1.0), epsilon=1e-3, max_preconditioner_dim=2, grafting="sgd")
    p = {"w": jnp.ones((4, 2))}
    state = opt.init(p)
    g = jnp.ones((4, 2)).at[0, 0].set(jnp.nan)
    _, state = jax.jit(opt.update)({"w": g}, state)
    first, second = fko.blocks_of(state, p)["['w']"]
    assert not bool(jnp.isfinite(first.L).all())
    np.testing.assert_array_equal(np.asarray(first.L_root), np.eye(2))
    np.testing.assert_array_equal(np.asarray(first.R_root), np.eye(2))
    assert bool(jnp.isfinite(second.L_root).all()) and not np.allclose(np.asarray(second.L_root), np.eye(2))


def test_float32_training_with_a_schedule():
    """Defaults but the learning rate (an optax schedule), float32, under jit: a
    least-squares fit gets better."""
    rng = np.random.default_rng(2)
    A = rng.standard_normal((64, 8)).astype(np.float32)
    B = (A @ rng.standard_normal((8, 3)) + 0.5).astype(np.float32)  # a fit of loss 0 exists
    p = {"w": jnp.zeros((8, 3), jnp.float32), "b": jnp.zeros((3,), jnp.float32)}
    loss = lambda p: jnp.mean((A @ p["w"] + p["b"] - B) ** 2)  # noqa: E731
    opt = fko.shampoo(optax.exponential_decay(0.05, 50, 0.5), epsilon=1e-6)
    state = opt.init(p)

    @jax.jit
    def step(p, state):
        g = jax.grad(loss)(p)
        u, state = opt.update(g, state, p)
        return optax.apply_updates(p, u), state

    first = float(loss(p))
    for _ in range(100):
        p, state = step(p, state)
    assert p["w"].dtype == jnp.float32 and float(loss(p)) < 0.05 * first


def test_argument_errors():
    cases = [
        (dict(betas=(1.0, 0.5)), "betas\\[0\\] = 1.0 must be < 1.0"),
        (dict(betas=(0.9, 0.0)), "betas\\[1\\] = 0.0 must be > 0.0"),
        (dict(epsilon=-1.0), "epsilon = -1.0 must be >= 0.0"),
        (dict(precondition_frequency=0), "precondition_frequency = 0 must be >= 1"),
        (dict(grafting="adagrad"), "grafting = 'adagrad'; choose 'adam', 'sgd' or None"),
        (dict(weight_decay=-1.0), "weight_decay = -1.0 must be >= 0.0"),
        (dict(newton_iterations=0), "newton_iterations must be an int in \\[1, 100\\], got 0"),
        (dict(learning_rate=-0.1), "lr = -0.1 must be >= 0.0"),
    ]
    for kwargs, msg in cases:
        with pytest.raises(fusekit.InvalidArgumentError, match="fusekit.jax.optim.shampoo: " + msg):
            fko.shampoo(**kwargs)
    with pytest.raises(TypeError, match="parameters must be float32 or float64, got a int32 parameter"):
        fko.shampoo().init({"w": jnp.zeros((2, 2), jnp.int32)})
