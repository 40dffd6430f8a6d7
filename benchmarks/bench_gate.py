#!/usr/bin/env python3
"""fused_kda_gate on CUDA: device checks and timings, OpenKDA against FLA 0.6.0's Triton kernel.

Usage:
    python benchmarks/bench_gate.py --check                 # correctness + determinism, exit 1 on failure
    python benchmarks/bench_gate.py                         # timings (forward, backward)
    python benchmarks/bench_gate.py --markdown              # + benchmarks/results/<gpu>-<date>.md
    python benchmarks/bench_gate.py --markdown FILE --summary FILE2

Checks (``--check``): every case is compared with a float64 torch reference computed from the same
(dtype-rounded) inputs, by the ratio metric ||out - ref|| / ||ref||, plus NaN/inf parity:
y and dg against per-dtype thresholds, dA_log and ddt_bias at 1e-3. Backward is run twice and must
be bitwise identical; an unaligned copy of the inputs (scalar kernel path) must agree with the
aligned one (vector path). When ``fla`` imports, the distance to FLA's output is reported too.

Timings: the median of CUDA-event timings over ``--repeats`` runs after ``--warmup`` runs. Forward
is ``fused_kda_gate`` without autograd; backward is ``torch.autograd.grad`` of a retained graph
(dg, dA_log, ddt_bias), so both libraries include their host-side work. The memory floor of a case
is its compulsory bytes (inputs read once, outputs written once) over the device-to-device copy
bandwidth measured in the same run (bytes read + bytes written of a large ``copy_``).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import math
import os
import platform
import statistics
import subprocess
import sys
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from _common import run_commit

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32, "f64": torch.float64}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
# Ratio-metric thresholds for outputs stored in a dtype (rounding dominates below f32).
OUT_TOL = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-5, torch.float64: 1e-5}
PARAM_TOL = 1e-3  # f32 sums with cancellation; an indexing bug gives O(1)


@dataclass
class Case:
    name: str
    shape: tuple  # (..., HV, K)
    g_dtype: torch.dtype = torch.bfloat16
    out_dtype: torch.dtype = torch.float32
    lower_bound: float | None = None
    has_A: bool = True
    has_bias: bool = True
    g_scale: float = 1.0  # raw gate ~ N(0, g_scale^2)
    fla_compare: bool = False  # --check: also report the distance to FLA (costs a Triton autotune)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def label(self) -> str:
        gate = "softplus" if self.lower_bound is None else f"lb{self.lower_bound:g}"
        parts = [
            "x".join(str(s) for s in self.shape),
            f"{DTYPE_NAMES[self.g_dtype]}->{DTYPE_NAMES[self.out_dtype]}",
            gate,
        ]
        if not self.has_A:
            parts.append("noA")
        if not self.has_bias:
            parts.append("nobias")
        return " ".join(parts)


CHECK_CASES = [
    Case("softplus-odd", (2, 63, 4, 128), fla_compare=True),
    Case("softplus-f32-to-bf16", (3, 17, 2, 64), torch.float32, torch.bfloat16, has_bias=False),
    Case("softplus-wide-range", (1, 300, 8, 128), g_scale=15.0),  # crosses the threshold 20
    Case("lowerbound", (2, 63, 4, 128), lower_bound=-5.0, fla_compare=True),
    Case("lowerbound-noA-f16", (1, 129, 4, 64), torch.float16, torch.float16, lower_bound=-3.0,
         has_A=False),
    Case("scalar-path-K100", (2, 37, 3, 100)),  # K % 8 != 0: one column per thread
    Case("single-token", (1, 1, 32, 128)),
    Case("tiny-C", (5, 7, 1, 8), lower_bound=-1.0),
    Case("many-rows", (1, 65536, 8, 64), g_scale=3.0),  # several row blocks per thread
    Case("bf16-out", (4, 1000, 16, 128), torch.bfloat16, torch.bfloat16),
]

BENCH_CASES = [
    Case("kimi-T32k-softplus", (1, 32768, 32, 128)),
    Case("kimi-T32k-lowerbound", (1, 32768, 32, 128), lower_bound=-5.0),
    Case("B8-T4k-HV64", (8, 4096, 64, 128)),
    Case("B8-T4k-HV64-bf16out", (8, 4096, 64, 128), torch.bfloat16, torch.bfloat16),
    Case("decode-B64", (64, 1, 32, 128)),
]


# ---- inputs and references -----------------------------------------------------------------------
def make_inputs(case: Case, device, gen):
    HV, K = case.shape[-2:]
    g = (torch.randn(case.shape, generator=gen, device=device) * case.g_scale).to(case.g_dtype)
    A_log = (torch.rand(HV, generator=gen, device=device) * 15 + 1).log() if case.has_A else None
    dt_bias = torch.randn(HV * K, generator=gen, device=device) * 0.5 if case.has_bias else None
    dy = torch.randn(case.shape, generator=gen, device=device).to(case.out_dtype)
    return g, A_log, dt_bias, dy


def reference(g, A_log, dt_bias, lower_bound, dy):
    """float64 forward and gradients (FLA 0.6.0 semantics) from the exact stored inputs."""
    HV, K = g.shape[-2:]
    g64 = g.detach().double().requires_grad_(True)
    A64 = A_log.detach().double().requires_grad_(True) if A_log is not None else None
    b64 = dt_bias.detach().double().requires_grad_(True) if dt_bias is not None else None
    x = g64 + b64.view(HV, K) if b64 is not None else g64
    if lower_bound is None:
        a_log = A64.view(HV, 1) if A64 is not None else torch.ones((), dtype=torch.float64,
                                                                   device=g.device)
        y = -a_log.exp() * F.softplus(x)
    else:
        a = A64.view(HV, 1).exp() if A64 is not None else 1.0
        y = lower_bound * torch.sigmoid(a * x)
    leaves = [t for t in (g64, A64, b64) if t is not None]
    grads = torch.autograd.grad(y, leaves, dy.double())
    it = iter(grads)
    dg = next(it)
    dA = next(it) if A64 is not None else None
    db = next(it) if b64 is not None else None
    return y.detach(), dg, dA, db


def ratio(out, ref) -> float:
    out = out.detach().double()
    ref = ref.detach().double()
    if torch.isnan(out).any() != torch.isnan(ref).any():
        return float("inf")
    if not torch.isfinite(out).all():
        return float("inf")
    den = ref.norm().item()
    num = (out - ref).norm().item()
    return num / den if den > 0 else num


def run_lib(fn, g, A_log, dt_bias, lower_bound, out_dtype, dy):
    """Forward and backward through autograd; returns (y, dg, dA_log, ddt_bias)."""
    # detach() keeps the storage offset, so unaligned inputs stay unaligned (clone() would not).
    gi = g.detach().requires_grad_(True)
    Ai = A_log.detach().requires_grad_(True) if A_log is not None else None
    bi = dt_bias.detach().requires_grad_(True) if dt_bias is not None else None
    y = fn(gi, Ai, bi, lower_bound=lower_bound, output_dtype=out_dtype)
    leaves = [t for t in (gi, Ai, bi) if t is not None]
    grads = list(torch.autograd.grad(y, leaves, dy))
    dg = grads.pop(0)
    dA = grads.pop(0) if Ai is not None else None
    db = grads.pop(0) if bi is not None else None
    return y.detach(), dg, dA, db


def unaligned_copy(t):
    """Same values, data pointer offset by one element (defeats 16-byte alignment)."""
    if t is None:
        return None
    flat = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    view = flat[1:].view(t.shape)
    view.copy_(t)
    return view


# ---- checks --------------------------------------------------------------------------------------
def check(ok_fn, fla_fn, device) -> bool:
    gen = torch.Generator(device=device)
    gen.manual_seed(1234)
    all_ok = True
    print(f"{'case':<24} {'shape/dtypes/gate':<40} {'y':>9} {'dg':>9} {'dA_log':>9} "
          f"{'ddt_bias':>9} {'det':>4} {'unal':>4} {'bits':>4} {'vs FLA y':>9}  result")
    for case in CHECK_CASES:
        g, A_log, dt_bias, dy = make_inputs(case, device, gen)
        try:
            out = run_lib(ok_fn, g, A_log, dt_bias, case.lower_bound, case.out_dtype, dy)
            out2 = run_lib(ok_fn, g, A_log, dt_bias, case.lower_bound, case.out_dtype, dy)
            out_un = run_lib(ok_fn, unaligned_copy(g), A_log, dt_bias, case.lower_bound,
                             case.out_dtype, unaligned_copy(dy))
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - report and continue with the next case
            print(f"{case.name:<24} {case.label():<40} ERROR {type(e).__name__}: {e}")
            all_ok = False
            continue
        ref = reference(g, A_log, dt_bias, case.lower_bound, dy)
        errs = [ratio(o, r) if r is not None else None for o, r in zip(out, ref)]
        tols = [OUT_TOL[case.out_dtype], OUT_TOL[case.g_dtype], PARAM_TOL, PARAM_TOL]
        ok = all(e is None or e <= t for e, t in zip(errs, tols))
        ok = ok and out[0].dtype == case.out_dtype and out[1].dtype == case.g_dtype
        det = all(a is None or torch.equal(a, b) for a, b in zip(out[1:], out2[1:]))
        # Unaligned inputs run the scalar kernel path: same values up to one ulp of the stored
        # dtype (bitwise equality is expected and reported as 'bits').
        unal = all(a is None or torch.allclose(a.double(), b.double(), atol=1e-6,
                                               rtol=2 * torch.finfo(a.dtype).eps)
                   for a, b in zip(out, out_un))
        bits = all(a is None or torch.equal(a, b) for a, b in zip(out, out_un))
        ok = ok and det and unal
        fla_txt = "-"
        if fla_fn is not None and case.fla_compare:
            try:
                y_fla = fla_fn(g, A_log, dt_bias, lower_bound=case.lower_bound,
                               output_dtype=case.out_dtype)
                fla_txt = f"{ratio(out[0], y_fla):.2e}"
            except Exception as e:  # noqa: BLE001
                fla_txt = type(e).__name__
        fmt = [f"{e:.2e}" if e is not None else "-" for e in errs]
        print(f"{case.name:<24} {case.label():<40} {fmt[0]:>9} {fmt[1]:>9} {fmt[2]:>9} "
              f"{fmt[3]:>9} {'yes' if det else 'NO':>4} {'yes' if unal else 'NO':>4} "
              f"{'yes' if bits else 'no':>4} "
              f"{fla_txt:>9}  {'PASS' if ok else 'FAIL'}")
        all_ok = all_ok and ok
    print(f"gate checks: {'PASS' if all_ok else 'FAIL'}")
    return all_ok


# ---- timing --------------------------------------------------------------------------------------
def time_ms(fn, warmup: int, repeats: int) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    events = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        events.append((start, end))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events)


def copy_bandwidth(device, warmup: int, repeats: int, nbytes: int = 1 << 31) -> float:
    """Device-to-device copy bandwidth in bytes/s (bytes read + bytes written)."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), warmup, repeats)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / (ms * 1e-3)


def case_bytes(case: Case, backward: bool) -> int:
    HV, K = case.shape[-2:]
    g_b = torch.empty((), dtype=case.g_dtype).element_size()
    y_b = torch.empty((), dtype=case.out_dtype).element_size()
    params = 4 * (HV + HV * K)
    if backward:  # read g, dy; write dg; dA_log/ddt_bias are negligible
        return case.numel * (2 * g_b + y_b) + 2 * params
    return case.numel * (g_b + y_b) + params


def bench(ok_fn, fla_fn, device, warmup, repeats, quick):
    bw = copy_bandwidth(device, warmup, repeats)
    print(f"device-to-device copy bandwidth: {bw / 1e12:.3f} TB/s (read + write)")
    gen = torch.Generator(device=device)
    gen.manual_seed(7)
    rows = []
    cases = BENCH_CASES[:2] if quick else BENCH_CASES
    for case in cases:
        g, A_log, dt_bias, dy = make_inputs(case, device, gen)
        row = {"case": case.name, "label": case.label()}
        for lib, fn in (("openkda", ok_fn), ("fla", fla_fn)):
            if fn is None:
                continue
            try:
                with torch.no_grad():
                    row[f"{lib}_fwd"] = time_ms(
                        lambda: fn(g, A_log, dt_bias, lower_bound=case.lower_bound,
                                   output_dtype=case.out_dtype), warmup, repeats)
                gi = g.detach().clone().requires_grad_(True)
                Ai = A_log.detach().clone().requires_grad_(True) if A_log is not None else None
                bi = dt_bias.detach().clone().requires_grad_(True) if dt_bias is not None else None
                y = fn(gi, Ai, bi, lower_bound=case.lower_bound, output_dtype=case.out_dtype)
                leaves = [t for t in (gi, Ai, bi) if t is not None]
                row[f"{lib}_bwd"] = time_ms(
                    lambda: torch.autograd.grad(y, leaves, dy, retain_graph=True), warmup, repeats)
                del y, gi, Ai, bi, leaves
            except Exception as e:  # noqa: BLE001
                row[f"{lib}_error"] = f"{type(e).__name__}: {e}"
        row["floor_fwd"] = case_bytes(case, False) / bw * 1e3
        row["floor_bwd"] = case_bytes(case, True) / bw * 1e3
        rows.append(row)
        del g, A_log, dt_bias, dy
        torch.cuda.empty_cache()
    return bw, rows


def fmt_ms(v):
    return f"{v:.4f}" if isinstance(v, float) else "-"


def table(rows) -> str:
    head = ("| case | shape, dtypes, gate | dir | openkda ms | FLA ms | floor ms | openkda % of floor "
            "| speed-up vs FLA |\n|---|---|---|---:|---:|---:|---:|---:|\n")
    lines = []
    for r in rows:
        for d in ("fwd", "bwd"):
            ok, fla, floor = r.get(f"openkda_{d}"), r.get(f"fla_{d}"), r[f"floor_{d}"]
            eff = f"{100 * floor / ok:.0f}%" if isinstance(ok, float) else "-"
            spd = f"{fla / ok:.2f}x" if isinstance(ok, float) and isinstance(fla, float) else "-"
            lines.append(f"| {r['case']} | {r['label']} | {d} | {fmt_ms(ok)} | {fmt_ms(fla)} | "
                         f"{floor:.4f} | {eff} | {spd} |")
        for lib in ("openkda", "fla"):
            if f"{lib}_error" in r:
                lines.append(f"| {r['case']} | {r['label']} | error | {lib}: "
                             f"{r[lib + '_error'][:120]} | | | | |")
    return head + "\n".join(lines) + "\n"


def environment() -> dict:
    props = torch.cuda.get_device_properties(0)
    env = {
        "gpu": props.name,
        "sms": str(props.multi_processor_count),
        "torch": torch.__version__,
        "cuda (torch)": str(torch.version.cuda),
        "python": platform.python_version(),
        "commit": run_commit(),
    }
    try:
        env["driver"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20).stdout.strip() or "unknown"
    except Exception:  # noqa: BLE001
        env["driver"] = "unknown"
    try:
        import triton

        env["triton"] = triton.__version__
    except Exception:  # noqa: BLE001
        pass
    try:
        import fla

        env["fla"] = fla.__version__
    except Exception:  # noqa: BLE001
        env["fla"] = "not installed"
    return env


def markdown_report(env, bw, rows, args) -> str:
    today = _dt.date.today().isoformat()
    out = [f"# fused_kda_gate on {env['gpu']} ({today})", "",
           "Generated by `python benchmarks/bench_gate.py --markdown`; do not edit by hand.", ""]
    out += [f"- {k}: {v}" for k, v in env.items()]
    out += [f"- copy bandwidth (read + write): {bw / 1e12:.3f} TB/s",
            f"- timing: median of {args.repeats} CUDA-event timings after {args.warmup} warm-up "
            "runs; bwd = torch.autograd.grad of a retained graph (dg, dA_log, ddt_bias)",
            "- floor: compulsory bytes / copy bandwidth; '% of floor' = floor / time", ""]
    out.append(table(rows))
    return "\n".join(out)


def gpu_tag(name: str) -> str:
    for tag in ("h200", "h100", "b200", "a100", "l40s"):
        if tag in name.lower():
            return tag
    return "".join(c for c in name.lower().replace("nvidia", "") if c.isalnum()) or "gpu"


def load_fns(use_fla: bool):
    import openkda

    ok_fn = openkda.fused_kda_gate
    if not use_fla:
        return ok_fn, None
    try:
        from fla.ops.kda.gate import fused_kda_gate as fla_fn
    except Exception as e:  # noqa: BLE001
        print(f"FLA not available ({type(e).__name__}: {e}); OpenKDA only")
        fla_fn = None
    return ok_fn, fla_fn


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="correctness checks only")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--quick", action="store_true", help="first two benchmark cases only")
    ap.add_argument("--no-fla", action="store_true", help="do not run FLA even if it imports")
    ap.add_argument("--markdown", nargs="?", const="", default=None,
                    help="write the report to this file (default <results-dir>/<gpu>-<date>.md)")
    ap.add_argument("--results-dir", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "results"),
        help="folder of the default report name (default benchmarks/results)")
    ap.add_argument("--summary", default=None, help="also write the results table to this file")
    args = ap.parse_args()

    if not torch.cuda.is_available():
        print("CUDA is not available: nothing to check or time")
        return 2
    device = torch.device("cuda")
    ok_fn, fla_fn = load_fns(use_fla=not args.no_fla)

    if args.check:
        return 0 if check(ok_fn, fla_fn, device) else 1

    env = environment()
    print(" | ".join(f"{k}: {v}" for k, v in env.items()))
    bw, rows = bench(ok_fn, fla_fn, device, args.warmup, args.repeats, args.quick)
    text = table(rows)
    print(text)
    if args.summary:
        with open(args.summary, "w") as f:
            f.write(f"copy bandwidth (read + write): {bw / 1e12:.3f} TB/s\n\n" + text)
    if args.markdown is not None:
        path = args.markdown or os.path.join(
            args.results_dir, f"{gpu_tag(env['gpu'])}-{_dt.date.today().isoformat()}.md")
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            f.write(markdown_report(env, bw, rows, args))
        print(f"wrote {path}")
    return 0 if all("openkda_error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
