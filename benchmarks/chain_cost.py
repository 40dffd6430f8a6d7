"""The fixed cost of one state chain in chunk_kda's CUDA scan: the same chunk steps in more,
shorter sequences.

bench_chunk_fwd.py's configuration (bf16, K = V = 128, safe gate, q/k l2norm and beta sigmoid in
the kernel, f32 states in and out) at --heads heads and --tokens tokens in all, cut into N varlen
sequences (or B dense rows) of tokens / N each: the scan's chunk steps stay the same, its chains
(N x heads) grow with N. Per row it prints the replay of a CUDA graph of one call (median of
--repeat, timed first, before any profiler run: bench_chunk_fwd.py's docstring says why) and the
profiler's prep and scan times (median of 5 calls), and from the scan times of each row and the
first one the chain's fixed cost in us of one multiprocessor:

    (scan - scan_first) x SMs / (chains - chains_first)

A row without initial and final states shows the part that goes with them. The thirty-fourth
session ran the same measurement as a development script (chunk_fwd README: 14-16 us per chain on
the H200, about 9 of them with the two f32 states).

    python benchmarks/chain_cost.py [--heads 32] [--tokens 32768] [--repeat 21]
"""

from __future__ import annotations

import argparse
import statistics

import torch

import bench_chunk_fwd as bench
import openkda

# (label, varlen sequences or dense rows, dense, with the two states)
ROWS = [("varlen", 8, False, True), ("varlen", 32, False, True), ("varlen", 128, False, True),
        ("varlen", 512, False, True), ("varlen", 128, False, False), ("dense", 8, True, True),
        ("dense", 128, True, True)]


def inputs(heads: int, tokens: int, n: int, dense: bool, states: bool,
           device: str = "cuda") -> tuple:
    """bench_chunk_fwd's inputs for n sequences of tokens / n tokens (varlen, or n dense rows)."""
    case = bench.BenchCase("chains", H=heads, seqlens=(tokens // n,) * n)
    pos, kw = bench.make_inputs(case, device=device)
    if dense:
        pos = [x.reshape(n, tokens // n, *x.shape[2:]) for x in pos]
        del kw["cu_seqlens"]
    if not states:
        kw["initial_state"], kw["output_final_state"] = None, False
    return pos, kw


def kernel_ms(fn, calls: int = 5) -> dict:
    """Median CUDA time (ms) per openkda kernel family (prep, scan: a family's kernels summed)
    over `calls` profiled calls (bench_chunk_fwd.kernel_times)."""
    per = {"prep": [], "scan": []}
    for _ in range(calls):
        parts = bench.kernel_times(fn)
        for family, times in per.items():
            times.append(sum(us for us, name in parts if name == family) / 1e3)
    return {k: statistics.median(v) for k, v in per.items()}


def main(argv: list | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=32768,
                        help="tokens in all; a multiple of 512 (the most sequences of a row)")
    parser.add_argument("--repeat", type=int, default=21, help="timed graph replays per row")
    args = parser.parse_args(argv)
    most = max(n for _, n, _, _ in ROWS)
    if args.heads < 1 or args.tokens < most or args.tokens % most or args.repeat < 1:
        parser.error(f"--heads {args.heads}, --tokens {args.tokens}, --repeat {args.repeat}; "
                     f"expected heads >= 1, tokens a positive multiple of {most}, repeat >= 1")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    calls = []
    with torch.inference_mode():
        for label, n, dense, states in ROWS:
            pos, kw = inputs(args.heads, args.tokens, n, dense, states)
            fn = lambda pos=pos, kw=kw: openkda.chunk_kda(*pos, **kw)  # noqa: E731
            graph = bench.graph_time(fn, 100.0, args.repeat)
            calls.append((label, n, states, fn, graph.median if graph else float("nan")))
        print("| layout | chains | states | graph ms | prep ms | scan ms | us per chain |")
        print("|---|---|---|---|---|---|---|")
        first = None
        for label, n, states, fn, graph_ms in calls:
            k = kernel_ms(fn)
            prep, scan = k["prep"], k["scan"]
            chains = n * args.heads
            cost = "-"
            if first is None:
                first = (chains, scan)
            elif chains != first[0]:
                cost = f"{(scan - first[1]) * 1e3 * sms / (chains - first[0]):.1f}"
            print(f"| {label} {n} x {args.tokens // n} | {chains} | {'yes' if states else 'no'} | "
                  f"{graph_ms:.3f} | {prep:.3f} | {scan:.3f} | {cost} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
