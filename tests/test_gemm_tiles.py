"""mlp.h's GEMM micro-kernel (shared by the C++ acting and PPO update kernels) against numpy, and the claim its
speed-ups rest on: the micro-tile's shape never changes a result (each output is the same chain of FMAs)."""
import subprocess

import numpy as np
import pytest

from scalebox_ms.ops.custom.build import probe_command

ACTS = {-1: lambda z: z, 0: np.tanh, 1: lambda z: np.maximum(z, 0.0)}


def read_dump(path):
    """The probe's cases: [(rows, N, K, act, a_transposed, A, B, bias or None, C)]."""
    raw = open(path, "rb").read()
    pos, cases = 0, []

    def take(n, dtype):
        nonlocal pos
        out = np.frombuffer(raw, dtype, n, pos)
        pos += out.nbytes
        return out

    while pos < len(raw):
        rows, n, k, act, has_bias, trans = (int(v) for v in take(6, np.int32))
        a = take(rows * k, np.float32).reshape(rows, k)
        b = take(k * n, np.float32).reshape(k, n)
        bias = take(n, np.float32) if has_bias else None
        c = take(rows * n, np.float32).reshape(rows, n)
        cases.append((rows, n, k, act, bool(trans), a, b, bias, c))
    return cases


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    """{tile rows (None: the default for this CPU): the probe's cases}."""
    tmp = tmp_path_factory.mktemp("gemm_probe")
    out = {}
    for rows in (None, 4, 6, 8):
        exe, data = tmp / f"probe_{rows}", tmp / f"cases_{rows}.bin"
        subprocess.run(probe_command(str(exe), rows), check=True, capture_output=True)
        subprocess.run([str(exe), "dump", str(data)], check=True)
        out[rows] = read_dump(data)
    return out


def test_gemm_matches_numpy(dumps):
    cases = dumps[None]
    assert len(cases) > 200 and {c[0] for c in cases} >= {1, 2, 3, 5, 7, 13, 512}  # every remainder tile runs
    assert any(c[4] for c in cases)  # and the backward's transposed-A layout
    for rows, n, k, act, trans, a, b, bias, c in cases:
        z = a.astype(np.float64) @ b.astype(np.float64) + (0.0 if bias is None else bias)
        np.testing.assert_allclose(c, ACTS[act](z), rtol=1e-5, atol=1e-5 * max(1, k) ** 0.5,
                                   err_msg=f"rows {rows} N {n} K {k} act {act} transposed {trans}")


def test_tiling_never_changes_a_result(dumps):
    base = dumps[None]
    for rows, other in dumps.items():
        assert len(other) == len(base)
        for x, y in zip(base, other):
            assert x[:5] == y[:5]
            assert np.array_equal(x[8].view(np.uint32), y[8].view(np.uint32)), \
                f"tile rows {rows}: case rows {x[0]} N {x[1]} K {x[2]} act {x[3]} differs bitwise"
