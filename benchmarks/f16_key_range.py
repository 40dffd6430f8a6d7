"""Exponent range of f16 gated keys: one chunk's o, emulated in float64 on the CPU.

The scan's inter-chunk output term is O = qg S with qg = scale q exp(G) (G: the chunk's
cumulative log-decay; the kernels hold it in log2 units and take exp2). Under strong decay qg
falls below f16's smallest subnormal (2^-24) within a few rows of a chunk; when S is large
against the chunk's values, the lost products still matter for those rows. This script measures
that for one chunk: qg in float64 (the reference), in f16 as is ("plain": the reverted path of
the twenty-second session), in f16 with a per-row anchor ("anchored": qg exp(-a_j), exp(a_j) the
power of two at or below max over d of exp(G_jd), the product's row multiplied back by it: the
f16 path since the twenty-third session), in tf32 (the tf32 path) and in bf16 (FLA 0.6.0 casts qg
to q's dtype: `fla/ops/gla/chunk.py`). The rounding is precision_budget.py's
round_to. It prints the largest per-row rel error of o (each chunk row's own error norm over its
own norm) and the rel-RMS over the chunk. The intra-chunk term A_qk v stays float64, so the
errors are the inter-chunk term's alone.

    python benchmarks/f16_key_range.py                 # a markdown table, well under a second
    python benchmarks/f16_key_range.py --seed 3 --lower-bound -2

Regimes: "uniform" (every channel at log-decay lower_bound on every token), "per-channel"
(lower_bound x sigmoid(8 N(0, 1)) per token and channel: decays in (lower_bound, 0)), and
"split" (half the channels at lower_bound with the state M, half without decay with the state
M x 1e-3: the anchor of a row is the undecayed half, so the decayed half still leaves f16).
S ~ M N(0, 1), v ~ N(0, 1), q and k l2-normalised, scale = K^-0.5.
"""

from __future__ import annotations

import argparse

import numpy as np

from precision_budget import round_to


def l2norm(x: np.ndarray) -> np.ndarray:
    return x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6)


def chunk_errors(M: float, regime: str, lower_bound: float, K: int, BT: int,
                 rng: np.random.Generator) -> dict:
    """Per-row max rel error and rel-RMS of o for each qg format, one chunk."""
    q = l2norm(rng.standard_normal((BT, K)))
    k = l2norm(rng.standard_normal((BT, K)))
    v = rng.standard_normal((BT, K))
    S = M * rng.standard_normal((K, K))
    if regime == "uniform":
        g = np.full((BT, K), lower_bound)
    elif regime == "per-channel":
        g = lower_bound / (1.0 + np.exp(-8.0 * rng.standard_normal((BT, K))))
    else:  # split
        decayed = np.arange(K) < K // 2
        g = np.where(decayed, lower_bound, 0.0)[None, :].repeat(BT, 0)
        S = S * np.where(decayed, 1.0, 1e-3)[:, None]
    G = np.cumsum(g, 0)
    scale = K ** -0.5
    qg = scale * q * np.exp(G)
    A_qk = np.tril(scale * (q[:, None, :] * k[None, :, :] * np.exp(G[:, None, :] - G[None, :, :]))
                   .sum(-1))
    intra = A_qk @ v
    o = qg @ S + intra
    a = np.floor(G.max(1, keepdims=True) / np.log(2.0)) * np.log(2.0)  # a power of two, as ka
    outs = {
        "plain f16": round_to(qg, "f16") @ S + intra,
        "anchored f16": (round_to(scale * q * np.exp(G - a), "f16") @ S) * np.exp(a) + intra,
        "tf32": round_to(qg, "tf32") @ S + intra,
        "bf16 (FLA)": round_to(qg, "bf16") @ S + intra,
    }
    res = {}
    for name, out in outs.items():
        row = np.sqrt(((out - o) ** 2).sum(1) / (o ** 2).sum(1))
        res[name] = (row.max(), np.sqrt(((out - o) ** 2).sum() / (o ** 2).sum()))
    return res


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--K", type=int, default=128)
    parser.add_argument("--chunk", type=int, default=32)
    parser.add_argument("--lower-bound", type=float, default=-5.0,
                        help="log-decay per token of the decayed channels (default -5)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    names = ("plain f16", "anchored f16", "tf32", "bf16 (FLA)")
    print("| regime | M | " + " | ".join(f"{n}: row max / RMS" for n in names) + " |")
    print("|---|---|" + "---|" * len(names))
    for regime in ("uniform", "per-channel", "split"):
        for M in (10.0, 1e3, 1e5):
            res = chunk_errors(M, regime, args.lower_bound, args.K, args.chunk, rng)
            cells = " | ".join(f"{res[n][0]:.2e} / {res[n][1]:.2e}" for n in names)
            print(f"| {regime} | {M:g} | {cells} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
