"""Per-token error of chunk_kda's o: OpenKDA and FLA against the float64 recurrence.

The rel-RMS over a whole output (the GPU tests' and bench_chunk_fwd.py's measure) is dominated by
the tokens with the largest o; a token whose own error is large but whose o is small (after a
large initial state has decayed, for instance) hides in it. This script reports, per regime and
implementation, the rel-RMS of o and the distribution over tokens of each token's error norm
over its own norm (max with the token and its norm, 90th percentile, median), on the same
(bf16-rounded) inputs. The reference is tests/python/reference.py's per-token float64 loop.

    python benchmarks/per_token_error.py                 # a markdown table; FLA when it imports
    python benchmarks/per_token_error.py --no-fla --device cpu   # OpenKDA's CPU backend only

Inputs: B = 1, T = 256 (--T), HV = 2, K = V = 128, bf16, the in-kernel lower-bound gate (-5, safe
gate) with q / k l2norm and beta sigmoid; every regime sets the raw gate to a constant plus
0.1 N(0, 1) and scales the initial state ~0.5 N(0, 1): raw gate 20 is log-decay -5 on every
token (strong decay: a large state is gone within a few tokens), raw gate -2 and 0 keep memory.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tests", "python"))
import reference  # noqa: E402  (tests/python/reference.py: the float64 recurrence)
from cases import QKVGB, Case, chunk_call, make_inputs  # noqa: E402

import openkda  # noqa: E402

# (raw gate, initial-state scale)
REGIMES = ((20.0, 2e5), (20.0, 10.0), (-2.0, 2e5), (0.0, 1e3))


def regime_inputs(T: int, raw: float, h0_scale: float, seed: int, device: str):
    torch.manual_seed(seed)
    case = Case(B=1, T=T, H=1, HV=2, K=128, V=128, dtype="bf16", gate="lb", safe_gate=True,
                l2norm=True, beta="sigmoid")
    inputs = make_inputs(case)
    g = torch.full_like(inputs["g"], raw, dtype=torch.float64)
    inputs["g"] = (g + 0.1 * torch.randn_like(g)).to(inputs["g"].dtype)
    inputs["initial_state"] = (inputs["initial_state"].double() * h0_scale).to(
        inputs["initial_state"].dtype)
    inputs = {n: t.to(device) if isinstance(t, torch.Tensor) else t for n, t in inputs.items()}
    return case, inputs


def reference_o(inputs: dict) -> torch.Tensor:
    d = {n: t.detach().cpu().double() if isinstance(t, torch.Tensor) else t
         for n, t in inputs.items()}
    with torch.no_grad():
        o, _ = reference.kda(
            *[d[n] for n in QKVGB], initial_state=d["initial_state"],
            use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=d.get("A_log"),
            dt_bias=d.get("dt_bias"), lower_bound=d.get("lower_bound"),
            use_beta_sigmoid_in_kernel=True)
    return o


def per_token(o: torch.Tensor, ref: torch.Tensor) -> dict:
    """Rel-RMS of o, and each token's error norm over its own norm (B and heads pooled)."""
    o, ref = o.detach().cpu().double(), ref.double()
    err = (o - ref).pow(2).sum(dim=(0, 2, 3)).sqrt()
    norm = ref.pow(2).sum(dim=(0, 2, 3)).sqrt()
    rel = err / norm.clamp_min(1e-30)
    worst = int(rel.argmax())
    return dict(rms=(err.pow(2).sum() / norm.pow(2).sum()).sqrt().item(), max=rel[worst].item(),
                token=worst, norm=norm[worst].item(), p90=rel.quantile(0.9).item(),
                median=rel.median().item())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--T", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--no-fla", action="store_true", help="skip FLA even when it imports")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("CUDA is not available (--device cpu runs OpenKDA's CPU backend)", file=sys.stderr)
        return 1
    impls = {"OpenKDA": openkda.chunk_kda}
    if not args.no_fla and args.device == "cuda":
        try:
            from fla.ops.kda import chunk_kda as fla_chunk_kda  # noqa: WPS433
            impls["FLA"] = fla_chunk_kda
        except ImportError:
            print("fla does not import: OpenKDA only", file=sys.stderr)
    print("| raw gate | h0 scale | implementation | o rel-RMS | per-token max (token, its norm) "
          "| p90 | median |")
    print("|---|---|---|---|---|---|---|")
    for raw, h0_scale in REGIMES:
        case, inputs = regime_inputs(args.T, raw, h0_scale, args.seed, args.device)
        ref = reference_o(inputs)
        pos, kw = chunk_call(inputs, case)
        for name, fn in impls.items():
            with torch.no_grad():
                o = fn(*pos, **kw)[0]
            r = per_token(o, ref)
            print(f"| {raw:g} | {h0_scale:g} | {name} | {r['rms']:.2e} | {r['max']:.2e} "
                  f"({r['token']}, {r['norm']:.1e}) | {r['p90']:.2e} | {r['median']:.2e} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
