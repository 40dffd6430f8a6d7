"""One profiled call per kernel family, for Nsight Compute (ncu) on a CUDA machine.

Each workload runs once untimed (warm-up, allocations) and then once inside
cudaProfilerStart/Stop, so that `ncu --profile-from-start off` measures exactly one call:

    ncu --profile-from-start off --set full -o $OUT/chunk \
        python3 benchmarks/profile_kernels.py chunk --case B1-T8192-H96
    ncu --profile-from-start off --set full -o $OUT/decode \
        python3 benchmarks/profile_kernels.py decode --case decode-B64

The inputs are those of benchmarks/bench_chunk_fwd.py and benchmarks/bench_decode.py.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_chunk_fwd  # noqa: E402
import bench_decode  # noqa: E402


def find_case(cases, name: str):
    """The case called `name`; a ValueError naming --case and the valid names otherwise."""
    for c in cases:
        if c.name == name:
            return c
    raise ValueError(f"--case {name!r}: expected one of {[c.name for c in cases]}")


def chunk_workload(name: str):
    import openkda

    case = find_case(bench_chunk_fwd.CASES, name)
    args, kwargs = bench_chunk_fwd.make_inputs(case)
    return lambda: openkda.chunk_kda(*args, **kwargs)


def decode_workload(name: str):
    import openkda

    case = find_case(bench_decode.CASES, name)
    pb = bench_decode.make_problem(case)
    pool = pb.pool0.clone()
    return lambda: bench_decode.call(openkda.fused_recurrent_kda_fwd, pb, pool, pb.out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("family", choices=["chunk", "decode"])
    ap.add_argument("--case", required=True, help="a case name of the family's benchmark")
    a = ap.parse_args()
    fn = chunk_workload(a.case) if a.family == "chunk" else decode_workload(a.case)
    fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
