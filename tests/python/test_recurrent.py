"""fused_recurrent_kda and fused_recurrent_kda_fwd (state pool, speculative decoding, per-token
states, out= buffer) against the float64 reference."""

import pytest
import torch

import openkda
import reference as R
from cases import (QKVGB, RATIOS, RECURRENT_F64, RECURRENT_LOWP, Case, assert_close,
                   assert_final_state, make_inputs, params, reference_call)

# Keyword arguments fused_recurrent_kda takes (chunk-only ones are dropped).
RECURRENT_KW = ("A_log", "dt_bias", "scale", "initial_state", "output_final_state",
                "use_qk_l2norm_in_kernel", "use_gate_in_kernel", "use_beta_sigmoid_in_kernel",
                "allow_neg_eigval", "lower_bound", "state_v_first", "cu_seqlens")


def _split(inputs):
    return [inputs[n] for n in QKVGB], {n: t for n, t in inputs.items() if n in RECURRENT_KW}


def _check(case, ratio):
    inputs = make_inputs(case)
    args, kw = _split(inputs)
    o, ht = openkda.fused_recurrent_kda(*args, **kw)
    (ref_o, ref_ht), _ = reference_call(inputs)
    assert o.dtype == inputs["v"].dtype and o.shape == inputs["v"].shape
    assert o.grad_fn is None
    assert_close("o", ref_o, o, ratio)
    assert_final_state(case, ref_ht, ht, ratio)


@pytest.mark.parametrize("case", params(RECURRENT_F64))
def test_fused_recurrent_f64(case, f64_core):
    _check(case, RATIOS["f64"][0])


@pytest.mark.parametrize("case", params(RECURRENT_LOWP))
def test_fused_recurrent_low_precision(case):
    _check(case, RATIOS[case.dtype][0])


def test_fused_recurrent_matches_chunk(f64_core):
    case = Case(B=1, T=90, H=2, HV=4, K=16, V=8, dtype="f64", gate="lb", beta="sigmoid",
                l2norm=True, cu_seqlens=(0, 10, 90))
    inputs = make_inputs(case)
    args, kw = _split(inputs)
    o_r, ht_r = openkda.fused_recurrent_kda(*args, **kw)
    o_c, ht_c = openkda.chunk_kda(*args, **kw)
    assert_close("o", o_c, o_r, 1e-10)
    assert_close("final_state", ht_c, ht_r, 1e-10)


def test_fused_recurrent_transpose_state_layout_deprecated():
    case = Case(T=10, K=16, V=8, v_first=True)
    inputs = make_inputs(case)
    args, kw = _split(inputs)
    o1, ht1 = openkda.fused_recurrent_kda(*args, **kw)
    kw.pop("state_v_first")
    with pytest.warns(DeprecationWarning, match="transpose_state_layout") as rec:
        o2, ht2 = openkda.fused_recurrent_kda(*args, transpose_state_layout=True, **kw)
    assert rec[0].filename == __file__
    assert torch.equal(o1, o2) and torch.equal(ht1, ht2)


# ---- serving entry point ------------------------------------------------------------------------

def _bits(t):
    """Bit pattern of a float tensor (NaN payloads compare equal to themselves)."""
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def _poisoned_pool(num_slots, HV, K, V, dtype=torch.float32):
    pool = torch.full((num_slots, HV, K, V), float("nan"), dtype=dtype)
    return pool


@pytest.mark.parametrize("idx_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("v_first", [False, True])
def test_decode_state_pool_1d(idx_dtype, v_first, f64_core):
    """T = 1 per sequence, 1-D slot indices, in place: used slots updated, others bit-identical."""
    N, HV, K, V = 5, 4, 16, 8
    case = Case(B=1, T=N, H=2, HV=HV, K=K, V=V, dtype="f64", gate="softplus", beta="sigmoid",
                l2norm=True, h0=False, final=False, cu_seqlens=tuple(range(N + 1)),
                v_first=v_first)
    inputs = make_inputs(case)
    args, kw = _split(inputs)
    slots = torch.randperm(3 * N)[:N].to(idx_dtype)
    pool = _poisoned_pool(3 * N, HV, *((V, K) if v_first else (K, V)), dtype=torch.float64)
    pool[slots.long()] = torch.randn(N, *pool.shape[1:], dtype=torch.float64)
    before = pool.clone()
    kw.pop("output_final_state")
    o, ht = openkda.fused_recurrent_kda_fwd(*args, initial_state=pool, ssm_state_indices=slots,
                                            **kw)
    assert ht is pool
    ref_o, ref_ht = R.kda(*[inputs[n].double() for n in QKVGB], cu_seqlens=case.cu_seqlens,
                          initial_slots=list(before[slots.long()]), state_v_first=v_first,
                          **_ref_flags(kw))
    assert_close("o", ref_o, o, 1e-10)
    assert_close("slots", ref_ht, pool[slots.long()], 1e-10)
    untouched = torch.ones(3 * N, dtype=torch.bool)
    untouched[slots.long()] = False
    assert torch.equal(_bits(pool[untouched]), _bits(before[untouched]))


def _ref_flags(kw):
    return {n: kw[n] for n in ("use_qk_l2norm_in_kernel", "use_gate_in_kernel", "A_log", "dt_bias",
                               "lower_bound", "use_beta_sigmoid_in_kernel", "allow_neg_eigval",
                               "scale") if n in kw}


@pytest.mark.parametrize("accepted", [False, True])
def test_spec_decoding_state_pool_2d(accepted, f64_core):
    """2-D indices [N, max_tokens] (+ num_accepted_tokens): the state after token t of sequence n
    goes to slot idx[n, t]; the initial state comes from idx[n, num_accepted[n] - 1]."""
    lens = [3, 1, 2]
    N, HV, K, V, M = len(lens), 2, 16, 16, 3
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    case = Case(B=1, T=cu[-1], H=1, HV=HV, K=K, V=V, dtype="f64", gate="lb", h0=False,
                final=False, cu_seqlens=tuple(cu))
    inputs = make_inputs(case)
    args, kw = _split(inputs)
    kw.pop("output_final_state")
    num_slots = 4 * N * M
    idx = torch.randperm(num_slots)[: N * M].reshape(N, M)
    pool = _poisoned_pool(num_slots, HV, K, V, dtype=torch.float64)
    nat = torch.tensor([2, 1, 3]) if accepted else None
    starts = [idx[n, (nat[n] - 1) if accepted else 0] for n in range(N)]
    for s in starts:
        pool[s] = torch.randn(HV, K, V, dtype=torch.float64)
    before = pool.clone()
    o, _ = openkda.fused_recurrent_kda_fwd(*args, initial_state=pool, ssm_state_indices=idx,
                                           num_accepted_tokens=nat, **kw)
    ref_o, _, states = R.kda(*[inputs[n].double() for n in QKVGB], cu_seqlens=cu,
                             initial_slots=[before[s] for s in starts], return_token_states=True,
                             **_ref_flags(kw))
    assert_close("o", ref_o, o, 1e-10)
    written = torch.zeros(num_slots, dtype=torch.bool)
    for n in range(N):
        for t in range(lens[n]):
            slot = idx[n, t]
            assert_close(f"pool[idx[{n}, {t}]]", states[cu[n] + t], pool[slot], 1e-10)
            written[slot] = True
    assert torch.equal(_bits(pool[~written]), _bits(before[~written]))


def test_per_token_states_not_in_place(f64_core):
    """ssm_state_indices without in-place update: final_state holds the state after every token
    [B * T, HV, K, V]; the pool is not modified."""
    cu = [0, 2, 5]  # sequence lengths 2 and 3
    case = Case(B=1, T=5, H=2, HV=2, K=8, V=16, dtype="f64", h0=False, final=False,
                cu_seqlens=tuple(cu))
    inputs = make_inputs(case)
    args, kw = _split(inputs)
    kw.pop("output_final_state")
    pool = torch.randn(7, 2, 8, 16, dtype=torch.float64)
    before = pool.clone()
    idx = torch.tensor([[4, 0, 0], [1, 5, 6]])
    o, ht = openkda.fused_recurrent_kda_fwd(*args, initial_state=pool, ssm_state_indices=idx,
                                            inplace_final_state=False, output_final_state=True,
                                            **kw)
    ref_o, _, states = R.kda(*[inputs[n].double() for n in QKVGB], cu_seqlens=cu,
                             initial_slots=[before[4], before[1]], return_token_states=True,
                             **_ref_flags(kw))
    assert ht.shape == (5, 2, 8, 16)
    assert_close("o", ref_o, o, 1e-10)
    assert_close("token states", torch.stack(states), ht, 1e-10)
    assert torch.equal(pool, before)


@pytest.mark.parametrize("contiguous", [True, False])
def test_out_buffer(contiguous):
    case = Case(B=2, T=9, H=2, HV=2, K=16, V=8)
    inputs = make_inputs(case)
    args, kw = _split(inputs)
    ref_o, ref_ht = openkda.fused_recurrent_kda(*args, **kw)
    if contiguous:
        out = torch.full_like(inputs["v"], float("nan"))
    else:
        out = torch.full((2, 2, 9, 8), float("nan")).transpose(1, 2)
        assert not out.is_contiguous()
    h0 = kw.pop("initial_state").clone()
    kw.pop("output_final_state")
    o, ht = openkda.fused_recurrent_kda_fwd(*args, initial_state=h0, out=out, **kw)
    assert o is out
    assert ht is h0  # in place by default (FLA's inplace_final_state=True)
    assert torch.equal(out, ref_o)
    assert torch.equal(h0, ref_ht)


def test_inplace_non_contiguous_pool(f64_core):
    """A pool that is a strided view (e.g. part of a larger cache) is updated through a copy."""
    N, HV, K, V = 3, 2, 8, 8
    case = Case(B=1, T=N, H=1, HV=HV, K=K, V=V, dtype="f64", h0=False, final=False,
                cu_seqlens=tuple(range(N + 1)))
    inputs = make_inputs(case)
    args, kw = _split(inputs)
    kw.pop("output_final_state")
    cache = torch.randn(6, 2, HV, K, V, dtype=torch.float64)
    pool = cache[:, 1]
    assert not pool.is_contiguous()
    other = cache[:, 0].clone()
    expected = pool.clone()
    idx = torch.tensor([5, 0, 2])
    openkda.fused_recurrent_kda_fwd(*args, initial_state=expected, ssm_state_indices=idx, **kw)
    openkda.fused_recurrent_kda_fwd(*args, initial_state=pool, ssm_state_indices=idx, **kw)
    assert torch.equal(cache[:, 1], expected)
    assert torch.equal(cache[:, 0], other)
