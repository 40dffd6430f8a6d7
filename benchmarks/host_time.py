"""Host time of one openkda.chunk_kda call on CUDA, by part, on bench_chunk_fwd.py's cases.

bench_chunk_fwd.py starts every timed call on an idle GPU, so the host time before a call's first
kernel is part of its ms; on the H200 machines of the thirty-first session it was 0.05-0.20 ms of
every call depending on the machine's host (chunk_fwd README). This splits it. Medians of
--repeat calls, each starting on an idle GPU (bench_chunk_fwd's time_ms), in us:

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
and from CUDA events:
  exposed    the event-timed call less the event-timed replay of a CUDA graph of it: the host
             time before the first kernel, with the launch gaps

    python benchmarks/host_time.py [--cases B1-T8192-H96 varlen6] [--repeat 200]
"""

from __future__ import annotations

import argparse
import contextlib
import sys

import torch
from torch.utils.dlpack import to_dlpack

import bench_chunk_fwd as bench
import openkda
from openkda import _C, _config, _ops


def host_us(fn, repeat: int) -> float:
    """Median host time of fn in us, each call starting on an idle GPU (bench_chunk_fwd's
    time_ms, which also times it by CUDA events)."""
    return bench.time_ms(fn, 0.0, repeat).host_us


@contextlib.contextmanager
def run_core_replaced(fn):
    """openkda._ops.run_core replaced by fn inside the block (the Python layer's one core call)."""
    real = _ops.run_core
    _ops.run_core = fn
    try:
        yield
    finally:
        _ops.run_core = real


def core_call(pos: list, kw: dict) -> tuple:
    """The (tensors, options) that one chunk_kda call hands to run_core."""
    seen = {}
    with run_core_replaced(lambda op, device, tensors, options: seen.update(t=tensors, o=options)):
        openkda.chunk_kda(*pos, **kw)
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
    with run_core_replaced(lambda *args, **kwargs: None):
        r["wrapper"] = host_us(call, repeat)
    r["run_core"] = host_us(lambda: _config.run_core("chunk_fwd", device, tensors, options),
                            repeat)
    r["capsules"] = host_us(capsules, repeat)
    r["parse"] = host_us(lambda: _C.chunk_fwd_workspace_bytes(capsules(), options),
                         repeat) - r["capsules"]
    r["launch"] = host_us(lambda: _C.chunk_fwd(capsules(), options, to_dlpack(workspace), stream),
                          repeat) - r["capsules"]
    r["workspace"] = host_us(allocate, repeat)
    r["torch_op"] = host_us(lambda: x.add_(1), repeat)
    graph = bench.captured(call)
    r["exposed"] = (bench.time_ms(call, 0.0, repeat).median -
                    bench.time_ms(graph.replay, 0.0, repeat).median) * 1e3
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
    cases = bench.select_cases(parser, "--cases", args.cases)
    if not torch.cuda.is_available():
        print("CUDA is not available", file=sys.stderr)
        return 1
    print("host time per chunk_kda call, us: medians")
    with torch.inference_mode():
        for case in cases:
            r = measure(case, args.repeat)
            print(f"{case.name:18s} " + "  ".join(f"{k} {v:.1f}" for k, v in r.items()),
                  flush=True)
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
