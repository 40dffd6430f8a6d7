"""chunk_kda forward and backward against the float64 reference (tests/python/reference.py)."""

import warnings

import pytest
import torch

import openkda
import reference as R
from cases import (CHUNK_F64, CHUNK_LOWP, CHUNK_SWEEP, GRAD_NAMES, RATIOS, Case,
                   assert_close, assert_final_state, chunk_call, make_inputs, params,
                   reference_call)


def _check_fwd_bwd(case: Case, ratios):
    r_o, r_qkv, r_gb, r_param = ratios
    inputs = make_inputs(case, requires_grad=True)
    args, kw = chunk_call(inputs, case)
    o, ht = openkda.chunk_kda(*args, **kw)
    (ref_o, ref_ht), leaves = reference_call(inputs, chunk_size=case.chunk_size)

    assert o.dtype == inputs["q"].dtype
    assert o.shape == (case.B, case.T, case.HV, case.V)
    assert_close("o", ref_o, o, r_o)
    assert_final_state(case, ref_ht, ht, r_o)

    do = torch.randn_like(ref_o)
    loss = (o.double() * do).sum()
    ref_loss = (ref_o * do).sum()
    if case.final:
        dht = torch.randn_like(ref_ht)
        loss = loss + (ht.double() * dht).sum()
        ref_loss = ref_loss + (ref_ht * dht).sum()
    loss.backward()
    ref_loss.backward()
    tol = {"q": r_qkv, "k": r_qkv, "v": r_qkv, "initial_state": r_qkv, "g": r_gb, "beta": r_gb,
           "A_log": r_param, "dt_bias": r_param}
    for name in GRAD_NAMES:
        if name not in leaves:
            continue
        grad = inputs[name].grad
        assert grad is not None, f"no gradient for {name}"
        assert grad.dtype == inputs[name].dtype and grad.shape == inputs[name].shape, name
        assert_close(f"d{name}", leaves[name].grad, grad, tol[name])


@pytest.mark.parametrize("case", params(CHUNK_F64))
def test_chunk_f64(case, f64_core):
    _check_fwd_bwd(case, RATIOS["f64"])


@pytest.mark.parametrize("case", params(CHUNK_SWEEP))
def test_chunk_modes_f64(case, f64_core):
    _check_fwd_bwd(case, RATIOS["f64"])


@pytest.mark.parametrize("case", params(CHUNK_LOWP))
def test_chunk_low_precision(case):
    _check_fwd_bwd(case, RATIOS[case.dtype])


@pytest.mark.parametrize("case", params([
    Case(B=2, T=100, H=2, HV=4, K=16, V=8, dtype="f64"),
    Case(B=2, T=100, H=2, HV=2, K=16, V=16, dtype="f64", v_first=True, chunk_size=32),
    Case(B=1, T=103, H=2, HV=2, K=16, V=16, dtype="f64", cu_seqlens=(0, 0, 1, 40, 40, 103)),
    Case(B=1, T=100, H=2, HV=2, K=16, V=16, dtype="bf16", cu_seqlens=(0, 64, 100)),
]))
def test_chunk_return_intermediate_states(case):
    inputs = make_inputs(case)
    args, kw = chunk_call(inputs, case)
    with torch.inference_mode():
        o, ht, h = openkda.chunk_kda(*args, return_intermediate_states=True, **kw)
    (ref_o, ref_ht, states), _ = reference_call(inputs, return_token_states=True)
    h0 = inputs["initial_state"].double()
    ref_h = R.chunk_start_states(states, list(h0), case.B, case.T, case.chunk_size,
                                 case.cu_seqlens)
    assert h.dtype == inputs["k"].dtype
    assert h.shape == ref_h.shape
    ratio = RATIOS["f32" if case.dtype == "f64" else case.dtype][0]
    assert_close("h", ref_h, h, ratio)
    assert_close("o", ref_o, o, ratio)


def test_chunk_return_intermediate_states_needs_inference_mode():
    inputs = make_inputs(Case(T=8))
    args, kw = chunk_call(inputs, Case(T=8))
    with pytest.raises(AssertionError, match="inference mode"):
        openkda.chunk_kda(*args, return_intermediate_states=True, **kw)
    with torch.inference_mode(), pytest.raises(AssertionError, match="disable_recompute"):
        openkda.chunk_kda(*args, return_intermediate_states=True, disable_recompute=True, **kw)


def test_chunk_transpose_state_layout_deprecated():
    case = Case(T=20, K=16, V=8, v_first=True)
    inputs = make_inputs(case)
    args, kw = chunk_call(inputs, case)
    o1, ht1 = openkda.chunk_kda(*args, **kw)
    kw.pop("state_v_first")
    with pytest.warns(DeprecationWarning, match="transpose_state_layout") as rec:
        o2, ht2 = openkda.chunk_kda(*args, transpose_state_layout=True, **kw)
    assert rec[0].filename == __file__  # the warning points at the caller, not into torch
    assert torch.equal(o1, o2) and torch.equal(ht1, ht2)
    with pytest.raises(ValueError, match="Cannot pass both"):
        openkda.chunk_kda(*args, state_v_first=True, transpose_state_layout=True, **kw)


def test_chunk_options_without_effect():
    """disable_recompute, use_graph and cu_seqlens_cpu leave the result bit-identical."""
    case = Case(B=1, T=50, cu_seqlens=(0, 20, 50))
    inputs = make_inputs(case)
    args, kw = chunk_call(inputs, case)
    o1, ht1 = openkda.chunk_kda(*args, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        o2, ht2 = openkda.chunk_kda(*args, disable_recompute=True, use_graph=True, max_num_seqs=2,
                                    cu_seqlens_cpu=kw["cu_seqlens"].clone(), **kw)
    assert torch.equal(o1, o2) and torch.equal(ht1, ht2)


def test_chunk_non_contiguous_inputs():
    case = Case(B=2, T=40, H=2, HV=2, K=16, V=16)
    inputs = make_inputs(case)
    args, kw = chunk_call(inputs, case)
    o1, ht1 = openkda.chunk_kda(*args, **kw)
    # The same values through transposed storage.
    nc = [t.transpose(1, 2).contiguous().transpose(1, 2) for t in args]
    assert not nc[0].is_contiguous()
    o2, ht2 = openkda.chunk_kda(*nc, **kw)
    assert torch.equal(o1, o2) and torch.equal(ht1, ht2)


def test_chunk_output_dtypes():
    """o takes q's dtype; gradients take their inputs' dtypes; dt_bias grad stays [HV * K]."""
    case = Case(B=1, T=20, gate="softplus", beta="sigmoid")
    inputs = make_inputs(case, requires_grad=True)
    args, kw = chunk_call(inputs, case)
    v_bf16 = inputs["v"].detach().to(torch.bfloat16).requires_grad_(True)
    args[2] = v_bf16
    o, ht = openkda.chunk_kda(*args, **kw)
    assert o.dtype == torch.float32 and ht.dtype == torch.float32
    (o.sum() + ht.sum()).backward()
    assert v_bf16.grad.dtype == torch.bfloat16
    assert kw["dt_bias"].grad.shape == kw["dt_bias"].shape
    assert kw["A_log"].grad.shape == kw["A_log"].shape


def test_chunk_size_changes_nothing_in_f64(f64_core):
    case = Case(B=1, T=100, dtype="f64", gate="softplus")
    inputs = make_inputs(case)
    args, kw = chunk_call(inputs, case)
    o64, ht64 = openkda.chunk_kda(*args, **kw)
    o32, ht32 = openkda.chunk_kda(*args, chunk_size=32, **kw)
    assert_close("o", o64, o32, 1e-10)
    assert_close("final_state", ht64, ht32, 1e-10)


def test_chunk_empty_sequence_batch():
    """T = 0: empty outputs; the final state is the initial state."""
    case = Case(B=2, T=0)
    inputs = make_inputs(case)
    args, kw = chunk_call(inputs, case)
    o, ht = openkda.chunk_kda(*args, **kw)
    assert o.shape == (2, 0, 2, 16)
    assert torch.equal(ht, kw["initial_state"].float())
