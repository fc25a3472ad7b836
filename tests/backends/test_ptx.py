"""Every primal, tangent and adjoint kernel of the corpus compiles to PTX for sm_90.

Runs in a subprocess without the CUDA simulator; needs NVVM and NVRTC, which the test extra
installs (numba-cuda[cu13]).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_corpus_compiles_to_ptx_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    shards = [subprocess.Popen([sys.executable, str(ROOT / "tests" / "backends" / "ptx_corpus.py"),
                                str(k), "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=env, cwd=ROOT) for k in range(2)]
    lines = []
    try:
        for proc in shards:           # two single-threaded compiles side by side
            out, err = proc.communicate(timeout=900)
            assert proc.returncode == 0, out + err
            lines += out.splitlines()
    finally:
        for proc in shards:
            if proc.poll() is None:
                proc.kill()
    ok = [ln for ln in lines if ln.startswith("ok ")]
    assert len(ok) == 3 * 19, "\n".join(lines)
    by_name = {tuple(ln.split()[1:3]): ln for ln in ok}
    # barriers and shared memory reach the GPU code; own-index adjoints stay atomic-free
    assert "bar=True" in by_name[("matmul", "reverse")]
    assert "atom=True" in by_name[("gather", "reverse")]
    assert "atom=False" in by_name[("sin_kernel", "reverse")]
