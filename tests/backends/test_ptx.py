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
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "backends" / "ptx_corpus.py")],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ok = [ln for ln in lines if ln.startswith("ok ")]
    assert len(ok) == 3 * 18, proc.stdout
    by_name = {tuple(ln.split()[1:3]): ln for ln in ok}
    # barriers and shared memory reach the GPU code; own-index adjoints stay atomic-free
    assert "bar=True" in by_name[("matmul", "reverse")]
    assert "atom=True" in by_name[("gather", "reverse")]
    assert "atom=False" in by_name[("sin_kernel", "reverse")]
