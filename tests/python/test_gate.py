"""fused_kda_gate (forward and backward) and the naive gate references."""

import pytest
import torch

import openkda
import reference as R
from cases import assert_close

# (B, T, HV, K, has_A_log, has_dt_bias, lower_bound): FLA's test_gate grid.
GATE_CASES = [
    (1, 2, 2, 12, True, False, -5.0),
    (1, 32, 2, 16, True, False, -5.0),
    (2, 64, 4, 32, True, False, -5.0),
    (4, 128, 8, 64, True, False, -5.0),
    (4, 128, 8, 128, True, False, None),
    (1, 2, 2, 12, True, True, None),
    (1, 32, 2, 16, True, True, None),
    (2, 64, 4, 32, True, True, None),
    (4, 128, 8, 64, True, True, None),
    (1, 2, 2, 12, False, False, -5.0),
    (2, 64, 4, 32, False, False, -5.0),
    (4, 128, 8, 64, False, True, -5.0),
]


def _gate_id(c):
    B, T, HV, K, has_a, has_b, lb = c
    return f"B{B}-T{T}-H{HV}-K{K}-{'A' if has_a else 'noA'}-{'bias' if has_b else 'nobias'}-lb{lb}"


def _inputs(B, T, HV, K, has_a, has_b, dtype=torch.float32):
    g = (10 * torch.randn(B, T, HV, K)).to(dtype).requires_grad_(True)
    A_log = torch.empty(HV).uniform_(1, 16).log().requires_grad_(True) if has_a else None
    dt_bias = torch.randn(HV * K).requires_grad_(True) if has_b else None
    return g, A_log, dt_bias


def _check(g, A_log, dt_bias, lb, y, ratio, output_dtype=torch.float32):
    leaves = [t.detach().double().requires_grad_(True) if t is not None else None
              for t in (g, A_log, dt_bias)]
    ref = R.gate(*leaves, lb)
    assert y.dtype == output_dtype and y.shape == g.shape
    assert_close("y", ref, y, ratio)
    dy = torch.randn_like(ref)
    (y.double() * dy).sum().backward()
    (ref * dy).sum().backward()
    for name, t, leaf in zip(("g", "A_log", "dt_bias"), (g, A_log, dt_bias), leaves):
        if t is None:
            continue
        assert t.grad is not None and t.grad.dtype == t.dtype and t.grad.shape == t.shape, name
        assert_close(f"d{name}", leaf.grad, t.grad, ratio)


@pytest.mark.parametrize("case", GATE_CASES, ids=[_gate_id(c) for c in GATE_CASES])
def test_fused_kda_gate(case):
    *shape, has_a, has_b, lb = case
    g, A_log, dt_bias = _inputs(*shape, has_a, has_b)
    y = openkda.fused_kda_gate(g, A_log, dt_bias, lower_bound=lb)
    _check(g, A_log, dt_bias, lb, y, 1e-4)


@pytest.mark.parametrize("output_dtype", [torch.bfloat16, torch.float32])
def test_fused_kda_gate_bf16(output_dtype):
    g, A_log, dt_bias = _inputs(2, 40, 4, 32, True, True, dtype=torch.bfloat16)
    y = openkda.fused_kda_gate(g, A_log, dt_bias, output_dtype=output_dtype)
    _check(g, A_log, dt_bias, None, y, 8e-3, output_dtype)


def test_fused_kda_gate_A_log_shape():
    """A_log may have any shape with HV elements; its gradient keeps that shape."""
    g = torch.randn(1, 8, 4, 16, requires_grad=True)
    A_log = torch.randn(1, 1, 4, 1, requires_grad=True)
    y = openkda.fused_kda_gate(g, A_log)
    ref = R.gate(g.detach(), A_log.detach(), None, None)
    assert_close("y", ref, y, 1e-5)
    y.sum().backward()
    assert A_log.grad.shape == (1, 1, 4, 1)


def test_fused_kda_gate_3d_input():
    """g may have any leading shape [..., HV, K]."""
    g = torch.randn(10, 4, 16)
    A_log = torch.randn(4)
    y = openkda.fused_kda_gate(g, A_log, lower_bound=-3.0)
    assert_close("y", R.gate(g, A_log, None, -3.0), y, 1e-5)


def test_naive_gates_match_reference():
    g = 10 * torch.randn(2, 16, 4, 32)
    A_log, dt_bias = torch.randn(4), torch.randn(4 * 32)
    y = openkda.naive_kda_gate(g, A_log, dt_bias)
    assert y.dtype == torch.float32
    assert_close("softplus", R.gate(g, A_log, dt_bias, None), y, 1e-6)
    y = openkda.naive_kda_lowerbound_gate(g, A_log, dt_bias, lower_bound=-2.0,
                                          output_dtype=torch.bfloat16)
    assert y.dtype == torch.bfloat16
    assert_close("lower bound", R.gate(g, A_log, dt_bias, -2.0), y, 5e-3)
    y = openkda.naive_kda_lowerbound_gate(g)
    assert_close("lower bound, no A", R.gate(g, None, None, -5.0), y, 1e-6)


@pytest.mark.parametrize("lower_bound", [None, -4.0])
def test_fused_matches_naive(lower_bound):
    """Forward and gradients of fused_kda_gate equal torch autograd through the naive gate."""
    leaves = [5 * torch.randn(3, 7, 4, 24), torch.randn(4), torch.randn(4 * 24)]
    fused = [t.clone().requires_grad_(True) for t in leaves]
    naive = [t.clone().requires_grad_(True) for t in leaves]
    if lower_bound is None:
        y_ref = openkda.naive_kda_gate(*naive)
    else:
        y_ref = openkda.naive_kda_lowerbound_gate(*naive, lower_bound=lower_bound)
    y = openkda.fused_kda_gate(*fused, lower_bound=lower_bound)
    assert_close("y", y_ref, y, 1e-5)
    dy = torch.randn_like(y)
    y.backward(dy)
    y_ref.backward(dy)
    for name, a, b in zip(("g", "A_log", "dt_bias"), naive, fused):
        assert_close(f"d{name}", a.grad, b.grad, 1e-4)
