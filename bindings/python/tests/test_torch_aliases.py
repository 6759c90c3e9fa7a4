"""The torch layer's old module paths still work for one release, each warning
with the new module's name; ``fusekit.nn`` is ``fusekit.torch.nn`` itself, without
a warning; and ``import fusekit.torch`` imports neither torch nor the compiled ops."""

import importlib
import os
import subprocess
import sys
import warnings

import pytest

torch = pytest.importorskip("torch")
import fusekit.torch  # noqa: E402
from conftest import PKG_ROOT  # noqa: E402  (the folder of the fusekit under test: the source tree or site-packages)
from fusekit.torch import _ext  # noqa: E402

pytestmark = pytest.mark.skipif(not _ext.available(), reason="the compiled torch ops are not built")


def _fresh_import(name):
    """Imports module ``name`` anew (its body runs again), returning it and the
    DeprecationWarnings it emitted."""
    sys.modules.pop(name, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mod = importlib.import_module(name)
    return mod, [w for w in caught if issubclass(w.category, DeprecationWarning)]


@pytest.mark.parametrize("old, new", [
    ("fusekit.torch_gaussian", "fusekit.torch.gaussian"),
    ("fusekit.torch_geodesic", "fusekit.torch.geodesic"),
])
def test_family_aliases_are_the_new_modules(old, new):
    mod, warned = _fresh_import(old)
    assert mod is importlib.import_module(new)
    assert len(warned) == 1 and new in str(warned[0].message) and old in str(warned[0].message)


def test_torch_ops_alias_reexports_the_ops():
    mod, warned = _fresh_import("fusekit.torch_ops")
    assert len(warned) == 1 and "fusekit.torch" in str(warned[0].message)
    assert mod.linear is fusekit.torch.linalg.linear
    assert mod.axpby is fusekit.torch.elementwise.axpby
    assert mod.register is fusekit.torch._register.register
    assert mod.eager_call is fusekit.torch._register.eager_call


def test_torch_ext_alias():
    mod, warned = _fresh_import("fusekit._torch_ext")
    assert len(warned) == 1 and "fusekit.torch._ext" in str(warned[0].message)
    assert mod.route is _ext.route and mod.translate is _ext.translate
    assert mod.available() and mod.load() == _ext.load()
    assert mod.BINARY is fusekit.torch.elementwise.BINARY
    assert mod.run is fusekit.torch._register.run


def test_warning_points_at_the_importer():
    code = "import fusekit.torch_gaussian"
    env = dict(os.environ, PYTHONPATH=str(PKG_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    # shown by the default filters (the importer is __main__), at the import line
    assert "<string>:1: DeprecationWarning: fusekit.torch_gaussian is deprecated" in r.stderr, r.stderr


def test_nn_is_a_plain_alias():
    mod, warned = _fresh_import("fusekit.nn")
    assert mod is importlib.import_module("fusekit.torch.nn")
    assert warned == []


def test_torch_package_imports_without_torch():
    code = ("import sys; sys.modules['torch'] = None; import fusekit.torch, fusekit.torch._ext; "
            "assert not fusekit.torch._ext.available(); "
            "assert not [m for m in sys.modules if m.startswith('fusekit.torch.') and m != 'fusekit.torch._ext']; "
            "print('ok')")
    env = dict(os.environ, PYTHONPATH=str(PKG_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


def test_families_are_reachable_from_the_package():
    assert fusekit.torch.FAMILIES == ("elementwise", "linalg", "mlp", "gaussian", "geodesic", "optim")
    assert fusekit.torch.load() == _ext.load()
    fusekit.add(torch.ones(2), torch.ones(2))  # takes the route: the family modules are its
    assert _ext.route.tensor is torch.Tensor
    for fam in fusekit.torch.FAMILIES:
        assert getattr(fusekit.torch, fam) is importlib.import_module(f"fusekit.torch.{fam}")
        assert getattr(_ext.route, fam) is getattr(fusekit.torch, fam)
    assert fusekit.torch.gaussian_field is fusekit.torch.gaussian.gaussian_field
    with pytest.raises(AttributeError):
        fusekit.torch.no_such_name  # noqa: B018
