"""fused_recurrent_kda on CUDA (decode and speculative verify) against a float64 reference.

The reference below is written here from the math (spec 1.1, 3, 6), independently of the library:
per sequence and value head, S = diag(exp(g)) S; r = v - S^T k; S += k (beta r)^T; o = S^T q,
in float64 on the CPU, from the exact (dtype-rounded) tensors the kernel reads. Every test is
marked ``gpu`` and is skipped without a CUDA device or a CUDA build (conftest.py).

Tolerances (rel-RMS): fp32 states 1e-4 (fp32 arithmetic only), o and states stored in bf16 5e-3,
f16 2e-3. Pool slots that are not written are poisoned with NaN and must stay bit-identical.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace

import pytest
import torch
import torch.nn.functional as F

import openkda

pytestmark = pytest.mark.gpu

TOL = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 5e-3, torch.float64: 1e-4}
DT = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


# ---- float64 reference --------------------------------------------------------------------------

def ref_gate(g, A_log, dt_bias, gate_in_kernel, lower_bound):
    """Per-token log-decay [..., HV, K] (float64) from the raw gate."""
    g = g.double()
    if not gate_in_kernel:
        return g
    HV, K = g.shape[-2:]
    x = g + (dt_bias.double().view(HV, K) if dt_bias is not None else 0.0)
    if lower_bound is None:
        a = A_log.double().view(HV, 1).exp() if A_log is not None else math.e
        sp = torch.where(x > 20, x, torch.log1p(torch.exp(torch.clamp(x, max=20))))
        return -a * sp
    a = A_log.double().view(HV, 1).exp() if A_log is not None else 1.0
    return lower_bound * torch.sigmoid(a * x)


def reference(q, k, v, g, beta, *, lens, h0, scale, A_log=None, dt_bias=None, l2norm=False,
              gate_in_kernel=False, lower_bound=None, beta_sigmoid=False, neg_eig=False):
    """o [T_total, HV, V], the state after every token [T_total, HV, K, V] and the final state per
    sequence [N, HV, K, V] (float64, [K, V] layout). Inputs are flattened to packed tokens;
    h0: list of N initial states [HV, K, V] (float64) or None entries (zeros)."""
    H, K = q.shape[-2:]
    HV, V = v.shape[-2:]
    q = q.reshape(-1, H, K).double().cpu()
    k = k.reshape(-1, H, K).double().cpu()
    v = v.reshape(-1, HV, V).double().cpu()
    gk = ref_gate(g.reshape(-1, HV, K).cpu(), None if A_log is None else A_log.cpu(),
                  None if dt_bias is None else dt_bias.cpu(), gate_in_kernel, lower_bound)
    b = beta.reshape(-1, HV, *beta.shape[3:]).double().cpu()
    if beta_sigmoid:
        b = torch.sigmoid(b) * (2.0 if neg_eig else 1.0)
    G = HV // H
    q, k = q.repeat_interleave(G, dim=1), k.repeat_interleave(G, dim=1)
    if l2norm:
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    q = q * scale
    total = q.shape[0]
    o = torch.zeros(total, HV, V, dtype=torch.float64)
    states = torch.zeros(total, HV, K, V, dtype=torch.float64)
    finals = []
    bos = 0
    for n, L in enumerate(lens):
        S = h0[n].double().cpu().clone() if h0[n] is not None else torch.zeros(HV, K, V,
                                                                             dtype=torch.float64)
        for t in range(bos, bos + L):
            S = S * gk[t].exp()[:, :, None]
            r = v[t] - torch.einsum("hkv,hk->hv", S, k[t])
            u = (b[t] if b.dim() == 3 else b[t][:, None]) * r
            S = S + k[t][:, :, None] * u[:, None, :]
            o[t] = torch.einsum("hkv,hk->hv", S, q[t])
            states[t] = S
        finals.append(S)
        bos += L
    return o, states, torch.stack(finals) if finals else torch.zeros(0, HV, K, V)


def rel_rms(ref, out):
    ref, out = ref.double().cpu(), out.double().cpu()
    return ((ref - out).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt().clamp_min(1e-30)).item()


def check(name, ref, out, tol):
    assert out.shape == ref.shape, f"{name}: shape {tuple(out.shape)}; expected {tuple(ref.shape)}"
    out = out.double().cpu()
    assert torch.isfinite(out).all(), f"{name}: non-finite values"
    if ref.numel() == 0:
        return
    err = rel_rms(ref, out)
    assert err <= tol, f"{name}: rel-RMS {err:.3e} > {tol:.1e}"


def bits(t):
    """Bit pattern (NaN payloads compare equal to themselves)."""
    return t.contiguous().view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def to_kv(x, v_first):
    return x.transpose(-1, -2) if v_first else x


# ---- problems -----------------------------------------------------------------------------------

@dataclass
class Problem:
    lens: list                   # tokens per sequence (varlen unless dense)
    dense: bool = False          # [B, T] with B = len(lens), every len equal
    H: int = 2
    HV: int = 4
    K: int = 128
    V: int = 128
    dtype: torch.dtype = torch.bfloat16   # q, k, v, beta
    g_dtype: torch.dtype | None = None    # default: dtype
    gate: str = "softplus"       # pre | softplus | softplus_noA | softplus_nobias | lb | lb_noA
    beta: str = "sigmoid"        # plain | sigmoid | neg
    headwise: bool = False
    l2norm: bool = True
    scale: float | None = None
    cu_dtype: torch.dtype = torch.int32
    extra: dict = field(default_factory=dict)

    def tag(self):
        return (f"{'dense' if self.dense else 'varlen'}{len(self.lens)}-H{self.H}-HV{self.HV}-"
                f"K{self.K}-V{self.V}-{str(self.dtype)[6:]}-{self.gate}-{self.beta}"
                f"{'-hw' if self.headwise else ''}{'-l2' if self.l2norm else ''}")


def make(p: Problem, dev="cuda"):
    """CUDA inputs and the keyword arguments shared by both entry points."""
    N = len(p.lens)
    if p.dense:
        B, T = N, p.lens[0]
        assert all(L == T for L in p.lens)
    else:
        B, T = 1, sum(p.lens)
    H, HV, K, V = p.H, p.HV, p.K, p.V
    q = torch.randn(B, T, H, K, device=dev)
    k = torch.randn(B, T, H, K, device=dev)
    if not p.l2norm:  # keep the delta rule stable: unit keys (rounded below, seen by both sides)
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    v = torch.randn(B, T, HV, V, device=dev)
    kw = dict(scale=p.scale, use_qk_l2norm_in_kernel=p.l2norm)
    if p.gate == "pre":
        g = F.logsigmoid(torch.randn(B, T, HV, K, device=dev) + 2.0)
    else:
        g = torch.randn(B, T, HV, K, device=dev)
        kw["use_gate_in_kernel"] = True
        kw["A_log"] = (None if p.gate.endswith("noA") else
                       torch.empty(HV, device=dev).uniform_(1, 8).log())
        kw["dt_bias"] = None if p.gate.endswith("nobias") else 0.5 * torch.randn(HV * K, device=dev)
        kw["lower_bound"] = {"lb": -5.0, "lb_noA": -3.0}.get(p.gate)
    bshape = (B, T, HV, V) if p.headwise else (B, T, HV)
    if p.beta == "plain":
        beta = torch.rand(bshape, device=dev) * 0.9 + 0.05
    else:
        beta = torch.randn(bshape, device=dev)
        kw["use_beta_sigmoid_in_kernel"] = True
        kw["allow_neg_eigval"] = p.beta == "neg"
    args = [q.to(p.dtype), k.to(p.dtype), v.to(p.dtype), g.to(p.g_dtype or p.dtype),
            beta.to(p.dtype)]
    if not p.dense:
        cu = torch.tensor(list(itertools.accumulate(p.lens, initial=0)), dtype=p.cu_dtype,
                          device=dev)
        kw["cu_seqlens"] = cu
    return args, kw


def run_reference(p: Problem, args, kw, h0):
    scale = p.scale if p.scale is not None else p.K ** -0.5
    return reference(*args, lens=p.lens, h0=h0, scale=scale, A_log=kw.get("A_log"),
                     dt_bias=kw.get("dt_bias"), l2norm=p.l2norm,
                     gate_in_kernel=kw.get("use_gate_in_kernel", False),
                     lower_bound=kw.get("lower_bound"),
                     beta_sigmoid=kw.get("use_beta_sigmoid_in_kernel", False),
                     neg_eig=kw.get("allow_neg_eigval", False))


def make_pool(num_slots, HV, K, V, dtype, v_first):
    shape = (num_slots, HV, V, K) if v_first else (num_slots, HV, K, V)
    return torch.full(shape, float("nan"), dtype=dtype, device="cuda")


# ---- the public API: fused_recurrent_kda --------------------------------------------------------

P0 = Problem(lens=[1, 3, 0, 2, 16, 5])
PUBLIC_CASES = [
    (P0, "f32", False),
    (P0, "f32", True),
    (replace(P0, K=64, V=64), "f32", False),
    (replace(P0, K=64, V=128), "f32", True),
    (replace(P0, K=128, V=64, H=1, HV=4), "bf16", False),  # bf16 h0 -> f32 final state
    (replace(P0, K=128, V=64), "bf16", True),
    (replace(P0, lens=[4, 4, 4], dense=True), "f32", False),
    (replace(P0, lens=[1], dense=True, H=4, HV=4), None, False),  # no initial state
    (replace(P0, dtype=torch.float32, gate="pre", beta="plain", l2norm=False), "f32", False),
    (replace(P0, dtype=torch.float16, gate="lb", beta="neg"), "f32", True),
    (replace(P0, headwise=True, gate="lb_noA", scale=0.3), "f32", False),
    (replace(P0, cu_dtype=torch.int64, g_dtype=torch.float32), "f32", True),
    (replace(P0, lens=[0, 0, 0]), "f32", False),  # no tokens at all
]


@pytest.mark.parametrize(
    "p,h0_dtype,v_first", PUBLIC_CASES,
    ids=[f"{p.tag()}-h0{h}{'-vk' if vf else ''}" for p, h, vf in PUBLIC_CASES])
def test_fused_recurrent_kda(p, h0_dtype, v_first):
    args, kw = make(p)
    N, HV, K, V = len(p.lens), p.HV, p.K, p.V
    h0 = None
    if h0_dtype is not None:
        h0 = to_kv(torch.randn(N, HV, K, V, device="cuda"), v_first).contiguous().to(DT[h0_dtype])
    o, ht = openkda.fused_recurrent_kda(*args, initial_state=h0, output_final_state=True,
                                        state_v_first=v_first, **kw)
    ref_o, _, ref_ht = run_reference(
        p, args, kw, [to_kv(h0[n], v_first) if h0 is not None else None for n in range(N)])
    assert o.dtype == args[2].dtype and o.shape == args[2].shape and o.is_cuda
    assert ht.dtype == torch.float32
    check("o", ref_o, o.reshape(ref_o.shape), TOL[o.dtype])
    check("final_state", ref_ht, to_kv(ht, v_first), TOL[torch.float32])
    o2, ht2 = openkda.fused_recurrent_kda(*args, initial_state=h0, state_v_first=v_first, **kw)
    assert ht2 is None and torch.equal(o2, o)


# ---- serving: single-token decode into a state pool ---------------------------------------------

DECODE_CASES = [
    (K, V, pool, v_first, idx)
    for K, V in [(128, 128), (64, 64), (128, 64), (64, 128)]
    for pool in ["f32", "bf16"]
    for v_first in [False, True]
    for idx in ["1d-i32", "2d-i64"]
]


@pytest.mark.parametrize("K,V,pool_dtype,v_first,idx_kind", DECODE_CASES,
                         ids=[f"K{c[0]}-V{c[1]}-{c[2]}-{'vk' if c[3] else 'kv'}-{c[4]}"
                              for c in DECODE_CASES])
def test_decode_pool_in_place(K, V, pool_dtype, v_first, idx_kind):
    """T = 1 per sequence, in place: slot idx[n] holds the new state, every other slot keeps its
    bits (NaN poison)."""
    N, HV = 7, 4
    p = Problem(lens=[1] * N, H=2, HV=HV, K=K, V=V)
    args, kw = make(p)
    num_slots = 3 * N
    slots = torch.randperm(num_slots)[:N].cuda()
    pool = make_pool(num_slots, HV, K, V, DT[pool_dtype], v_first)
    pool[slots] = torch.randn(N, *pool.shape[1:], device="cuda").to(pool.dtype)
    before = pool.clone()
    idx = slots.to(torch.int32) if idx_kind == "1d-i32" else slots.view(N, 1).to(torch.int64)
    o, ht = openkda.fused_recurrent_kda_fwd(*args, initial_state=pool, ssm_state_indices=idx,
                                            state_v_first=v_first, **kw)
    assert ht is pool
    ref_o, ref_states, _ = run_reference(p, args, kw, [to_kv(before[s], v_first) for s in slots])
    check("o", ref_o, o.reshape(ref_o.shape), TOL[o.dtype])
    check("pool[idx]", ref_states, to_kv(pool[slots], v_first), TOL[pool.dtype])
    untouched = torch.ones(num_slots, dtype=torch.bool, device="cuda")
    untouched[slots] = False
    assert torch.equal(bits(pool[untouched]), bits(before[untouched]))


# ---- large batches: the streaming kernel (launch.cu's dispatch) ---------------------------------
# An f32 state with more (sequence, value head) pairs than SMs runs src/cuda/recurrent/stream.cuh
# (the state through shared memory by bulk copies); fewer pairs run the register-tile kernel
# (kernel.cuh). These shapes keep N * HV above the SM count; stream_heads gives the smallest HV
# that does for a small N.

def sm_count():
    return torch.cuda.get_device_properties(0).multi_processor_count


def assert_stream_shape(N, HV):
    assert N * HV > sm_count(), "shape too small to select the streaming kernel"


def stream_heads(N):
    return sm_count() // N + 1


STREAM_DECODE = [(K, V, v_first, idx) for K, V in [(128, 128), (64, 64), (128, 64), (64, 128)]
                     for v_first in [False, True] for idx in ["1d-i32", "2d-i64"]
                     if idx == "1d-i32" or (K, V) == (128, 128)]


@pytest.mark.parametrize("K,V,v_first,idx_kind", STREAM_DECODE,
                         ids=[f"K{c[0]}-V{c[1]}-{'vk' if c[2] else 'kv'}-{c[3]}"
                              for c in STREAM_DECODE])
def test_decode_pool_in_place_large_batch(K, V, v_first, idx_kind):
    """T = 1, N = 384 sequences x HV = 8 on the streaming kernel; some indices are -1 (padding:
    zero state, nothing written)."""
    N, HV = 384, 8
    assert_stream_shape(N, HV)
    p = Problem(lens=[1] * N, H=4, HV=HV, K=K, V=V)
    args, kw = make(p)
    num_slots = N + 40
    slots = torch.randperm(num_slots)[:N]
    pad = torch.zeros(N, dtype=torch.bool)
    pad[torch.randperm(N)[:9]] = True
    pool = make_pool(num_slots, HV, K, V, torch.float32, v_first)
    pool[slots.cuda()] = torch.randn(N, *pool.shape[1:], device="cuda")
    before = pool.clone()
    idx_list = torch.where(pad, torch.full_like(slots, -1), slots)
    idx = (idx_list.to(torch.int32) if idx_kind == "1d-i32" else
           idx_list.view(N, 1).to(torch.int64)).cuda()
    o, ht = openkda.fused_recurrent_kda_fwd(*args, initial_state=pool, ssm_state_indices=idx,
                                            state_v_first=v_first, **kw)
    assert ht is pool
    h0 = [None if pad[n] else to_kv(before[int(slots[n])], v_first) for n in range(N)]
    ref_o, ref_states, _ = run_reference(p, args, kw, h0)
    check("o", ref_o, o.reshape(ref_o.shape), TOL[o.dtype])
    keep = ~pad
    check("pool[idx]", ref_states[keep], to_kv(pool[slots[keep].cuda()], v_first),
          TOL[torch.float32])
    untouched = torch.ones(num_slots, dtype=torch.bool)
    untouched[slots[keep]] = False
    u = untouched.cuda()
    assert torch.equal(bits(pool[u]), bits(before[u]))


@pytest.mark.parametrize("v_first", [False, True], ids=["kv", "vk"])
def test_spec_verify_pool_large_batch(v_first):
    """0..8 tokens per sequence, N = 160 x HV = 8: per-token states into the pool from the
    accepted slot, empty sequences untouched, on the streaming kernel."""
    N, M, HV, K, V = 160, 8, 8, 128, 128
    assert_stream_shape(N, HV)
    lens = [int(x) for x in torch.randint(0, M + 1, (N,))]
    p = Problem(lens=lens, H=2, HV=HV, K=K, V=V, headwise=True)
    args, kw = make(p)
    num_slots = N * M + 32
    idx = torch.randperm(num_slots)[: N * M].view(N, M).cuda()
    nat = torch.randint(1, M + 1, (N,), device="cuda")
    first = [int(idx[n, nat[n] - 1]) for n in range(N)]
    pool = make_pool(num_slots, HV, K, V, torch.float32, v_first)
    for n, s in enumerate(first):
        pool[s] = torch.randn(pool.shape[1:], device="cuda")  # read even when lens[n] == 0
    before = pool.clone()
    o, _ = openkda.fused_recurrent_kda_fwd(*args, initial_state=pool, ssm_state_indices=idx,
                                           num_accepted_tokens=nat, state_v_first=v_first, **kw)
    ref_o, ref_states, _ = run_reference(p, args, kw,
                                         [to_kv(before[s], v_first) for s in first])
    check("o", ref_o, o.reshape(ref_o.shape), TOL[o.dtype])
    written = torch.zeros(num_slots, dtype=torch.bool)
    bos, got, want = 0, [], []
    for n, L in enumerate(lens):
        for t in range(L):
            s = int(idx[n, t])
            written[s] = True
            got.append(to_kv(pool[s], v_first))
            want.append(ref_states[bos + t])
        bos += L
    check("pool[idx[n, t]]", torch.stack(want), torch.stack(got), TOL[torch.float32])
    w = written.cuda()
    assert torch.equal(bits(pool[~w]), bits(before[~w]))


def test_public_api_large_batch():
    """No pool: initial_state [N, ...] f32 -> final state per sequence (varlen, empty sequences
    keep h0), on the streaming kernel; no initial state (zeros, f32 final state: streaming); and
    the bf16 h0 of the same shape (register-tile kernel)."""
    N, HV, K, V = 300, 4, 128, 128
    assert_stream_shape(N, HV)
    lens = [int(x) for x in torch.randint(0, 4, (N,))]
    p = Problem(lens=lens, H=2, HV=HV, K=K, V=V, gate="lb")
    args, kw = make(p)
    for h0_dtype in [torch.float32, None, torch.bfloat16]:
        h0 = None if h0_dtype is None else torch.randn(N, HV, K, V, device="cuda").to(h0_dtype)
        o, ht = openkda.fused_recurrent_kda(*args, initial_state=h0, output_final_state=True,
                                            **kw)
        ref_o, _, ref_ht = run_reference(p, args, kw, [None] * N if h0 is None else list(h0))
        check("o", ref_o, o.reshape(ref_o.shape), TOL[o.dtype])
        check("final_state", ref_ht, ht, TOL[torch.float32])


# ---- serving: speculative verify (2-D indices, num_accepted_tokens) -----------------------------

@pytest.mark.parametrize("pool_dtype", ["f32", "bf16"])
@pytest.mark.parametrize("v_first", [False, True], ids=["kv", "vk"])
@pytest.mark.parametrize("accepted", [True, False], ids=["accepted", "first-slot"])
def test_spec_verify_pool(pool_dtype, v_first, accepted):
    """Sequences of 0..16 tokens: the state after token t of sequence n goes to slot idx[n, t];
    the initial state comes from idx[n, num_accepted[n] - 1]; empty sequences touch nothing."""
    lens = list(range(17))
    N, M, HV, K, V = len(lens), 16, 4, 128, 128
    p = Problem(lens=lens, H=2, HV=HV, K=K, V=V, gate="softplus", headwise=False)
    args, kw = make(p)
    num_slots = 2 * N * M
    idx = torch.randperm(num_slots)[: N * M].view(N, M).cuda()
    nat = torch.randint(1, M + 1, (N,), device="cuda") if accepted else None
    first = [int(idx[n, nat[n] - 1]) if accepted else int(idx[n, 0]) for n in range(N)]
    pool = make_pool(num_slots, HV, K, V, DT[pool_dtype], v_first)
    for n, s in enumerate(first):
        if lens[n] > 0:
            pool[s] = torch.randn(pool.shape[1:], device="cuda").to(pool.dtype)
    before = pool.clone()
    o, _ = openkda.fused_recurrent_kda_fwd(*args, initial_state=pool, ssm_state_indices=idx,
                                           num_accepted_tokens=nat, state_v_first=v_first, **kw)
    ref_o, ref_states, _ = run_reference(
        p, args, kw, [to_kv(before[s], v_first) if lens[n] else None for n, s in enumerate(first)])
    check("o", ref_o, o.reshape(ref_o.shape), TOL[o.dtype])
    written = torch.zeros(num_slots, dtype=torch.bool)
    bos, got, want = 0, [], []
    for n, L in enumerate(lens):
        for t in range(L):
            s = int(idx[n, t])
            written[s] = True
            got.append(to_kv(pool[s], v_first))
            want.append(ref_states[bos + t])
        bos += L
    check("pool[idx[n, t]]", torch.stack(want), torch.stack(got), TOL[pool.dtype])
    w = written.cuda()
    assert torch.equal(bits(pool[~w]), bits(before[~w]))


@pytest.mark.parametrize("kernel", ["register", "stream"])
def test_per_token_states_not_in_place(kernel):
    """ssm_state_indices without the in-place update: final_state [B * T, HV, K, V] f32 holds the
    state after every token and the pool keeps its bits."""
    lens = [2, 0, 3, 1]
    N, M, K, V = len(lens), 4, 64, 128
    HV = stream_heads(N) if kernel == "stream" else 4
    p = Problem(lens=lens, HV=HV, K=K, V=V, gate="lb")
    args, kw = make(p)
    idx = torch.randperm(3 * N * M)[: N * M].view(N, M).cuda()
    pool = torch.randn(3 * N * M, HV, K, V, device="cuda")
    before = pool.clone()
    o, ht = openkda.fused_recurrent_kda_fwd(*args, initial_state=pool, ssm_state_indices=idx,
                                            inplace_final_state=False, output_final_state=True,
                                            **kw)
    ref_o, ref_states, _ = run_reference(p, args, kw, [before[int(idx[n, 0])] for n in range(N)])
    assert ht.shape == (sum(lens), HV, K, V) and ht.dtype == torch.float32
    check("o", ref_o, o.reshape(ref_o.shape), TOL[o.dtype])
    check("token states", ref_states, ht, TOL[torch.float32])
    assert torch.equal(bits(pool), bits(before))


# ---- device index values the host cannot check -------------------------------------------------

@pytest.mark.parametrize("kernel", ["register", "stream"])
def test_device_cu_seqlens_clamped_to_T(kernel):
    """cu_seqlens past T (device values, never read on the host) is clamped to T: the same o and
    final states as the well-formed cu_seqlens, bit for bit."""
    lens = [3, 5, 0, 4]
    N = len(lens)
    HV = stream_heads(N) if kernel == "stream" else 4
    p = Problem(lens=lens, HV=HV, K=128, V=128, gate="softplus")
    args, kw = make(p)
    h0 = torch.randn(N, HV, 128, 128, device="cuda")
    kw.update(initial_state=h0, output_final_state=True, inplace_final_state=False)
    good = openkda.fused_recurrent_kda_fwd(*args, **kw)
    bad_cu = kw["cu_seqlens"].clone()
    bad_cu[0] = -5  # clamped to 0
    bad_cu[-1] = 1000  # T = 12
    kw["cu_seqlens"] = bad_cu
    bad = openkda.fused_recurrent_kda_fwd(*args, **kw)
    torch.cuda.synchronize()
    for name, g, b in zip(("o", "final_state"), good, bad):
        assert torch.equal(bits(g), bits(b)), name


@pytest.mark.parametrize("kernel", ["register", "stream"])
def test_spec_verify_tokens_past_index_columns_store_nothing(kernel):
    """A sequence longer than ssm_state_indices is wide (possible only with device cu_seqlens):
    its tokens past the last column store no state; every other slot keeps its bits. The empty
    sequence's row holds the slots a read past sequence 0's row would reach (they must stay
    untouched), and o matches the reference."""
    lens = [6, 0, 2]
    N, M = len(lens), 4
    HV = stream_heads(N) if kernel == "stream" else 4
    p = Problem(lens=lens, H=1, HV=HV, K=128, V=128, gate="softplus")
    args, kw = make(p)
    num_slots = 4 * N * M
    idx = torch.randperm(num_slots)[: N * M].view(N, M).cuda()
    pool = make_pool(num_slots, HV, 128, 128, torch.float32, False)
    for n in range(N):
        if lens[n] > 0:
            pool[int(idx[n, 0])] = torch.randn(pool.shape[1:], device="cuda")
    before = pool.clone()
    o, _ = openkda.fused_recurrent_kda_fwd(*args, initial_state=pool, ssm_state_indices=idx, **kw)
    ref_o, ref_states, _ = run_reference(
        p, args, kw, [before[int(idx[n, 0])] if lens[n] else None for n in range(N)])
    check("o", ref_o, o.reshape(ref_o.shape), TOL[o.dtype])
    written = torch.zeros(num_slots, dtype=torch.bool)
    bos, got, want = 0, [], []
    for n, L in enumerate(lens):
        for t in range(min(L, M)):
            s = int(idx[n, t])
            written[s] = True
            got.append(pool[s])
            want.append(ref_states[bos + t])
        bos += L
    check("pool[idx[n, t]]", torch.stack(want), torch.stack(got), TOL[torch.float32])
    w = written.cuda()
    assert torch.equal(bits(pool[~w]), bits(before[~w]))


# ---- gate / beta / l2norm / dtype matrix (small, every mode) ------------------------------------

MODES = [
    dict(gate=g, beta=b, headwise=hw, l2norm=l2)
    for g in ["pre", "softplus", "softplus_noA", "softplus_nobias", "lb", "lb_noA"]
    for b, hw in [("plain", False), ("sigmoid", False), ("neg", False), ("plain", True),
                  ("sigmoid", True)]
    for l2 in [True, False]
]


@pytest.mark.parametrize("kernel", ["register", "stream"])
@pytest.mark.parametrize("mode", MODES,
                         ids=[f"{m['gate']}-{m['beta']}{'-hw' if m['headwise'] else ''}"
                              f"{'-l2' if m['l2norm'] else ''}" for m in MODES])
def test_modes_pool(mode, kernel):
    lens = [1, 3, 0, 2]
    N, M, K, V = len(lens), 3, 64, 64
    HV = stream_heads(N) if kernel == "stream" else 4
    p = Problem(lens=lens, H=1, HV=HV, K=K, V=V, dtype=torch.float32, **mode)
    args, kw = make(p)
    idx = torch.randperm(2 * N * M)[: N * M].view(N, M).cuda()
    pool = torch.randn(2 * N * M, HV, K, V, device="cuda")
    before = pool.clone()
    o, _ = openkda.fused_recurrent_kda_fwd(*args, initial_state=pool, ssm_state_indices=idx, **kw)
    ref_o, ref_states, _ = run_reference(p, args, kw, [before[int(idx[n, 0])] for n in range(N)])
    check("o", ref_o, o.reshape(ref_o.shape), TOL[torch.float32])
    bos = 0
    for n, L in enumerate(lens):
        for t in range(L):
            check(f"pool[idx[{n}, {t}]]", ref_states[bos + t], pool[int(idx[n, t])],
                  TOL[torch.float32])
        bos += L


@pytest.mark.parametrize("kernel", ["register", "stream"])
@pytest.mark.parametrize("in_dtype", ["bf16", "f16", "f32"])
@pytest.mark.parametrize("out_dtype", ["bf16", "f32"])
def test_dtypes_and_out_buffer(in_dtype, out_dtype, kernel):
    """q/k/v/g/beta in every input dtype; an out= buffer of any float dtype receives o."""
    lens = [1, 2, 5]
    N, K, V = len(lens), 128, 64
    HV = 2 * (stream_heads(N) // 2 + 1) if kernel == "stream" else 4
    p = Problem(lens=lens, H=2, HV=HV, K=K, V=V, dtype=DT[in_dtype])
    args, kw = make(p)
    h0 = torch.randn(N, HV, K, V, device="cuda")
    state = h0.clone()
    out = torch.full(args[2].shape, float("nan"), dtype=DT[out_dtype], device="cuda")
    o, ht = openkda.fused_recurrent_kda_fwd(*args, initial_state=state, out=out, **kw)
    assert o is out and ht is state  # FLA: in place by default, into initial_state[n]
    ref_o, _, ref_ht = run_reference(p, args, kw, list(h0))
    check("o", ref_o, out.reshape(ref_o.shape), TOL[out.dtype])
    check("final_state (in place)", ref_ht, state, TOL[torch.float32])


# ---- serving requirements: CUDA graphs, determinism, unsupported sizes --------------------------

def _serving_step(args, kw, pool, idx, out):
    return openkda.fused_recurrent_kda_fwd(*args, initial_state=pool, ssm_state_indices=idx,
                                           out=out, **kw)


@pytest.mark.parametrize("N", [16, 256], ids=["register", "stream"])
def test_cuda_graph_replay(N):
    """Capture one decode step (device cu_seqlens and indices) and replay it: same o and pool as
    an eager call from the same starting pool (N = 16: the register-tile kernel, N = 256: the
    streaming kernel)."""
    HV, K, V = 8, 128, 128
    p = Problem(lens=[1] * N, H=4, HV=HV, K=K, V=V)
    args, kw = make(p)
    idx = torch.randperm(4 * N)[:N].cuda()
    pool0 = torch.randn(4 * N, HV, K, V, device="cuda")
    eager_pool, eager_out = pool0.clone(), torch.empty_like(args[2])
    _serving_step(args, kw, eager_pool, idx, eager_out)
    pool, out = pool0.clone(), torch.empty_like(args[2])
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up off the capture (lazy initialisation)
        _serving_step(args, kw, pool, idx, out)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _serving_step(args, kw, pool, idx, out)
    for _ in range(2):  # replays from the same starting pool give the eager result
        pool.copy_(pool0)
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(bits(out), bits(eager_out))
        assert torch.equal(bits(pool), bits(eager_pool))


@pytest.mark.parametrize("reps", [1, 40], ids=["register", "stream"])
def test_deterministic(reps):
    lens = [3, 16, 1, 0, 7] * reps
    N, M, HV, K, V = len(lens), 16, 8, 128, 128
    p = Problem(lens=lens, H=2, HV=HV, K=K, V=V, headwise=True)
    args, kw = make(p)
    idx = torch.randperm(N * M).view(N, M).cuda()
    nat = torch.randint(1, M + 1, (N,), device="cuda")
    pool0 = torch.randn(N * M, HV, V, K, device="cuda")
    results = []
    for _ in range(2):
        pool = pool0.clone()
        o, _ = openkda.fused_recurrent_kda_fwd(*args, initial_state=pool, ssm_state_indices=idx,
                                               num_accepted_tokens=nat, state_v_first=True, **kw)
        results.append((o, pool))
    assert torch.equal(bits(results[0][0]), bits(results[1][0]))
    assert torch.equal(bits(results[0][1]), bits(results[1][1]))


@pytest.mark.parametrize("K,V,seen", [(96, 128, r"q\.shape\[3\] \(K\) = 96"),
                                       (128, 32, r"v\.shape\[3\] \(V\) = 32"),
                                       (256, 256, r"q\.shape\[3\] \(K\) = 256")])
def test_unsupported_head_dims(K, V, seen):
    p = Problem(lens=[1, 2], K=K, V=V)
    args, kw = make(p)
    with pytest.raises(NotImplementedError, match=seen + r".*\{64, 128\}"):
        openkda.fused_recurrent_kda(*args, **kw)


def test_matches_cpu_backend():
    """Same inputs on the CPU backend (fp64) and on CUDA."""
    p = Problem(lens=[2, 0, 5, 1], HV=4, K=64, V=64, gate="lb", headwise=True)
    args, kw = make(p)
    h0 = torch.randn(4, 4, 64, 64, device="cuda")
    o, ht = openkda.fused_recurrent_kda(*args, initial_state=h0, output_final_state=True, **kw)
    cpu = lambda t: t.cpu() if isinstance(t, torch.Tensor) else t  # noqa: E731
    with openkda.cpu_precision("f64"):
        o_c, ht_c = openkda.fused_recurrent_kda(*[cpu(a) for a in args], initial_state=h0.cpu(),
                                                output_final_state=True,
                                                **{n: cpu(t) for n, t in kw.items()})
    check("o", o_c.double(), o, TOL[o.dtype])
    check("final_state", ht_c, ht, TOL[torch.float32])
