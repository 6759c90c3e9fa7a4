"""Shampoo as an optax ``GradientTransformation``, on fusekit.jax's ops.

::

    import optax
    import fusekit.jax.optim as fko

    opt = fko.shampoo(1e-3, betas=(0.9, 0.999), epsilon=1e-6, precondition_frequency=20,
                      grafting="adam", weight_decay=1e-4)
    state = opt.init(params)

    @jax.jit
    def step(params, state, batch):
        grads = jax.grad(loss)(params, batch)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state

The step is ``fusekit.optim.Shampoo``'s (docs/optim.md, "What a step does"; the
same arguments, defaults and order): per block of each parameter of two or more
dimensions (viewed as ``[shape[0], rest]``, cut into blocks of at most
``max_preconditioner_dim`` per side) the statistics ``L``, ``R`` through
``fusekit.jax.shampoo_stats``, their inverse 4th roots
``(L / c2 + epsilon I)^(-1/4)`` through ``fusekit.jax.matrix_power`` (Newton,
``newton_iterations`` iterations, every root due in a step of one side and dtype
in one batched call) at step ``start_preconditioning_step`` and every
``precondition_frequency`` steps after it, and the direction
``L_root G_bar R_root`` through ``fusekit.jax.shampoo_precondition``, grafted to
the SGD or Adam direction's norm per block.

Everything the step keeps is in the optimizer state, a pytree of arrays (the
step count included), and the step has no Python branch on it: the root
recomputation is a ``jax.lax.cond`` on the count, so one ``jax.jit`` of the
training step serves every step. A root with a non-finite entry (from non-finite
statistics) keeps the previous root (the identity at first).

:func:`scale_by_shampoo` is the transformation alone (the direction ``P``,
before weight decay and the learning rate) for ``optax.chain``; :func:`shampoo`
chains weight decay and ``optax.scale_by_learning_rate`` around it, as the torch
optimizer applies them.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

try:
    import optax
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("fusekit.jax.optim needs optax: pip install optax") from e

from .. import _lib
from .. import optim as _torch_optim  # the argument rules and the block plan (no torch imported)
from . import matrix_power, shampoo_precondition, shampoo_stats

__all__ = ["ShampooState", "BlockState", "scale_by_shampoo", "shampoo", "blocks_of"]

_WHERE = "fusekit.jax.optim.shampoo"


class BlockState(NamedTuple):
    """One block's statistics and roots (``[m, m]``, ``[n, n]``)."""

    L: jax.Array
    R: jax.Array
    L_root: jax.Array
    R_root: jax.Array


class ShampooState(NamedTuple):
    """:func:`scale_by_shampoo`'s state: ``count`` (int32, the steps taken), the
    gradient's moving average ``exp_avg`` (None with ``beta1 = 0``), Adam
    grafting's ``graft_sq`` (None otherwise), each a pytree like the parameters,
    and ``blocks``: per parameter, in ``jax.tree_util.tree_leaves`` order, a tuple
    of :class:`BlockState` (empty for parameters of fewer than two dimensions).
    :func:`blocks_of` pairs them with the parameters' paths."""

    count: jax.Array
    exp_avg: Any
    graft_sq: Any
    blocks: Any


def _check(betas, epsilon, precondition_frequency, start_preconditioning_step, max_preconditioner_dim, grafting,
           grafting_beta2, grafting_epsilon, weight_decay, newton_iterations, learning_rate=0.0):
    """The torch optimizer's argument rules, with this function's name in the message."""
    try:
        _torch_optim._check_args(learning_rate, betas, epsilon, precondition_frequency, start_preconditioning_step,
                                 max_preconditioner_dim, grafting, grafting_beta2, grafting_epsilon, weight_decay)
    except _lib.InvalidArgumentError as e:
        raise _lib.InvalidArgumentError(str(e).replace("fusekit.optim.Shampoo", _WHERE)) from None
    if isinstance(newton_iterations, bool) or not isinstance(newton_iterations, int) \
            or not 1 <= newton_iterations <= 100:
        raise _lib.InvalidArgumentError(f"{_WHERE}: newton_iterations must be an int in [1, 100], "
                                        f"got {newton_iterations!r}")


def blocks_of(state: ShampooState, params) -> dict:
    """``{path: tuple of BlockState}`` of the parameters of two or more dimensions
    (``jax.tree_util.keystr`` of each parameter's path in ``params``)."""
    paths = jax.tree_util.tree_leaves_with_path(params)
    return {jax.tree_util.keystr(k): b for (k, _), b in zip(paths, state.blocks) if b}


def _plan(shape, max_dim):
    """The blocks ``[((r0, r1), (c0, c1)), ...]`` of a parameter viewed as
    ``[shape[0], rest]``, row-major; None for fewer than two dimensions."""
    if len(shape) < 2:
        return None
    m = shape[0]
    n = int(np.prod(shape[1:]))
    rows, cols = _torch_optim.block_ranges(m, max_dim), _torch_optim.block_ranges(n, max_dim)
    return [(r, c) for r in rows for c in cols]


def _blocks_of(x2, plan):
    return [x2[r0:r1, c0:c1] for (r0, r1), (c0, c1) in plan]


def _assemble(parts, plan, shape):
    """The ``[shape[0], rest]`` matrix of the blocks ``parts``, as ``shape``."""
    ncols = len({c for _, c in plan})
    rows = [jnp.concatenate(parts[i:i + ncols], axis=1) for i in range(0, len(parts), ncols)]
    return jnp.concatenate(rows, axis=0).reshape(shape)


def _correction(beta: float, t, dtype):
    return 1.0 - jnp.power(jnp.asarray(beta, dtype), t.astype(dtype))


def scale_by_shampoo(betas=(0.9, 1.0), epsilon: float = 1e-12, precondition_frequency: int = 1,
                     start_preconditioning_step: int = 1, max_preconditioner_dim: int = 1024, grafting="adam",
                     grafting_beta2: float = 0.999, grafting_epsilon: float = 1e-8, bias_correction: bool = True,
                     newton_iterations: int = 20, precision=None) -> optax.GradientTransformation:
    """Shampoo's update direction ``P`` (steps 2 to 6 of docs/optim.md's "What a
    step does"): no weight decay, no learning rate, not negated.

    Args:
        betas: ``(beta1, beta2)``: ``0 <= beta1 < 1`` (the gradient's moving
            average; 0: none), ``0 < beta2 <= 1`` (the statistics'; 1: sums).
        epsilon: added to the diagonal before the roots (>= 0).
        precondition_frequency, start_preconditioning_step: ints >= 1; the roots
            are computed at step ``start_preconditioning_step`` and every
            ``precondition_frequency`` steps after it (steps count from 1).
        max_preconditioner_dim: the largest side of a block.
        grafting: ``"adam"``, ``"sgd"`` or None (no rescaling of the
            preconditioned direction; SGD's direction where a grafted one is used).
        grafting_beta2, grafting_epsilon: Adam grafting's ``b`` and epsilon.
        bias_correction: the ``1 - beta^t`` divisions.
        newton_iterations: the Newton iterations of every root (``tol = 0``:
            exactly these, nothing read on the host, as fusekit.optim's fast path;
            directions of ``L / c2 + epsilon I`` below about
            ``|L / c2 + epsilon I|_F 2.4^-K`` are then preconditioned less than
            exactly). 20 reach float32 accuracy for conditions up to about 1e6.
        precision: of the products (``fusekit.jax.allow_tf32``): TF32 for float32
            on CUDA where it names TF32; None follows ``jax_default_matmul_precision``.

    Parameters must be float32 or float64 (``TypeError`` at ``init`` otherwise).
    """
    if isinstance(grafting, str):
        grafting = grafting.lower()
    betas = tuple(betas) if isinstance(betas, (tuple, list)) else betas
    _check(betas, epsilon, precondition_frequency, start_preconditioning_step, max_preconditioner_dim, grafting,
           grafting_beta2, grafting_epsilon, 0.0, newton_iterations)
    beta1, beta2 = (float(b) for b in betas)
    a_stats, b_stats = (1.0, 1.0) if beta2 == 1.0 else (1.0 - beta2, beta2)
    start, freq = int(start_preconditioning_step), int(precondition_frequency)
    max_dim, iters = int(max_preconditioner_dim), int(newton_iterations)
    epsilon = float(epsilon)

    def init_fn(params):
        def blocks(p):
            if p.dtype not in (jnp.float32, jnp.float64):
                raise TypeError(f"{_WHERE}: parameters must be float32 or float64, got a {p.dtype} parameter "
                                f"of shape {tuple(p.shape)}")
            plan = _plan(p.shape, max_dim)
            if plan is None:
                return ()
            out = []
            for (r0, r1), (c0, c1) in plan:
                m, n = r1 - r0, c1 - c0
                zm, zn = jnp.zeros((m, m), p.dtype), jnp.zeros((n, n), p.dtype)
                out.append(BlockState(zm, zn, jnp.eye(m, dtype=p.dtype), jnp.eye(n, dtype=p.dtype)))
            return tuple(out)

        zeros = lambda: jax.tree_util.tree_map(jnp.zeros_like, params)  # noqa: E731
        return ShampooState(
            count=jnp.zeros((), jnp.int32),
            exp_avg=zeros() if beta1 > 0 else None,
            graft_sq=zeros() if grafting == "adam" else None,
            blocks=tuple(blocks(p) for p in jax.tree_util.tree_leaves(params)),
        )

    def roots(stats, old, t):
        """The inverse 4th roots of every statistic in ``stats`` (a list), batched
        by (side, dtype); a root with a non-finite entry keeps ``old``'s."""
        groups = {}
        for i, s in enumerate(stats):
            groups.setdefault((s.shape[-1], s.dtype), []).append(i)
        out = [None] * len(stats)
        for (_, dtype), idx in groups.items():
            c2 = _correction(beta2, t, dtype) if (beta2 < 1.0 and bias_correction) else jnp.ones((), dtype)
            a = jnp.stack([stats[i] for i in idx]) / c2
            x = matrix_power(a, -0.25, epsilon, method="newton", max_iter=iters, precision=precision)
            prev = jnp.stack([old[i] for i in idx])
            finite = jnp.all(jnp.isfinite(x), axis=(-2, -1), keepdims=True)
            x = jnp.where(finite, x, prev)
            for j, i in enumerate(idx):
                out[i] = x[j]
        return out

    def update_fn(updates, state, params=None):
        del params
        t = state.count + 1
        grads, treedef = jax.tree_util.tree_flatten(updates)
        blocks = state.blocks
        plans = [_plan(g.shape, max_dim) for g in grads]

        # 2. statistics, per block
        new_blocks = []
        for g, plan, bs in zip(grads, plans, blocks):
            if plan is None:
                new_blocks.append(())
                continue
            g2 = g.reshape(g.shape[0], -1)
            nb = []
            for gb, b in zip(_blocks_of(g2, plan), bs):
                L, R = shampoo_stats(gb, b.L, b.R, a_stats, b_stats, precision=precision)
                nb.append(BlockState(L, R, b.L_root, b.R_root))
            new_blocks.append(nb)

        # 3. the roots, when due
        flat = [b for nb in new_blocks for b in nb]
        if flat:
            stats = [s for b in flat for s in (b.L, b.R)]
            old = [r for b in flat for r in (b.L_root, b.R_root)]
            due = (t == start) | ((t > start) & (t % freq == 0))
            new = jax.lax.cond(due, lambda s, o: roots(s, o, t), lambda s, o: list(o), stats, old)
            it = iter(new)
            new_blocks = [[BlockState(b.L, b.R, next(it), next(it)) for b in nb] for nb in new_blocks]

        # 4, 5. G_bar and the grafted direction
        if beta1 > 0:
            ms = [beta1 * m + (1.0 - beta1) * g for m, g in zip(jax.tree_util.tree_leaves(state.exp_avg), grads)]
            gbars = [m / _correction(beta1, t, m.dtype) for m in ms] if bias_correction else ms
        else:
            ms, gbars = None, grads
        if grafting == "adam":
            vs = [grafting_beta2 * v + (1.0 - grafting_beta2) * g * g
                  for v, g in zip(jax.tree_util.tree_leaves(state.graft_sq), grads)]
            pgs = [gb / (jnp.sqrt(v / (_correction(grafting_beta2, t, v.dtype) if bias_correction else 1.0))
                         + grafting_epsilon) for gb, v in zip(gbars, vs)]
        else:
            vs, pgs = None, gbars

        # 6. the preconditioned direction, grafted per block, from start_preconditioning_step on
        dirs = []
        for gbar, pg, plan, nb in zip(gbars, pgs, plans, new_blocks):
            if plan is None:
                dirs.append(pg)
                continue
            parts = []
            for gb, pb, b in zip(_blocks_of(gbar.reshape(gbar.shape[0], -1), plan),
                                 _blocks_of(pg.reshape(pg.shape[0], -1), plan), nb):
                ps = shampoo_precondition(gb, b.L_root, b.R_root, precision=precision)
                if grafting is not None:
                    ps = ps * (jnp.linalg.norm(pb) / (jnp.linalg.norm(ps) + 1e-16))
                parts.append(ps)
            pre = _assemble(parts, plan, gbar.shape)
            dirs.append(pre if start <= 1 else jnp.where(t >= start, pre, pg))

        unflat = treedef.unflatten
        new_state = ShampooState(
            count=t,
            exp_avg=unflat(ms) if ms is not None else None,
            graft_sq=unflat(vs) if vs is not None else None,
            blocks=tuple(tuple(nb) for nb in new_blocks),
        )
        return unflat(dirs), new_state

    return optax.GradientTransformation(init_fn, update_fn)


def shampoo(learning_rate=1e-3, betas=(0.9, 1.0), epsilon: float = 1e-12, precondition_frequency: int = 1,
            start_preconditioning_step: int = 1, max_preconditioner_dim: int = 1024, grafting="adam",
            grafting_beta2: float = 0.999, grafting_epsilon: float = 1e-8, weight_decay: float = 0.0,
            decoupled_weight_decay: bool = True, bias_correction: bool = True, newton_iterations: int = 20,
            precision=None) -> optax.GradientTransformation:
    """Shampoo as ``fusekit.optim.Shampoo`` steps (docs/optim.md), an optax
    transformation: ``updates = -learning_rate * P`` with :func:`scale_by_shampoo`'s
    ``P``. ``learning_rate`` is a number or an optax schedule (a function of the
    step count). ``weight_decay`` (>= 0): with ``decoupled_weight_decay`` (the
    default, AdamW style) ``P <- P + weight_decay W`` after the direction,
    otherwise L2, ``G <- G + weight_decay W`` before the statistics (both through
    ``optax.add_decayed_weights``, so ``update`` needs ``params`` when
    ``weight_decay > 0``). The other arguments are :func:`scale_by_shampoo`'s."""
    lr_check = 0.0 if callable(learning_rate) else learning_rate
    if isinstance(grafting, str):
        grafting = grafting.lower()
    _check(tuple(betas) if isinstance(betas, (tuple, list)) else betas, epsilon, precondition_frequency,
           start_preconditioning_step, max_preconditioner_dim, grafting, grafting_beta2, grafting_epsilon,
           weight_decay, newton_iterations, lr_check)
    parts = []
    if weight_decay and not decoupled_weight_decay:
        parts.append(optax.add_decayed_weights(weight_decay))
    parts.append(scale_by_shampoo(betas, epsilon, precondition_frequency, start_preconditioning_step,
                                  max_preconditioner_dim, grafting, grafting_beta2, grafting_epsilon,
                                  bias_correction, newton_iterations, precision))
    if weight_decay and decoupled_weight_decay:
        parts.append(optax.add_decayed_weights(weight_decay))
    parts.append(optax.scale_by_learning_rate(learning_rate))
    return optax.chain(*parts)
