"""The command line: `tapegrad demo` (the README's main job) and the bench smoke run."""

from __future__ import annotations

import json
import subprocess
import sys


def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tapegrad", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_demo_runs_and_every_check_passes():
    proc = run("demo")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "all checks passed" in proc.stdout
    assert "gradient check against central finite differences" in proc.stdout
    assert "(ok)" in proc.stdout and "loss fell from" in proc.stdout


def test_bench_quick_prints_the_table_and_writes_json(tmp_path):
    out = tmp_path / "bench.json"
    proc = run("bench", "--quick", "--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "tg/numba" in proc.stdout and "memory bandwidth" in proc.stdout
    data = json.loads(out.read_text())
    kernels = [r["kernel"] for r in data["results"]]
    assert any("saxpy" in k for k in kernels) and any("stencil" in k for k in kernels)
    assert any("matmul" in k for k in kernels)
    for row in data["results"]:
        assert row["tapegrad_ms"] > 0 and row["numba_ms"] > 0 and row["numpy_ms"] > 0
    assert "adj/primal" in proc.stdout
    for row in data["gradients"]:
        assert row["adjoint_ms"] > 0 and row["hand_ms"] > 0 and row["autodiff_ms"] > 0
    assert "per launch of a 64-element kernel" in proc.stdout
    assert set(data["overhead_us"]) == {"kernel_call", "launch", "recorded_launch",
                                        "replayed_adjoint", "autodiff"}
    assert all(v > 0 for v in data["overhead_us"].values())


def test_help_lists_the_commands():
    proc = run("--help")
    assert proc.returncode == 0
    assert "demo" in proc.stdout and "bench" in proc.stdout
