"""Precision budget of the chunk_kda forward's workspace formats (CPU, float64 emulation).

The CUDA forward hands its chunk intermediates from the prep kernel to the scan kernel through a
workspace in f32 (tf32-rounded where only tensor cores read them; 1.4 GB at B=1, T=8192, H=96,
src/cuda/chunk_fwd/README.md). This script was written when those were w, u, qg, kg and A_qk (the
WY form, until the fourteenth session); the kernels now pass ke = k E and Tinv' instead of w and u
(the scan reads a 16-bit v itself), and form v_new = Tinv' (v - ke S) in the scan. It still
models the WY form, so its rows for w and u are not measurements of ke and Tinv' (ke is bounded
like kg, |ke| <= |k|; Tinv' would need its own row scale in f16: chunk_fwd README, fourteenth
session). It asks which narrower formats keep the issue's accuracy bar (rel-RMS <= 5e-3 against a
float64 reference) before any kernel is written for them.

It runs the chunked algorithm of the CUDA kernels in float64 (chunk size 32 by default, the
kernels' own; the same stages and intermediates: G cumsum, A_kk, A_qk, Tinv, w, u, qg, kg,
gamma, then the state scan) with each workspace tensor rounded to a chosen format, and the
scan's register operands (S and v_new) rounded to the tensor cores' operand format (tf32 today,
round to nearest even, as cvt.rn). Everything else stays float64: the prep's own
products (A_kk, A_qk, Tinv), and S between chunks (the kernel keeps it in f32). So it measures
what the workspace and operand formats add, not the kernels' whole error. The last rows also
round the prep's own product operands as the kernel forms them (16-row blocks anchored at their
first row, Tinv in f32, then w = Tinv (beta k E), u = Tinv (beta v)) to tf32 (the kernels
today), f16 or bf16; the last rows round the scan's operands S and v_new to f16 as well (the
operands of f16 wgmma), S optionally with a power-of-two scale per value column. The reference is
the per-token recurrence in float64 on the same bf16-rounded inputs. o is rounded to bf16 at the
end, as the op returns it.

    python benchmarks/precision_budget.py            # a markdown table, ~1 s on one core
    python benchmarks/precision_budget.py --T 8192 --seed 1

Formats: f32, tf32 (10-bit mantissa, f32 range), bf16 (7-bit mantissa), f16 (10-bit mantissa,
max 65504, subnormals below 6.1e-5), f16r / f16c (f16 with a power-of-two scale per row / per
column). Regimes:
"standard" (raw gate N(0, 1) through the safe gate, v N(0, 1), h0 0.5 N(0, 1)) and "long memory"
(raw gate -12, so the decay is ~1; v x 1e-3; h0 of magnitude 10), the regime that decides the
state's budget; --v-scale multiplies v in both (1e5 takes u past f16's range).
"""

from __future__ import annotations

import argparse

import numpy as np


def round_to(x: np.ndarray, fmt: str) -> np.ndarray:
    """x rounded to nearest-even in `fmt`, returned as float64."""
    if fmt == "f64":
        return x
    if fmt == "f32":
        return x.astype(np.float32).astype(np.float64)
    if fmt == "f16":
        return x.astype(np.float16).astype(np.float64)
    if fmt in ("f16r", "f16c"):
        # f16 with a power-of-two scale per row (f16r: along the last axis) or per column (f16c:
        # along the first), chosen so that the largest magnitude lands in [0.5, 1): the range fix
        # the 2-byte workspace needs for u and w (f16r), and a scan operand S [K, V] scaled per
        # value column, i.e. per row of the wgmma A operand S^T (f16c).
        m = np.abs(x).max(axis=-1 if fmt == "f16r" else 0, keepdims=True)
        e = np.where(m > 0, np.ceil(np.log2(np.where(m > 0, m, 1.0))), 0.0)
        return (np.ldexp(x, -e.astype(int)).astype(np.float16).astype(np.float64)
                * np.ldexp(1.0, e.astype(int)))
    # tf32: cvt.rn.tf32.f32; bf16: __float2bfloat16. Both round to nearest even. Finite inputs
    # only.
    bits = {"tf32": 13, "bf16": 16}[fmt]  # low mantissa bits of an f32 dropped
    f = x.astype(np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    half = np.uint64(1 << (bits - 1))
    lsb = (u >> np.uint64(bits)) & np.uint64(1)
    u = ((u + half - np.uint64(1) + lsb) >> np.uint64(bits)) << np.uint64(bits)
    return u.astype(np.uint32).view(np.float32).astype(np.float64)


def make_inputs(T: int, K: int, regime: str, seed: int, v_scale: float = 1.0):
    rng = np.random.default_rng(seed)
    q = round_to(rng.standard_normal((T, K)), "bf16")
    k = round_to(rng.standard_normal((T, K)), "bf16")
    v = rng.standard_normal((T, K))
    raw = rng.standard_normal((T, K))
    h0 = 0.5 * rng.standard_normal((K, K))
    if regime == "long":
        raw = np.full((T, K), -12.0)
        v = 1e-3 * v
        h0 = 10.0 * np.sign(rng.standard_normal((K, K)))
    v = round_to(v_scale * v, "bf16")
    raw = round_to(raw, "bf16")
    beta = 1.0 / (1.0 + np.exp(-round_to(rng.standard_normal(T), "bf16")))
    # in-kernel l2norm and the safe gate (lower_bound = -5, A_log = 0, no dt_bias)
    q = q / np.sqrt((q * q).sum(1, keepdims=True) + 1e-6)
    k = k / np.sqrt((k * k).sum(1, keepdims=True) + 1e-6)
    g = -5.0 / (1.0 + np.exp(-raw))
    return q, k, v, g, beta, h0


def reference(q, k, v, g, beta, h0, scale):
    """Per-token recurrence: S_t = (I - b k k^T) diag(a_t) S_{t-1} + b k v^T, o_t = scale q S_t."""
    S = h0.copy()
    o = np.empty_like(v)
    for t in range(q.shape[0]):
        S = np.exp(g[t])[:, None] * S
        S = S + beta[t] * np.outer(k[t], v[t] - k[t] @ S)
        o[t] = scale * (q[t] @ S)
    return o, S


def anchored_products(qc, kc, G, sub: int, fmt: str, diag_fmt: str):
    """sum_d q_i k_j exp(G_i - G_j) and the same for k_i, as the prep's tensor-core products form
    them (intra.cuh): 16-row blocks anchored at their first row a, operands x_i exp(G_i - G_a) and
    k_j exp(G_a - G_j) rounded to `fmt` (`diag_fmt` in the diagonal blocks, where the k factor
    exp(G_a - G_j) >= 1 reaches e^75 at lower_bound -5), products and sums exact. Columns past
    each row block are left 0 (the caller masks the upper triangle)."""
    n = qc.shape[0]
    A_q, A_k = np.zeros((n, n)), np.zeros((n, n))
    for r0 in range(0, n, sub):
        rows = slice(r0, min(r0 + sub, n))
        left = np.exp(G[rows] - G[r0])
        for c0, f in ((0, fmt), (r0, diag_fmt)):  # blocks left of the diagonal, then the diagonal
            cols = slice(c0, r0 if c0 < r0 else rows.stop)
            if cols.stop <= cols.start:
                continue
            right = round_to(kc[cols] * np.exp(G[r0] - G[cols]), f)
            A_q[rows, cols] = round_to(qc[rows] * left, f) @ right.T
            A_k[rows, cols] = round_to(kc[rows] * left, f) @ right.T
    return A_q, A_k


def chunked(q, k, v, g, beta, h0, scale, ws: dict, operand: str, BT: int = 64, prep: str = "f64"):
    """The CUDA kernels' stages with the workspace tensors rounded to ws[name] and the scan's
    register operands (S for X and O, v_new for O and the update) rounded to `operand`. `prep`:
    the operand format of the prep's own products (A_qk / A_kk from anchored 16-row blocks, then
    w = Tinv (beta k E) and u = Tinv (beta v)); f64 keeps them exact."""
    T, K = q.shape
    S = h0.copy()
    o = np.empty_like(v)
    for t0 in range(0, T, BT):
        sl = slice(t0, min(t0 + BT, T))
        qc, kc, vc, gc, bc = q[sl], k[sl], v[sl], g[sl], beta[sl]
        n = qc.shape[0]
        G = np.cumsum(gc, axis=0)
        E = np.exp(G)
        if prep == "f64":
            diff = np.exp(G[:, None, :] - G[None, :, :])  # exp(G_i - G_j), all pairs (exact)
            P_qk = np.einsum("id,jd,ijd->ij", qc, kc, diff)
            P_kk = np.einsum("id,jd,ijd->ij", kc, kc, diff)
        else:
            fmt, _, diag = prep.partition("/")  # "f16/tf32": f16 off the diagonal blocks
            P_qk, P_kk = anchored_products(qc, kc, G, 16, fmt, diag or fmt)
        A_kk = bc[:, None] * P_kk * np.tri(n, k=-1)
        A_qk = scale * P_qk * np.tri(n)
        Tinv = np.linalg.inv(np.eye(n) + A_kk)
        if prep != "f64":
            Tinv = round_to(Tinv, "f32")  # the kernel's f32 forward substitution
        wy = prep.partition("/")[0]
        Top = round_to(Tinv, wy)
        w = round_to(Top @ round_to(bc[:, None] * kc * E, wy), ws["w"])
        u = round_to(Top @ round_to(bc[:, None] * vc, wy), ws["u"])
        qg = round_to(scale * qc * E, ws["qg"])
        kg = round_to(kc * np.exp(G[-1] - G), ws["kg"])
        A_qk = round_to(A_qk, ws["aqk"])
        gamma = np.exp(G[-1])
        s_fmt, _, v_fmt = operand.partition("/")  # "f16c/f16": S per-column f16, v_new f16
        Sop = round_to(S, s_fmt)
        v_new = u - w @ Sop
        vop = round_to(v_new, v_fmt or s_fmt)
        o[sl] = qg @ Sop + A_qk @ vop
        S = gamma[:, None] * S + kg.T @ vop
    return round_to(o, "bf16"), S


def rel_rms(ref, out):
    return float(np.sqrt(((out - ref) ** 2).mean()) / np.sqrt((ref ** 2).mean()))


TODAY = dict(w="tf32", u="f32", qg="tf32", kg="tf32", aqk="tf32")
ALL_F16 = dict(w="f16", u="f16", qg="f16", kg="f16", aqk="f16")

# (name, workspace formats, scan operand format[, prep operand format, default f64: exact])
SCHEMES = [
    ("f32 workspace, tf32 operands (tf32-rounded w, qg, kg, A_qk: today)", TODAY, "tf32"),
    ("qg, u, A_qk bf16; w, kg tf32", dict(w="tf32", u="bf16", qg="bf16", kg="tf32", aqk="bf16"),
     "tf32"),
    ("qg, u, A_qk bf16; w, kg f16", dict(w="f16", u="bf16", qg="bf16", kg="f16", aqk="bf16"),
     "tf32"),
    ("w, kg bf16; the rest as today", dict(w="bf16", u="f32", qg="tf32", kg="bf16", aqk="tf32"),
     "tf32"),
    ("all five bf16, tf32 operands", dict(w="bf16", u="bf16", qg="bf16", kg="bf16", aqk="bf16"),
     "tf32"),
    ("all five f16 (range permitting), tf32 operands",
     dict(w="f16", u="f16", qg="f16", kg="f16", aqk="f16"), "tf32"),
    ("all five f16, u and w with row scales (f16r), tf32 operands",
     dict(w="f16r", u="f16r", qg="f16", kg="f16", aqk="f16"), "tf32"),
    ("u bf16 only", dict(w="tf32", u="bf16", qg="tf32", kg="tf32", aqk="tf32"), "tf32"),
    ("qg bf16 only", dict(w="tf32", u="f32", qg="bf16", kg="tf32", aqk="tf32"), "tf32"),
    ("A_qk bf16 only", dict(w="tf32", u="f32", qg="tf32", kg="tf32", aqk="bf16"), "tf32"),
    ("all five bf16, bf16 operands (FLA's precision class)",
     dict(w="bf16", u="bf16", qg="bf16", kg="bf16", aqk="bf16"), "bf16"),
    # The prep's own products with rounded operands (anchored 16-row blocks, f32 Tinv).
    ("prep tf32 operands, workspace and scan as today (the kernels' whole format chain)", TODAY,
     "tf32", "tf32"),
    ("prep f16 operands (NaN: the diagonal blocks' k factors overflow f16)", TODAY, "tf32",
     "f16"),
    ("prep f16 operands, tf32 in the diagonal blocks; workspace and scan as today", TODAY, "tf32",
     "f16/tf32"),
    ("prep f16 operands, tf32 in the diagonal blocks; all five f16", ALL_F16, "tf32",
     "f16/tf32"),
    ("prep bf16 operands, workspace and scan as today", TODAY, "tf32", "bf16"),
    # 2-byte tensor-core operands in the scan too (f16 wgmma, k16): S and v_new rounded to f16.
    ("all five f16 (u, w f16r); scan operands S, v_new f16", dict(ALL_F16, u="f16r", w="f16r"),
     "f16"),
    ("all five f16 (u, w f16r); S f16 scaled per value column, v_new f16",
     dict(ALL_F16, u="f16r", w="f16r"), "f16c/f16"),
    ("the same with the prep's f16 operands (tf32 in the diagonal blocks)",
     dict(ALL_F16, u="f16r", w="f16r"), "f16c/f16", "f16/tf32"),
    ("all five f16 (u, w f16r); S f16 scaled per value column, v_new bf16",
     dict(ALL_F16, u="f16r", w="f16r"), "f16c/bf16"),
    ("all five f16 (u, w f16r); S and v_new f16 scaled per value column",
     dict(ALL_F16, u="f16r", w="f16r"), "f16c/f16c"),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--T", type=int, default=2048)
    parser.add_argument("--K", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--v-scale", type=float, default=1.0,
                        help="multiplies v (e.g. 1e5: u leaves f16's range, f16r keeps it)")
    parser.add_argument("--chunk", type=int, default=32, choices=(32, 64),
                        help="chunk length (the CUDA kernels' is 32 since the seventh session)")
    args = parser.parse_args()
    scale = args.K ** -0.5
    results = {}
    for regime in ("standard", "long"):
        inputs = make_inputs(args.T, args.K, regime, args.seed, args.v_scale)
        # The f16 prep row overflows on purpose (it shows why the diagonal blocks need tf32).
        np.seterr(over="ignore", invalid="ignore")
        ref_o, ref_S = reference(*inputs, scale)
        for name, ws, operand, *prep in SCHEMES:
            o, S = chunked(*inputs, scale, ws, operand, BT=args.chunk,
                           prep=prep[0] if prep else "f64")
            results[(name, regime)] = (rel_rms(ref_o, o), rel_rms(ref_S, S))
    print(f"T = {args.T}, K = V = {args.K}, chunk {args.chunk}, seed {args.seed}, v x "
          f"{args.v_scale:g}; rel-RMS against "
          f"the per-token float64 recurrence (o rounded to bf16; the bar is 5e-3)\n")
    print("| workspace / operands | o, standard | state, standard | o, long memory | "
          "state, long memory |")
    print("|---|---|---|---|---|")
    for name, *_ in SCHEMES:
        s_o, s_S = results[(name, "standard")]
        l_o, l_S = results[(name, "long")]
        print(f"| {name} | {s_o:.2e} | {s_S:.2e} | {l_o:.2e} | {l_S:.2e} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
