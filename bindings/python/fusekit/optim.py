"""Optimizers built on fusekit's optimizer math (docs/optim.md, "The Shampoo optimizer").

- :class:`Shampoo`: a ``torch.optim.Optimizer``. Statistics through
  :func:`fusekit.shampoo_stats`, inverse 4th roots through
  :func:`fusekit.matrix_power` (a float64 retry when the float32 root fails or is
  ill-conditioned), preconditioning through :func:`fusekit.shampoo_precondition`;
  blocking of large dimensions; SGD or Adam norm grafting as Meta's
  DistributedShampoo does it; under ``torch.distributed`` the roots are split
  across ranks and shared with fusekit's collectives.
- :func:`init_distributed`: a fusekit communicator over the ranks of
  ``torch.distributed`` (the NCCL unique id goes through torch.distributed's store).
- :func:`assign_roots`: which rank computes which root.

``import fusekit.optim`` does not import torch; touching :class:`Shampoo` does.
"""

from __future__ import annotations

import math
import time
import warnings

__all__ = ["Shampoo", "FusekitComm", "init_distributed", "assign_roots", "block_ranges", "newton_iterations_for",
           "root_batches"]

_GRAFTING = ("adam", "sgd", None)
_ROOT_METHODS = ("auto", "newton", "checked")
#: Fixed Newton iterations of the fast root path (docs/optim.md, "Root policy").
NEWTON_ITERATIONS_F32 = 20
NEWTON_ITERATIONS_TF32 = 12
#: The fast path accepts a root X of S = A + eps I when the largest eigenvalue of
#: X^2 S X^2 (1 for the exact root, below 1 in directions Newton has not finished)
#: is at most 1 + ROOT_ACCEPT_TOL: no direction is amplified more than 2.4% beyond
#: the exact root.
ROOT_ACCEPT_TOL = 0.1
#: With ``allow_tf32``, a fast-path root whose Newton iteration hint is above
#: TF32_FINISH_HINT (|A + eps I|_F / eps above about 2.5e2) runs TF32_DAMPED_ITERATIONS
#: TF32 iterations: finishing every direction of such statistics in TF32 lets the
#: rounding of the root's largest entries (the smallest directions, where the root is
#: large) overshoot the large directions by up to 80% in X^4 (A + eps I); stopping
#: earlier leaves the smallest directions damped instead (docs/optim.md, "TF32 and
#: the condition").
TF32_FINISH_HINT = 10
TF32_DAMPED_ITERATIONS = 8
#: Roots are computed in canonical batches: the due roots of one size, dtype, device,
#: epsilon and Newton key, in step order, cut into runs of at most
#: ``max(1, ROOT_BATCH_COST // side**3)``. The cut does not depend on the number of
#: ranks, and the distributed split hands each rank whole batches, so every root is
#: computed in the batch one process computes it in: bit for bit the same root on
#: CUDA too, where a batch's size picks cuBLAS's batched-GEMM kernels (and the checked
#: path's Newton residual and eigh routine act per batch). Four roots of side 1024 per
#: batch (256 output tiles of 128x128 per GEMM: two waves on an H100's 132 SMs; batches
#: of two, 128 tiles, made the two-GPU bench's one-GPU step 11% slower on H200s), 32 of
#: side 512, 256 of side 256. With ``allow_tf32`` twice that: TF32 products are several
#: times faster, and batches of four left the step bound by the host's per-batch work
#: (H200s: the roots-every-step TF32 step 23% slower than with one batch of eight).
ROOT_BATCH_COST = 4 * 1024 ** 3
ROOT_BATCH_COST_TF32 = 8 * 1024 ** 3
#: Adam grafting of float32 parameters in torch's fused Adam kernel (Shampoo._grafted_fused).
FUSED_GRAFTING = True
_STORE_KEY = "fusekit.optim.comm_uid"
_comm_counter = [0]


def _bad(name: str, msg: str):
    """An InvalidArgumentError naming the argument (a ValueError too)."""
    from ._lib import InvalidArgumentError

    return InvalidArgumentError(f"fusekit.optim.Shampoo: {name} {msg}")


def block_ranges(size: int, block: int) -> list:
    """``[(start, stop), ...]`` covering ``range(size)`` in pieces of at most ``block``
    (the last one may be shorter)."""
    return [(s, min(s + block, size)) for s in range(0, size, block)]


def assign_roots(costs, world_size: int) -> list:
    """Owner rank of each root job: the largest cost first to the least loaded rank
    (ties: the lower job index, then the lower rank). Deterministic, so every rank
    computes the same assignment from the same list."""
    loads = [0.0] * world_size
    owner = [0] * len(costs)
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        r = min(range(world_size), key=lambda r: (loads[r], r))
        owner[i] = r
        loads[r] += costs[i]
    return owner


def root_batches(keys, sides, cost=None) -> list:
    """Canonical batches of root jobs: job indices grouped by ``keys[i]`` (first
    appearance order), each group cut in order into runs of at most
    ``max(1, cost // sides[i]**3)`` (``cost`` default ROOT_BATCH_COST). Depends only
    on the jobs, never on the number of ranks."""
    cost = ROOT_BATCH_COST if cost is None else cost
    groups = {}
    for i, k in enumerate(keys):
        groups.setdefault(k, []).append(i)
    out = []
    for idx in groups.values():
        per = max(1, cost // max(1, sides[idx[0]]) ** 3)
        out += [idx[s:s + per] for s in range(0, len(idx), per)]
    return out


class FusekitComm:
    """The collective :class:`Shampoo` needs, over a :class:`fusekit.Comm`:
    ``all_gather(send, recv)`` of 1-D torch tensors on the communicator's device
    (on torch's current stream). Any object with ``rank``, ``size`` and this
    ``all_gather`` can stand in for it (the tests use one made of threads)."""

    def __init__(self, comm):
        self.comm = comm
        self.rank = comm.rank
        self.size = comm.size

    def all_gather(self, send, recv):
        from .runtime import all_gather

        all_gather(send, recv, comm=self.comm)


def init_distributed(device=None) -> FusekitComm:
    """A fusekit communicator over all ranks of torch.distributed's default group
    (one process per GPU, as torchrun starts them), for ``Shampoo(distributed=...)``.

    Rank 0 makes the NCCL unique id (:func:`fusekit.comm_unique_id`) and puts it in
    torch.distributed's key-value store; every rank reads it and creates its own
    rank of the communicator (:func:`fusekit.comm_init_rank`) on ``device`` (default
    ``cuda:<torch.cuda.current_device()>``). Collective: every rank must call it."""
    import torch
    import torch.distributed as dist

    from ._core import default_context
    from .runtime import Comm, comm_unique_id

    if not (dist.is_available() and dist.is_initialized()):
        raise _bad("distributed", "needs torch.distributed initialised (dist.init_process_group) first")
    rank, world = dist.get_rank(), dist.get_world_size()
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device())
    device = torch.device(device)
    if device.type != "cuda":
        raise _bad("device", f"must be a CUDA device for a communicator of {world} ranks, got {device}")
    uid = _share_from_rank0(comm_unique_id)
    ctx = default_context(f"cuda:{device.index if device.index is not None else torch.cuda.current_device()}")
    return FusekitComm(Comm.init_rank(ctx, world, uid, rank))


def _share_from_rank0(make) -> bytes:
    """``make()`` (bytes) run on rank 0 of torch.distributed's default group, read by
    every rank from the group's key-value store (a new key per call; every rank must
    call it the same number of times)."""
    import torch.distributed as dist

    store = dist.distributed_c10d._get_default_store()
    _comm_counter[0] += 1
    key = f"{_STORE_KEY}.{_comm_counter[0]}"
    if dist.get_rank() == 0:
        store.set(key, make())
    return bytes(store.get(key))


def newton_iterations_for(ratio: float):
    """Newton iterations that finish every direction of ``A + eps I`` given
    ``ratio >= |A + eps I|_F / eps`` (None when unknown: not finite). The smallest
    eigenvalue of Newton's ``M`` starts at ``2.5 eps / |A + eps I|_F`` or above and
    grows 2.44-fold per iteration; from 0.3 about 4 quadratic iterations reach float32
    precision (20 in all for the bench's ratio 1.2e7, as measured); 2 more for
    statistics that grew since (a factor of 6)."""
    if not (isinstance(ratio, float) and math.isfinite(ratio)):
        return None
    return max(4, math.ceil(math.log(max(0.12 * ratio, 1.0)) / math.log(2.44)) + 6)


def _check_args(lr, betas, epsilon, precondition_frequency, start_preconditioning_step, max_preconditioner_dim,
                grafting, grafting_beta2, grafting_epsilon, weight_decay):
    def real(name, v, lo=None, lo_open=False, hi=None, hi_open=False):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise _bad(name, f"must be a finite real number, got {v!r}")
        if lo is not None and (v < lo or (lo_open and v == lo)):
            raise _bad(name, f"= {v} must be {'>' if lo_open else '>='} {lo}")
        if hi is not None and (v > hi or (hi_open and v == hi)):
            raise _bad(name, f"= {v} must be {'<' if hi_open else '<='} {hi}")

    def integer(name, v, lo):
        if isinstance(v, bool) or not isinstance(v, int):
            raise _bad(name, f"must be an int, got {v!r}")
        if v < lo:
            raise _bad(name, f"= {v} must be >= {lo}")

    real("lr", lr, 0.0)
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise _bad("betas", f"must be a pair (beta1, beta2), got {betas!r}")
    real("betas[0]", betas[0], 0.0, False, 1.0, True)
    real("betas[1]", betas[1], 0.0, True, 1.0, False)
    real("epsilon", epsilon, 0.0)
    integer("precondition_frequency", precondition_frequency, 1)
    integer("start_preconditioning_step", start_preconditioning_step, 1)
    integer("max_preconditioner_dim", max_preconditioner_dim, 1)
    if grafting not in _GRAFTING:
        raise _bad("grafting", f"= {grafting!r}; choose 'adam', 'sgd' or None")
    real("grafting_beta2", grafting_beta2, 0.0, True, 1.0, False)
    real("grafting_epsilon", grafting_epsilon, 0.0, True)
    real("weight_decay", weight_decay, 0.0)


def _make_shampoo():
    import torch

    from ._lib import Error as FusekitError
    from .ops import optim as _fo  # its functions looked up at each call (tests replace matrix_power)

    class Shampoo(torch.optim.Optimizer):
        r"""Shampoo with grafting, blocking and distributed roots (docs/optim.md).

        Per parameter of two or more dimensions (viewed as ``[shape[0], rest]``),
        split into blocks of at most ``max_preconditioner_dim`` x
        ``max_preconditioner_dim``, each block ``G`` keeps
        ``L = beta2 L + (1 - beta2) G G^T`` and ``R = beta2 R + (1 - beta2) G^T G``
        (plain sums when ``beta2 = 1``) and the roots
        ``(L / c2 + epsilon I)^(-1/4)``, ``(R / c2 + epsilon I)^(-1/4)``
        (``c2 = 1 - beta2^t``; 1 when ``beta2 = 1`` or ``bias_correction=False``),
        recomputed at step ``start_preconditioning_step`` and then every
        ``precondition_frequency`` steps. Steps count from 1.

        A step, as DistributedShampoo orders it:

        1. ``G <- G + weight_decay W`` unless ``decoupled_weight_decay``;
        2. statistics updated with ``G``; Adam grafting's ``V <- b V + (1 - b) G^2``;
        3. roots recomputed when due;
        4. ``G_bar``: ``G``, or with ``beta1 > 0`` the moving average
           ``M <- beta1 M + (1 - beta1) G`` divided by ``1 - beta1^t``;
        5. the grafted direction ``P_g``: ``G_bar`` (``"sgd"``) or
           ``G_bar / (sqrt(V / (1 - b^t)) + grafting_epsilon)`` (``"adam"``);
           before ``start_preconditioning_step``, for parameters of fewer than
           two dimensions, and (as ``"sgd"``) without grafting, ``P = P_g``;
        6. otherwise per block ``P_s = L_root G_bar R_root`` and, with grafting,
           ``P = P_s |P_g| / (|P_s| + 1e-16)`` (Frobenius norms of the block);
        7. ``P <- P + weight_decay W`` if ``decoupled_weight_decay``;
        8. ``W <- W - lr P``.

        Roots (docs/optim.md, "Root policy"), batched over all matrices of one size:

        - float32 on CUDA (or ``root_method="newton"``): the fast path. Newton with
          a fixed number of iterations (``newton_iterations``) and ``tol=0``,
          nothing read on the host; an acceptance check on the device (the largest
          eigenvalue of ``X^2 (A + eps I) X^2``, 1 for the exact root, at most
          ``1 + ROOT_ACCEPT_TOL``, by power iteration) picks, per matrix, the new
          root or the previous one. The flags are read at the start of the next
          step (a wait for work queued one step before) and each rejected root is
          recomputed then in float64 from the same statistics. Directions of
          ``A + eps I`` too small for the iterations to finish (eigenvalues below
          about ``|A + eps I|_F 2.4^-K``) are preconditioned less than exactly: a
          damping that the check accepts.
        - otherwise (the CPU, float64, ``root_method="checked"``):
          ``fusekit.matrix_power(method="auto")`` with its report, read at once; a
          float32 batch is recomputed in float64 (eigendecomposition) when the
          call raises, returns a non-finite value, or fell back to the
          eigendecomposition with a condition estimate
          ``max |A + eps I|_F / lambda_min`` above ``max_condition_f32``.

        ``max_condition_f32=0`` sends every float32 root straight to float64. When
        the float64 attempt fails as well, the previous root is kept (a warning).
        Under ``distributed`` the owners' flags travel with the roots in the
        all-gather and every rank reads all of them at its next step, retrying every
        rejected root itself: the ranks compute what one process computes.

        Args:
            params: parameters or parameter groups.
            lr: learning rate (>= 0).
            betas: ``(beta1, beta2)``: ``0 <= beta1 < 1`` (0: no moving average of
                the gradient), ``0 < beta2 <= 1``.
            epsilon: added to the diagonal before the roots (>= 0).
            precondition_frequency, start_preconditioning_step: ints >= 1.
            max_preconditioner_dim: largest side of a block (int >= 1).
            grafting: ``"adam"``, ``"sgd"`` or None.
            grafting_beta2, grafting_epsilon: Adam grafting's ``b`` and epsilon.
            weight_decay: >= 0; ``decoupled_weight_decay`` (default True, AdamW
                style) or L2 added to the gradient.
            bias_correction: the ``1 - beta^t`` divisions above (default True).
            allow_tf32: TF32 tensor cores for float32 statistics, roots and
                preconditioning on CUDA (about 1e-3 relative error in the statistics
                and roots); fast-path roots of statistics whose iteration hint is above
                ``TF32_FINISH_HINT`` run ``TF32_DAMPED_ITERATIONS`` iterations, which
                leaves their smallest directions damped.
            max_condition_f32: the float64 retry's condition threshold (see above;
                0 computes every float32 root in float64).
            root_method: ``"auto"`` (the fast path for float32 on CUDA),
                ``"newton"`` (the fast path for float32 everywhere) or
                ``"checked"`` (never the fast path).
            newton_iterations: the fast path's iterations, an int in [1, 100]; None
                (default): at most 20, or 12 with ``allow_tf32``, fewer where the
                statistics' last ``|A + eps I|_F / eps`` needed fewer
                (:func:`newton_iterations_for`).
            distributed: None (every root on this process), True (a communicator
                over torch.distributed's default group from :func:`init_distributed`)
                or a communicator (:class:`FusekitComm` or any object with ``rank``,
                ``size``, ``all_gather``). Every rank must hold the same parameters
                and gradients (after DDP's all-reduce), all of one dtype and device;
                each computes its share of the roots and the roots are all-gathered.
        """

        def __init__(self, params, lr=1e-3, betas=(0.9, 1.0), epsilon=1e-12, precondition_frequency=1,
                     start_preconditioning_step=1, max_preconditioner_dim=1024, grafting="adam",
                     grafting_beta2=0.999, grafting_epsilon=1e-8, weight_decay=0.0, decoupled_weight_decay=True,
                     bias_correction=True, *, allow_tf32=False, max_condition_f32=1e6, root_method="auto",
                     newton_iterations=None, distributed=None):
            if isinstance(grafting, str):
                grafting = grafting.lower()
            if isinstance(betas, (tuple, list)):
                betas = tuple(betas)
            _check_args(lr, betas, epsilon, precondition_frequency, start_preconditioning_step,
                        max_preconditioner_dim, grafting, grafting_beta2, grafting_epsilon, weight_decay)
            if isinstance(max_condition_f32, bool) or not isinstance(max_condition_f32, (int, float)) \
                    or not max_condition_f32 >= 0:
                raise _bad("max_condition_f32", f"must be a real number >= 0, got {max_condition_f32!r}")
            defaults = dict(lr=lr, betas=betas, epsilon=epsilon, precondition_frequency=precondition_frequency,
                            start_preconditioning_step=start_preconditioning_step,
                            max_preconditioner_dim=max_preconditioner_dim, grafting=grafting,
                            grafting_beta2=grafting_beta2, grafting_epsilon=grafting_epsilon,
                            weight_decay=weight_decay, decoupled_weight_decay=bool(decoupled_weight_decay),
                            bias_correction=bool(bias_correction))
            super().__init__(params, defaults)
            for g in self.param_groups:
                self._check_group(g)
            if root_method not in _ROOT_METHODS:
                raise _bad("root_method", f"= {root_method!r}; choose 'auto', 'newton' or 'checked'")
            if newton_iterations is not None and (isinstance(newton_iterations, bool)
                                                  or not isinstance(newton_iterations, int)
                                                  or not 1 <= newton_iterations <= 100):
                raise _bad("newton_iterations", f"must be None or an int in [1, 100], got {newton_iterations!r}")
            self.allow_tf32 = bool(allow_tf32)
            self.max_condition_f32 = float(max_condition_f32)
            self.root_method = root_method
            self.newton_iterations = newton_iterations
            self._pending = []  # fast-path acceptance flags not read yet (see _settle)
            if distributed is True:
                distributed = init_distributed()
            elif distributed is False:
                distributed = None
            if distributed is not None and not all(hasattr(distributed, a) for a in ("rank", "size", "all_gather")):
                raise _bad("distributed", f"must be None, True or a communicator (rank, size, all_gather), "
                                          f"got {type(distributed).__name__}")
            self.comm = distributed
            #: roots this process computed / retried in float64 / kept after a failure / retried
            #: in strict float32 after a rejected TF32 root (counters; distributed, every rank
            #: retries every rejected fast-path root, see _settle).
            self.root_stats = {"computed": 0, "float64_retries": 0, "kept": 0, "strict_retries": 0}

        def _check_group(self, g):
            _check_args(g["lr"], g["betas"], g["epsilon"], g["precondition_frequency"],
                        g["start_preconditioning_step"], g["max_preconditioner_dim"], g["grafting"],
                        g["grafting_beta2"], g["grafting_epsilon"], g["weight_decay"])
            for p in g["params"]:
                if p.dtype not in (torch.float32, torch.float64):
                    raise _bad("params", f"must be float32 or float64, got a {p.dtype} parameter")

        def add_param_group(self, param_group):
            super().add_param_group(param_group)
            if hasattr(self, "comm"):  # after __init__: groups added later are checked here
                self._check_group(self.param_groups[-1])

        # -- state -------------------------------------------------------------------
        @staticmethod
        def _blocks(p, group):
            """Row and column ranges of a parameter's blocks (None: not Shampoo)."""
            if p.dim() < 2:
                return None
            m = p.shape[0]
            n = p.numel() // m if m else 0
            if m == 0 or n == 0:
                return None
            b = group["max_preconditioner_dim"]
            return [(r, c) for r in block_ranges(m, b) for c in block_ranges(n, b)]

        def _init_state(self, p, group):
            st = self.state[p]
            st["step"] = torch.tensor(0, dtype=torch.int64)
            if group["betas"][0] > 0:
                st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            if group["grafting"] == "adam":
                st["graft_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            blocks = self._blocks(p, group)
            if blocks is not None:
                kw = dict(dtype=p.dtype, device=p.device)
                st["L"] = [torch.zeros(r[1] - r[0], r[1] - r[0], **kw) for r, _ in blocks]
                st["R"] = [torch.zeros(c[1] - c[0], c[1] - c[0], **kw) for _, c in blocks]
                st["L_root"] = [torch.eye(r[1] - r[0], **kw) for r, _ in blocks]
                st["R_root"] = [torch.eye(c[1] - c[0], **kw) for _, c in blocks]
            return st

        def state_dict(self):
            if getattr(self, "_pending", None):
                self._settle()  # the last roots' flags and iteration hints belong to the state
            return super().state_dict()

        def load_state_dict(self, state_dict):
            self._pending = []  # flags of roots that the loaded state replaces
            super().load_state_dict(state_dict)

        # -- roots -------------------------------------------------------------------
        def _fast_path(self, dtype, device):
            """Whether float32 roots take the fixed-iteration Newton path (root_method)."""
            if dtype != torch.float32 or self.max_condition_f32 <= 0 or self.root_method == "checked":
                return False
            return self.root_method == "newton" or device.type == "cuda"

        def _iterations(self, tf32):
            if self.newton_iterations is not None:
                return self.newton_iterations
            return NEWTON_ITERATIONS_TF32 if tf32 else NEWTON_ITERATIONS_F32

        def _newton_iterations(self, job):
            """The fast path's Newton iterations for a job's root: ``newton_iterations``
            if given; else the cap (20, or 12 with TF32) for an unknown hint, the hint up
            to the cap, and with TF32 ``TF32_DAMPED_ITERATIONS`` for a hint above
            ``TF32_FINISH_HINT``."""
            tf32 = self.allow_tf32
            iters = self._iterations(tf32)
            hint = self._hint(job) if self.newton_iterations is None else None
            if hint is None:
                return iters
            return TF32_DAMPED_ITERATIONS if tf32 and hint > TF32_FINISH_HINT else min(iters, hint)

        def _probe(self, n, dtype, device):
            """Fixed unit vectors ``[n, k]`` for :meth:`_accept` (one per size, dtype, device)."""
            key = (n, dtype, device)
            v = self._probes.get(key) if hasattr(self, "_probes") else None
            if v is None:
                gen = torch.Generator().manual_seed(n)
                v = torch.randn(n, min(4, n), generator=gen, dtype=torch.float64)
                v = (v / v.norm(dim=0, keepdim=True)).to(dtype=dtype, device=device)
                self.__dict__.setdefault("_probes", {})[key] = v
            return v

        def _accept(self, S, X, eps):
            """On the device, no host read: ``[batch]`` bools, True where the largest
            eigenvalue of ``Y = X^2 (S + eps I) X^2`` (similar to ``X^4 (S + eps I)``:
            1 for the exact root, in [0, 1) where Newton is unfinished, above 1 where a
            direction is over-amplified or the iteration diverged) is at most
            ``1 + ROOT_ACCEPT_TOL``, estimated by two power steps on four fixed probe
            vectors (a non-finite X gives NaN: rejected)."""
            v = self._probe(S.shape[-1], S.dtype, S.device).expand(S.shape[0], -1, -1)

            def y(v):
                u = torch.bmm(X, torch.bmm(X, v))
                u = torch.baddbmm(u, S, u, beta=eps)
                return torch.bmm(X, torch.bmm(X, u))

            for _ in range(2):
                v = y(v)
                v = v / v.norm(dim=1, keepdim=True)
            q = (v * y(v)).sum(dim=1).amax(dim=1)
            return q <= 1.0 + ROOT_ACCEPT_TOL

        def _exact_roots(self, S, eps, dtype, retry):
            """Roots of the scaled stack ``S`` by float64 (or S's float64) eigh: a list,
            None where it failed (a warning; the previous root is kept)."""
            if retry:
                self.root_stats["float64_retries"] += S.shape[0]
            S = S.double()
            why = "a non-finite result"
            try:
                X = _fo.matrix_power(S, -0.25, eps, method="eigh")
                if bool(torch.isfinite(X).all()):
                    return list(X.to(dtype).unbind(0))
            except FusekitError as e:
                why = str(e)
            warnings.warn(f"fusekit.optim.Shampoo: {S.shape[0]} root(s) of side {S.shape[-1]} failed in "
                          f"{S.dtype} ({why}); keeping their previous roots", RuntimeWarning, stacklevel=5)
            self.root_stats["kept"] += S.shape[0]
            return [None] * S.shape[0]

        @staticmethod
        def _scaled(mats, scales):
            S = torch.stack(mats)
            if len(set(scales)) == 1:  # one step count and beta2: a host scalar, no copy
                if scales[0] != 1.0:
                    S.mul_(scales[0])
            else:
                S.mul_(torch.tensor(scales, dtype=S.dtype).to(S.device).view(-1, 1, 1))
            return S

        def _root_batch(self, jobs):
            """Inverse 4th roots of ``stat * scale + eps I`` for ``jobs`` (stat, scale,
            eps, root) of one size, dtype, device and eps: a list of results (None where
            every attempt failed) and the fast path's ``[2, batch]`` device tensor of
            acceptance flags and ``|S + eps I|_F / eps`` bounds (None off the fast
            path), for :meth:`_defer`. On the fast path a rejected root is replaced by
            the previous one on the device."""
            mats, eps, olds = [j[0] for j in jobs], jobs[0][2], [j[3] for j in jobs]
            S = self._scaled(mats, [j[1] for j in jobs])
            self.root_stats["computed"] += len(jobs)
            if self._fast_path(S.dtype, S.device):
                tf32 = self.allow_tf32
                iters = max(self._newton_iterations(j) for j in jobs)  # one value: a batch shares its key
                #: (side, batch, Newton iterations, "tf32" or "f32") of each fast-path
                #: batch, the latest last.
                log = self.__dict__.setdefault("newton_log", [])
                log.append((S.shape[-1], S.shape[0], iters, "tf32" if tf32 else "f32"))
                del log[:-64]
                try:
                    X = _fo.matrix_power(S, -0.25, eps, method="newton", max_iter=iters, tol=0.0,
                                         allow_tf32=tf32)
                except FusekitError:
                    return self._exact_roots(S, eps, S.dtype, retry=True), None
                ok = self._accept(S, X, eps)
                X = torch.where(ok.view(-1, 1, 1), X, torch.stack(olds))
                # |S + eps I|_F / eps (bounded above), for the next computation's iterations
                ratio = (torch.linalg.matrix_norm(S) + eps * S.shape[-1] ** 0.5) / eps if eps > 0 else \
                    torch.full_like(ok, math.inf, dtype=S.dtype)
                return list(X.unbind(0)), torch.stack([ok.to(S.dtype), ratio])
            if S.dtype == torch.float32 and self.max_condition_f32 > 0:
                try:
                    X, rep = _fo.matrix_power(S, -0.25, eps, method="auto", allow_tf32=self.allow_tf32,
                                              return_report=True)
                    ok = rep.converged and bool(torch.isfinite(X).all())
                    if ok and rep.method == "eigh":
                        top = float(torch.linalg.matrix_norm(S).max()) + eps
                        lo = rep.min_eigenvalue
                        ok = lo > 0 and top / lo <= self.max_condition_f32
                    if ok:
                        return list(X.unbind(0)), None
                except FusekitError:
                    pass
            return self._exact_roots(S, eps, S.dtype, retry=S.dtype == torch.float32), None

        def _redo(self, S, eps, tf32):
            """Roots the fast path rejected: after TF32 (``tf32``), strict float32 Newton
            (20 iterations, its check read at once) first; what remains in float64."""
            out = [None] * S.shape[0]
            if tf32 and S.dtype == torch.float32:
                self.root_stats["strict_retries"] += S.shape[0]
                try:
                    X = _fo.matrix_power(S, -0.25, eps, method="newton", max_iter=NEWTON_ITERATIONS_F32, tol=0.0)
                    out = [x if f else None for x, f in zip(X.unbind(0), self._accept(S, X, eps).tolist())]
                except FusekitError:
                    pass
            bad = [i for i, x in enumerate(out) if x is None]
            if bad:
                for i, x in zip(bad, self._exact_roots(S[bad], eps, S.dtype, retry=True)):
                    out[i] = x
            return out

        @staticmethod
        def _hint(job):
            """The Newton iterations a job's root needed last time (None: not known)."""
            hints, k = job[4]
            return hints[k] or None

        def _learn(self, jobs, info):
            """Acceptance flags from ``info`` (``[2, batch]``: flags, ``|S + eps I|_F / eps``
            bounds, read on the host here), remembering each root's iteration hint. A NaN
            flag (distributed: a root its owner computed off the fast path, after a
            failed Newton call) is accepted and leaves the hint as it was, as one
            process does."""
            flags, ratios = info.tolist()
            for j, f, r in zip(jobs, flags, ratios):
                if f == f:
                    hints, k = j[4]
                    hints[k] = newton_iterations_for(r) or 0
            return [f == 1.0 or f != f for f in flags]

        def _defer(self, info, jobs):
            """Queues ``info`` (see :meth:`_root_batch`) of ``jobs`` for :meth:`_settle`:
            copied to the host without a wait, read at the next step."""
            if info.is_cuda:
                host = torch.empty(info.shape, dtype=info.dtype, pin_memory=True)
                host.copy_(info, non_blocking=True)
                ev = torch.cuda.Event()
                ev.record()
            else:
                host, ev = info, None
            self._pending.append((host, ev, list(jobs)))

        def _settle(self):
            """Reads the fast path's acceptance flags of the last root computation (at
            most one wait per step, for work queued a step ago) and recomputes each
            rejected root in float64 from its statistics, which are still those the
            root was computed from (this runs before the step updates them).
            Distributed, every rank holds every root's flags (gathered with the roots)
            and redoes every rejected root in the batches one process would use, so
            this needs no communication and the ranks stay equal."""
            pending, self._pending = self._pending, []
            for _, ev, _ in pending:
                if ev is not None:
                    ev.synchronize()
            self._mark("flags wait")  # the wait for last step's roots, apart from host work
            for info, ev, jobs in pending:
                tf32 = self.allow_tf32
                bad = [j for j, f in zip(jobs, self._learn(jobs, info)) if not f]
                if not bad:
                    continue
                S = self._scaled([j[0] for j in bad], [j[1] for j in bad])
                redo = self._redo(S, bad[0][2], tf32)
                dst = [j[3] for j, x in zip(bad, redo) if x is not None]
                if dst:
                    torch._foreach_copy_(dst, [x for x in redo if x is not None])

        def _compute_roots(self, jobs):
            """``jobs``: (stat, scale, eps, root) to recompute, in an order every rank
            shares, computed in canonical batches (:func:`root_batches`). Each rank
            computes the whole batches it owns (:func:`assign_roots` over the batches'
            costs) and the results are all-gathered, with the fast path's acceptance
            flags, so that every rank settles every root as one process would
            (:meth:`_settle`): distributed roots are bit for bit one process's."""
            if not jobs:
                return
            comm = self.comm
            world = comm.size if comm is not None else 1
            ref = jobs[0][3]
            if world > 1 and any(j[3].dtype != ref.dtype or j[3].device != ref.device for j in jobs):
                raise _bad("params", "must share one dtype and device when the roots are distributed")
            # one batch per iteration hint too (a root's iterations do not depend on
            # which roots share its batch); with TF32 per iteration count, since damped
            # roots of every ill-conditioned hint run the same TF32_DAMPED_ITERATIONS
            # and one batch of them is faster (bench_shampoo)
            keys = [(j[0].shape[0], j[0].dtype, j[0].device, j[2],
                     self._newton_iterations(j) if self.allow_tf32 else self._hint(j)) for j in jobs]
            batches = root_batches(keys, [j[0].shape[0] for j in jobs],
                                   ROOT_BATCH_COST_TF32 if self.allow_tf32 else ROOT_BATCH_COST)
            owners = assign_roots([len(b) * float(jobs[b[0]][0].shape[0]) ** 3 for b in batches], world)
            me = comm.rank if world > 1 else 0
            owner = [0] * len(jobs)
            results, infos = {}, {}
            for idx, o in zip(batches, owners):
                for i in idx:
                    owner[i] = o
                if o != me:
                    continue
                outs, info = self._root_batch([jobs[i] for i in idx])
                for c, (i, x) in enumerate(zip(idx, outs)):
                    results[i] = x if x is not None else jobs[i][3]  # a failed root keeps the old one
                    if info is not None:
                        infos[i] = info[:, c]
                if info is not None and world == 1:
                    self._defer(info, [jobs[i] for i in idx])
            if world == 1:
                new = [i for i in results if results[i] is not jobs[i][3]]
                dst, src = [jobs[i][3] for i in new], [results[i] for i in new]
                if dst:
                    torch._foreach_copy_(dst, src)
                return
            # one flat shard per rank (the largest share's size), all-gathered; on the fast
            # path each root is followed by its (flag, bound), NaN where its owner computed
            # it off the fast path (after a failed Newton call)
            extra = 2 if self._fast_path(ref.dtype, ref.device) else 0
            sizes = [0] * world
            offset = [0] * len(jobs)
            for i, j in enumerate(jobs):
                offset[i] = sizes[owner[i]]
                sizes[owner[i]] += j[3].numel() + extra
            shard = max(sizes)
            send = torch.full((shard,), math.nan, dtype=ref.dtype, device=ref.device)
            for i in results:
                n = jobs[i][3].numel()
                send[offset[i]:offset[i] + n].copy_(results[i].reshape(-1))
                if extra and i in infos:
                    send[offset[i] + n:offset[i] + n + 2].copy_(infos[i])
            recv = torch.empty(world * shard, dtype=ref.dtype, device=ref.device)
            comm.all_gather(send, recv)
            dst, src, info = [], [], {}
            for i, j in enumerate(jobs):
                n = j[3].numel()
                base = owner[i] * shard + offset[i]
                dst.append(j[3])
                src.append(recv[base:base + n].view_as(j[3]))
                info[i] = recv[base + n:base + n + extra]
            torch._foreach_copy_(dst, src)
            if extra:
                for idx in batches:  # the batches of one process, in its order
                    self._defer(torch.stack([info[i] for i in idx], dim=1), [jobs[i] for i in idx])

        # -- the step ----------------------------------------------------------------
        def _mark(self, name):
            """With ``self.profile`` set to a list: appends ``(phase, CUDA event or None,
            perf_counter)`` at the end of each phase of a step (benches/bench_shampoo.py).
            "flags wait" ends the wait in :meth:`_settle` for the last root step's
            flags (on the host: a synchronisation, not work)."""
            log = self.__dict__.get("profile")
            if log is None:
                return
            ev = None
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                ev = torch.cuda.Event(enable_timing=True)
                ev.record()
            log.append((name, ev, time.perf_counter()))

        def _block_plan(self, p, group):
            """``_blocks`` cached per (shape, max_preconditioner_dim)."""
            cache = self.__dict__.setdefault("_block_cache", {})
            key = (tuple(p.shape), group["max_preconditioner_dim"])
            if key not in cache:
                cache[key] = self._blocks(p, group)
            return cache[key]

        @torch.no_grad()
        def step(self, closure=None):
            loss = None
            if closure is not None:
                with torch.enable_grad():
                    loss = closure()
            self._mark("start")
            if getattr(self, "_pending", None):
                self._settle()
            plans, jobs = [], []
            for group in self.param_groups:
                ps, sts, gs, ts = [], [], [], []
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    if p.grad.is_sparse:
                        raise _bad("params", "have a sparse gradient; Shampoo needs dense gradients")
                    st = self.state[p]
                    if not st:
                        st = self._init_state(p, group)
                    st["step"] += 1
                    ps.append(p)
                    sts.append(st)
                    gs.append(p.grad.detach())
                    ts.append(int(st["step"]))
                if not ps:
                    continue
                if group["weight_decay"] != 0 and not group["decoupled_weight_decay"]:
                    gs = torch._foreach_add(gs, ps, alpha=group["weight_decay"])
                self._statistics(group, ps, sts, gs, ts, jobs)
                plans.append((group, ps, sts, gs, ts))
            self._mark("settle+stats")
            self._compute_roots(jobs)
            self._mark("roots")
            for group, ps, sts, gs, ts in plans:
                gbars, pgs = self._grafted(group, sts, gs, ts)
                self._mark("grafting")
                ds = self._directions(group, ps, sts, gbars, pgs, ts)
                if group["weight_decay"] != 0 and group["decoupled_weight_decay"]:
                    ds = torch._foreach_add(ds, ps, alpha=group["weight_decay"])
                torch._foreach_add_(ps, ds, alpha=-group["lr"])
                self._mark("precondition+update")
            return loss

        def _statistics(self, group, ps, sts, gs, ts, jobs):
            """L and R of every block updated; the roots due appended to ``jobs``."""
            beta2 = group["betas"][1]
            a, b = (1.0, 1.0) if beta2 == 1.0 else (1.0 - beta2, beta2)
            start, freq = group["start_preconditioning_step"], group["precondition_frequency"]
            for p, st, g, t in zip(ps, sts, gs, ts):
                blocks = self._block_plan(p, group)
                if blocks is None:
                    continue
                g2 = g.reshape(p.shape[0], -1)
                one = len(blocks) == 1
                if one:
                    g2 = g2.contiguous()
                for k, (r, c) in enumerate(blocks):
                    gb = g2 if one else g2[r[0]:r[1], c[0]:c[1]].contiguous()
                    _fo.shampoo_stats(gb, st["L"][k], st["R"][k], alpha=a, beta=b, allow_tf32=self.allow_tf32)
                if (t % freq == 0 and t > start) or t == start:
                    c2 = 1.0 - beta2 ** t if (beta2 < 1.0 and group["bias_correction"]) else 1.0
                    hints = st.setdefault("newton_hints", {"L": [0] * len(blocks), "R": [0] * len(blocks)})
                    for k in range(len(blocks)):
                        jobs.append((st["L"][k], 1.0 / c2, group["epsilon"], st["L_root"][k], (hints["L"], k)))
                        jobs.append((st["R"][k], 1.0 / c2, group["epsilon"], st["R_root"][k], (hints["R"], k)))

        def _grafted(self, group, sts, gs, ts):
            """``(G_bar, P_g)`` of every parameter (steps 2, 4, 5), each operation once
            over the group's parameters (``torch._foreach_*``), or with Adam grafting of
            float32 parameters one fused kernel (:meth:`_grafted_fused`)."""
            beta1 = group["betas"][0]
            bc, graft = group["bias_correction"], group["grafting"]
            if graft == "adam" and bc and FUSED_GRAFTING and hasattr(torch, "_fused_adam_") \
                    and all(g.dtype == torch.float32 for g in gs):
                return self._grafted_fused(group, sts, gs, ts)
            if graft == "adam":
                gb2 = group["grafting_beta2"]
                sq = [st["graft_sq"] for st in sts]
                torch._foreach_mul_(sq, gb2)
                torch._foreach_addcmul_(sq, gs, gs, value=1.0 - gb2)
            if beta1 > 0:
                ms = [st["exp_avg"] for st in sts]
                torch._foreach_lerp_(ms, gs, 1.0 - beta1)
                gbars = torch._foreach_div(ms, [1.0 - beta1 ** t for t in ts]) if bc else ms
            else:
                gbars = gs
            if graft != "adam":
                return gbars, gbars
            den = torch._foreach_div(sq, [1.0 - gb2 ** t if bc else 1.0 for t in ts])
            torch._foreach_sqrt_(den)
            torch._foreach_add_(den, group["grafting_epsilon"])
            return gbars, torch._foreach_div(gbars, den)

        def _scratch(self, name, like):
            """Tensors shaped like ``like``, kept between steps (not state)."""
            cache = self.__dict__.setdefault("_scratch_cache", {})
            key = (name, tuple((tuple(t.shape), t.dtype, t.device) for t in like))
            if key not in cache:
                cache[key] = [torch.empty_like(t) for t in like]
            return cache[key]

        def _grafted_fused(self, group, sts, gs, ts):
            """Adam grafting in torch's fused Adam kernel (what ``torch.optim.Adam(fused=True)``
            runs): on zeroed buffers with ``lr = -1`` it writes
            ``P_g = M / (1 - beta1^t) / (sqrt(V / (1 - b^t)) + grafting_epsilon)`` and
            updates ``M`` and ``V`` in place, one pass over the gradients instead of eight.
            ``G_bar`` is then ``M`` without its bias correction: every use of it is
            rescaled to ``|P_g|`` by the grafting, which makes its scale irrelevant."""
            beta1, gb2 = group["betas"][0], group["grafting_beta2"]
            sq = [st["graft_sq"] for st in sts]
            ms = [st["exp_avg"] for st in sts] if beta1 > 0 else self._scratch("m", gs)
            pgs = self._scratch("pg", gs)
            torch._foreach_zero_(pgs)
            steps = {}
            for g, t in zip(gs, ts):
                if (t, g.device) not in steps:
                    steps[(t, g.device)] = torch.full((), float(t), dtype=torch.float32, device=g.device)
            torch._fused_adam_(pgs, gs, ms, sq, [], [steps[(t, g.device)] for g, t in zip(gs, ts)], lr=-1.0,
                               beta1=beta1, beta2=gb2, weight_decay=0.0, eps=group["grafting_epsilon"],
                               amsgrad=False, maximize=False)
            return (ms if beta1 > 0 else gs), pgs

        def _directions(self, group, ps, sts, gbars, pgs, ts):
            """The update direction of every parameter (step 6): ``P_g``, or per block
            ``L_root G_bar R_root`` with the grafted norm (norms of all blocks at once)."""
            start, graft = group["start_preconditioning_step"], group["grafting"]
            ds = list(pgs)
            dirs, gparts, owners = [], [], []
            for i, (p, st, gbar, pg, t) in enumerate(zip(ps, sts, gbars, pgs, ts)):
                blocks = self._block_plan(p, group)
                if blocks is None or t < start:
                    continue
                m = p.shape[0]
                g2 = gbar.reshape(m, -1)
                pg2 = pg.reshape(m, -1)
                one = len(blocks) == 1
                for k, (r, c) in enumerate(blocks):
                    gb = g2.contiguous() if one else g2[r[0]:r[1], c[0]:c[1]].contiguous()
                    dirs.append(_fo.shampoo_precondition(gb, st["L_root"][k], st["R_root"][k],
                                                         allow_tf32=self.allow_tf32))
                    gparts.append(pg2 if one else pg2[r[0]:r[1], c[0]:c[1]])
                    owners.append((i, r, c, one))
            if not dirs:
                return ds
            if graft is not None:
                gn = torch._foreach_norm(gparts)
                sn = torch._foreach_norm(dirs)
                torch._foreach_add_(sn, 1e-16)
                torch._foreach_div_(gn, sn)
                torch._foreach_mul_(dirs, gn)
            full = {}
            for x, (i, r, c, one) in zip(dirs, owners):
                p = ps[i]
                if one:
                    ds[i] = x.view(p.shape)
                    continue
                if i not in full:
                    full[i] = torch.empty((p.shape[0], p.numel() // p.shape[0]), dtype=p.dtype, device=p.device)
                    ds[i] = full[i].view(p.shape)
                full[i][r[0]:r[1], c[0]:c[1]].copy_(x)
            return ds

    Shampoo.__module__ = __name__
    return Shampoo


_classes = {}


def __getattr__(name):
    if name == "Shampoo":
        if "Shampoo" not in _classes:
            _classes["Shampoo"] = _make_shampoo()
        return _classes["Shampoo"]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
