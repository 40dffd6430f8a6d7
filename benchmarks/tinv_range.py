"""Range of the WY factor Tinv' = (I + A_kk)^-1 diag(beta), emulated in float64 on the CPU.

The scan forms v_new = R Tinv'^T with Tinv' as a tf32 operand. An f16 operand would need its
entries inside f16's range (65504) without a guard. This script measures the largest |Tinv'|
entry over many 32-row chunks in adversarial regimes: l2-normalised keys (the condition of the
scan's f16 path, params.h: f16_keys_apply), beta up to 2 (allow_neg_eigval), near-parallel or
sign-alternating keys, no decay and per-channel extreme decays.

Why a bound is expected: row i > j of Tinv' is -beta_i k_i^T P diag(decay from j to i) k_j
beta_j, where P is a product of factors diag(gamma_m) (I - beta_m k_m k_m^T). Each factor has norm
<= 1 when the keys are unit vectors, beta <= 2 and the decays are <= 1. So |Tinv'| <= beta_max^2,
which is 1, or 4 with allow_neg_eigval. The script checks that numerically.

    python benchmarks/tinv_range.py                  # a markdown table, a few seconds
    python benchmarks/tinv_range.py --seed 3 --chunks 200
"""

from __future__ import annotations

import argparse

import numpy as np

BT, K = 32, 128


def l2norm(x: np.ndarray) -> np.ndarray:
    return x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6)


def tinv_prime(k: np.ndarray, beta: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Tinv' of one chunk: k [BT, K] keys, beta [BT], g [BT, K] log-decays (natural log, <= 0)."""
    G = np.cumsum(g, 0)
    # A_kk[i, j] = beta_i sum_d k_id k_jd exp(G_id - G_jd), j < i; the exponent is <= 0 there.
    diff = np.minimum(G[:, None, :] - G[None, :, :], 0.0)
    A = beta[:, None] * np.einsum("id,jd,ijd->ij", k, k, np.exp(diff))
    A = np.tril(A, -1)
    return np.linalg.solve(np.eye(BT) + A, np.diag(beta))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--chunks", type=int, default=100, help="chunks per regime")
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)

    def random_keys():
        return l2norm(rng.standard_normal((BT, K)))

    def parallel_keys():  # every key within ~1 % of one direction
        base = rng.standard_normal(K)
        return l2norm(base[None] + 0.01 * rng.standard_normal((BT, K)))

    def alternating_keys():  # +-one direction, alternating
        base = rng.standard_normal(K)
        sign = np.where(np.arange(BT) % 2 == 0, 1.0, -1.0)
        return l2norm(sign[:, None] * base[None] + 0.01 * rng.standard_normal((BT, K)))

    betas = {
        "sigmoid": lambda: 1.0 / (1.0 + np.exp(-rng.standard_normal(BT))),
        "2 sigmoid": lambda: 2.0 / (1.0 + np.exp(-rng.standard_normal(BT))),
        "2": lambda: np.full(BT, 2.0),
    }
    gates = {
        "none": lambda: np.full((BT, K), -1e-6),
        "lower bound -5": lambda: -5.0 / (1.0 + np.exp(-rng.standard_normal((BT, K)))),
        "per-channel extremes": lambda: -5.0 / (1.0 + np.exp(-8.0 * rng.standard_normal((BT, K)))),
        "softplus, raw 20 N(0,1)": lambda: -np.logaddexp(0.0, 20.0 * rng.standard_normal((BT, K))),
    }
    keys = {"random": random_keys, "parallel": parallel_keys, "alternating": alternating_keys}

    print("| keys | beta | gate | max abs Tinv' | bound beta_max^2 |")
    print("|---|---|---|---|---|")
    worst = 0.0
    for kname, kf in keys.items():
        for bname, bf in betas.items():
            for gname, gf in gates.items():
                m = max(np.abs(tinv_prime(kf(), bf(), gf())).max() for _ in range(args.chunks))
                bound = 1.0 if bname == "sigmoid" else 4.0
                worst = max(worst, m / bound)
                print(f"| {kname} | {bname} | {gname} | {m:.3g} | {bound:g} |")
    print(f"\nlargest ratio to the bound: {worst:.3f}")
    return 0 if worst <= 1.0 + 1e-9 else 1


if __name__ == "__main__":
    raise SystemExit(main())
