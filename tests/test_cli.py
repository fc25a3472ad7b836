"""The command line: `tapegrad demo` (the README's main job) and the bench smoke run."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import tapegrad as tg


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
    overhead = dict(data["overhead_us"])
    # (the replay's overhead is a difference of two timings: near 0, either sign when noisy)
    assert isinstance(overhead.pop("captured_overhead"), float)
    assert set(overhead) == {"kernel_call", "launch", "launch_check", "recorded_launch",
                             "allocation", "replayed_adjoint",
                             "replayed_one_by_one", "autodiff", "autodiff_forward",
                             "captured_replay",
                             "captured_gradient", "nonlinear_gradient",
                             "captured_nonlinear_gradient", "compiled_kernels",
                             "recorded_nonlinear_launch", "replayed_nonlinear_adjoint"}
    assert all(v > 0 for v in overhead.values())
    assert overhead["launch_check"] < overhead["launch"]
    assert overhead["allocation"] < overhead["recorded_launch"]
    assert "of replay overhead per launch" in proc.stdout
    assert "hvp (reverse over forward)" in proc.stdout
    assert {r["problem"].split(",")[0] for r in data["hvp"]} == {"sin", "gather", "heat"}
    assert all(r["hvp_ms"] > 0 and r["ratio"] == r["hvp_ms"] / r["gradient_ms"]
               for r in data["hvp"])
    for impl, only in (("tg capture", "heat"), ("capt. loss", "heat"), ("tg fma", "matmul")):
        ours = [r for r in data["peers"] if r.get("implementation") == impl]
        assert [r["problem"] for r in ours] == [r["problem"] for r in data["peers"]
                                                 if only in r.get("problem", "")
                                                 and r.get("implementation") == "tapegrad"]
        assert all(r["gradient_ms"] > 0 for r in ours)
    assert "busy machine (" in proc.stdout and "fair share ~2x" in proc.stdout
    busy = data["busy_machine"]         # (a ratio, not a limit: CI machines are shared)
    assert busy["idle_ms"] > 0 and busy["busy_ms"] > 0 and busy["busy_processes"] >= 1


def test_help_lists_the_commands_and_what_bench_can_run():
    proc = run("--help")
    assert proc.returncode == 0
    assert "demo" in proc.stdout and "bench" in proc.stdout
    for example in ("--checkpointing", "--hvp", "--backend opencl", "--backend cuda ",
                    "--backend cuda-standin", "--version"):
        assert example in proc.stdout, example


def test_version():
    import tapegrad as tg
    proc = run("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"tapegrad {tg.__version__}"


def test_peer_table_times_primal_and_gradient_in_turn_and_survives_a_failing_peer(
        monkeypatch, capsys):
    """Each implementation's primal and gradient alternate (a shared machine's slow minute
    slows both, so their ratio holds); a peer that raises is reported and left out."""
    import tapegrad.bench as bench
    from tapegrad.bench import peers, problems

    calls: list[str] = []

    def maker(impl: str, fail_at: int | None = None):
        def make(prob: dict):
            count = [0]

            def primal() -> None:
                calls.append(f"{impl}.p")

            def grad() -> None:
                count[0] += 1
                if fail_at is not None and count[0] == fail_at:
                    raise RuntimeError("peer broke")
                calls.append(f"{impl}.g")
            return primal, grad
        return make

    def unavailable(prob: dict):
        raise peers.Unavailable("not installed here")

    monkeypatch.setattr(problems, "problems", lambda quick: [dict(name="toy")])
    monkeypatch.setattr(problems, "make_tapegrad", maker("tg"))
    monkeypatch.setattr(problems, "make_tapegrad_enzyme", maker("en"))
    monkeypatch.setattr(peers, "PEERS", {"flaky": maker("flaky", 3), "absent": unavailable,
                                         "good": maker("good")})
    rows = bench._peer_table(quick=True, repeats=3)
    out = capsys.readouterr().out
    # the first call, the untimed pairs, then 3 timed rounds
    turns = ["p", "g"] * (1 + bench.WARMUP + 3)
    assert calls == ([f"tg.{c}" for c in turns] + [f"en.{c}" for c in turns]
                     + ["flaky.p", "flaky.g", "flaky.p", "flaky.g", "flaky.p"]  # 3rd grad fails
                     + [f"good.{c}" for c in turns])
    assert "failed: RuntimeError: peer broke" in out
    assert "skipped absent: not installed here" in out
    impls = [r["implementation"] for r in rows if "implementation" in r]
    assert impls == ["tapegrad", "tg Enzyme", "good"]
    assert [r["best_peer"] for r in rows if "best_peer" in r] == ["good"]


def test_bench_of_the_cuda_host_path_on_a_stand_in_driver(tmp_path):
    """(no GPU: tapegrad/bench/host_cost.py) every row measured, every launch handed to the
    stand-in driver, the issue's targets printed beside them"""
    out = tmp_path / "host.json"
    proc = run("bench", "--backend", "cuda-standin", "--quick", "--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "stand-in driver (no GPU)" in proc.stdout and "target <= 3 us" in proc.stdout
    data = json.loads(out.read_text())
    assert data["machine"]["versions"]["tapegrad"] == tg.__version__   # where and when
    assert data["machine"]["cores"] >= 1 and data["machine"]["date"].startswith("20")
    us = data["launch_overhead_us"]
    for row in ("launch", "recorded_launch", "replayed_adjoint", "captured_gradient",
                "recorded_nonlinear_launch", "replayed_nonlinear_adjoint"):
        assert 0 < us[row] < 1000, (row, us[row])
    launches = re.search(r"\((\d+) launches handed to the stand-in driver\)", proc.stdout)
    assert launches and int(launches.group(1)) > 1000
