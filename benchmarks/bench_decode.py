#!/usr/bin/env python3
"""fused_recurrent_kda decode and speculative verify on CUDA: OpenKDA against FLA 0.6.0.

Usage:
    python benchmarks/bench_decode.py                      # table on stdout
    python benchmarks/bench_decode.py --markdown FILE      # + the table (and run info) in FILE
    python benchmarks/bench_decode.py --check              # + distance between OpenKDA and FLA
    python benchmarks/bench_decode.py --cases decode-B1 mtp4-B64

Cases (the serving conditions of issue 4): H = HV = 32, K = V = 128, bf16 q/k/v/g/beta, the
softplus gate (A_log, dt_bias) and q/k l2norm in the kernel, an fp32 state pool [num_slots, HV, K,
V] updated in place through ssm_state_indices (vLLM layout: B = 1, cu_seqlens = arange):
    decode-B{1,64,256}   one token per sequence, 1-D int32 slot indices;
    mtp4-B64             4 draft tokens per sequence, 2-D indices [N, 4] and num_accepted_tokens
                         (random in 1..4): the state is read once and written after every token;
    *-vfirst             the same with state_v_first=True (pool [num_slots, HV, V, K]).

Timing: every library call is captured N times (--calls) in one CUDA graph after eager warm-up
calls; a replay is timed with CUDA events; the reported time per call is the median over
--repeats replays. Python overhead is out of the number; the gaps between kernels inside the
graph are in it (as in a serving engine's captured decode step). Both libraries get the same
inputs, their own copy of the pool and an out= buffer (no allocation or memset in the graph).

HBM floor: compulsory bytes / copy bandwidth, where the bytes are the state read once and written
once per token (fp32), plus q, k, v, g, beta read and o written once; the copy bandwidth is that
of a device-to-device copy of --copy-gib GiB measured in the same run (bytes read + written over
the time). % of floor = floor time / measured time. Working sets of B >= 64 (128 MiB and more of
state) exceed the 60 MB L2; B = 1 (2 MiB) stays L2-resident across calls for both libraries.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import platform
import statistics
import subprocess
import sys
from dataclasses import dataclass

import torch

from _common import run_commit


@dataclass
class Case:
    name: str
    batch: int
    tokens: int = 1       # tokens per sequence
    H: int = 32
    HV: int = 32
    K: int = 128
    V: int = 128
    two_d: bool = False   # 2-D indices [N, tokens] + num_accepted_tokens
    v_first: bool = False  # state layout [.., V, K] (what FLA's KDA layer passes)

    def state_bytes(self) -> int:
        return self.HV * self.K * self.V * 4  # fp32 per (sequence, head) x heads

    def floor_bytes(self) -> int:
        N, T = self.batch, self.tokens
        state = N * self.state_bytes() * (1 + T)  # one read, one write per token
        io = N * T * 2 * (2 * self.H * self.K      # q, k
                          + self.HV * self.V       # v
                          + self.HV * self.K       # g
                          + self.HV                # beta
                          + self.HV * self.V)      # o
        return state + io


CASES = [
    Case("decode-B1", 1),
    Case("decode-B64", 64),
    Case("decode-B256", 256),
    Case("mtp4-B64", 64, tokens=4, two_d=True),
    Case("decode-B256-vfirst", 256, v_first=True),
    Case("mtp4-B64-vfirst", 64, tokens=4, two_d=True, v_first=True),
]


@dataclass
class Problem:
    args: list
    kwargs: dict
    pool0: torch.Tensor
    idx: torch.Tensor
    nat: torch.Tensor | None
    out: torch.Tensor


def make_problem(case: Case, seed: int = 0) -> Problem:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    dev = "cuda"
    N, T, H, HV, K, V = case.batch, case.tokens, case.H, case.HV, case.K, case.V
    total = N * T
    rnd = lambda *s: torch.randn(*s, generator=gen, device=dev)  # noqa: E731
    q, k = rnd(1, total, H, K).bfloat16(), rnd(1, total, H, K).bfloat16()
    v = rnd(1, total, HV, V).bfloat16()
    g = rnd(1, total, HV, K).bfloat16()
    beta = torch.rand(1, total, HV, generator=gen, device=dev).bfloat16()
    A_log = (torch.rand(HV, generator=gen, device=dev) * 15 + 1).log()
    dt_bias = 0.5 * rnd(HV * K)
    num_slots = max(2 * N * T, 8)
    perm = torch.randperm(num_slots, generator=gen, device=dev)
    if case.two_d:
        idx = perm[: N * T].view(N, T).to(torch.int32)
        nat = torch.randint(1, T + 1, (N,), generator=gen, device=dev).to(torch.int32)
    else:
        idx = perm[:N].to(torch.int32)
        nat = None
    pool0 = 0.1 * rnd(num_slots, HV, K, V)
    cu = torch.arange(0, total + 1, T, device=dev, dtype=torch.int32)
    kwargs = dict(A_log=A_log, dt_bias=dt_bias, cu_seqlens=cu, use_qk_l2norm_in_kernel=True,
                  use_gate_in_kernel=True, inplace_final_state=True,
                  state_v_first=case.v_first)
    return Problem([q, k, v, g, beta], kwargs, pool0, idx, nat, torch.empty_like(v))


def call(fn, pb: Problem, pool: torch.Tensor, out: torch.Tensor):
    return fn(*pb.args, initial_state=pool, ssm_state_indices=pb.idx,
              num_accepted_tokens=pb.nat, out=out, **pb.kwargs)


def time_graph(step, calls: int, repeats: int, warmup: int = 3) -> float:
    """Median microseconds per call of `step` over `repeats` replays of a graph of `calls` calls."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            step()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(repeats):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    del graph
    return statistics.median(times)


def copy_bandwidth(gib: float, repeats: int = 10) -> float:
    """Device-to-device copy bandwidth in bytes/s (bytes read + bytes written)."""
    n = int(gib * (1 << 30))
    src = torch.empty(n, dtype=torch.uint8, device="cuda").fill_(1)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(repeats):
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * n / statistics.median(times)


def load_fla():
    try:
        from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd
        return fused_recurrent_kda_fwd, None
    except Exception as e:  # not installed, or no working Triton here
        return None, f"{type(e).__name__}: {e}"


def rel_rms(ref: torch.Tensor, out: torch.Tensor) -> float:
    ref, out = ref.double(), out.double()
    return ((ref - out).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt().clamp_min(1e-30)).item()


def check_case(case: Case, pb: Problem, ok_fn, fla_fn) -> str:
    """One call of each library from the same pool: distance of o and of the written slots."""
    pool_a, pool_b = pb.pool0.clone(), pb.pool0.clone()
    out_a, out_b = torch.empty_like(pb.out), torch.empty_like(pb.out)
    call(ok_fn, pb, pool_a, out_a)
    call(fla_fn, pb, pool_b, out_b)
    torch.cuda.synchronize()
    slots = pb.idx.reshape(-1).long()
    return (f"{case.name}: rel-RMS(OpenKDA, FLA) o {rel_rms(out_b, out_a):.2e}, "
            f"written slots {rel_rms(pool_b[slots], pool_a[slots]):.2e}")


def run_info() -> dict:
    info = {"date": _dt.datetime.now().isoformat(timespec="seconds"),
            "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "python": platform.python_version()}
    info["commit"] = run_commit()
    try:
        info["driver"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, check=False).stdout.strip() or "unknown"
    except OSError:
        info["driver"] = "unknown"
    return info


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", nargs="*", default=None, help="case names (default: all)")
    ap.add_argument("--calls", type=int, default=0,
                    help="calls per graph (default: 200 at B = 1, 20 otherwise)")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--copy-gib", type=float, default=1.0)
    ap.add_argument("--no-fla", action="store_true")
    ap.add_argument("--check", action="store_true", help="report the distance OpenKDA-FLA")
    ap.add_argument("--markdown", metavar="PATH", default=None)
    a = ap.parse_args()

    if not torch.cuda.is_available():
        print("CUDA is not available", file=sys.stderr)
        return 1
    import openkda
    if not openkda.build_config().get("cuda"):
        print("openkda was built without the CUDA backend", file=sys.stderr)
        return 1
    fla_fn, fla_err = (None, "disabled (--no-fla)") if a.no_fla else load_fla()

    cases = [c for c in CASES if a.cases is None or c.name in a.cases]
    bw = copy_bandwidth(a.copy_gib)
    rows, notes = [], []
    for case in cases:
        pb = make_problem(case)
        calls = a.calls or (200 if case.batch == 1 else 20)
        floor_us = case.floor_bytes() / bw * 1e6
        pool_ok, out_ok = pb.pool0.clone(), pb.out.clone()
        ok_us = time_graph(lambda: call(openkda.fused_recurrent_kda_fwd, pb, pool_ok, out_ok),
                           calls, a.repeats)
        fla_us = None
        if fla_fn is not None:
            try:
                pool_fla, out_fla = pb.pool0.clone(), pb.out.clone()
                fla_us = time_graph(lambda: call(fla_fn, pb, pool_fla, out_fla), calls, a.repeats)
                del pool_fla
                if a.check:
                    notes.append(check_case(case, pb, openkda.fused_recurrent_kda_fwd, fla_fn))
            except Exception as e:  # keep the OpenKDA numbers if FLA fails on this machine
                notes.append(f"{case.name}: FLA failed: {type(e).__name__}: {e}")
        del pool_ok
        torch.cuda.empty_cache()
        rows.append((case, ok_us, floor_us, fla_us))

    head = ("| case | OpenKDA µs | floor µs | % of floor | FLA µs | FLA % of floor | speed-up |"
            "\n|---|---:|---:|---:|---:|---:|---:|")
    lines = [head]
    for case, ok_us, floor_us, fla_us in rows:
        fla = (f"{fla_us:.1f} | {100 * floor_us / fla_us:.0f}% | {fla_us / ok_us:.2f}x"
               if fla_us else "- | - | -")
        lines.append(f"| {case.name} | {ok_us:.1f} | {floor_us:.1f} | "
                     f"{100 * floor_us / ok_us:.0f}% | {fla} |")
    table = "\n".join(lines)
    info = run_info()
    meta = (f"GPU {info['gpu']} (driver {info['driver']}), torch {info['torch']}, commit "
            f"{info['commit']}, {info['date']}; copy bandwidth {bw / 1e9:.0f} GB/s "
            f"(read + write, {a.copy_gib:g} GiB device-to-device copy); FLA: "
            f"{'fla ' + _fla_version() if fla_fn else fla_err}")
    print(meta)
    print(table)
    for n in notes:
        print(n)
    if a.markdown:
        os.makedirs(os.path.dirname(os.path.abspath(a.markdown)), exist_ok=True)
        with open(a.markdown, "w") as f:
            f.write("# fused_recurrent_kda decode on CUDA\n\n")
            f.write("H = HV = 32, K = V = 128, bf16 inputs, softplus gate + l2norm in the kernel, "
                    "fp32 state pool in place; CUDA-graph replay, median per call.\n\n")
            f.write(meta + "\n\n" + table + "\n")
            if notes:
                f.write("\n" + "\n".join(f"- {n}" for n in notes) + "\n")
    return 0


def _fla_version() -> str:
    try:
        from importlib.metadata import version
        for dist in ("flash-linear-attention", "fla-core"):
            try:
                return version(dist)
            except Exception:
                continue
    except Exception:
        pass
    return "?"


if __name__ == "__main__":
    sys.exit(main())
