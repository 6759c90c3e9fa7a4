"""The geodesic ops' precision on torch (fusekit.torch.geodesic, fusekit.nn): the
mode chosen from ``torch.get_float32_matmul_precision()`` or an explicit
``precision``, the ``flags`` word that reaches ``torch.ops.fusekit.christoffel`` /
``leapfrog`` (recorded with a TorchDispatchMode, and in the graphs torch.compile
builds), the errors, and that on the CPU (which ignores the modes) values and
gradients are those of the strict path. docs/geodesic.md, "Precision in torch and
JAX", has the table tested here."""

import numpy as np
import pytest

import fusekit

torch = pytest.importorskip("torch")
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import fusekit.nn as fnn  # noqa: E402
from fusekit.torch import geodesic as geo  # noqa: E402

TF32, FORCE_GENERIC, TF32X3 = fusekit.GEO_ALLOW_TF32, fusekit.GEO_FORCE_GENERIC, fusekit.GEO_ALLOW_TF32X3
SETTINGS = ("highest", "high", "medium")  # every value torch.set_float32_matmul_precision takes
# the specification (docs/geodesic.md): the flags of (christoffel, leapfrog) forwards
WANT_FLAGS = {
    "highest": (0, 0), "high": (0, TF32X3), "medium": (0, TF32X3),
    "strict": (0, 0), "tf32x3": (0, TF32X3), "tf32": (TF32, TF32),
}
FORWARDS = (torch.ops.fusekit.christoffel.default, torch.ops.fusekit.leapfrog.default)


@pytest.fixture(autouse=True)
def _restore_precision():
    before = torch.get_float32_matmul_precision()
    yield
    torch.set_float32_matmul_precision(before)


def _flags_arg(target, args, kwargs):
    """The ``flags`` argument of a call of a fusekit forward op (its schema's default
    where the call leaves it out)."""
    arguments = target._schema.arguments
    i = [a.name for a in arguments].index("flags")
    if "flags" in kwargs:
        return kwargs["flags"]
    return args[i] if len(args) > i else arguments[i].default_value


class _Record(TorchDispatchMode):
    """Records ``(op name, flags)`` of every fusekit forward op that runs."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in FORWARDS:
            self.calls.append((func._schema.name.split("::")[1], _flags_arg(func, args, kwargs)))
        return func(*args, **kwargs)


def _problem(dtype=torch.float32, b=4, d=6, r=3, seed=0, grad=True, uw=0.5):
    rng = np.random.default_rng(seed)
    x, v, f = (torch.tensor(rng.standard_normal((b, d)) * 0.5, dtype=dtype) for _ in range(3))
    U, W = (torch.tensor(rng.standard_normal((d, r)) * uw, dtype=dtype) for _ in range(2))
    mu = torch.full((d,), 0.1, dtype=dtype)
    ts = [x, v, U, W, f]
    if grad:
        for t in ts:
            t.requires_grad_(True)
    return (*ts, mu)


def _run_both(precision=None, flags=None, grad=True):
    """The flags each forward op got from the wrappers."""
    x, v, U, W, f, mu = _problem(grad=grad)
    with _Record() as rec:
        geo.christoffel(v, U, W, precision=precision, flags=flags)
        geo.leapfrog(x, v, U, W, 0.1, 3, f=f, mu=mu, precision=precision, flags=flags)
    assert [n for n, _ in rec.calls] == ["christoffel", "leapfrog"], rec.calls
    return tuple(fl for _, fl in rec.calls)


# ------------------------------------------------------------------ the mapping


@pytest.mark.parametrize("setting", SETTINGS)
def test_mode_for_every_torch_setting(setting):
    assert geo.mode_for_torch_setting(setting) == {"highest": "strict", "high": "tf32x3", "medium": "tf32x3"}[setting]
    torch.set_float32_matmul_precision(setting)
    assert geo.precision_mode(None) == geo.mode_for_torch_setting(setting)
    for x3, want in ((False, WANT_FLAGS[setting][0]), (True, WANT_FLAGS[setting][1])):
        assert geo.geo_flags(x3=x3) == want


def test_highest_is_strict():
    torch.set_float32_matmul_precision("highest")
    assert geo.geo_flags(x3=True) == 0 and geo.geo_flags(x3=False) == 0


def test_mode_for_unknown_torch_setting():
    for bad in ("low", "HIGH", None, 3):
        with pytest.raises(ValueError, match="'highest', 'high', 'medium'"):
            geo.mode_for_torch_setting(bad)


@pytest.mark.parametrize("mode", geo.PRECISIONS)
def test_explicit_modes_flags(mode):
    for setting in SETTINGS:  # an explicit precision ignores torch's setting
        torch.set_float32_matmul_precision(setting)
        assert (geo.geo_flags(mode, x3=False), geo.geo_flags(mode, x3=True)) == WANT_FLAGS[mode]


def test_same_modes_as_fusekit_jax():
    """The torch modes are fusekit.jax.precision_mode's names, and torch's "highest"
    and "high" give the flags JAX's "highest" and "high" give."""
    jax_mod = pytest.importorskip("fusekit.jax")
    assert set(geo.PRECISIONS) == {jax_mod.precision_mode(p) for p in ("highest", "high", "tensorfloat32")}
    for setting in ("highest", "high"):
        assert geo.mode_for_torch_setting(setting) == jax_mod.precision_mode(setting)
        for x3 in (False, True):
            assert geo.geo_flags(geo.mode_for_torch_setting(setting), x3=x3) == jax_mod._geo_flags(setting, x3)


def test_mixed_precision_apis_fall_back_to_the_cuda_switch():
    """With the legacy and the new precision APIs mixed torch refuses to name a
    setting; the CUDA matmul TF32 switch then decides."""
    torch.set_float32_matmul_precision("highest")
    torch.backends.mkldnn.matmul.fp32_precision = "bf16"
    try:
        torch.get_float32_matmul_precision()
    except RuntimeError:
        pass
    else:
        pytest.skip("this torch names a setting for mixed APIs")
    assert geo.precision_mode(None) == "strict"
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    assert geo.precision_mode(None) == "tf32x3"


# ------------------------------------------------------------------ what reaches the ops


@pytest.mark.parametrize("grad", [True, False])
@pytest.mark.parametrize("setting", SETTINGS)
def test_functions_follow_torch_at_call_time(setting, grad):
    torch.set_float32_matmul_precision(setting)
    assert _run_both(grad=grad) == WANT_FLAGS[setting]
    # read at each call: a change applies to the next one
    other = "highest" if setting != "highest" else "high"
    torch.set_float32_matmul_precision(other)
    assert _run_both(grad=grad) == WANT_FLAGS[other]


@pytest.mark.parametrize("mode", geo.PRECISIONS)
def test_explicit_precision_overrides_torch(mode):
    for setting in SETTINGS:
        torch.set_float32_matmul_precision(setting)
        assert _run_both(precision=mode) == WANT_FLAGS[mode]


def test_raw_flags_pass_as_given():
    torch.set_float32_matmul_precision("high")  # not followed when flags are given
    assert _run_both(flags=0) == (0, 0)
    assert _run_both(flags=TF32 | FORCE_GENERIC) == (TF32 | FORCE_GENERIC,) * 2
    assert _run_both(flags=FORCE_GENERIC, precision="strict") == (FORCE_GENERIC,) * 2
    x, v, U, W, f, mu = _problem()
    with _Record() as rec:
        geo.leapfrog(x, v, U, W, 0.1, 2, flags=TF32X3, precision="tf32x3")
        geo.christoffel(v, U, W, flags=TF32X3, precision="tf32x3")  # no 3xTF32 there: both strict
        geo.christoffel(v, U, W, flags=TF32X3, precision="strict")
    assert [fl for _, fl in rec.calls] == [TF32X3] * 3


def test_flags_reach_the_c_abi():
    """An unknown bit is refused by the library itself (its message names the C
    constants): the word the wrappers pass is the one fk_*_forward gets."""
    x, v, U, W, f, mu = _problem()
    with pytest.raises(fusekit.InvalidArgumentError, match=r"fk_christoffel_forward: flags = 0x8 .*FK_GEO_ALLOW_TF32"):
        geo.christoffel(v, U, W, flags=8)
    with pytest.raises(fusekit.InvalidArgumentError, match=r"fk_leapfrog_forward: flags = 0x10 .*FK_GEO_ALLOW_TF32"):
        geo.leapfrog(x, v, U, W, 0.1, 2, flags=16)
    with torch.no_grad():
        with pytest.raises(fusekit.InvalidArgumentError, match=r"fk_leapfrog_forward: flags = 0x8 "):
            geo.leapfrog(x, v, U, W, 0.1, 2, flags=8)


@pytest.mark.parametrize("setting", SETTINGS)
def test_modules_follow_torch_or_their_precision(setting):
    torch.set_float32_matmul_precision(setting)
    x, v, *_ = _problem()
    flow = fnn.LeapfrogIntegrator(6, 3, dt=0.1, steps=2, friction=True)
    with _Record() as rec:
        flow(x, v)
        flow.christoffel(v)
    assert [fl for _, fl in rec.calls] == [WANT_FLAGS[setting][1], WANT_FLAGS[setting][0]]
    for mode in geo.PRECISIONS:
        flow = fnn.LeapfrogIntegrator(6, 3, dt=0.1, steps=2, precision=mode)
        chr_ = fnn.LowRankChristoffel(6, 3, precision=mode)
        with _Record() as rec:
            flow(x, v)
            chr_(v)
            flow.christoffel(v)  # the submodule got the integrator's precision
        assert [fl for _, fl in rec.calls] == [WANT_FLAGS[mode][1], WANT_FLAGS[mode][0], WANT_FLAGS[mode][0]]
        assert f"precision={mode!r}" in repr(flow)
    flow.precision = "tf32"  # the attribute is read at each call; one setting for both modules
    assert flow.christoffel.precision == "tf32"
    with _Record() as rec:
        flow(x, v)
        flow.christoffel(v)
    assert rec.calls == [("leapfrog", TF32), ("christoffel", TF32)]
    flow.christoffel.precision = None
    assert flow.precision is None


# ------------------------------------------------------------------ errors

BAD_PRECISIONS = ["TF32", "high", "highest", "fp32", "", 1, True, torch.float32]


@pytest.mark.parametrize("bad", BAD_PRECISIONS)
def test_bad_precision(bad):
    x, v, U, W, f, mu = _problem()
    allowed = r"one of 'strict', 'tf32x3', 'tf32', got "
    with pytest.raises(ValueError, match=r"fusekit\.torch\.geodesic\.christoffel: precision must be None .*" + allowed):
        geo.christoffel(v, U, W, precision=bad)
    with pytest.raises(ValueError, match=r"fusekit\.torch\.geodesic\.leapfrog: precision must be None .*" + allowed):
        geo.leapfrog(x, v, U, W, 0.1, 2, precision=bad)
    with pytest.raises(ValueError, match="LeapfrogIntegrator: precision must be None .*" + allowed):
        fnn.LeapfrogIntegrator(6, 3, dt=0.1, steps=2, precision=bad)
    with pytest.raises(ValueError, match="LowRankChristoffel: precision must be None .*" + allowed):
        fnn.LowRankChristoffel(6, 3, precision=bad)
    flow = fnn.LeapfrogIntegrator(6, 3, dt=0.1, steps=2, precision="tf32")
    with pytest.raises(ValueError, match="LeapfrogIntegrator: precision must be None .*" + allowed):
        flow.precision = bad
    with pytest.raises(ValueError, match="LowRankChristoffel: precision must be None .*" + allowed):
        flow.christoffel.precision = bad
    assert flow.precision == flow.christoffel.precision == "tf32"  # unchanged


def test_precision_and_flags_disagree():
    x, v, U, W, f, mu = _problem()
    cases = [  # (function, precision, flags)
        (lambda **k: geo.christoffel(v, U, W, **k), "strict", TF32),
        (lambda **k: geo.christoffel(v, U, W, **k), "tf32", 0),
        (lambda **k: geo.christoffel(v, U, W, **k), "tf32", TF32X3),
        (lambda **k: geo.leapfrog(x, v, U, W, 0.1, 2, **k), "strict", TF32X3),
        (lambda **k: geo.leapfrog(x, v, U, W, 0.1, 2, **k), "tf32x3", 0),
        (lambda **k: geo.leapfrog(x, v, U, W, 0.1, 2, **k), "tf32x3", TF32 | TF32X3),  # TF32 wins in the ABI
        (lambda **k: geo.leapfrog(x, v, U, W, 0.1, 2, **k), "tf32", FORCE_GENERIC),
    ]
    for fn, precision, flags in cases:
        with pytest.raises(ValueError, match=f"precision={precision!r} and flags={flags:#x} disagree"):
            fn(precision=precision, flags=flags)


@pytest.mark.parametrize("bad,err", [(True, TypeError), (1.0, TypeError), ("1", TypeError), (-1, ValueError),
                                     (1 << 32, ValueError)])
def test_bad_flags(bad, err):
    x, v, U, W, f, mu = _problem()
    with pytest.raises(err, match=r"fusekit\.torch\.geodesic\.christoffel: flags must be"):
        geo.christoffel(v, U, W, flags=bad)
    with pytest.raises(err, match=r"fusekit\.torch\.geodesic\.leapfrog: flags must be"):
        geo.leapfrog(x, v, U, W, 0.1, 2, flags=bad)


# ------------------------------------------------------------------ the CPU ignores the modes


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cpu_values_and_gradients_unchanged(dtype):
    x, v, U, W, f, mu = _problem(dtype=dtype, seed=3)
    args = (x, v, U, W, f)

    def run(**k):
        xT, vT = geo.leapfrog(x, v, U, W, 0.1, 3, f=f, mu=mu, **k)
        g = geo.christoffel(v, U, W, **k)
        loss = (xT * xT).sum() + (vT * xT).sum() + (g * g).sum()
        return (xT, vT, g, *torch.autograd.grad(loss, args))

    want = run(precision="strict")
    assert all(t.abs().sum() > 0 for t in want)
    for k in [dict(precision=m) for m in geo.PRECISIONS] + [dict(flags=TF32), dict(flags=TF32X3)]:
        for a, b in zip(run(**k), want):
            assert torch.equal(a, b), k
    for setting in SETTINGS:
        torch.set_float32_matmul_precision(setting)
        for a, b in zip(run(), want):
            assert torch.equal(a, b), setting


def test_gradcheck_with_tf32_modes_f64():
    x, v, U, W, f, mu = _problem(dtype=torch.float64, b=2, d=4, r=2, seed=5)
    for mode in ("tf32", "tf32x3"):
        assert torch.autograd.gradcheck(lambda v, U, W: geo.christoffel(v, U, W, precision=mode), (v, U, W))
        assert torch.autograd.gradcheck(
            lambda x, v, U, W, f: geo.leapfrog(x, v, U, W, 0.1, 2, f=f, mu=mu, precision=mode), (x, v, U, W, f))


def test_opcheck_forward_ops_with_flags():
    if not hasattr(torch.library, "opcheck"):
        pytest.skip("torch.library.opcheck needs torch >= 2.4")
    x, v, U, W, f, mu = _problem(dtype=torch.float64)
    torch.library.opcheck(torch.ops.fusekit.christoffel.default, (v, U, W, 5.0, TF32))
    torch.library.opcheck(torch.ops.fusekit.leapfrog.default, (x, v, U, W, f, mu, 0.1, 2, 5.0, True, TF32X3))


# ------------------------------------------------------------------ torch.compile


class _Backend:
    """A torch.compile backend that runs the graph as traced (eager) and logs, at
    each run, the flags of the fusekit forward ops in the graph that ran."""

    def __init__(self):
        self.runs, self.compiles = [], 0

    def __call__(self, gm, example_inputs):
        self.compiles += 1
        flags = tuple(_flags_arg(n.target, n.args, n.kwargs) for n in gm.graph.nodes
                      if n.op == "call_function" and n.target in FORWARDS)
        runs = self.runs

        def run(*args):
            runs.append(flags)
            return gm.forward(*args)

        return run


def _compile_or_skip(fn, **kw):
    try:
        return torch.compile(fn, fullgraph=True, **kw)
    except RuntimeError as e:  # e.g. torch.compile unsupported on this Python
        pytest.skip(f"torch.compile unavailable: {e}")


def test_module_compile_fullgraph_follows_setting():
    """The setting is read when the graph is traced (flags are constants of the
    graph); torch.compile re-traces when TF32 is switched on or off, so a graph
    with the old flags never runs after a change that alters them."""
    torch._dynamo.reset()
    torch.manual_seed(1)
    flow = fnn.LeapfrogIntegrator(6, 3, dt=0.1, steps=2, friction=True)
    x, v, *_ = _problem(grad=False)
    backend = _Backend()
    cf = _compile_or_skip(lambda x, v: (*flow(x, v), flow.christoffel(v)), backend=backend)
    order = ["highest", "high", "medium", "highest", "high"]
    for setting in order:
        torch.set_float32_matmul_precision(setting)
        cf(x, v)
    assert backend.runs == [(WANT_FLAGS[s][1], WANT_FLAGS[s][0]) for s in order]
    assert backend.compiles == 2  # one graph per TF32 switch state, reused
    flow.precision = "tf32"  # an explicit precision: a module attribute, guarded
    cf(x, v)
    assert backend.runs[-1] == (TF32, TF32)
    torch._dynamo.reset()


@pytest.mark.parametrize("setting", ["highest", "high"])
def test_module_compile_fullgraph_training_matches_eager(setting):
    """torch.compile(fullgraph=True) of the module (inductor, forward and backward)
    gives eager's values and gradients under either state of the setting."""
    torch.set_float32_matmul_precision(setting)
    torch._dynamo.reset()
    torch.manual_seed(2)
    flow = fnn.LeapfrogIntegrator(6, 3, dt=0.1, steps=3, friction=True)
    x, v, *_ = _problem(seed=4)
    cflow = _compile_or_skip(flow)
    with _Record() as rec:
        want = flow(x, v)
    assert rec.calls == [("leapfrog", WANT_FLAGS[setting][1])]
    got = cflow(x, v)
    params = (x, v, flow.christoffel.U, flow.christoffel.W)
    gw = torch.autograd.grad((want[0] * want[1]).sum(), params)
    gg = torch.autograd.grad((got[0] * got[1]).sum(), params)
    for a, b in zip((*got, *gg), (*want, *gw)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    torch._dynamo.reset()


# ------------------------------------------------------------------ CUDA (where a GPU is usable)


@pytest.mark.skipif(fusekit.device_count() == 0 or not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("setting,mode,uw,tol", [("highest", None, 0.5, 1e-5), ("high", None, 0.5, 1e-5),
                                               ("medium", None, 0.5, 1e-5), ("highest", "tf32x3", 0.5, 1e-5),
                                               ("highest", "tf32", 0.15, 3e-3)])
def test_cuda_modes_against_cpu(setting, mode, uw, tol):
    """f32 on CUDA in each mode against the CPU's strict result, every output and
    gradient within ``tol`` as the largest error relative to the largest value.

    The strict and 3xTF32 rows take U, W of scale 0.5, where 81% of the
    Christoffel terms sit at the clamp. That problem is too ill-conditioned for
    TF32: rounding only the inputs to TF32 on the CPU's strict path already moves
    vT by 8e-3 and the gradients by 0.1-0.3 (terms cross the clamp, whose
    derivative jumps), which is what the TF32 kernels gave on the H200 (vT 1.1e-2,
    df 0.18). The TF32 row takes U, W of scale 0.15 (nothing clamped), where that
    input rounding moves every output by 3e-4 to 6e-4 (docs/geodesic.md,
    precision modes)."""
    torch.set_float32_matmul_precision(setting)
    cpu = _problem(b=64, d=128, r=16, seed=7, uw=uw)
    gpu = [t.detach().cuda().requires_grad_(t.requires_grad) for t in cpu]

    def run(x, v, U, W, f, mu):
        xT, vT = geo.leapfrog(x, v, U, W, 0.05, 4, f=f, mu=mu, precision=mode)
        g = geo.christoffel(v, U, W, precision=mode)
        outs = (xT, vT, g)
        return (*outs, *torch.autograd.grad(sum((o * o).sum() for o in outs), (x, v, U, W, f)))

    names = ("xT", "vT", "christoffel", "dx", "dv", "dU", "dW", "df")
    err = {n: ((a.double().cpu() - b.double()).abs().max() / b.double().abs().max()).item()
           for n, a, b in zip(names, run(*gpu), run(*cpu))}
    print(f"relative errors, {setting} / {mode}:", {n: f"{e:.2e}" for n, e in err.items()})
    for n, e in err.items():
        assert e <= tol, (n, e)
