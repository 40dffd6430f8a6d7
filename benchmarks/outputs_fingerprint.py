"""Bit-for-bit comparison of chunk_kda's outputs between two builds (kernel refactors that must not
change a single bit: layouts, pipelines, instruction trimming).

Runs a fixed grid of seeded configurations (K 64 / 128 with V = 128, f16 / bf16 inputs, the
softplus and the lower-bound gate in the kernel, a dense batch of T = 502 and a varlen batch with
an empty and a one-token sequence; l2norm, beta sigmoid, an f32 initial state, the final state
and the h snapshots), three times each: the runs must agree bitwise (determinism). With --save the
outputs (o, final state, h of each configuration) go to a file; with --compare they are compared
bitwise with a file that another build saved. Exit status 1 when a run is not deterministic or a
configuration differs.

    python benchmarks/outputs_fingerprint.py --save /tmp/base.pt          # build A
    python benchmarks/outputs_fingerprint.py --compare /tmp/base.pt       # build B

Inputs come from a seeded torch.Generator on the device (torch.randn_like would draw from the
global generator, and the inputs would differ between processes). --device cpu runs the CPU
backend (a smoke test of the script; its bits are the CPU backend's, not the kernels').
"""

from __future__ import annotations

import argparse
import itertools
import sys

import torch

SEQLENS = {False: (502,), True: (100, 1, 0, 333, 64)}
H, HV = 4, 8


def grid() -> list:
    return list(itertools.product((64, 128), (128,), (torch.float16, torch.bfloat16),
                                  ("softplus", "lower_bound"), (False, True)))


def make_call(K: int, V: int, dtype: torch.dtype, gate: str, varlen: bool, device: str,
              seed: int = 1):
    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape, scale=1.0):
        return torch.randn(*shape, device=device, generator=gen) * scale

    seqlens = SEQLENS[varlen]
    T = sum(seqlens)
    q, k = randn(1, T, H, K).to(dtype), randn(1, T, H, K).to(dtype)
    v = randn(1, T, HV, V).to(dtype)
    g = randn(1, T, HV, K, scale=3.0).to(dtype)
    beta = randn(1, T, HV).to(dtype)
    kw = dict(A_log=randn(HV), dt_bias=randn(HV * K), initial_state=randn(len(seqlens), HV, K, V),
              output_final_state=True, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
              use_beta_sigmoid_in_kernel=True, return_intermediate_states=True)
    if gate == "lower_bound":
        kw.update(safe_gate=True, lower_bound=-5.0)
    if varlen:
        cu = [0]
        for n in seqlens:
            cu.append(cu[-1] + n)
        kw["cu_seqlens"] = torch.tensor(cu, device=device)
    return (q, k, v, g, beta), kw


def run(device: str, configs: list) -> tuple[dict, list]:
    """Outputs of every configuration (on the CPU) and the configurations whose 3 runs differ."""
    import openkda

    outputs, nondeterministic = {}, []
    for K, V, dtype, gate, varlen in configs:
        args, kw = make_call(K, V, dtype, gate, varlen, device)
        runs = []
        for _ in range(3):
            with torch.inference_mode():
                o, ht, h = openkda.chunk_kda(*args, **kw)
            runs.append(tuple(t.cpu() for t in (o, ht, h)))
        layout = "varlen" if varlen else "dense"
        key = f"K{K} V{V} {str(dtype).removeprefix('torch.')} {gate} {layout}"
        if not all(torch.equal(a, b) for r in runs[1:] for a, b in zip(runs[0], r)):
            nondeterministic.append(key)
        outputs[key] = runs[0]
    return outputs, nondeterministic


def compare(outputs: dict, reference: dict) -> list:
    """Lines naming every configuration whose outputs differ from the reference's."""
    lines = []
    for key, outs in outputs.items():
        ref = reference.get(key)
        if ref is None:
            lines.append(f"{key}: not in the reference file")
            continue
        names = ("o", "final state", "h")
        diffs = [f"{n} max |diff| {(a.double() - b.double()).abs().max().item():.3e}"
                 for n, a, b in zip(names, outs, ref)
                 if a.shape != b.shape or not torch.equal(a, b)]
        if diffs:
            lines.append(f"{key}: " + ", ".join(diffs))
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--save", help="write the outputs to this file")
    parser.add_argument("--compare", help="compare bitwise with outputs saved by another build")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--limit", type=int, default=None,
                        help="only the first N configurations of the grid")
    args = parser.parse_args(argv)
    configs = grid()[: args.limit]
    outputs, nondeterministic = run(args.device, configs)
    for key in nondeterministic:
        print(f"NOT DETERMINISTIC: {key}")
    if args.save:
        torch.save(outputs, args.save)
    failed = bool(nondeterministic)
    if args.compare:
        lines = compare(outputs, torch.load(args.compare))
        for line in lines:
            print(f"DIFFERS: {line}")
        failed |= bool(lines)
        print(f"{len(outputs) - len(lines)} of {len(outputs)} configurations bitwise equal to "
              f"{args.compare}")
    print(f"{len(outputs) - len(nondeterministic)} of {len(outputs)} configurations deterministic "
          f"over 3 runs")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
