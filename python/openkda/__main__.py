"""``python -m openkda``: run a Kimi-like KDA workload (forward and backward), time it and check it.

The workload mirrors how the KDA layer calls ``chunk_kda``: raw gate with the in-kernel softplus
(or, with ``--gate lower_bound``, the bounded sigmoid gate with ``safe_gate``), in-kernel q/k
l2norm and beta sigmoid, V-first state. It prints the shapes, the time and tokens/s of forward and
backward, and the error (rel-RMS, FLA's ratio metric) of ``o``, the final state and every gradient
against the core's recurrent reference (per-token recurrence and backpropagation through time, in
float64 on the CPU). On the GPU the reference runs on a slice (``--check-T`` tokens of the first
sequence) and the slice is recomputed with the CUDA path for the comparison.

Exit status: 0 when every error is below its tolerance, 1 otherwise.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import torch

import openkda

# Tolerances (rel-RMS): FLA's test_kda ratios for low precision, tight ones for f32 inputs.
TOLERANCES = {
    "o": 5e-3, "final_state": 5e-3, "dq": 8e-3, "dk": 8e-3, "dv": 8e-3, "dg": 2e-2,
    "dbeta": 2e-2, "dA_log": 2e-2, "ddt_bias": 2e-2,
}
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


class Progress:
    """Step-level progress: tqdm when installed, else a plain-text bar on stderr."""

    def __init__(self, steps: int, enabled: bool):
        enabled = enabled and sys.stderr.isatty()
        self.steps, self.done, self.enabled, self.bar, self.width = steps, 0, enabled, None, 0
        if enabled:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=steps, file=sys.stderr, leave=False,
                                bar_format="{l_bar}{bar:30}| {n_fmt}/{total_fmt} [{elapsed}]")
            except ImportError:
                pass

    def step(self, label: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.set_description(label)
            if self.done:
                self.bar.update(1)
        else:
            filled = int(30 * self.done / self.steps)
            line = f"[{'#' * filled}{'.' * (30 - filled)}] {self.done}/{self.steps} {label}"
            sys.stderr.write("\r" + line.ljust(self.width))
            sys.stderr.flush()
            self.width = max(self.width, len(line))
        self.done += 1

    def close(self) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(1)
            self.bar.close()
        else:
            sys.stderr.write("\r" + " " * self.width + "\r")
            sys.stderr.flush()


def pick_device(requested: str, probe: dict) -> tuple[torch.device, str]:
    """The device to run on, and why."""
    if requested == "cpu":
        return torch.device("cpu"), "requested"
    if not torch.cuda.is_available():
        if requested == "cuda":
            sys.exit("--device cuda: CUDA is not available")
        return torch.device("cpu"), "CUDA is not available"
    if not openkda.build_config()["cuda"]:
        if requested == "cuda":
            sys.exit("--device cuda: openkda was built without the CUDA backend")
        return torch.device("cpu"), "openkda was built without the CUDA backend"
    cuda_probe = {n: (t.cuda() if isinstance(t, torch.Tensor) else t) for n, t in probe.items()}
    ok, reason = openkda.supports(**cuda_probe)
    if not ok:
        if requested == "cuda":
            sys.exit(f"--device cuda: {reason}")
        return torch.device("cpu"), f"the CUDA chunk_kda is not available ({reason})"
    return torch.device("cuda"), "CUDA chunk_kda is available"


def make_workload(args, device: torch.device, B: int, T: int) -> tuple[dict, dict]:
    """Kimi-like inputs (leaves requiring grad) and the chunk_kda flags."""
    H, HV, K, V = args.H, args.HV or args.H, args.K, args.V
    dt = DTYPES[args.dtype]
    gen = torch.Generator().manual_seed(args.seed)

    def randn(*shape, dtype=dt, scale=1.0):
        return (scale * torch.randn(*shape, generator=gen)).to(device=device, dtype=dtype)

    dt_init = torch.exp(torch.rand(HV * K, generator=gen) * (math.log(0.1) - math.log(1e-3))
                        + math.log(1e-3)).clamp(min=1e-4)
    tensors = dict(
        q=randn(B, T, H, K), k=randn(B, T, H, K), v=randn(B, T, HV, V),
        g=randn(B, T, HV, K), beta=randn(B, T, HV),
        A_log=torch.empty(HV).uniform_(1, 16, generator=gen).log().to(device),
        dt_bias=(dt_init + torch.log(-torch.expm1(-dt_init))).to(device),  # inverse softplus
    )
    for t in tensors.values():
        t.requires_grad_(True)
    flags = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                 use_beta_sigmoid_in_kernel=True, state_v_first=True, output_final_state=True,
                 chunk_size=args.chunk_size)
    if args.gate == "lower_bound":
        flags.update(lower_bound=-5.0, safe_gate=True)
    return tensors, flags


GRADS = ("q", "k", "v", "g", "beta", "A_log", "dt_bias")


def run_chunk(tensors: dict, flags: dict, do: torch.Tensor, dht: torch.Tensor):
    """chunk_kda forward + backward; returns outputs, grads and the two times."""
    for t in tensors.values():
        t.grad = None
    sync = torch.cuda.synchronize if do.is_cuda else (lambda: None)
    sync()
    t0 = time.perf_counter()
    o, ht = openkda.chunk_kda(**tensors, **flags)
    sync()
    t1 = time.perf_counter()
    torch.autograd.backward([o, ht], [do, dht])
    sync()
    t2 = time.perf_counter()
    grads = {f"d{n}": tensors[n].grad.detach().clone() for n in GRADS}
    return {"o": o.detach(), "final_state": ht.detach(), **grads}, t1 - t0, t2 - t1


def run_reference(tensors: dict, flags: dict, do: torch.Tensor, dht: torch.Tensor) -> dict:
    """The core's recurrent reference (float64, CPU): forward and backpropagation through time."""
    # Exact upcasts of the inputs, so the reference outputs and gradients stay in float64.
    cpu = {n: t.detach().cpu().double() for n, t in tensors.items()}
    args = (cpu["q"], cpu["k"], cpu["v"], cpu["g"], cpu["beta"], cpu["A_log"], cpu["dt_bias"],
            None, None)
    K = cpu["q"].shape[-1]
    opts = dict(scale=K ** -0.5, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                use_beta_sigmoid_in_kernel=True, lower_bound=flags.get("lower_bound"),
                safe_gate=flags.get("safe_gate", False), chunk_size=flags["chunk_size"],
                state_v_first=True, precision="f64", algorithm="reference")
    o, ht, _ = torch.ops.openkda.chunk_fwd(*args, output_final_state=True, **opts)
    grads = torch.ops.openkda.chunk_bwd(*args, do.cpu().double(), dht.cpu().double(), **opts)
    out = {"o": o, "final_state": ht}
    out.update({f"d{n}": gr for n, gr in zip(GRADS, grads)})
    return out


def rel_rms(ref: torch.Tensor, out: torch.Tensor) -> float:
    ref, out = ref.double().cpu(), out.double().cpu()
    return ((ref - out).pow(2).mean().sqrt() / (ref.pow(2).mean().sqrt() + 1e-8)).item()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m openkda", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--B", type=int, default=None, help="batch (default 1 on CPU, 2 on GPU)")
    p.add_argument("--T", type=int, default=None, help="tokens (default 2048 CPU, 8192 GPU)")
    p.add_argument("--H", type=int, default=None, help="q/k heads (default 8 CPU, 32 GPU)")
    p.add_argument("--HV", type=int, default=None, help="value heads (default H)")
    p.add_argument("--K", type=int, default=128)
    p.add_argument("--V", type=int, default=128)
    p.add_argument("--dtype", choices=tuple(DTYPES), default="bf16")
    p.add_argument("--gate", choices=("softplus", "lower_bound"), default="softplus")
    p.add_argument("--chunk-size", type=int, choices=(32, 64), default=64)
    p.add_argument("--check-T", type=int, default=None,
                   help="tokens of the reference check (default: all on CPU, 1024 on GPU)")
    p.add_argument("--no-check", action="store_true", help="skip the reference check")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    args = p.parse_args(argv)

    probe_H = args.H or 8
    probe = dict(q=torch.zeros(1, 1, probe_H, args.K, dtype=DTYPES[args.dtype],
                               requires_grad=True),
                 k=torch.zeros(1, 1, probe_H, args.K, dtype=DTYPES[args.dtype]),
                 v=torch.zeros(1, 1, args.HV or probe_H, args.V, dtype=DTYPES[args.dtype]),
                 g=torch.zeros(1, 1, args.HV or probe_H, args.K, dtype=DTYPES[args.dtype]),
                 beta=torch.zeros(1, 1, args.HV or probe_H, dtype=DTYPES[args.dtype]),
                 use_gate_in_kernel=True, A_log=torch.zeros(args.HV or probe_H),
                 use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                 state_v_first=True, chunk_size=args.chunk_size)
    device, why = pick_device(args.device, probe)
    gpu = device.type == "cuda"
    args.B = args.B or (2 if gpu else 1)
    args.T = args.T or (8192 if gpu else 2048)
    args.H = args.H or (32 if gpu else 8)
    B, T = args.B, args.T
    check_T = min(T, args.check_T or (1024 if gpu else T))
    check_B = B if (not gpu and check_T == T) else 1

    cfg = openkda.build_config()
    where = torch.cuda.get_device_name(device) if gpu else f"cpu, {os.cpu_count()} hardware threads"
    backend = "yes " + cfg["cuda_archs"] if cfg["cuda"] else "no"
    print(f"OpenKDA {openkda.__version__} (CUDA backend: {backend})")
    print(f"device : {device} ({where}); chosen because {why}")
    HV = args.HV or args.H
    print(f"shape  : q, k [{B}, {T}, {args.H}, {args.K}]  v [{B}, {T}, {HV}, {args.V}]  "
          f"{args.dtype}; state [{B}, {HV}, {args.V}, {args.K}] f32 (V-first)")
    print(f"flags  : gate={args.gate} (in kernel), beta sigmoid (in kernel), q/k l2norm, "
          f"chunk_size={args.chunk_size}")

    progress = Progress(1 if args.no_check else 4, enabled=not args.quiet)
    tensors, flags = make_workload(args, device, B, T)
    gen = torch.Generator().manual_seed(args.seed + 1)
    do = torch.randn(B, T, HV, args.V, generator=gen).to(device, DTYPES[args.dtype])
    dht = torch.randn(B, HV, args.V, args.K, generator=gen).to(device)
    progress.step("forward + backward")
    if gpu:  # warm-up (first-call allocation)
        run_chunk(tensors, flags, do, dht)
    out, t_fwd, t_bwd = run_chunk(tensors, flags, do, dht)
    tokens = B * T
    lines = [f"forward : {t_fwd * 1e3:9.1f} ms  {tokens / t_fwd:12,.0f} tokens/s",
             f"backward: {t_bwd * 1e3:9.1f} ms  {tokens / t_bwd:12,.0f} tokens/s"]

    ok = True
    if not args.no_check:
        if (check_B, check_T) != (B, T):
            progress.step(f"slice [{check_B}, {check_T}] on {device.type}")
            sl = {n: (t.detach()[:check_B, :check_T].clone().requires_grad_(True)
                      if t.dim() >= 3 else t.detach().clone().requires_grad_(True))
                  for n, t in tensors.items()}
            do_s, dht_s = do[:check_B, :check_T].contiguous(), dht[:check_B].contiguous()
            out_s, _, _ = run_chunk(sl, flags, do_s, dht_s)
        else:
            progress.step("slice = whole problem")
            sl, do_s, dht_s, out_s = tensors, do, dht, out
        progress.step(f"reference (f64 recurrence, T={check_T})")
        ref = run_reference(sl, flags, do_s, dht_s)
        progress.step("compare")
        lines.append("check   : vs the recurrent reference (float64, CPU) on "
                     f"[{check_B}, {check_T}]")
        for name, tol in TOLERANCES.items():
            err = rel_rms(ref[name], out_s[name])
            good = math.isfinite(err) and err < tol
            ok &= good
            verdict = "ok" if good else "FAIL"
            lines.append(f"  {name:<12} rel-RMS {err:9.2e}  (tol {tol:.0e}) {verdict}")
    progress.close()
    print("\n".join(lines))
    print("result  : " + ("ok" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
