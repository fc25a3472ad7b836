"""The ``tapegrad`` command: ``tapegrad demo`` and ``tapegrad bench``."""

from __future__ import annotations

import argparse
import sys

_EPILOG = """examples:
  tapegrad demo                              the main job: a gradient through a simulation
  tapegrad bench --quick                     kernels and gradients against Numba, NumPy, peers
  tapegrad bench --checkpointing             tg.checkpoint_loop against the plain tape
  tapegrad bench --hvp                       tg.hvp against tg.gradient (also in the full bench)
  tapegrad bench --backend opencl            a GPU through OpenCL (or the CPU through PoCL)
  tapegrad bench --backend cuda              an NVIDIA GPU (CuPy)
  tapegrad bench --backend cuda-standin      CUDA's host cost per launch, without a GPU

docs: docs/ in the source tree (README.md lists them)"""


def main(argv: list[str] | None = None) -> int:
    from tapegrad._version import __version__
    parser = argparse.ArgumentParser(
        prog="tapegrad", description="tapegrad: GPU-side automatic differentiation of compute "
        "kernels written in Python.", epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"tapegrad {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{demo,bench}")
    sub.add_parser(
        "demo", help="recover a plate's initial temperature by gradients through a simulation",
        description="Recover the initial temperature of a 2-D plate from its temperature 100 "
        "time steps later: conjugate gradients through the whole simulation (100 heat-step "
        "kernel launches recorded on a tape per evaluation, their generated adjoint kernels "
        "replayed backwards). Prints the loss falling, a gradient check against finite "
        "differences and timings; with matplotlib installed, writes tapegrad_demo.png. The "
        "first run compiles the kernels (cached afterwards, see docs/language.md).")
    bench = sub.add_parser("bench", help="time tapegrad kernels against hand-written Numba and NumPy")
    bench.add_argument("--quick", action="store_true", help="small sizes, few repeats (< 60 s)")
    bench.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    bench.add_argument("--checkpointing", action="store_true",
                       help="only the checkpointing table (tg.checkpoint_loop against the tape)")
    bench.add_argument("--hvp", action="store_true",
                       help="only the tg.hvp lines (a Hessian-vector product against a gradient)")
    bench.add_argument("--backend", choices=("cpu", "cuda", "opencl", "cuda-standin"),
                       default="cpu", help="where to run (cuda needs a GPU; cuda-standin: "
                       "the CUDA host path's cost per launch, on a stand-in driver)")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from tapegrad.demo import main as demo
        return demo()
    if args.checkpointing or args.hvp:
        if args.checkpointing:
            from tapegrad.bench.checkpointing import main as checkpointing
            name, rows = "checkpointing", checkpointing(quick=args.quick)
        else:
            from tapegrad.bench.second import hvp_lines
            name, rows = "hvp", hvp_lines(quick=args.quick, repeats=5 if args.quick else 20)
        if args.json:
            import json

            from tapegrad.bench.machine import describe
            with open(args.json, "w") as f:
                json.dump({"machine": describe(), "quick": args.quick, name: rows}, f, indent=2)
            print(f"wrote {args.json}")
        return 0
    if args.backend == "cuda-standin":
        from tapegrad.bench.host_cost import host_cost_main
        return host_cost_main(quick=args.quick, json_path=args.json)
    from tapegrad.bench import main as run_bench  # noqa: I001
    return run_bench(quick=args.quick, json_path=args.json, backend=args.backend)


if __name__ == "__main__":
    sys.exit(main())
