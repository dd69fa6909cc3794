"""Plans are the same bits on every machine: aspc.portable_math and the rule that the compile path uses it.

NumPy's exp/log family dispatches to CPU-specific SIMD code (AVX-512 builds
differ from the C library in the last bit for a few percent of inputs) and
``np.dot``/``@`` call BLAS, whose kernels and thread splits depend on the
CPU. Before this module, a plan compiled on an AVX-512 machine differed from
the same plan compiled on an AVX2 one (the committed fixtures broke when CI
moved to another host). The subprocess test emulates an older CPU on this
one (``NPY_DISABLE_CPU_FEATURES``, ``OPENBLAS_CORETYPE``); on a machine
without AVX-512 both runs see the same CPU and it checks less.
"""

from __future__ import annotations

import ast
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from aspc import portable_math as pm

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "prompts.jsonl"

# Modules whose floats end up in a plan (predictions, costs, partition, order, metrics, epoch
# and re-planned plans), and lexical training (its predictors are bit for bit the same for the
# same data and seed). Static and transformer training (LAPACK, torch) and the runtime are not.
COMPILE_PATH = [
    "aspc/anneal",
    "aspc/costs",
    "aspc/emit",
    "aspc/partition",
    "aspc/caps.py",
    "aspc/compiler.py",
    "aspc/epochs.py",
    "aspc/replan.py",
    "aspc/scout.py",
    "aspc/predict/base.py",
    "aspc/predict/calibration.py",
    "aspc/predict/ease.py",
    "aspc/predict/features.py",
    "aspc/predict/history.py",
    "aspc/predict/history_estimates.py",
    "aspc/predict/lexical.py",
    "aspc/predict/lexical_kernel.py",
    "aspc/predict/lexical_train.py",
    "aspc/predict/ridge.py",
    "aspc/predict/static.py",
    "aspc/runtime/lengths.py",  # lengths drawn from a plan's predictions (a run without --actual-lengths)
]
MACHINE_DEPENDENT = {"exp", "log", "log1p", "log2", "log10", "expm1", "exp2", "power", "float_power", "dot",
                     "matmul", "inner", "vdot", "einsum", "tensordot", "cbrt", "sinh", "cosh", "tanh", "arctan",
                     "cov", "corrcoef", "polyfit"}  # fmt: skip  # the last three: BLAS or LAPACK inside


def _compile_path_files() -> list[Path]:
    out = []
    for entry in COMPILE_PATH:
        p = ROOT / entry
        out += sorted(p.rglob("*.py")) if p.is_dir() else [p]
    return out


def test_the_compile_path_uses_no_machine_dependent_numpy():
    offences = []
    for path in _compile_path_files():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
                offences.append(f"{where}: @ (BLAS)")
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "np":
                if node.attr in MACHINE_DEPENDENT or node.attr == "linalg":
                    offences.append(f"{where}: np.{node.attr}")
    assert not offences, "use aspc.portable_math instead:\n" + "\n".join(offences)


VALUES = np.array(
    [0.0, -0.0, 1e-300, 1e-9, 0.5, 1.0, 2.0, 10.0, 700.0, 709.78, 710.0, 1e300, -1.0, -1e-9, -5.0, -800.0,
     np.inf, -np.inf, np.nan]
)  # fmt: skip


@pytest.mark.parametrize("name", ["exp", "expm1", "log", "log1p", "log2"])
def test_elementwise_functions_give_the_c_library_bits_and_numpy_semantics(name):
    rng = np.random.default_rng(0)
    x = np.concatenate([VALUES, rng.uniform(-30, 30, 5000), np.exp(rng.uniform(-20, 20, 5000))])
    got = getattr(pm, name)(x)
    with np.errstate(all="ignore"):
        ref_np = getattr(np, name)(x)
    for v, g, r in zip(x.tolist(), got.tolist(), ref_np.tolist(), strict=True):
        try:
            want = getattr(math, name)(v)
        except (ValueError, OverflowError):
            want = r  # where math raises, NumPy's answer (-inf, nan, inf)
        assert (g == want) or (math.isnan(g) and math.isnan(want)), (name, v, g, want)
        # And within one ulp of NumPy's own result (the SIMD code is not always correctly rounded).
        assert (math.isnan(g) and math.isnan(r)) or g == r or abs(g - r) <= 2 * math.ulp(r), (name, v, g, r)


def test_elementwise_functions_keep_shape_and_give_scalars_for_scalars():
    m = np.arange(1.0, 7.0).reshape(2, 3)[:, ::2]  # not contiguous
    assert pm.log(m).shape == (2, 2)
    assert pm.log(m)[1, 1] == math.log(6.0)
    s = pm.exp(1.0)
    assert np.ndim(s) == 0 and float(s) == math.exp(1.0)
    assert pm.log([]).shape == (0,)


def test_dot_and_matvec_are_ordered_sums():
    rng = np.random.default_rng(1)
    for n in (0, 1, 7, 8, 9, 1001):
        a, b = rng.normal(size=n), rng.normal(size=n)
        lanes = [0.0] * 8  # the documented order, in plain Python floats
        for i, (x, y) in enumerate(zip(a.tolist(), b.tolist(), strict=True)):
            lanes[i % 8] += x * y
        s = lanes
        assert pm.dot(a, b) == ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]))
        assert abs(pm.dot(a, b) - math.fsum((a * b).tolist())) < 1e-12
    assert pm.dot(a[::2], b[::2]) == pm.dot(a[::2].copy(), b[::2].copy())  # strided views: the same sum
    m = rng.normal(size=(37, 6))
    v = rng.normal(size=6)
    naive = []
    for row in m:
        s = 0.0
        for x, y in zip(row.tolist(), v.tolist(), strict=True):
            s += x * y
        naive.append(s)
    assert pm.matvec(m, v).tolist() == naive
    assert pm.matvec(m[:, 1:], v[1:]).tolist() == pytest.approx((m[:, 1:] @ v[1:]).tolist(), abs=1e-12)
    assert pm.matvec(m.astype(np.float32), v).tolist() == pm.matvec(m.astype(np.float32).astype(np.float64), v).tolist()
    with pytest.raises(ValueError, match="1-D arrays of one length"):
        pm.dot(a, b[:-1])
    with pytest.raises(ValueError, match="1-D arrays of one length"):
        pm.dot(3.0, 4.0)  # a scalar is no vector (ascontiguousarray made it one)
    with pytest.raises(ValueError, match="matrix and a k-vector"):
        pm.matvec(m, v[:-1])


def _numpy2_pairwise(a: list[float], lo: int, n: int) -> float:
    # The oracle: NumPy's pairwise_sum (numpy/_core/src/umath/loops_utils.h.src) in plain Python floats.
    if n < 8:
        res = 0.0
        for i in range(n):
            res += a[lo + i]
        return res
    if n <= 128:
        r = a[lo:lo + 8]
        i = 8
        while i < n - n % 8:
            r = [r[j] + a[lo + i + j] for j in range(8)]
            i += 8
        res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
        for k in range(i, n):
            res += a[lo + k]
        return res
    n2 = n // 2 - (n // 2) % 8
    return _numpy2_pairwise(a, lo, n2) + _numpy2_pairwise(a, lo + n2, n - n2)


def test_sum_mean_and_var_are_numpy_2_3s_on_any_numpy():
    rng = np.random.default_rng(2)
    numpy2 = np.lib.NumpyVersion(np.__version__) >= "2.3.0"  # before 2.3 NumPy split sums past 8,192
    for n in [*range(0, 140), 255, 256, 1001, 8192, 8193, 20001, 60000]:
        a = rng.lognormal(size=n) * 100
        assert pm.sum(a) == _numpy2_pairwise(a.tolist(), 0, n)
        if numpy2 or n <= 8192:
            assert pm.sum(a) == float(np.sum(a))
            if n:
                assert pm.mean(a) == float(np.mean(a)) and pm.var(a) == float(np.var(a))
            if n > 1:
                assert pm.var(a, ddof=1) == float(np.var(a, ddof=1))
    assert math.isnan(pm.mean([])) and math.isnan(pm.var([1.0], ddof=1))  # NumPy's answers, without its warning
    assert pm.mean([1, 2, 4]) == 7 / 3  # lists and integers are read as float64
    assert pm.sum(a[::3]) == float(np.sum(a[::3].copy())) or not numpy2  # a strided view: the same sum
    assert math.copysign(1.0, pm.sum(np.full(9, -0.0))) == 1.0  # as np.sum: 0.0 + the pairwise sum
    with pytest.raises(ValueError, match="1-D array"):
        pm.mean(np.ones((2, 2)))


def test_ridge_fit_without_lapack_matches_lstsq():
    from aspc.predict.features import Features
    from aspc.predict.ridge import ridge_fit

    rng = np.random.default_rng(2)
    n = 400
    dense = np.column_stack([np.ones(n), rng.normal(size=n), rng.normal(size=n), np.zeros(n), rng.normal(size=n)])
    dense[:, 4] = 2.0 * dense[:, 1] - dense[:, 2]  # collinear: dropped, as the SVD rank cut dropped it
    rows = np.repeat(np.arange(n), 3)
    cols = rng.integers(0, 64, size=rows.size)
    vals = np.ones(rows.size)
    X = Features(dense, rows, cols, vals, 64)
    y = 1.5 + 0.3 * dense[:, 1] - 0.2 * dense[:, 2] + rng.normal(scale=0.1, size=n)
    sol = ridge_fit(X, y, 1.0, tol=1e-10, max_iter=1000)
    fitted = sol.predict(X)
    # The fitted values are what the old SVD/lstsq solve gave (alpha may differ where collinear).
    resid = y - X.hashed_matvec(sol.beta)
    alpha_ref = np.linalg.lstsq(dense, resid, rcond=None)[0]
    assert np.allclose(fitted, dense @ alpha_ref + X.hashed_matvec(sol.beta), atol=1e-9)
    assert sol.alpha[3] == 0.0  # the all-zero column gets no weight


# An older CPU on this one: NumPy without its AVX-512 loops, OpenBLAS with its Haswell kernels on
# one thread. Variables for features this machine lacks are ignored by both libraries.
OLD_CPU = {"NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR", "OPENBLAS_CORETYPE": "Haswell",
           "OPENBLAS_NUM_THREADS": "1"}  # fmt: skip


def _aspc(args: list[str], env_extra: dict[str, str], cwd: Path) -> str:
    # Without NUMBA_DISABLE_JIT (the no-JIT job runs this file too): this is about NumPy and BLAS.
    env = {k: v for k, v in os.environ.items() if k not in OLD_CPU and k != "NUMBA_DISABLE_JIT"}
    env.update(env_extra)
    res = subprocess.run([sys.executable, "-m", "aspc.cli", *args], cwd=cwd, env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout


@pytest.mark.skipif(not EXAMPLE.is_file(), reason="examples/prompts.jsonl is not in this checkout")
def test_plans_are_the_same_bits_on_an_older_cpu(tmp_path):
    outputs = {}
    for name, env in (("native", {}), ("old", OLD_CPU)):
        d = tmp_path / name
        d.mkdir()
        # Text through the shipped predictor, then an epoch planned from the first one's log
        # (history blend, the per-run ridge correction, epoch alignment).
        _aspc(["compile", str(EXAMPLE), "-n", "4", "-w", "4", "-o", "plan.parquet", "--quiet"], env, d)
        _aspc(["run", "plan.parquet", "--epochs", "2", "--actual-lengths", str(EXAMPLE), "--length-field",
               "lengths", "-w", "4", "--global-batch", "64", "--log", "run", "--quiet"], env, d)  # fmt: skip
        # A lexical predictor trained here (ridge, calibration) and its predictions.
        _aspc(["predict", "train", str(EXAMPLE), "--length-field", "lengths", "--kind", "lexical", "-o", "pred",
               "--quiet"], env, d)  # fmt: skip
        _aspc(["predict", "pred", str(EXAMPLE), "-o", "preds.parquet", "--quiet"], env, d)
        # A simulated run without recorded lengths draws them from the plan's predictions.
        drawn = _aspc(["run", "plan.parquet", "-w", "4", "--global-batch", "64", "--json"], env, d)
        outputs[name] = [(d / p).read_bytes() for p in ("plan.parquet", "run/plans/epoch-2.parquet", "preds.parquet")]
        outputs[name].append(drawn)
    assert outputs["native"][0] == outputs["old"][0], "the compiled plan differs on an older CPU"
    assert outputs["native"][1] == outputs["old"][1], "the second epoch's plan differs on an older CPU"
    assert outputs["native"][2] == outputs["old"][2], "a trained predictor predicts differently on an older CPU"
    assert outputs["native"][3] == outputs["old"][3], "a run drawing lengths from the plan differs on an older CPU"
