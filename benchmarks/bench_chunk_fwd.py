"""Benchmark of the chunk_kda forward on CUDA: OpenKDA, FLA's Triton chunk_kda, the memory floor.

Conditions (issue 3): bf16 q/k/v/g/beta, K = V = 128, the safe gate (lower_bound = -5, A_log and
dt_bias), q/k l2norm and beta sigmoid in the kernel, an f32 initial state in and the f32 final state
out ([N, HV, V, K], the model layer's state_v_first layout).

For each case it reports the median ms over --repeat timed calls (CUDA events around each call,
synchronised per call, after --warmup-ms of untimed calls) with its p10-p90 spread and the calls'
median host time, OpenKDA's median over the replays of a CUDA graph of one call (its GPU time
without the host time before its first kernel; --no-graph skips it), the memory
floor (the bytes of q, k, v, g, beta, o and the two states at the device-to-device copy bandwidth
measured in the same run), FLA 0.6.0's chunk_kda in the same run when ``fla`` imports, the issue's
bar, and the accuracy of o and of the final state of both implementations: rel-RMS against the
float64 per-token recurrence of tests/python/reference.py on the same (bf16-rounded) inputs
(--no-accuracy skips it; about 1 s per case at T = 8192, H = 96 and 10 s at T = 65536 on the
H200).

    python benchmarks/bench_chunk_fwd.py                       # table on stdout
    python benchmarks/bench_chunk_fwd.py --quick               # shorter warm-up, fewer calls
    python benchmarks/bench_chunk_fwd.py --markdown benchmarks/results/h200-$(date +%F).md
        # also writes the table there and a plot next to it (.png, when matplotlib imports)

Each case is printed (stderr) as soon as it is measured. OpenKDA's cases are all timed first;
the float64 references and FLA (its timings and its autotuning) run after them, and OpenKDA's
per-kernel split (prep / scan, one torch.profiler call per case; --no-kernels skips it) last:
once the profiler has run in a process that captured a CUDA graph, torch leaves CUPTI attached
(TEARDOWN_CUPTI=0, its workaround for CUPTI re-init crashes with CUDA graphs), and every later
CUDA call of that process pays CUPTI's callbacks. While the split ran after each case's timing,
the cases timed after the first lost 0.06-0.13 ms of host time per call to it in the
thirty-fourth session's GPU check (k-run: 57 us per call at the first case, 119-191 at the
others, against 57-64 for all five in host_time.py's own process; chunk_fwd README). FLA autotunes
once per shape inside its warm-up calls, about 70 s per new shape on the H200, or 4-6 s with
Triton's autotune results cached on disk (scripts/gpu_check.sh unpacks benchmarks/fla_autotune/;
--fla-cases limits FLA to some cases); without FLA the whole run takes well under a minute.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass

import torch

from _common import run_commit

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tests", "python"))
import reference  # noqa: E402  (tests/python/reference.py: the float64 recurrence)


@dataclass(frozen=True)
class BenchCase:
    name: str
    H: int
    T: int = 0                 # dense: B = 1 row of T tokens
    seqlens: tuple = ()        # varlen: packed sequences
    bar_ms: float = 0.0        # the bar

    @property
    def total_tokens(self) -> int:
        return sum(self.seqlens) if self.seqlens else self.T

    @property
    def N(self) -> int:
        return len(self.seqlens) if self.seqlens else 1


CASES = [
    BenchCase("B1-T8192-H96", H=96, T=8192, bar_ms=1.0),
    BenchCase("varlen6-T8192-H96", H=96, seqlens=(1300, 547, 2048, 963, 271, 3063),
              bar_ms=1.0),
    BenchCase("B1-T8192-H64", H=64, T=8192, bar_ms=0.8),
    BenchCase("B1-T65536-H16", H=16, T=65536, bar_ms=2.0),
    BenchCase("varlen8x4096-H32", H=32, seqlens=(4096,) * 8, bar_ms=1.2),
]

K = V = 128
LOWER_BOUND = -5.0


def select_cases(parser: argparse.ArgumentParser, flag: str, subs) -> list:
    """The cases whose names contain one of `subs` (all when subs is None or empty); a parser
    error naming `flag` when none does."""
    cases = [c for c in CASES if not subs or any(s in c.name for s in subs)]
    if not cases:
        parser.error(f"{flag} {' '.join(subs)}: no case matches; expected substrings of "
                     + ", ".join(c.name for c in CASES))
    return cases


def make_inputs(case: BenchCase, device: str = "cuda", seed: int = 0) -> tuple[list, dict]:
    gen = torch.Generator(device=device).manual_seed(seed)
    T, H = case.total_tokens, case.H
    bf = torch.bfloat16

    def randn(*shape, dtype=bf, scale=1.0):
        return (scale * torch.randn(*shape, generator=gen, device=device,
                                    dtype=torch.float32)).to(dtype)

    q = randn(1, T, H, K)
    k = randn(1, T, H, K)
    v = randn(1, T, H, V)
    g = randn(1, T, H, K)        # raw gate
    beta = randn(1, T, H)        # logits
    kw = dict(
        A_log=torch.zeros(H, device=device, dtype=torch.float32),  # the model's safe-gate init
        dt_bias=randn(H * K, dtype=torch.float32, scale=0.5),
        initial_state=randn(case.N, H, V, K, dtype=torch.float32, scale=0.5),
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
        use_gate_in_kernel=True,
        use_beta_sigmoid_in_kernel=True,
        safe_gate=True,
        lower_bound=LOWER_BOUND,
        state_v_first=True,
    )
    if case.seqlens:
        cu = [0]
        for n in case.seqlens:
            cu.append(cu[-1] + n)
        kw["cu_seqlens"] = torch.tensor(cu, dtype=torch.int64, device=device)
    return [q, k, v, g, beta], kw


def floor_bytes(case: BenchCase) -> int:
    """Bytes every implementation must move: q, k, v, g, beta in, o out (bf16), h0 in, ht out
    (f32)."""
    T, H = case.total_tokens, case.H
    io = 2 * (T * H * (3 * K + V) + T * H + T * H * V)
    states = 2 * 4 * case.N * H * K * V
    return io + states


class Timing:
    """Per-call ms of the timed calls: the median (what the table reports) and p10 / p90; and the
    median host time of the calls in us (from the call to its return: the Python layer, the
    binding and the launches), printed beside them. The call's own host time before its first
    kernel is part of its ms, as the GPU is idle when each call starts, so a slow host shows in
    both (the thirty-first session's development run 17: calls 0.08-0.11 ms slower than in the
    other rounds, with the same kernel durations in the profiler)."""

    def __init__(self, times: list, host_us: list):
        ordered = sorted(times)
        self.calls = len(ordered)
        self.median = statistics.median(ordered)
        self.p10 = ordered[(self.calls - 1) // 10]
        self.p90 = ordered[self.calls - 1 - (self.calls - 1) // 10]
        self.host_us = statistics.median(host_us)

    def spread(self) -> str:
        return (f"p10-p90 {self.p10:.3f}-{self.p90:.3f} over {self.calls} calls; host "
                f"{self.host_us:.0f} us per call")


def time_ms(fn, warmup_ms: float, repeat: int) -> Timing:
    """Timing of fn over `repeat` calls, each between two CUDA events and synchronised (so each
    starts on an idle GPU and its host time counts), after untimed warm-up calls: one call (module
    load; FLA autotunes there), then more until warmup_ms of wall time have passed since it ended.
    A fixed handful was too few: in the twenty-ninth session's development run 14 the median of
    11 calls after 3 warm-up calls sometimes came out 0.07-0.14 ms above the median of 200 calls
    after 10 (chunk_fwd README)."""
    fn()
    torch.cuda.synchronize()
    t_end = time.perf_counter() + warmup_ms * 1e-3
    while time.perf_counter() < t_end:
        fn()
        torch.cuda.synchronize()
    times, host_us = [], []
    for _ in range(repeat):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        fn()
        host_us.append((time.perf_counter() - t0) * 1e6)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return Timing(times, host_us)


def captured(fn) -> torch.cuda.CUDAGraph:
    """A CUDA graph of one call of fn, captured after two calls on the capture stream (which warm
    the allocator's pools for it)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def graph_time(fn, warmup_ms: float, repeat: int) -> Timing | None:
    """fn's GPU time without the host time of its Python layer, binding and launches: the replays
    of a CUDA graph of one call (captured) timed as time_ms times calls (the replay's own launch,
    ~10 us of host time, is still inside each). None, with the reason printed, when fn cannot be
    captured. Added after the thirty-first session's checks, in which the same kernels' calls
    took 0.05 ms more than their graph replays on one machine and 0.14-0.19 ms more on another,
    whose host was slower (B1-T8192-H96 and varlen6; chunk_fwd README)."""
    try:
        graph = captured(fn)
    except Exception as exc:  # noqa: BLE001  (any capture failure: report it, keep the run)
        print(f"# CUDA graph capture failed: {type(exc).__name__}: {exc}", file=sys.stderr,
              flush=True)
        return None
    timing = time_ms(graph.replay, warmup_ms, repeat)
    del graph
    return timing


def kernel_times(fn) -> list:
    """CUDA time of each kernel in one call of fn (torch.profiler), longest first, as (us, name)
    pairs; openkda's kernels are named by their family (chunk_index, prep, scan: the time split's
    two scan passes are two entries)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    parts = []
    for ev in prof.key_averages():
        us = getattr(ev, "device_time_total", None)
        if us is None:
            us = getattr(ev, "cuda_time_total", 0.0)
        if us <= 0:
            continue
        name = ev.key
        for short in ("chunk_index", "prep", "scan"):
            if f"openkda_fwd_{short}_kernel" in name:
                name = short
                break
        parts.append((us, name[:40]))
    return sorted(parts, reverse=True)


def kernel_split(fn) -> str:
    """kernel_times of one call of fn as text, e.g. 'prep 1.20 ms, scan 0.80 ms'."""
    try:
        return ", ".join(f"{name} {us / 1e3:.3f} ms" for us, name in kernel_times(fn)[:5])
    except Exception as exc:  # the split is a diagnostic only
        return f"kernel split unavailable ({type(exc).__name__})"


def copy_bandwidth(warmup_ms: float, repeat: int) -> float:
    """Device-to-device copy bandwidth in bytes/s (bytes read + bytes written), 1 GiB buffers."""
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    src.fill_(1)
    ms = time_ms(lambda: dst.copy_(src), warmup_ms, repeat).median
    del src, dst
    torch.cuda.empty_cache()
    return 2 * n / (ms * 1e-3)


def load_fla():
    try:
        from fla.ops.kda import chunk_kda as fla_chunk_kda  # noqa: WPS433
        import fla
        return fla_chunk_kda, getattr(fla, "__version__", "?")
    except Exception as exc:  # FLA is optional
        print(f"# FLA not available ({type(exc).__name__}: {exc}); skipping the FLA column",
              file=sys.stderr)
        return None, None


def rel_rms(ref: torch.Tensor, out: torch.Tensor) -> float:
    ref, out = ref.double(), out.double()
    return ((ref - out).pow(2).mean().sqrt() / (ref.pow(2).mean().sqrt() + 1e-8)).item()


def reference_outputs(pos: list, kw: dict) -> tuple:
    """(o, final_state) of the float64 per-token recurrence on the inputs of make_inputs."""
    cu = kw.get("cu_seqlens")
    with torch.no_grad():
        return reference.kda(
            *pos, initial_state=kw["initial_state"],
            use_qk_l2norm_in_kernel=kw["use_qk_l2norm_in_kernel"],
            use_gate_in_kernel=kw["use_gate_in_kernel"], A_log=kw["A_log"],
            dt_bias=kw["dt_bias"], lower_bound=kw["lower_bound"],
            use_beta_sigmoid_in_kernel=kw["use_beta_sigmoid_in_kernel"],
            state_v_first=kw["state_v_first"], cu_seqlens=None if cu is None else cu.tolist())


def accuracy(ref: tuple, out: tuple) -> tuple:
    """(rel-RMS of o, rel-RMS of the final state) of out = (o, final_state) against ref."""
    return rel_rms(ref[0], out[0]), rel_rms(ref[1], out[1])


def run(args, cases: list, fla_cases: list) -> tuple:
    """The table's rows for `cases` (FLA on those also in `fla_cases`), the copy bandwidth and
    FLA's version."""
    import openkda

    if args.quick:
        args.warmup_ms, args.repeat = 100.0, 51
    fla_fn, fla_version = (None, None) if args.no_fla else load_fla()
    t_start = time.perf_counter()
    bandwidth = copy_bandwidth(args.warmup_ms, args.repeat)
    print(f"# copy bandwidth {bandwidth / 1e12:.2f} TB/s (read + write)", file=sys.stderr,
          flush=True)
    # Phase 1: OpenKDA's timings, case after case, before anything else runs. The float64
    # reference (seconds of CPU work per case) and FLA (autotuning ~90 s per new shape) come after
    # them: in the thirtieth session's first GPU check the OpenKDA cases timed after FLA's
    # autotuning and the reference of the case before ran 0.005-0.09 ms slower, with p10-p90
    # spreads up to 5x wider, than in development runs of the same build without them (the case
    # timed first matched them; chunk_fwd README), as varlen6 had in the twenty-ninth's.
    rows = []
    for case in cases:
        pos, kw = make_inputs(case)
        kw["chunk_size"] = args.chunk_size
        with torch.inference_mode():
            ours_fn = lambda: openkda.chunk_kda(*pos, **kw)  # noqa: E731
            timing = time_ms(ours_fn, args.warmup_ms, args.repeat)
            graph = None if args.no_graph else graph_time(ours_fn, args.warmup_ms, args.repeat)
            row = dict(case=case.name, openkda_ms=timing.median,
                       spread=f"{timing.p10:.3f}-{timing.p90:.3f}",
                       graph_ms=graph.median if graph else None,
                       floor_ms=floor_bytes(case) / bandwidth * 1e3,
                       fla_ms=None, bar_ms=case.bar_ms, acc=None, fla_acc=None)
        print(f"# {case.name}: openkda {timing.median:.3f} ms ({timing.spread()}; floor "
              f"{row['floor_ms']:.3f}, bar {case.bar_ms:.1f})" +
              (f" graph {graph.median:.3f} ms ({graph.spread()})" if graph else "") +
              f"  t={time.perf_counter() - t_start:.0f}s", file=sys.stderr, flush=True)
        rows.append(row)
        del pos, kw
        torch.cuda.empty_cache()
    # Phase 2: accuracy of both implementations, and FLA's timings.
    for case, row in zip(cases, rows):
        with_fla = fla_fn is not None and case in fla_cases
        if args.no_accuracy and not with_fla:
            continue
        pos, kw = make_inputs(case)
        kw["chunk_size"] = args.chunk_size
        with torch.inference_mode():
            ref = None if args.no_accuracy else reference_outputs(pos, kw)
            if ref is not None:
                row["acc"] = accuracy(ref, openkda.chunk_kda(*pos, **kw))
                print(f"# {case.name}: openkda rel-RMS vs float64: o {row['acc'][0]:.2e}, "
                      f"final state {row['acc'][1]:.2e}", file=sys.stderr, flush=True)
            if with_fla:
                call = lambda: fla_fn(*pos, **kw)  # noqa: E731  (A_log, dt_bias via **kwargs)
                try:
                    # FLA autotunes once per shape, in the first warm-up call.
                    fla_timing = time_ms(call, args.warmup_ms, args.repeat)
                    row["fla_ms"] = fla_timing.median
                    if ref is not None:
                        row["fla_acc"] = accuracy(ref, call())
                    acc = (f", rel-RMS vs float64: o {row['fla_acc'][0]:.2e}, final state "
                           f"{row['fla_acc'][1]:.2e}" if row["fla_acc"] else "")
                    print(f"# {case.name}: fla {row['fla_ms']:.3f} ms ({fla_timing.spread()}), "
                          f"speed-up {row['fla_ms'] / row['openkda_ms']:.2f}x{acc}"
                          f"  t={time.perf_counter() - t_start:.0f}s", file=sys.stderr,
                          flush=True)
                except Exception as exc:
                    print(f"# FLA failed on {case.name}: {type(exc).__name__}: {exc}",
                          file=sys.stderr, flush=True)
        del pos, kw, ref
        torch.cuda.empty_cache()
    # Phase 3: OpenKDA's per-kernel split, after every timing (the module docstring says why).
    for case in [] if args.no_kernels else cases:
        pos, kw = make_inputs(case)
        kw["chunk_size"] = args.chunk_size
        with torch.inference_mode():
            split = kernel_split(lambda: openkda.chunk_kda(*pos, **kw))
        print(f"# {case.name}: openkda kernels [{split}]", file=sys.stderr, flush=True)
        del pos, kw
        torch.cuda.empty_cache()
    return rows, bandwidth, fla_version


def markdown(rows, bandwidth, fla_version, warmup_ms: float, repeat: int) -> str:
    props = torch.cuda.get_device_properties(0)
    lines = [
        f"# chunk_kda forward, {props.name}, {datetime.date.today().isoformat()}",
        "",
        f"commit {run_commit()}; torch {torch.__version__}; CUDA {torch.version.cuda}; "
        f"FLA {fla_version or 'not installed'}; copy bandwidth {bandwidth / 1e12:.2f} TB/s; "
        f"host {platform.node()}",
        "",
        "bf16, K = V = 128, safe gate (lower_bound = -5) + q/k l2norm + beta sigmoid in kernel, "
        f"f32 state in and out. Median of {repeat} timed calls (CUDA events, synchronised per "
        f"call) after {warmup_ms:.0f} ms of warm-up calls; OpenKDA graph ms: the same for the "
        "replays of a CUDA graph of one call (the GPU's time without the call's host time "
        "before its first kernel; the bars are read from OpenKDA ms). Accuracy: rel-RMS of o / of "
        "the final state against the float64 recurrence on the same inputs (o is bf16, so its "
        "rounding alone costs ~1.6e-3).",
        "",
        "| case | OpenKDA ms | OpenKDA p10-p90 ms | OpenKDA graph ms | FLA ms | speed-up | "
        "floor ms | OpenKDA / floor | bar ms | meets bar | OpenKDA o / state rel-RMS | "
        "FLA o / state rel-RMS |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def acc(a):
        return f"{a[0]:.2e} / {a[1]:.2e}" if a else "-"

    for r in rows:
        fla = f"{r['fla_ms']:.3f}" if r["fla_ms"] else "-"
        speed = f"{r['fla_ms'] / r['openkda_ms']:.2f}x" if r["fla_ms"] else "-"
        graph = f"{r['graph_ms']:.3f}" if r["graph_ms"] else "-"
        lines.append(
            f"| {r['case']} | {r['openkda_ms']:.3f} | {r['spread']} | {graph} | {fla} | {speed} | "
            f"{r['floor_ms']:.3f} | "
            f"{r['openkda_ms'] / r['floor_ms']:.1f}x | {r['bar_ms']:.1f} | "
            f"{'yes' if r['openkda_ms'] <= r['bar_ms'] else 'no'} | {acc(r['acc'])} | "
            f"{acc(r['fla_acc'])} |")
    return "\n".join(lines) + "\n"


def plot(rows, path: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:
        print("# matplotlib not available; no plot", file=sys.stderr)
        return
    names = [r["case"] for r in rows]
    x = range(len(rows))
    width = 0.27
    fig, ax = plt.subplots(figsize=(9, 4.5))
    ax.bar([i - width for i in x], [r["openkda_ms"] for r in rows], width, label="OpenKDA")
    ax.bar(list(x), [r["fla_ms"] or 0 for r in rows], width, label="FLA chunk_kda")
    ax.bar([i + width for i in x], [r["floor_ms"] for r in rows], width, label="memory floor")
    ax.scatter(list(x), [r["bar_ms"] for r in rows], marker="_", s=600, color="k",
               label="issue bar", zorder=3)
    ax.set_xticks(list(x))
    ax.set_xticklabels(names, rotation=15, ha="right")
    ax.set_ylabel("ms (median)")
    ax.set_title(f"chunk_kda forward, {torch.cuda.get_device_name(0)}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"# plot written to {path}", file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup-ms", type=float, default=200.0,
                        help="wall time of untimed warm-up calls per implementation and case, "
                             "after the first call")
    parser.add_argument("--repeat", type=int, default=201, help="timed calls per implementation "
                        "and case")
    parser.add_argument("--quick", action="store_true",
                        help="100 ms of warm-up calls and 51 timed calls per implementation and "
                             "case")
    parser.add_argument("--no-kernels", action="store_true",
                        help="skip the per-kernel split (one torch.profiler call per case)")
    parser.add_argument("--cases", nargs="*", default=None,
                        help="substrings of case names to run (default: all)")
    parser.add_argument("--no-fla", action="store_true", help="skip FLA even when it imports")
    parser.add_argument("--no-graph", action="store_true",
                        help="skip the CUDA-graph replay timing of OpenKDA's calls")
    parser.add_argument("--no-accuracy", action="store_true",
                        help="skip the float64 reference (the accuracy columns)")
    parser.add_argument("--chunk-size", type=int, default=64, choices=(32, 64),
                        help="chunk_size of both implementations' calls (the issue's cases: 64)")
    parser.add_argument("--fla-cases", nargs="*", default=None,
                        help="substrings of the case names FLA runs on (default: every case; "
                             "FLA autotunes for about 70 s per new shape without cached results)")
    parser.add_argument("--markdown", default=None, help="write the markdown table to this path")
    parser.add_argument("--plot", default=None,
                        help="plot path (default: the markdown path with .png)")
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error(f"--repeat {args.repeat}; expected at least 1 timed call")
    if args.warmup_ms < 0:
        parser.error(f"--warmup-ms {args.warmup_ms}; expected >= 0")
    cases = select_cases(parser, "--cases", args.cases)
    fla_cases = select_cases(parser, "--fla-cases", args.fla_cases)
    if not torch.cuda.is_available():
        print("CUDA is not available", file=sys.stderr)
        return 1
    rows, bandwidth, fla_version = run(args, cases, fla_cases)
    table = markdown(rows, bandwidth, fla_version, args.warmup_ms, args.repeat)
    print(table)
    if args.markdown:
        os.makedirs(os.path.dirname(os.path.abspath(args.markdown)), exist_ok=True)
        with open(args.markdown, "w") as f:
            f.write(table)
    plot_path = args.plot or (
        os.path.splitext(args.markdown)[0] + ".png" if args.markdown else None)
    if plot_path and rows:
        plot(rows, plot_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
