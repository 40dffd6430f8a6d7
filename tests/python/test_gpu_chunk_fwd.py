"""chunk_kda forward on CUDA (src/cuda/chunk_fwd) against the float64 reference.

Every check runs ``openkda.chunk_kda`` on CUDA tensors and compares o, the final state and the
``h`` snapshots with tests/python/reference.py (a per-token float64 loop written from the math)
evaluated on the very same inputs (rounded to the kernel dtype first, then upcast): rel-RMS <= 5e-3
(RTOL). Failures print where the error lives (token, position inside the chunk, head) so that a
broken stage or fragment mapping shows up as a pattern, not just a number.

Also: adversarial regimes (long memory, strong decay, per-channel extremes, +-20/30 raw gates,
T = 65536), bitwise determinism, exact causality, CUDA-graph capture/replay, agreement with the CPU
backend, and the CUDA-only errors. All tests are marked ``gpu`` and skip without a CUDA build.
"""

from __future__ import annotations

import re

import pytest
import torch

import openkda
import reference as R
from cases import QKVGB, Case, chunk_call, make_inputs, params

pytestmark = pytest.mark.gpu

RTOL = 5e-3
DEV = "cuda"


# ---- helpers -----------------------------------------------------------------------------------

def _cuda_inputs(case: Case, **scale) -> dict:
    """make_inputs on the GPU; ``scale`` multiplies named float64 inputs before the dtype cast."""
    inputs = make_inputs(case)
    out = {}
    for name, t in inputs.items():
        if isinstance(t, torch.Tensor):
            if name in scale:
                t = (t.double() * scale[name]).to(t.dtype)
            t = t.to(DEV)
        out[name] = t
    return out


def _poison(*shapes_dtypes) -> None:
    """Leaves NaN-filled blocks of these sizes in the caching allocator, so that outputs the kernel
    forgets to write come back as NaN instead of plausible stale values."""
    blocks = [torch.full(s, float("nan"), dtype=d, device=DEV) for s, d in shapes_dtypes]
    del blocks


def _run(inputs: dict, case: Case, want_h: bool = False):
    """openkda.chunk_kda on the GPU -> (o, final_state, h or None)."""
    args, kw = chunk_call(inputs, case)
    B, T, HV, V = case.B, case.T, case.HV, case.V
    _poison(((B, T, HV, V), inputs["q"].dtype), ((max(case.N, 1), HV, case.K, V), torch.float32))
    if want_h:
        with torch.inference_mode():
            o, ht, h = openkda.chunk_kda(*args, return_intermediate_states=True, **kw)
    else:
        o, ht = openkda.chunk_kda(*args, **kw)
        h = None
    torch.cuda.synchronize()
    return o, ht, h


def _reference(inputs: dict, case: Case, want_h: bool = False):
    """float64 reference -> (o, final_state, h or None); runs on the GPU for long inputs."""
    device = "cpu" if case.B * case.T <= 4096 and not want_h else DEV
    d = {n: (t.detach().to(device).double() if isinstance(t, torch.Tensor) and t.is_floating_point()
             else t) for n, t in inputs.items()}
    cu = inputs.get("cu_seqlens")
    with torch.no_grad():
        out = R.kda(
            d["q"], d["k"], d["v"], d["g"], d["beta"],
            scale=inputs.get("scale"),
            initial_state=d.get("initial_state"),
            use_qk_l2norm_in_kernel=inputs.get("use_qk_l2norm_in_kernel", False),
            use_gate_in_kernel=inputs.get("use_gate_in_kernel", False),
            A_log=d.get("A_log"), dt_bias=d.get("dt_bias"),
            lower_bound=inputs.get("lower_bound"),
            use_beta_sigmoid_in_kernel=inputs.get("use_beta_sigmoid_in_kernel", False),
            allow_neg_eigval=inputs.get("allow_neg_eigval", False),
            state_v_first=inputs.get("state_v_first", False),
            cu_seqlens=None if cu is None else cu.tolist(),
            return_token_states=want_h,
        )
    if not want_h:
        return out[0], out[1], None
    o, ht, states = out
    v_first = inputs.get("state_v_first", False)
    shape = (case.HV, case.V, case.K) if v_first else (case.HV, case.K, case.V)
    h0 = d.get("initial_state")
    initial = [h0[n] if h0 is not None else o.new_zeros(shape) for n in range(case.N)]
    h = R.chunk_start_states(states, initial, case.B, case.T, case.chunk_size, case.cu_seqlens)
    return o, ht, h


def _locate(diff: torch.Tensor, ref: torch.Tensor, token_dim: int | None, chunk: int) -> str:
    """Where the error lives: worst element, and for token-major tensors the first bad token, the
    bad positions inside the chunk (a fragment-mapping bug shows as a fixed set of rows) and heads."""
    flat = int(diff.argmax())
    idx = []
    for s in reversed(diff.shape):
        idx.append(flat % s)
        flat //= s
    idx = tuple(reversed(idx))
    msg = f"max abs err {diff.max().item():.3e} at {idx} (ref {ref[idx].item():.4e})"
    if token_dim is not None and diff.dim() == 4 and diff.shape[token_dim] > 0:
        scale = ref.pow(2).mean().sqrt().item() + 1e-12
        per_tok = diff.pow(2).mean(dim=(0, 2, 3)).sqrt() / scale  # [T]
        bad = (per_tok > RTOL).nonzero().flatten().tolist()
        if bad:
            rows = sorted({t % chunk for t in bad})
            per_head = diff.pow(2).mean(dim=(0, 1, 3)).sqrt() / scale
            msg += (f"; {len(bad)} tokens above tol, first {bad[0]}, rows in chunk {rows[:16]}"
                    f"{'...' if len(rows) > 16 else ''}, per-head rel err "
                    f"{[round(x, 4) for x in per_head.tolist()]}")
    return msg


def _check(name: str, ref: torch.Tensor, out: torch.Tensor, tol: float = RTOL,
           token_dim: int | None = None, chunk: int = 64) -> float:
    assert out is not None, f"{name}: missing output"
    assert tuple(out.shape) == tuple(ref.shape), \
        f"{name}: shape {tuple(out.shape)}; expected {tuple(ref.shape)}"
    ref = ref.detach().to(out.device).double()
    got = out.detach().double()
    finite = torch.isfinite(got)
    if not finite.all():
        bad = (~finite).nonzero()
        raise AssertionError(f"{name}: {bad.shape[0]} non-finite values (NaN: unwritten or "
                             f"overflow), first at {tuple(bad[0].tolist())}")
    if ref.numel() == 0:
        return 0.0
    err = R.rel_rms(ref, got)
    if not err <= tol:
        raise AssertionError(f"{name}: rel-RMS {err:.3e} > {tol:.1e}; "
                             + _locate((got - ref).abs(), ref, token_dim, chunk))
    return err


def _check_case(case: Case, want_h: bool = False, inputs: dict | None = None,
                tol: float = RTOL) -> dict:
    inputs = _cuda_inputs(case) if inputs is None else inputs
    o, ht, h = _run(inputs, case, want_h)
    ref_o, ref_ht, ref_h = _reference(inputs, case, want_h)
    assert o.dtype == inputs["q"].dtype and o.device.type == torch.device(DEV).type
    errs = {"o": _check("o", ref_o, o, tol, token_dim=1, chunk=case.chunk_size)}
    if case.final:
        assert ht.dtype == torch.float32
        errs["final_state"] = _check("final_state", ref_ht, ht, tol)
    else:
        assert ht is None
    if want_h:
        assert h.dtype == inputs["k"].dtype
        errs["h"] = _check("h", ref_h, h, tol)
    return errs


def _case(**kw) -> Case:
    base = dict(B=1, T=130, H=2, HV=2, K=64, V=64, dtype="bf16")
    base.update(kw)
    return Case(**base)


# ---- FLA's test grid (spec 9.2), on the head dims the GPU compiles -----------------------------

GRID = [
    _case(T=1, H=1, HV=1),
    _case(B=2, T=63, K=128, V=128),
    _case(T=64, H=2, HV=4, K=64, V=128),
    _case(B=2, T=65, H=1, HV=2, K=128, V=64, dtype="f16"),
    _case(B=2, T=500, H=3, HV=3, K=128, V=128, gate="softplus", beta="sigmoid", l2norm=True),
    _case(B=4, T=1000, H=4, HV=4, K=128, V=128, scale=0.1),
    _case(B=2, T=1024, H=2, HV=8, K=128, V=128, l2norm=True, gate="lb", safe_gate=True),
    _case(B=1, T=300, H=2, HV=2, K=128, V=128, dtype="f32", gate="softplus"),
    _case(B=2, T=300, K=64, V=64, chunk_size=32, gate="softplus", beta="neg"),
    _case(B=2, T=200, K=128, V=64, v_first=True, h0_dtype="bf16"),
    _case(B=2, T=200, K=64, V=128, v_first=True, chunk_size=32, gate="lb"),
    _case(B=2, T=100, h0=False, final=False),
    _case(B=1, T=4096, H=4, HV=4, K=128, V=128, gate="lb", safe_gate=True, l2norm=True,
          beta="sigmoid"),
]


@pytest.mark.parametrize("case", params(GRID))
def test_grid(case):
    _check_case(case)


# ---- every gate x beta mode ----------------------------------------------------------------------

MODES = [
    _case(B=2, T=150, H=2, HV=4, gate=gate, beta=beta, l2norm=l2)
    for gate in ("pre", "softplus", "lb", "lb_noA")
    for beta in ("post", "sigmoid", "neg")
    for l2 in (False, True)
] + [
    _case(B=2, T=150, gate="pre", safe_gate=True),
    _case(B=2, T=150, gate="lb", safe_gate=True, l2norm=True, beta="sigmoid"),
    _case(B=2, T=150, gate="lb_noA", safe_gate=True),
    _case(B=2, T=150, gate="softplus", dt_bias=False, A_log_shape="4d"),
    _case(B=2, T=150, gate="lb", dt_bias=False),
]


@pytest.mark.parametrize("case", params(MODES))
def test_modes(case):
    _check_case(case)


# ---- varlen ------------------------------------------------------------------------------------

VARLEN = [
    _case(T=103, cu_seqlens=(0, 0, 1, 40, 40, 103), cu_dtype="i32"),
    _case(T=103, cu_seqlens=(0, 0, 1, 40, 40, 103), cu_dtype="i64", chunk_size=32, v_first=True),
    _case(T=15, cu_seqlens=(0, 15), K=128, V=128, gate="softplus", l2norm=True),
    _case(T=1000, cu_seqlens=(0, 256, 500, 1000), H=4, HV=4, gate="softplus", beta="sigmoid"),
    _case(T=2000, cu_seqlens=(0, 15, 100, 300, 1200, 2000), H=2, HV=4, K=128, V=128,
          gate="lb", safe_gate=True, l2norm=True, beta="sigmoid", cu_dtype="i32"),
    _case(T=4096, cu_seqlens=(0, 100, 300, 1200, 3000, 4096), H=2, HV=2, K=128, V=128,
          h0_dtype="bf16"),
    _case(T=160, cu_seqlens=(0, 31, 96, 160), chunk_size=32, gate="softplus", h0=False),
    _case(T=129, cu_seqlens=(0, 64, 65, 129, 129), K=128, V=64, beta="neg", final=False),
    # Rows outside [cu_seqlens[0], cu_seqlens[-1]) (a serving engine's padded token buffer; only
    # device-side cu_seqlens may leave them): o is 0 there, written by the op itself (o comes
    # NaN-poisoned, _run).
    _case(T=200, cu_seqlens=(0, 70, 150), K=128, V=128, gate="lb", safe_gate=True, l2norm=True,
          beta="sigmoid"),
    _case(T=90, cu_seqlens=(5, 40, 80), chunk_size=32, cu_dtype="i32", dtype="f32"),
]


# ---- two warpgroups per scan CTA ----------------------------------------------------------------
# With V = 128 and more states than half the SMs (N HV > 66 on the H200), the scan does not split
# V: one CTA of two warpgroups per state (vs = 128), with 16-bit o written by the packed,
# transposed stores. The cases above all have N HV <= 16, which selects vs = 64.

WIDE = [
    _case(B=2, T=200, H=8, HV=40, K=128, V=128, gate="lb", safe_gate=True, l2norm=True,
          beta="sigmoid"),
    _case(B=1, T=130, H=72, HV=72, K=64, V=128, dtype="f16", gate="softplus", chunk_size=32),
    _case(T=300, cu_seqlens=(0, 70, 71, 200, 300), H=4, HV=24, K=128, V=128, gate="softplus",
          l2norm=True, v_first=True),
]


@pytest.mark.parametrize("case", params(WIDE))
def test_two_warpgroups(case):
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert case.N * case.HV * 2 > sms, "the case must select vs = 128 (launch.cu choose_vsplit)"
    _check_case(case)


@pytest.mark.parametrize("case", params(VARLEN))
def test_varlen(case):
    _check_case(case)


@pytest.mark.parametrize("n_seqs", [300, 1100], ids=["ranked", "index_order"])
def test_varlen_many_sequences(n_seqs):
    """Many sequences of 0 .. 40 tokens (ranks tie often): the scan runs them longest first
    (chunk_index.cuh: seq_order ranks up to kMaxOrderedSeqs = 1024 of them, and keeps index order
    past that), and every sequence's o and final state still match the reference."""
    gen = torch.Generator().manual_seed(n_seqs)
    lens = torch.randint(0, 41, (n_seqs,), generator=gen)
    cu = (0,) + tuple(torch.cumsum(lens, 0).tolist())
    _check_case(_case(T=cu[-1], cu_seqlens=cu, H=1, HV=2, gate="lb", safe_gate=True, l2norm=True,
                      beta="sigmoid", cu_dtype="i32"))


def _device_cu_call(cu: tuple, T: int = 300, HV: int = 4, chunk_size: int = 0):
    """chunk_kda with device cu_seqlens `cu` (values the kernels never have checked) on T tokens
    of bf16 inputs; o comes NaN-poisoned. chunk_size > 0: also return_intermediate_states at that
    chunk size, with h sized on the host from `cu` (chunk.py _num_chunks) -> (o, h); else o."""
    case = _case(T=T, cu_seqlens=(0, T), H=2, HV=HV, K=128, V=128, gate="softplus", l2norm=True,
                 chunk_size=chunk_size or 64)
    inputs = _cuda_inputs(case)
    inputs["cu_seqlens"] = torch.tensor(cu, dtype=torch.int32, device=DEV)
    inputs["initial_state"] = None
    args, kw = chunk_call(inputs, case)
    _poison(((1, T, HV, 128), torch.bfloat16))
    if chunk_size:
        with torch.inference_mode():
            o, _, h = openkda.chunk_kda(*args, return_intermediate_states=True, **kw)
        torch.cuda.synchronize()
        return o, h
    o, _ = openkda.chunk_kda(*args, **kw)
    torch.cuda.synchronize()
    return o


def test_varlen_no_sequence_zeroes_o():
    """Device cu_seqlens of one element (N = 0): every row is padding, written as 0."""
    o = _device_cu_call((7,))
    assert torch.equal(o, torch.zeros_like(o))


def test_varlen_decreasing_device_cu_seqlens_stays_in_bounds():
    """Decreasing device cu_seqlens (overlapping sequences, more chunks than the workspace has
    slots): o is unspecified there, but the op completes without a CUDA error (the chunk offsets
    are capped at the slots; compute-sanitizer memcheck sees no access outside the buffers), and
    the rows no sequence covers are 0."""
    T, BT, cu = 300, 32, (5, 290, 10, 295)  # BT: the kernels' chunk (plan.h kKernelChunk)
    # As the kernels clamp them: [5, 290), [290, 290), [10, 295).
    spans = [(5, 290), (290, 290), (10, 295)]
    chunks = sum((b - a + BT - 1) // BT for a, b in spans)
    slots = (T + (len(cu) - 1) * (BT - 1)) // BT  # launch.cu WorkspaceLayout, varlen
    assert chunks > slots, (chunks, slots)
    o = _device_cu_call(cu, T=T)
    assert torch.equal(o[:, :5], torch.zeros_like(o[:, :5]))
    assert torch.equal(o[:, 295:], torch.zeros_like(o[:, 295:]))


@pytest.mark.parametrize("chunk_size", [32, 64])
def test_varlen_decreasing_device_cu_seqlens_with_h_stays_in_bounds(chunk_size):
    """The same decreasing device cu_seqlens with return_intermediate_states: the host sizes h from
    them (negative lengths count negative chunks), so h has fewer rows than the kernels' clamped
    sequences take snapshots and the snapshot offsets hit their cap (chunk_index.cuh
    build_offsets; at chunk_size 64 the separate h_offsets). The op completes without a CUDA error
    and the rows no sequence covers are 0."""
    T, cu = 300, (5, 290, 10, 295)
    spans = [(5, 290), (290, 290), (10, 295)]  # as the kernels clamp them
    snapshots = sum((b - a + chunk_size - 1) // chunk_size for a, b in spans)
    host_rows = sum((b - a + chunk_size - 1) // chunk_size for a, b in zip(cu[:-1], cu[1:]))
    assert 0 < host_rows < snapshots, (host_rows, snapshots)
    o, h = _device_cu_call(cu, T=T, chunk_size=chunk_size)
    assert h.shape[1] == host_rows
    assert torch.equal(o[:, :5], torch.zeros_like(o[:, :5]))
    assert torch.equal(o[:, 295:], torch.zeros_like(o[:, 295:]))


# ---- return_intermediate_states ------------------------------------------------------------------

H_CASES = [
    _case(B=2, T=300, K=128, V=128, gate="lb", safe_gate=True, l2norm=True),
    _case(B=1, T=200, K=64, V=128, v_first=True, chunk_size=32, gate="softplus"),
    _case(B=2, T=64, dtype="f16", h0_dtype="bf16"),
]

# h with device-side cu_seqlens: the core's validation of h's shape must not read cu_seqlens on
# the host (deselect with -k "not varlen_h" on a build where it still does).
# chunk_size 64 takes h every second kernel chunk (h_offsets: its own prefix sum), 32 every one.
H_VARLEN_CASES = [
    _case(T=300, cu_seqlens=(0, 1, 65, 65, 300), K=128, V=128, cu_dtype="i32"),
    _case(T=300, cu_seqlens=(0, 100, 300), v_first=True, dtype="f32"),
    _case(T=200, cu_seqlens=(0, 31, 31, 96, 200), K=64, V=64, chunk_size=32, gate="softplus"),
]


@pytest.mark.parametrize("case", params(H_CASES))
def test_intermediate_states(case):
    _check_case(case, want_h=True)


@pytest.mark.parametrize("case", params(H_VARLEN_CASES))
def test_intermediate_states_varlen_h(case):
    _check_case(case, want_h=True)


# ---- chunk_size sets where h is taken, nothing else ----------------------------------------------
# The kernels always work in 32-token chunks (plan.h kKernelChunk): at chunk_size 64 they take h
# every second chunk (varlen: h_offsets, next to chunk_offsets). So o and the final state are
# bitwise the same at 32 and 64, and h at 64 is every second h at 32 of each sequence.

@pytest.mark.parametrize("cu", [None, (0, 0, 31, 31, 96, 200)], ids=["dense", "varlen"])
def test_chunk_size_only_sets_the_snapshots(cu):
    import dataclasses
    case32 = _case(B=1 if cu else 2, T=200, H=2, HV=4, K=128, V=64, gate="lb", safe_gate=True,
                   l2norm=True, beta="sigmoid", chunk_size=32, cu_seqlens=cu)
    case64 = dataclasses.replace(case32, chunk_size=64)
    inputs = _cuda_inputs(case32)
    o32, ht32, h32 = _run(inputs, case32, want_h=True)
    o64, ht64, h64 = _run(inputs, case64, want_h=True)
    _assert_bitwise((o32, ht32), (o64, ht64), names=("o", "final_state"))
    if cu is None:
        rows32 = [list(range(0, h32.shape[1], 2))]
    else:  # every second row of each sequence's own rows
        rows32, base = [], 0
        for a, b in zip(cu[:-1], cu[1:]):
            n32 = (b - a + 31) // 32
            rows32.append(list(range(base, base + n32, 2)))
            base += n32
        assert base == h32.shape[1], (base, h32.shape)
    take = [r for seq in rows32 for r in seq]
    assert len(take) == h64.shape[1], (take, h64.shape)
    _assert_bitwise((h32[:, take],), (h64,), names=("h",))


# ---- time split (src/cuda/chunk_fwd/segments.cuh) ---------------------------------------------------
# Dense batches whose N * HV chains fill at most half of the SMs at vs = 64, with >= 32 kernel
# chunks (32 tokens each, whatever chunk_size) per sequence, run the scan in segments (transition, combine, output passes). Every case here takes
# that path (asserted through the combine kernel's launch), with each state option.

SPLIT_CASES = [
    _case(B=1, T=2100, H=1, HV=2, K=128, V=128, gate="lb", safe_gate=True, l2norm=True,
          beta="sigmoid"),
    _case(B=2, T=2048, H=1, HV=1, K=64, V=128, v_first=True, h0_dtype="bf16", gate="softplus"),
    _case(B=1, T=1100, H=2, HV=2, K=128, V=64, chunk_size=32, beta="neg"),
    _case(B=1, T=3000, H=1, HV=1, K=64, V=64, h0=False, final=False),
    _case(B=1, T=4200, H=1, HV=3, K=128, V=128, dtype="f16", gate="lb", l2norm=True),
]


def _kernel_names(fn) -> set:
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return {e.key for e in prof.key_averages()}


def _uses_time_split(case: Case, inputs: dict) -> bool:
    args, kw = chunk_call(inputs, case)
    names = _kernel_names(lambda: openkda.chunk_kda(*args, **kw))
    return any("openkda_fwd_segment_combine_kernel" in n for n in names)


# ---- the compiled paths (traits.h: PrepPath, ScanIo; params.h: prep_path_of, scan_io_of) -------
# (case, inputs cast to another dtype, the prep's path, the scan's formats). Each fixed path at
# both head dims, dense and varlen, and configurations one condition away from it, which must take
# the generic kernel. The profiled call takes no h snapshots; the accuracy check runs with and
# without them (h snapshots need the generic scan).
KERNEL_PATHS = [
    (_case(T=200, K=64, V=64, gate="lb", safe_gate=True, l2norm=True, beta="sigmoid"), {},
     "kSafeBF16", "kBF16"),
    (_case(T=200, K=128, V=128, gate="lb", safe_gate=True, l2norm=True,
           cu_seqlens=(0, 37, 37, 200)), {}, "kSafeBF16", "kBF16"),
    (_case(T=200, H=1, HV=2, K=128, V=64, dtype="f16", gate="lb", l2norm=True), {},
     "kSafeF16", "kF16"),
    (_case(T=200, K=64, V=128, dtype="f16", gate="lb_noA", l2norm=True,
           cu_seqlens=(0, 1, 70, 200)), {}, "kSafeF16", "kF16"),
    (_case(T=200, K=128, V=128, gate="lb", safe_gate=True, l2norm=True), {"g": torch.float32},
     "kGeneric", "kBF16"),
    (_case(T=200, K=128, V=128, gate="lb", safe_gate=True, l2norm=True), {"v": torch.float32},
     "kGeneric", "kGeneric"),
    (_case(T=200, K=128, V=128, gate="lb", safe_gate=True), {}, "kGeneric", "kGeneric"),
    (_case(T=200, K=128, V=128, gate="softplus", l2norm=True), {}, "kGeneric", "kBF16"),
]


def _template_arg(names: set, kernel: str, values: tuple) -> str:
    """The last template argument (an enum) of the kernels named `kernel` among the profiled
    names, as one of `values` (its enumerators in order); every such kernel must agree."""
    found = set()
    for name in names:
        m = re.search(kernel + r"<([^>]*)>", name)
        if m is None:
            continue
        arg = m.group(1).split(",")[-1].strip()  # "(openkda::...::PrepPath)1" or "...::kSafeF16"
        for index, value in enumerate(values):
            if arg.endswith("::" + value) or re.fullmatch(rf"(\(.*\))?{index}", arg):
                found.add(value)
    assert len(found) == 1, f"{kernel}: {sorted(found)} among {sorted(names)}"
    return found.pop()


@pytest.mark.parametrize("case,cast,prep,scan", [
    pytest.param(c, cast, pp, sp, id="-".join([c.id] + [f"{n}_f32" for n in cast]))
    for c, cast, pp, sp in KERNEL_PATHS])
def test_kernel_paths(case, cast, prep, scan):
    inputs = _cuda_inputs(case)
    for name, dtype in cast.items():
        inputs[name] = inputs[name].to(dtype)  # the same values, another dtype
    args, kw = chunk_call(inputs, case)
    names = _kernel_names(lambda: openkda.chunk_kda(*args, **kw))
    assert _template_arg(names, "openkda_fwd_prep_kernel",
                         ("kGeneric", "kSafeBF16", "kSafeF16")) == prep
    assert _template_arg(names, "openkda_fwd_scan_kernel", ("kGeneric", "kBF16", "kF16")) == scan
    _check_case(case, inputs=inputs)
    _check_case(case, want_h=True, inputs=inputs)


@pytest.mark.parametrize("case", params(SPLIT_CASES))
def test_time_split(case):
    inputs = _cuda_inputs(case)
    assert _uses_time_split(case, inputs)
    _check_case(case, want_h=True, inputs=inputs)


def test_time_split_only_for_few_chains():
    """N * HV = 128 chains fill the SMs: one segment per sequence (the plain scan)."""
    case = _case(B=2, T=2048, H=64, HV=64, K=128, V=128, gate="lb", safe_gate=True, l2norm=True)
    assert not _uses_time_split(case, _cuda_inputs(case))


def test_time_split_causal_and_deterministic():
    """At a fixed shape the segment boundaries are fixed: perturbing tokens after t (before, at
    and after a boundary) never changes o[:t + 1] by one bit; a repeated call is bitwise equal."""
    case = _case(B=1, T=2048, H=1, HV=1, K=128, V=128, gate="softplus", l2norm=True,
                 beta="sigmoid")
    inputs = _cuda_inputs(case)
    assert _uses_time_split(case, inputs)
    o_ref, ht_ref, _ = _run(inputs, case)
    o2, ht2, _ = _run(inputs, case)
    assert torch.equal(o2, o_ref) and torch.equal(ht2, ht_ref)
    _assert_causal(inputs, case, o_ref, (100, 1023, 1024, 1500, 2040))


# One varlen sequence splits in time as a dense row of all T tokens would (plan.h): its segments
# cover ceil(T / BT) chunks, so with padding rows the last ones are empty (segments.cuh).
SPLIT_VARLEN = [
    # 1463 tokens from 37 (tail chunk of 23): segments of 17 chunks over 66, the fourth empty.
    _case(T=2100, cu_seqlens=(37, 1500), H=1, HV=2, K=128, V=128, gate="lb", safe_gate=True,
          l2norm=True, beta="sigmoid"),
    _case(T=2100, cu_seqlens=(0, 2100), H=1, HV=1, K=64, V=128, v_first=True, h0_dtype="bf16",
          gate="softplus", cu_dtype="i32"),
]


@pytest.mark.parametrize("case", params(SPLIT_VARLEN))
def test_time_split_varlen_one_sequence(case):
    """o, the final state and h match the reference, and repeated calls are bitwise equal: only
    the segment with the last chunk writes the final state (the empty ones after it hold the
    combine's f32 copy of it, which may differ in the last bits)."""
    inputs = _cuda_inputs(case)
    assert _uses_time_split(case, inputs)
    _check_case(case, want_h=True, inputs=inputs)
    first = _run(inputs, case)
    for _ in range(2):
        _assert_bitwise(first[:2], _run(inputs, case)[:2])


def test_time_split_varlen_empty_sequence():
    """An empty varlen sequence under the time split: every segment is empty, o is all padding
    (0) and the final state is the initial one, written once, by segment 0."""
    case = _case(T=1100, cu_seqlens=(300, 300), H=2, HV=2, K=128, V=64, gate="softplus")
    inputs = _cuda_inputs(case)
    assert _uses_time_split(case, inputs)
    o, ht, _ = _run(inputs, case)
    assert torch.equal(o, torch.zeros_like(o))
    assert torch.equal(ht, inputs["initial_state"].float())


# ---- the prep / scan hand-off (src/cuda/chunk_fwd/handoff.cuh) ----------------------------------
# Dense batches at K = V = 128 with N HV chains in (SMs / 4, SMs - 8] (one 8-warp scan CTA each,
# multiprocessors to spare; fewer chains take the time split) and >= 64 kernel chunks: the prep
# runs as a persistent grid beside the scan, which waits on every tile's ready mark (plan.h:
# handoff_fits, plan_prep). Below SMs / 2 chains the scan would otherwise split V.

HANDOFF = [
    _case(B=1, T=2048, H=96, HV=96, K=128, V=128, gate="lb", safe_gate=True, l2norm=True,
          beta="sigmoid"),
    _case(B=2, T=2100, H=20, HV=40, K=128, V=128, gate="softplus", l2norm=True, beta="sigmoid",
          h0_dtype="bf16"),
    _case(B=1, T=2048, H=80, HV=80, K=128, V=128, dtype="f32", gate="lb", chunk_size=32),
    _case(B=2, T=2048, H=8, HV=24, K=128, V=128, gate="softplus", l2norm=True, v_first=True),
]


def _uses_handoff(case: Case, inputs: dict) -> bool:
    """Whether the call took the hand-off: only it zeroes marks on the stream (a memset). (When
    it is taken is plan.h's plan_prep, unit-tested at several SM counts in
    tests/cpp/test_chunk_fwd_plan.cpp.)"""
    args, kw = chunk_call(inputs, case)
    names = _kernel_names(lambda: openkda.chunk_kda(*args, **kw))
    return any("Memset" in n for n in names)


def _kernel_spans(fn) -> dict:
    """{'prep' | 'scan': (first start, last end)} in us of one profiled call of fn."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    spans = {}
    for e in prof.events():
        for short in ("prep", "scan"):
            if f"openkda_fwd_{short}_kernel" in e.name:
                lo, hi = spans.get(short, (e.time_range.start, e.time_range.end))
                spans[short] = (min(lo, e.time_range.start), max(hi, e.time_range.end))
    return spans


@pytest.mark.parametrize("case", params(HANDOFF))
def test_handoff(case):
    inputs = _cuda_inputs(case)
    assert _uses_handoff(case, inputs)
    _check_case(case, inputs=inputs)
    _check_case(case, want_h=True, inputs=inputs)


def test_handoff_only_with_idle_multiprocessors():
    """No hand-off where the scan's CTAs fill the SMs (128 chains: two 4-warp CTAs per chain),
    for varlen, or at K = 64."""
    for case in (_case(B=2, T=2048, H=64, HV=64, K=128, V=128, gate="lb", safe_gate=True,
                       l2norm=True),
                 _case(T=2048, cu_seqlens=(0, 2048), H=96, HV=96, K=128, V=128),
                 _case(B=1, T=2048, H=96, HV=96, K=64, V=128)):
        assert not _uses_handoff(case, _cuda_inputs(case)), case.id


def test_handoff_overlaps_deterministic_causal():
    """The scan starts while the prep still runs (the hand-off is taken: without it the scan
    waits for the whole prep grid); repeated calls are bitwise equal whichever multiprocessors
    ran which items; tokens after t never change o[:t + 1]."""
    case = HANDOFF[0]
    inputs = _cuda_inputs(case)
    args, kw = chunk_call(inputs, case)
    openkda.chunk_kda(*args, **kw)
    spans = _kernel_spans(lambda: openkda.chunk_kda(*args, **kw))
    assert spans["scan"][0] < spans["prep"][1], spans
    o_ref, ht_ref, _ = _run(inputs, case)
    for _ in range(3):
        _assert_bitwise((o_ref, ht_ref), _run(inputs, case)[:2])
    _assert_causal(inputs, case, o_ref, (100, 1023, 1024, 2040))


# ---- adversarial regimes -------------------------------------------------------------------------

def _raw_gate_case(case: Case, raw: float | None = None, factor: float | None = None,
                   **scale) -> dict:
    inputs = _cuda_inputs(case, **scale)
    g = inputs["g"].double()
    if raw is not None:
        g = torch.full_like(g, raw) + 0.1 * torch.randn_like(g)
    if factor is not None:
        g = g * factor
    inputs["g"] = g.to(inputs["g"].dtype)
    return inputs


def test_long_memory():
    """decay ~ 1 (softplus of raw -12), tiny updates (v x 1e-3), |h0| ~ 10: a bf16 state or bf16
    S-products would lose the updates."""
    case = _case(B=1, T=2048, H=2, HV=2, K=128, V=128, gate="softplus", l2norm=True,
                 beta="sigmoid")
    inputs = _raw_gate_case(case, raw=-12.0, v=1e-3, initial_state=20.0)
    errs = _check_case(case, inputs=inputs)
    assert errs["o"] <= RTOL


def test_strong_decay():
    """log-decay at lower_bound on every step (raw gate +20 through the sigmoid gate)."""
    case = _case(B=2, T=512, K=128, V=128, gate="lb", safe_gate=True, l2norm=True)
    _check_case(case, inputs=_raw_gate_case(case, raw=20.0))


def test_strong_decay_pre_gated():
    """pre-gated g = -5 (the safe bound) and g = -1000 on 10% of the entries (FLA's varlen mask)."""
    case = _case(B=1, T=300, K=128, V=128, cu_seqlens=(0, 100, 300))
    inputs = _cuda_inputs(case)
    g = torch.full_like(inputs["g"], -5.0, dtype=torch.float64)
    mask = torch.rand_like(g) < 0.1
    inputs["g"] = torch.where(mask, torch.full_like(g, -1000.0), g).to(inputs["g"].dtype)
    _check_case(case, inputs=inputs)


def test_per_channel_extremes():
    """raw gate x 8 through softplus: some channels decay completely each step, others not at all."""
    case = _case(B=2, T=400, H=2, HV=4, K=128, V=128, gate="softplus", l2norm=True)
    _check_case(case, inputs=_raw_gate_case(case, factor=8.0))


@pytest.mark.parametrize("raw", [-30.0, -20.0, 20.0, 30.0])
def test_softplus_raw_gate_extremes(raw):
    """the unbounded softplus gate never gives inf/NaN, whatever the raw gate (every exponent of the
    exact path is <= 0)."""
    case = _case(B=1, T=300, K=128, V=128, gate="softplus", beta="sigmoid", l2norm=True)
    _check_case(case, inputs=_raw_gate_case(case, raw=raw))


@pytest.mark.parametrize("T", [2048, 8192], ids=["serial", "time_split"])
def test_f16_operand_large_state(T):
    """The in-kernel l2norm and gate put S^T into an f16 operand (params.h: f16_keys_apply); with
    long memory, v x 1e4 and |h0| ~ 1e5 its rows pass f16's 65504 within a few chunks, so the range
    guard must scale them (unscaled, the products would be inf). T = 8192 with one head runs the
    time split: its output pass starts from the combined states."""
    case = _case(B=1, T=T, H=1, HV=1, K=128, V=128, gate="softplus", l2norm=True,
                 beta="sigmoid")
    inputs = _raw_gate_case(case, raw=-12.0, v=1e4, initial_state=2e5)
    _check_case(case, inputs=inputs)


def test_f16_operand_tiny_state():
    """As above with v x 1e-6 and |h0| ~ 1e-5: the state's rows sit in f16's subnormal range, so
    the guard must scale them up (unscaled, the products would keep a few bits of them)."""
    case = _case(B=1, T=1024, H=2, HV=2, K=128, V=128, gate="softplus", l2norm=True,
                 beta="sigmoid")
    inputs = _raw_gate_case(case, raw=-12.0, v=1e-6, initial_state=2e-5)
    _check_case(case, inputs=inputs)


@pytest.mark.parametrize("T", [64, 2048, 8192], ids=["two_chunks", "serial", "time_split"])
def test_f16_update_large_v_from_zero_state(T):
    """v x 1e5 from a zero state: the first chunk's v_new (~1e5) is past f16's range while the
    range guard's bound, taken from the state, is still 0, so the f16 operand of the state update
    and of the O^T update saturates at 65504 and the scan must repair both products
    (f16_operands.cuh: add_saturated_residual, called by state.cuh's scan_step; unrepaired, the
    state and the first chunk's o would take every value of v_new above 65504 as 65504: at T = 64
    that chunk is half of o)."""
    case = _case(B=1, T=T, H=1, HV=1, K=128, V=128, gate="softplus", l2norm=True,
                 beta="sigmoid")
    inputs = _raw_gate_case(case, raw=-12.0, v=1e5, initial_state=0.0)
    _check_case(case, inputs=inputs)


def test_large_state_then_strong_decay_per_token():
    """|h0| ~ 1e5 against v ~ 1 under the strongest decay (log-decay at lower_bound on every
    step): within the first chunk the gated keys (ke, qg) fall far below f16's range while
    their products with the large state still matter for a few tokens. The rel-RMS over all of
    o hides those tokens (the undecayed first token dominates its norm), so this checks every
    token's own error, against the larger of its own norm and the median token norm (a token
    whose o nearly cancels has no meaningful rel error of its own); the f16 keys path needs the
    keys' row anchors (wy.cuh) for it: without them token 2's error was 0.53 of its norm."""
    case = _case(B=1, T=256, H=1, HV=2, K=128, V=128, gate="lb", safe_gate=True, l2norm=True,
                 beta="sigmoid")
    inputs = _raw_gate_case(case, raw=20.0, initial_state=2e5)
    o, _, _ = _run(inputs, case)
    ref_o, _, _ = _reference(inputs, case)
    ref = ref_o.to(o.device).double()
    err = (o.double() - ref).pow(2).sum(dim=(0, 2, 3)).sqrt()
    norm = ref.pow(2).sum(dim=(0, 2, 3)).sqrt()
    per_token = err / torch.maximum(norm, norm.median())
    worst = int(per_token.argmax())
    assert per_token.max().item() <= RTOL, (
        f"token {worst}: error {per_token[worst].item():.3e} of max(its norm, the median norm) "
        f"> {RTOL:.1e}")


def test_long_sequence_65536():
    case = _case(B=1, T=65536, H=1, HV=2, K=128, V=128, gate="lb", safe_gate=True, l2norm=True,
                 beta="sigmoid")
    _check_case(case)


# ---- serving properties --------------------------------------------------------------------------

def _assert_bitwise(first, again, names=("o", "final_state", "h")):
    for name, a, b in zip(names, first, again):
        if a is None:
            continue
        if not torch.equal(a, b):
            diff = (a.double() - b.double()).abs()
            raise AssertionError(f"{name}: two runs differ at {int((diff > 0).sum())} elements "
                                 f"(max {diff.max().item():.3e})")


def test_deterministic():
    case = _case(B=2, T=1000, H=2, HV=4, K=128, V=128, gate="softplus", l2norm=True,
                 beta="sigmoid")
    inputs = _cuda_inputs(case)
    first = _run(inputs, case, want_h=True)
    for _ in range(2):
        _assert_bitwise(first, _run(inputs, case, want_h=True))
    case = _case(B=1, T=2000, H=2, HV=4, K=128, V=128, cu_seqlens=(0, 700, 701, 2000),
                 gate="lb", safe_gate=True, l2norm=True, beta="sigmoid")
    inputs = _cuda_inputs(case)
    first = _run(inputs, case)
    for _ in range(2):
        _assert_bitwise(first, _run(inputs, case))


def _assert_causal(inputs: dict, case: Case, o_ref: torch.Tensor, ts) -> None:
    """For each t: random tokens after t leave o[:t + 1] bit-equal to o_ref (and change o after)."""
    for t in ts:
        pert = dict(inputs)
        for name in QKVGB:
            x = inputs[name].clone()
            x[:, t + 1:] = torch.randn_like(x[:, t + 1:].float()).to(x.dtype)
            pert[name] = x
        o, _, _ = _run(pert, case)
        same = o[:, :t + 1] == o_ref[:, :t + 1]
        if not same.all():
            first = (~same).nonzero()[0].tolist()
            raise AssertionError(f"perturbing tokens > {t} changed o at {first} "
                                 f"({int((~same).sum())} elements)")
        assert not torch.equal(o[:, t + 1:], o_ref[:, t + 1:]), "perturbation had no effect"


@pytest.mark.parametrize("gate", ["lb_safe", "softplus"])
def test_causal(gate):
    """changing tokens after t never changes o[:t + 1], not even by one bit."""
    kw = dict(gate="lb", safe_gate=True) if gate == "lb_safe" else dict(gate="softplus")
    case = _case(B=1, T=256, H=2, HV=2, K=128, V=128, l2norm=True, beta="sigmoid", **kw)
    inputs = _cuda_inputs(case)
    o_ref, _, _ = _run(inputs, case)
    _assert_causal(inputs, case, o_ref, (0, 7, 15, 16, 31, 47, 63, 64, 100, 200, 254))


@pytest.mark.parametrize("mode", ["varlen", "time_split", "handoff"])
def test_cuda_graph_capture_replay(mode):
    """the op captures into a CUDA graph (no host sync, no allocation outside the graph pool) and
    replays on new data exactly like an eager call; also with the time split's three passes and
    with the prep / scan hand-off (a memset node, the scan a programmatic dependent)."""
    if mode == "time_split":
        case = _case(B=1, T=2100, H=1, HV=2, K=128, V=128, gate="lb", safe_gate=True,
                     l2norm=True, beta="sigmoid")
    elif mode == "handoff":
        case = HANDOFF[0]
    else:
        case = _case(B=1, T=700, H=2, HV=4, K=128, V=128, cu_seqlens=(0, 0, 300, 301, 700),
                     gate="lb", safe_gate=True, l2norm=True, beta="sigmoid", cu_dtype="i32")
    inputs = _cuda_inputs(case)
    assert _uses_time_split(case, inputs) == (mode == "time_split")
    assert _uses_handoff(case, inputs) == (mode == "handoff")
    args, kw = chunk_call(inputs, case)
    static = [a.clone() for a in args]
    o_eager, ht_eager = openkda.chunk_kda(*static, **kw)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        openkda.chunk_kda(*static, **kw)  # warm-up on the capture stream
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o_g, ht_g = openkda.chunk_kda(*static, **kw)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(o_g, o_eager) and torch.equal(ht_g, ht_eager)
    # New values in the same buffers: the replay must follow them.
    fresh = _cuda_inputs(case)
    for buf, name in zip(static, QKVGB):
        buf.copy_(fresh[name])
    graph.replay()
    torch.cuda.synchronize()
    o_new, ht_new = openkda.chunk_kda(*[fresh[n] for n in QKVGB], **kw)
    assert torch.equal(o_g, o_new) and torch.equal(ht_g, ht_new)


def _against_cpu(case: Case) -> None:
    inputs = _cuda_inputs(case)
    o, ht, h = _run(inputs, case, want_h=True)
    cpu = {n: (t.cpu() if isinstance(t, torch.Tensor) else t) for n, t in inputs.items()}
    args, kw = chunk_call(cpu, case)
    with torch.inference_mode():
        o_c, ht_c, h_c = openkda.chunk_kda(*args, return_intermediate_states=True, **kw)
    _check("o vs CPU", o_c, o, token_dim=1, chunk=case.chunk_size)
    _check("final_state vs CPU", ht_c, ht)
    _check("h vs CPU", h_c, h)


def test_matches_cpu_backend(f64_core):
    """the CUDA stages against their CPU twins (the chunked CPU backend in f64, end to end)."""
    _against_cpu(_case(B=2, T=333, H=2, HV=4, K=128, V=64, gate="softplus", l2norm=True,
                       beta="sigmoid", v_first=True))


def test_time_split_matches_cpu_backend(f64_core):
    """the time split (transition, combine, output passes) against the serial CPU backend."""
    case = _case(B=1, T=2200, H=1, HV=2, K=64, V=128, gate="softplus", l2norm=True,
                 beta="sigmoid", v_first=True)
    assert _uses_time_split(case, _cuda_inputs(case))
    _against_cpu(case)


def test_matches_cpu_backend_varlen_h(f64_core):
    _against_cpu(_case(B=1, T=333, H=2, HV=4, K=64, V=128, cu_seqlens=(0, 1, 150, 333),
                       gate="lb", safe_gate=True, chunk_size=32))


@pytest.mark.parametrize("K,V", [(100, 64), (64, 96), (256, 128)])
def test_unsupported_head_dims(K, V):
    case = _case(T=20, K=K, V=V)
    inputs = _cuda_inputs(case)
    args, kw = chunk_call(inputs, case)
    with pytest.raises(NotImplementedError, match="on CUDA"):
        openkda.chunk_kda(*args, **kw)


def test_sanitizer_small_varlen():
    """small cases with initial and final state, quick enough for compute-sanitizer
    (memcheck / racecheck: ``-k sanitizer``): varlen with empty and 1-token sequences, and h."""
    _check_case(_case(T=100, cu_seqlens=(0, 0, 1, 37, 100), K=64, V=64, gate="softplus",
                      beta="sigmoid", l2norm=True))
    _check_case(_case(T=100, cu_seqlens=(0, 0, 1, 37, 100), K=128, V=128, gate="lb",
                      safe_gate=True, chunk_size=32, v_first=True))
    _check_case(_case(B=2, T=70, K=128, V=64, gate="softplus"), want_h=True)


def test_empty_and_zero_length():
    """T = 0: o is empty and the final state is the initial state."""
    case = _case(B=2, T=0)
    inputs = _cuda_inputs(case)
    args, kw = chunk_call(inputs, case)
    o, ht = openkda.chunk_kda(*args, **kw)
    torch.cuda.synchronize()
    assert o.shape == (2, 0, 2, 64)
    assert torch.equal(ht, kw["initial_state"].float())
    case = _case(T=10, cu_seqlens=(0, 0, 10, 10))
    _check_case(case)

