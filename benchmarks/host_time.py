"""Host time of one openkda.chunk_kda call on CUDA, by part, on bench_chunk_fwd.py's cases.

bench_chunk_fwd.py starts every timed call on an idle GPU, so the host time before a call's first
kernel is part of its ms; on the H200 machines of the thirty-first session it was 0.05-0.17 ms of
every call depending on the machine's host (chunk_fwd README). This splits it. Medians (p10) of
--repeat calls, each after a synchronise, in us:

  call       openkda.chunk_kda, from the call to its return
  wrapper    the call with the core call (openkda._ops.run_core) skipped: the Python layer, its
             argument checks and the two output allocations
  run_core   the core call alone: the tensors' DLPack capsules and the binding's chunk_fwd_run
             (argument parse, validation, the workspace through its callback, the launches)
  capsules   the capsules alone (torch.utils.dlpack.to_dlpack of each tensor)
  parse      openkda._C.chunk_fwd_workspace_bytes less the capsules: parse, validation, layout
  launch     openkda._C.chunk_fwd with a ready workspace less the capsules: parse, validation,
             layout, tensor-map encodes, the hand-off's memset and the launches
  workspace  the workspace's torch.empty and its capsule (what the binding's callback does)
  torch_op   one x.add_(1) on a 16-element CUDA tensor: the host's pace, for comparison
and from CUDA events (medians of the same calls):
  exposed    the event-timed call less the event-timed replay of a CUDA graph of it: the host
             time before the first kernel, with the launch gaps

    python benchmarks/host_time.py [--cases B1-T8192-H96 varlen6] [--repeat 200]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
from torch.utils.dlpack import to_dlpack

import bench_chunk_fwd as bench
import openkda
from openkda import _C, _config, _ops


def host_us(fn, repeat: int) -> tuple:
    """(median, p10) of fn's host time in us, each call after a synchronise."""
    times = []
    for _ in range(repeat):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    times.sort()
    return statistics.median(times), times[(len(times) - 1) // 10]


def event_us(fn, repeat: int) -> float:
    """Median of fn's CUDA-event time in us, each call after a synchronise."""
    times = []
    for _ in range(repeat):
        torch.cuda.synchronize()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def core_call(pos: list, kw: dict) -> tuple:
    """The (tensors, options) that one chunk_kda call hands to run_core."""
    seen = {}
    real = _ops.run_core
    _ops.run_core = lambda op, device, tensors, options: seen.update(t=tensors, o=options)
    try:
        openkda.chunk_kda(*pos, **kw)
    finally:
        _ops.run_core = real
    return seen["t"], seen["o"]


def measure(case, repeat: int) -> dict:
    pos, kw = bench.make_inputs(case)
    call = lambda: openkda.chunk_kda(*pos, **kw)  # noqa: E731
    for _ in range(20):
        call()
    tensors, options = core_call(pos, kw)
    device = tensors["q"].device
    stream = torch._C._cuda_getCurrentRawStream(device.index)
    capsules = lambda: {n: None if t is None else to_dlpack(t)  # noqa: E731
                        for n, t in tensors.items()}
    nbytes = _C.chunk_fwd_workspace_bytes(capsules(), options)
    workspace = torch.empty(nbytes, dtype=torch.uint8, device=device)
    allocate = lambda: to_dlpack(  # noqa: E731
        torch.empty(nbytes, dtype=torch.uint8, device=device))
    x = torch.zeros(16, device=device)
    r = {"call": host_us(call, repeat)}
    real = _ops.run_core
    _ops.run_core = lambda *args, **kwargs: None
    try:
        r["wrapper"] = host_us(call, repeat)
    finally:
        _ops.run_core = real
    r["run_core"] = host_us(lambda: _config.run_core("chunk_fwd", device, tensors, options),
                            repeat)
    r["capsules"] = host_us(capsules, repeat)
    parse = host_us(lambda: _C.chunk_fwd_workspace_bytes(capsules(), options), repeat)
    launch = host_us(lambda: _C.chunk_fwd(capsules(), options, to_dlpack(workspace), stream),
                     repeat)
    r["parse"] = tuple(a - b for a, b in zip(parse, r["capsules"]))
    r["launch"] = tuple(a - b for a, b in zip(launch, r["capsules"]))
    r["workspace"] = host_us(allocate, repeat)
    r["torch_op"] = host_us(lambda: x.add_(1), repeat)
    graph = bench.captured(call)
    r["exposed"] = event_us(call, repeat) - event_us(graph.replay, repeat)
    del graph, workspace
    return r


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="*", default=None,
                        help="substrings of bench_chunk_fwd.py's case names (default: all)")
    parser.add_argument("--repeat", type=int, default=200, help="calls per measurement")
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error(f"--repeat {args.repeat}; expected at least 1 call")
    if not torch.cuda.is_available():
        print("CUDA is not available", file=sys.stderr)
        return 1
    print("host time per chunk_kda call, us: median (p10)")
    with torch.inference_mode():
        for case in bench.CASES:
            if args.cases and not any(s in case.name for s in args.cases):
                continue
            r = measure(case, args.repeat)
            print(f"{case.name:18s} " + "  ".join(
                f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v[0]:.1f} ({v[1]:.1f})"
                for k, v in r.items()), flush=True)
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
