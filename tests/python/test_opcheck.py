"""torch.library.opcheck on every custom op of the openkda namespace (schema, fake tensors,
autograd registration, AOT dispatch)."""

import pytest
import torch

import openkda  # noqa: F401  (registers torch.ops.openkda)
from cases import Case, make_inputs

ops = torch.ops.openkda


def _chunk_args(case: Case, grad: bool):
    a = make_inputs(case, requires_grad=grad)
    args = (a["q"], a["k"], a["v"], a["g"], a["beta"], a.get("A_log"), a.get("dt_bias"),
            a.get("initial_state"), a.get("cu_seqlens"))
    kwargs = dict(
        scale=0.25,
        output_final_state=True,
        use_qk_l2norm_in_kernel=a.get("use_qk_l2norm_in_kernel", False),
        use_gate_in_kernel=a.get("use_gate_in_kernel", False),
        use_beta_sigmoid_in_kernel=a.get("use_beta_sigmoid_in_kernel", False),
        lower_bound=a.get("lower_bound"),
        state_v_first=case.v_first,
    )
    return args, kwargs


CHUNK_CASES = [
    Case(B=2, T=9, H=1, HV=2, K=8, V=4),
    Case(B=1, T=12, H=1, HV=2, K=8, V=8, gate="softplus", beta="sigmoid", l2norm=True,
         cu_seqlens=(0, 5, 12), v_first=True),
]


@pytest.mark.parametrize("case", CHUNK_CASES, ids=lambda c: c.id)
def test_opcheck_chunk_fwd(case):
    args, kwargs = _chunk_args(case, grad=True)
    torch.library.opcheck(ops.chunk_fwd.default, args, kwargs)


def test_opcheck_chunk_fwd_with_h():
    args, kwargs = _chunk_args(CHUNK_CASES[0], grad=False)
    torch.library.opcheck(ops.chunk_fwd.default, args, dict(kwargs, num_h_chunks=1))


@pytest.mark.parametrize("case", CHUNK_CASES, ids=lambda c: c.id)
def test_opcheck_chunk_bwd(case):
    args, kwargs = _chunk_args(case, grad=False)
    kwargs.pop("output_final_state")
    o = torch.randn_like(args[2])
    h0 = args[7]
    torch.library.opcheck(ops.chunk_bwd.default, args + (o, torch.randn_like(h0)), kwargs)


def test_opcheck_recurrent_fwd():
    case = Case(B=1, T=3, H=1, HV=2, K=8, V=4, gate="lb", cu_seqlens=(0, 1, 3), h0=False)
    a = make_inputs(case)
    pool = torch.randn(5, 2, 8, 4)
    idx = torch.tensor([[3, 1], [0, 4]])
    o = torch.empty(1, 3, 2, 4)
    args = (a["q"], a["k"], a["v"], a["g"], a["beta"], a.get("A_log"), a.get("dt_bias"), pool,
            a["cu_seqlens"], idx, torch.tensor([1, 2]), o, None)
    torch.library.opcheck(ops.recurrent_fwd.default, args,
                          dict(scale=0.3, use_gate_in_kernel=True, lower_bound=-5.0,
                               inplace_final_state=True))
    final = torch.empty(2, 2, 8, 4)
    case = Case(B=2, T=4, H=1, HV=2, K=8, V=4)
    a = make_inputs(case)
    args = (a["q"], a["k"], a["v"], a["g"], a["beta"], None, None, a["initial_state"], None, None,
            None, torch.empty(2, 4, 2, 4), final)
    torch.library.opcheck(ops.recurrent_fwd.default, args, dict(scale=0.3))


@pytest.mark.parametrize("lower_bound, has_bias", [(None, True), (-5.0, False)])
def test_opcheck_gate(lower_bound, has_bias):
    g = torch.randn(2, 3, 4, 8, requires_grad=True)
    A_log = torch.randn(4, requires_grad=True)
    dt_bias = torch.randn(32, requires_grad=True) if has_bias else None
    torch.library.opcheck(ops.gate_fwd.default, (g, A_log, dt_bias),
                          dict(lower_bound=lower_bound))
    torch.library.opcheck(ops.gate_bwd.default,
                          (g.detach(), A_log.detach(),
                           None if dt_bias is None else dt_bias.detach(), torch.randn(2, 3, 4, 8)),
                          dict(lower_bound=lower_bound))
