"""NaN/Inf propagation (documented in README 'Limits' and docs/design.md section 5): a NaN in one
token's input (or an Inf in v) poisons that (sequence, value head) from the token on; earlier
outputs, other heads and other sequences are unchanged, bit for bit. Nothing is clamped: an Inf
raw gate or beta logit goes through the activations (sigmoid(+inf) = 1, decay exp(-inf) = 0)."""

import pytest
import torch

import openkda


def _inputs(seed=0):
    gen = torch.Generator().manual_seed(seed)
    B, T, H, HV, K, V = 2, 150, 2, 4, 16, 8
    q = torch.randn(B, T, H, K, generator=gen)
    k = torch.randn(B, T, H, K, generator=gen)
    v = torch.randn(B, T, HV, V, generator=gen)
    g = torch.randn(B, T, HV, K, generator=gen)
    beta = torch.randn(B, T, HV, generator=gen)
    A_log = torch.randn(HV, generator=gen)
    return q, k, v, g, beta, A_log


def _run(q, k, v, g, beta, A_log, fn):
    kw = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
              use_beta_sigmoid_in_kernel=True, output_final_state=True)
    if fn == "chunk":
        return openkda.chunk_kda(q, k, v, g, beta, A_log=A_log, **kw)
    return openkda.fused_recurrent_kda(q, k, v, g, beta, A_log, **kw)


@pytest.mark.parametrize("fn", ["chunk", "recurrent"])
@pytest.mark.parametrize("where,value", [("v", float("nan")), ("g", float("nan")),
                                         ("beta", float("nan")), ("v", float("inf"))])
def test_nonfinite_input_poisons_only_its_sequence_and_head_from_its_token_on(fn, where, value):
    b, t, hv = 1, 70, 3  # t inside the second chunk of 64
    inputs = _inputs()
    o_ref, ht_ref = _run(*inputs, fn)
    q, k, v, g, beta, A_log = (x.clone() for x in inputs)
    {"v": v, "g": g, "beta": beta}[where][b, t, hv] = value
    o, ht = _run(q, k, v, g, beta, A_log, fn)

    # Earlier tokens of the poisoned (sequence, head): identical.
    assert torch.equal(o[b, :t, hv], o_ref[b, :t, hv])
    # Other heads and the other sequence: identical, outputs and final states.
    others = [h for h in range(o.shape[2]) if h != hv]
    assert torch.equal(o[:, :, others], o_ref[:, :, others])
    assert torch.equal(o[1 - b], o_ref[1 - b])
    assert torch.equal(ht[1 - b], ht_ref[1 - b]) and torch.equal(ht[b, others], ht_ref[b, others])
    # From the token on, every output row of that head and its final state are no longer finite.
    assert not torch.isfinite(o[b, t:, hv]).all(dim=-1).any()
    assert not torch.isfinite(ht[b, hv]).all()
