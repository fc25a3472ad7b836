"""Compiled kernels are cached on disk: a second process launches without recompiling."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

KERNEL_MODULE = '''
import math
import numpy as np
import tapegrad as tg

TILE = 4


@tg.func
def smooth(x):
    return math.tanh(x) * 0.5 + x * x


@tg.kernel
def cached_kernel(C, A, B):
    i, j = tg.index(tg.Global, tg.NTuple)
    li, lj = tg.index(tg.Local, tg.NTuple)
    As = tg.localmem(A.dtype, (TILE, TILE))
    Bs = tg.localmem(B.dtype, (TILE, TILE))
    acc = 0.0
    for t in range(0, A.shape[1], TILE):
        As[li, lj] = A[i, t + lj]
        Bs[li, lj] = B[t + li, j]
        tg.synchronize()
        for k in range(TILE):
            acc += As[li, k] * Bs[k, lj]
        tg.synchronize()
    C[i, j] = smooth(acc)
'''

DRIVER = '''
import json, sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np
import tapegrad as tg
import cached_kernels

rng = np.random.default_rng(0)
A = rng.standard_normal((8, 12)); B = rng.standard_normal((12, 8)); C = np.zeros((8, 8))
start = time.perf_counter()
cached_kernels.cached_kernel(tg.CPU(), (4, 4))(C, A, B, ndrange=C.shape)
first_launch = time.perf_counter() - start
P = A @ B
ok = bool(np.allclose(C, np.tanh(P) * 0.5 + P * P, rtol=1e-12, atol=1e-12))
print("RESULT " + json.dumps({"first_launch_s": first_launch, "ok": ok}))
'''


def _run(tmp_path, cache_dir):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TAPEGRAD_", "NUMBA_"))}
    env["TAPEGRAD_CACHE_DIR"] = str(cache_dir)
    env["NUMBA_DEBUG_CACHE"] = "1"
    proc = subprocess.run([sys.executable, str(tmp_path / "driver.py"), str(tmp_path)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    result = json.loads(line[len("RESULT "):])
    print("first launch:", result["first_launch_s"], "s")
    return result, proc.stdout


def _snapshot(cache_dir):
    return {p.relative_to(cache_dir): p.stat().st_mtime_ns
            for p in cache_dir.rglob("*") if p.is_file()}


def test_second_process_loads_from_disk_cache(tmp_path):
    (tmp_path / "cached_kernels.py").write_text(textwrap.dedent(KERNEL_MODULE))
    (tmp_path / "driver.py").write_text(textwrap.dedent(DRIVER))
    cache_dir = tmp_path / "cache"

    first, log1 = _run(tmp_path, cache_dir)
    assert first["ok"]
    assert "data saved to" in log1          # the first process compiled and wrote the cache
    index_files = list(cache_dir.rglob("*.nbi"))
    data_files = list(cache_dir.rglob("*.nbc"))
    assert index_files and data_files, sorted(map(str, cache_dir.rglob("*")))
    generated = list(cache_dir.rglob("*.py"))
    assert generated and all("cached_kernel" in p.name for p in generated)
    before = _snapshot(cache_dir)

    second, log2 = _run(tmp_path, cache_dir)
    assert second["ok"]
    assert second["first_launch_s"] < 1.0, second
    assert second["first_launch_s"] < first["first_launch_s"], (first, second)
    # no recompilation: everything was loaded, nothing saved, no cache file rewritten or added
    assert "data loaded from" in log2
    assert "data saved to" not in log2 and "index saved to" not in log2
    assert _snapshot(cache_dir) == before
