"""fused_kda_gate on CUDA against the float64 reference (skipped without CUDA)."""

import pytest
import torch

import openkda
import reference as R
from cases import assert_close
from test_gate import GATE_CASES, _gate_id

pytestmark = pytest.mark.gpu


def _cuda_inputs(B, T, HV, K, has_a, has_b, dtype):
    g = (10 * torch.randn(B, T, HV, K, device="cuda")).to(dtype).requires_grad_(True)
    A_log = (torch.empty(HV, device="cuda").uniform_(1, 16).log().requires_grad_(True)
             if has_a else None)
    dt_bias = torch.randn(HV * K, device="cuda").requires_grad_(True) if has_b else None
    return g, A_log, dt_bias


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("case", GATE_CASES + [(2, 1000, 16, 128, True, True, None),
                                               (1, 4096, 8, 128, True, True, -5.0)],
                         ids=[_gate_id(c) for c in GATE_CASES] + ["large-softplus", "large-lb"])
def test_fused_kda_gate_cuda(case, dtype):
    *shape, has_a, has_b, lb = case
    g, A_log, dt_bias = _cuda_inputs(*shape, has_a, has_b, dtype)
    y = openkda.fused_kda_gate(g, A_log, dt_bias, lower_bound=lb)
    assert y.device.type == "cuda" and y.dtype == torch.float32 and y.shape == g.shape
    leaves = [t.detach().cpu().double().requires_grad_(True) if t is not None else None
              for t in (g, A_log, dt_bias)]
    ref = R.gate(*leaves, lb)
    ratio = 1e-4 if dtype == torch.float32 else 8e-3
    assert_close("y", ref, y.cpu(), ratio)
    dy = torch.randn_like(ref)
    (y * dy.to(y)).sum().backward()
    (ref * dy).sum().backward()
    for name, t, leaf in zip(("g", "A_log", "dt_bias"), (g, A_log, dt_bias), leaves):
        if t is None:
            continue
        assert t.grad.dtype == t.dtype and t.grad.shape == t.shape, name
        assert_close(f"d{name}", leaf.grad, t.grad.cpu(), ratio)


def test_fused_kda_gate_cuda_matches_cpu():
    g = 10 * torch.randn(2, 64, 4, 64)
    A_log, dt_bias = torch.randn(4), torch.randn(4 * 64)
    y_cpu = openkda.fused_kda_gate(g, A_log, dt_bias)
    y_gpu = openkda.fused_kda_gate(g.cuda(), A_log.cuda(), dt_bias.cuda())
    assert_close("y", y_cpu, y_gpu.cpu(), 1e-5)


def test_fused_kda_gate_cuda_device_mismatch():
    g = torch.randn(1, 8, 4, 16, device="cuda")
    with pytest.raises(ValueError, match="A_log"):
        openkda.fused_kda_gate(g, torch.randn(4))


def test_fused_kda_gate_cuda_stream():
    """Runs on the current (non-default) stream."""
    g = 10 * torch.randn(4, 256, 8, 128, device="cuda")
    A_log = torch.randn(8, device="cuda")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        y = openkda.fused_kda_gate(g, A_log)
    s.synchronize()
    assert_close("y", R.gate(g.cpu(), A_log.cpu(), None, None), y.cpu(), 1e-4)


def test_device_mismatch_names_the_argument():
    q = torch.randn(1, 8, 2, 16, device="cuda")
    k = torch.randn(1, 8, 2, 16)
    v = torch.randn(1, 8, 2, 16, device="cuda")
    g = -torch.rand(1, 8, 2, 16, device="cuda")
    beta = torch.rand(1, 8, 2, device="cuda")
    with pytest.raises(ValueError, match=r"\bk\.device"):
        openkda.chunk_kda(q, k, v, g, beta)
    with pytest.raises(ValueError, match=r"initial_state\.device"):
        openkda.fused_recurrent_kda(q, q, v, g, beta, initial_state=torch.zeros(1, 2, 16, 16))
