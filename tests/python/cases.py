"""Test cases of the Python suite, in one place: the Case description, its input generator and the
case lists used by the test modules (odd shapes first)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

import pytest
import torch
import torch.nn.functional as F

import reference as R

QKVGB = ("q", "k", "v", "g", "beta")  # the positional inputs of every KDA op

DTYPES = {"f64": torch.float64, "f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}

# Gate modes: pre (log-decay given), softplus (in kernel, A_log), softplus_noA (recurrent only:
# exp(A_log) = e), lb (lower bound with A_log), lb_noA (lower bound without A_log).
GATES = ("pre", "softplus", "softplus_noA", "lb", "lb_noA")
# beta modes: post (post-activation), sigmoid (logits, in-kernel sigmoid), neg (2 * sigmoid).
BETAS = ("post", "sigmoid", "neg")


@dataclass(frozen=True)
class Case:
    B: int = 1
    T: int = 33
    H: int = 2
    HV: int = 2
    K: int = 16
    V: int = 16
    dtype: str = "f32"
    gate: str = "pre"
    beta: str = "post"
    l2norm: bool = False
    h0: bool = True
    h0_dtype: Optional[str] = None  # default: f64 for f64 cases, else f32
    final: bool = True
    dt_bias: bool = True
    cu_seqlens: Optional[tuple] = None
    cu_dtype: str = "i64"
    chunk_size: int = 64
    v_first: bool = False
    safe_gate: bool = False
    scale: Optional[float] = None
    headwise_beta: bool = False
    A_log_shape: str = "flat"  # flat [HV] or "4d" [1, 1, HV, 1]

    @property
    def id(self) -> str:
        parts = [f"B{self.B}-T{self.T}-H{self.H}" + (f"x{self.HV}" if self.HV != self.H else ""),
                 f"K{self.K}" + (f"V{self.V}" if self.V != self.K else ""), self.dtype,
                 f"gate_{self.gate}" + ("" if self.dt_bias else "_nobias"), f"beta_{self.beta}"]
        if self.l2norm:
            parts.append("l2")
        if self.h0:
            parts.append("h0" + ("" if self.h0_dtype is None else f"_{self.h0_dtype}"))
        if self.cu_seqlens is not None:
            parts.append("cu" + "_".join(map(str, self.cu_seqlens)) + f"_{self.cu_dtype}")
        if self.chunk_size != 64:
            parts.append(f"C{self.chunk_size}")
        if self.v_first:
            parts.append("vfirst")
        if self.safe_gate:
            parts.append("safe")
        if self.scale is not None:
            parts.append(f"scale{self.scale}")
        if self.headwise_beta:
            parts.append("headwise")
        if not self.final:
            parts.append("nofinal")
        if self.A_log_shape != "flat":
            parts.append("Alog4d")
        return "-".join(parts)

    def replace(self, **kw) -> "Case":
        return dataclasses.replace(self, **kw)

    @property
    def N(self) -> int:
        return self.B if self.cu_seqlens is None else len(self.cu_seqlens) - 1


def params(cases):
    return [pytest.param(c, id=c.id) for c in cases]


def make_inputs(c: Case, requires_grad: bool = False) -> dict:
    """Inputs of one case: tensors in the case dtype plus the keyword arguments of the API call.

    q ~ N(0, 1); k ~ N(0, 1) (unit rows when the kernel does not l2-normalise, as FLA's tests);
    v ~ N(0, 1); pre-gated g = logsigmoid(N(0, 1)) (clamped to [-5, 0] with safe_gate);
    raw gate ~ N(0, 1); A_log = log U(1, 16) [HV] f32; dt_bias ~ 0.5 N(0, 1) [HV * K] f32;
    beta = sigmoid(N(0, 1)) or logits N(0, 1); h0 ~ 0.5 N(0, 1).
    """
    dt = DTYPES[c.dtype]
    pdt = torch.float64 if c.dtype == "f64" else torch.float32  # A_log, dt_bias, default h0
    B, T, H, HV, K, V = c.B, c.T, c.H, c.HV, c.K, c.V
    q = torch.randn(B, T, H, K, dtype=torch.float64)
    k = torch.randn(B, T, H, K, dtype=torch.float64)
    if not c.l2norm:
        k = F.normalize(k, dim=-1)
    v = torch.randn(B, T, HV, V, dtype=torch.float64)
    kw = {}
    if c.gate == "pre":
        g = F.logsigmoid(torch.randn(B, T, HV, K, dtype=torch.float64))
        if c.safe_gate:
            g = g.clamp(-5, 0)
    else:
        g = torch.randn(B, T, HV, K, dtype=torch.float64)
        kw["use_gate_in_kernel"] = True
        if not c.gate.endswith("noA"):
            A_log = torch.empty(HV, dtype=pdt).uniform_(1, 16).log()
            kw["A_log"] = A_log.reshape(1, 1, HV, 1) if c.A_log_shape == "4d" else A_log
        if c.dt_bias:
            kw["dt_bias"] = 0.5 * torch.randn(HV * K, dtype=pdt)
        if c.gate.startswith("lb"):
            kw["lower_bound"] = -5.0
    if c.safe_gate:
        kw["safe_gate"] = True
    bshape = (B, T, HV, V) if c.headwise_beta else (B, T, HV)
    if c.beta == "post":
        beta = torch.sigmoid(torch.randn(bshape, dtype=torch.float64))
    else:
        beta = torch.randn(bshape, dtype=torch.float64)
        kw["use_beta_sigmoid_in_kernel"] = True
        kw["allow_neg_eigval"] = c.beta == "neg"
    if c.l2norm:
        kw["use_qk_l2norm_in_kernel"] = True
    if c.scale is not None:
        kw["scale"] = c.scale
    if c.v_first:
        kw["state_v_first"] = True
    if c.cu_seqlens is not None:
        kw["cu_seqlens"] = torch.tensor(c.cu_seqlens, dtype=DTYPES_INT[c.cu_dtype])
    if c.h0:
        shape = (c.N, HV, V, K) if c.v_first else (c.N, HV, K, V)
        h0_dt = pdt if c.h0_dtype is None else DTYPES[c.h0_dtype]
        kw["initial_state"] = (0.5 * torch.randn(shape, dtype=torch.float64)).to(h0_dt)
    kw["output_final_state"] = c.final
    tensors = dict(q=q.to(dt), k=k.to(dt), v=v.to(dt), g=g.to(dt), beta=beta.to(dt))
    if requires_grad:
        params = [kw.get(n) for n in ("A_log", "dt_bias", "initial_state")]
        for t in list(tensors.values()) + params:
            if t is not None:
                t.requires_grad_(True)
    return {**tensors, **kw}


DTYPES_INT = {"i32": torch.int32, "i64": torch.int64}

GRAD_NAMES = ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state")


def reference_call(inputs: dict, chunk_size: int = 64, return_token_states: bool = False):
    """The float64 reference on (detached, upcast) copies of ``inputs`` that require grad.

    Returns (o, final_state[, token_states]) and the dict of float64 leaves.
    """
    leaves = {}
    for n in GRAD_NAMES:
        t = inputs.get(n)
        if t is not None:
            leaves[n] = t.detach().double().requires_grad_(True)
    cu = inputs.get("cu_seqlens")
    out = R.kda(
        leaves["q"], leaves["k"], leaves["v"], leaves["g"], leaves["beta"],
        scale=inputs.get("scale"),
        initial_state=leaves.get("initial_state"),
        use_qk_l2norm_in_kernel=inputs.get("use_qk_l2norm_in_kernel", False),
        use_gate_in_kernel=inputs.get("use_gate_in_kernel", False),
        A_log=leaves.get("A_log"),
        dt_bias=leaves.get("dt_bias"),
        lower_bound=inputs.get("lower_bound"),
        use_beta_sigmoid_in_kernel=inputs.get("use_beta_sigmoid_in_kernel", False),
        allow_neg_eigval=inputs.get("allow_neg_eigval", False),
        state_v_first=inputs.get("state_v_first", False),
        cu_seqlens=None if cu is None else cu.tolist(),
        return_token_states=return_token_states,
    )
    return out, leaves


def assert_close(name: str, ref: torch.Tensor, out: torch.Tensor, ratio: float,
                 atol: Optional[float] = None) -> None:
    """FLA's check on the finite entries: pass if max|ref - out| <= atol, else rel-RMS < ratio;
    NaN and +-inf at exactly the reference's positions.

    atol defaults to FLA's 1e-6 for low-precision outputs and to 0 for f64 outputs, whose
    ratios (1e-9, 1e-10) would otherwise never be applied to values of magnitude ~1.
    """
    assert out.shape == ref.shape, f"{name}: shape {tuple(out.shape)}; expected {tuple(ref.shape)}"
    if atol is None:
        atol = 0.0 if out.dtype == torch.float64 else 1e-6
    ref, out = ref.detach().double(), out.detach().double()
    assert torch.equal(torch.isnan(ref), torch.isnan(out)), f"{name}: NaN mismatch"
    for sign in (1, -1):
        assert torch.equal(ref == sign * float("inf"), out == sign * float("inf")), \
            f"{name}: {'+' if sign > 0 else '-'}inf mismatch"
    finite = torch.isfinite(ref)
    ref, out = ref[finite], out[finite]
    if ref.numel() == 0:
        return
    abs_err = (ref - out).abs().max().item()
    if abs_err <= atol:
        return
    err = R.rel_rms(ref, out)
    assert err < ratio, f"{name}: rel-RMS {err:.3e} >= {ratio:.1e} (max abs err {abs_err:.3e})"


# ---- chunk_kda ----------------------------------------------------------------------------------

_C64 = Case(B=2, T=63, H=2, HV=2, K=16, V=16, dtype="f64")
_VARLEN = (0, 0, 1, 40, 40, 103)  # empty, 1-token, 39-token, empty and 63-token sequences

# fp64 inputs, fp64 CPU backend: tight agreement with the float64 reference (values and grads).
CHUNK_F64 = [
    _C64.replace(T=1),
    _C64,
    _C64.replace(B=1, T=64),
    _C64.replace(T=65, chunk_size=32),
    _C64.replace(B=1, T=130),
    _C64.replace(gate="softplus", beta="sigmoid", l2norm=True),
    _C64.replace(gate="softplus", dt_bias=False, A_log_shape="4d"),
    _C64.replace(gate="lb", safe_gate=True, l2norm=True),
    _C64.replace(gate="lb"),
    _C64.replace(gate="lb_noA", beta="neg"),
    _C64.replace(safe_gate=True),
    _C64.replace(H=1, HV=4, gate="softplus", beta="sigmoid"),
    _C64.replace(H=2, HV=4, K=32, V=8, l2norm=True),
    _C64.replace(K=8, V=24),
    _C64.replace(B=1, T=103, cu_seqlens=_VARLEN, gate="softplus", cu_dtype="i32"),
    _C64.replace(B=1, T=103, cu_seqlens=_VARLEN, h0=False, v_first=True, chunk_size=32),
    _C64.replace(K=16, V=8, v_first=True),
    _C64.replace(h0=False, final=False),
    _C64.replace(scale=0.1),
    Case(B=1, T=20, H=1, HV=1, K=256, V=16, dtype="f64", l2norm=True),
]

# Low-precision inputs, default fp32 CPU backend: FLA's ratio tolerances.
CHUNK_LOWP = [
    Case(B=2, T=70, H=2, HV=2, K=16, V=16, dtype="f32", gate="softplus", beta="sigmoid"),
    Case(B=2, T=100, H=2, HV=4, K=32, V=32, dtype="bf16", gate="softplus", beta="sigmoid",
         l2norm=True),
    Case(B=1, T=150, H=2, HV=2, K=64, V=32, dtype="bf16", gate="lb", safe_gate=True, l2norm=True,
         v_first=True),
    Case(B=1, T=130, H=2, HV=2, K=32, V=32, dtype="bf16", cu_seqlens=(0, 1, 64, 130),
         h0_dtype="bf16"),
    Case(B=2, T=80, H=1, HV=2, K=32, V=16, dtype="f16", chunk_size=32, beta="neg",
         gate="lb_noA"),
]

# dtype -> (o and final state, dq dk dv dh0, dg dbeta, dA_log ddt_bias)
RATIOS = {
    "f64": (1e-9, 1e-9, 1e-9, 1e-9),
    "f32": (1e-4, 1e-4, 1e-4, 1e-4),
    "bf16": (5e-3, 8e-3, 2e-2, 2e-2),
    "f16": (5e-3, 8e-3, 2e-2, 2e-2),
}


# ---- fused_recurrent_kda ------------------------------------------------------------------------

_R64 = Case(B=2, T=37, H=2, HV=2, K=16, V=16, dtype="f64")

RECURRENT_F64 = [
    _R64.replace(T=1),
    _R64,
    _R64.replace(gate="softplus", beta="sigmoid", l2norm=True),
    _R64.replace(gate="softplus_noA"),
    _R64.replace(gate="lb", beta="neg"),
    _R64.replace(gate="lb_noA", dt_bias=False),
    _R64.replace(headwise_beta=True),
    _R64.replace(headwise_beta=True, beta="sigmoid"),
    _R64.replace(H=1, HV=4, K=32, V=8),
    _R64.replace(K=8, V=24, v_first=True),
    _R64.replace(B=1, T=103, cu_seqlens=(0, 0, 1, 40, 40, 103), cu_dtype="i32"),
    _R64.replace(h0=False, final=False),
    _R64.replace(scale=0.3),
]

RECURRENT_LOWP = [
    Case(B=2, T=64, H=2, HV=4, K=32, V=32, dtype="bf16", gate="softplus", beta="sigmoid",
         l2norm=True),
    Case(B=1, T=80, H=2, HV=2, K=32, V=16, dtype="f16", gate="lb", cu_seqlens=(0, 30, 80),
         v_first=True),
    Case(B=2, T=50, H=2, HV=2, K=16, V=16, dtype="f32", h0_dtype="bf16"),
]

# Every gate x beta x l2norm combination of chunk_kda (fp64, small).
CHUNK_SWEEP = [
    Case(B=1, T=40, H=1, HV=2, K=16, V=8, dtype="f64", gate=gate, beta=beta, l2norm=l2,
         chunk_size=32, v_first=l2)
    for gate in ("pre", "softplus", "lb", "lb_noA")
    for beta in BETAS
    for l2 in (False, True)
]


def chunk_call(inputs: dict, case: Case):
    """(positional q, k, v, g, beta; the other inputs as keywords) of a chunk_kda call."""
    args = [inputs[n] for n in QKVGB]
    kw = {n: t for n, t in inputs.items() if n not in QKVGB}
    if case.chunk_size != 64:
        kw["chunk_size"] = case.chunk_size
    return args, kw


def assert_final_state(case: Case, ref_ht, ht, ratio: float) -> None:
    """The CPU backend's final state: None unless requested, else in the CPU precision's dtype and
    within `ratio` of the reference."""
    if not case.final:
        assert ht is None
        return
    import openkda
    expected = torch.float64 if openkda.get_cpu_precision() == "f64" else torch.float32
    assert ht.dtype == expected
    assert_close("final_state", ref_ht, ht, ratio)
