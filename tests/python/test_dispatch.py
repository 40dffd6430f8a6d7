"""The public wrappers' dispatch: a plain eager call runs the op's implementation directly (no
torch.library dispatch: ~12 us less host time per chunk_kda call), and everything that needs the
op still gets it: autograd, fake tensors, functorch transforms, tensor subclasses. Both ways
compute the same thing, bit for bit."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import openkda
from openkda import _ops
from cases import Case, chunk_call, make_inputs

CASE = Case(B=2, T=21, H=1, HV=2, K=8, V=4, gate="softplus", beta="sigmoid", l2norm=True)


def _call(inputs: dict):
    args, kw = chunk_call(inputs, CASE)
    kw["output_final_state"] = True
    return openkda.chunk_kda(*args, **kw)


def _count(monkeypatch, name: str) -> list:
    """Counts the calls that go through the torch.library op openkda::<name>."""
    calls = []
    op = getattr(_ops, name)

    def counting(*args, **kwargs):
        calls.append(1)
        return op(*args, **kwargs)

    monkeypatch.setattr(_ops, name, counting)
    return calls


@pytest.fixture
def op_calls(monkeypatch):
    return _count(monkeypatch, "chunk_fwd")


def test_plain_call_skips_the_op(op_calls):
    inputs = make_inputs(CASE)
    with torch.no_grad():
        _call(inputs)
    with torch.inference_mode():
        _call(inputs)
    _call(inputs)  # grad mode on, but nothing requires grad
    assert op_calls == []


def test_parameters_are_plain(op_calls):
    inputs = make_inputs(CASE)
    inputs["A_log"] = torch.nn.Parameter(inputs["A_log"])
    inputs["dt_bias"] = torch.nn.Parameter(inputs["dt_bias"])
    with torch.no_grad():
        _call(inputs)
    assert op_calls == []


def test_autograd_goes_through_the_op_and_matches(op_calls):
    inputs = make_inputs(CASE)
    plain = _call(inputs)
    for name in ("q", "k", "v", "g", "beta"):
        inputs[name] = inputs[name].clone().requires_grad_()
    o, ht = _call(inputs)
    assert op_calls == [1]
    assert o.requires_grad and o.grad_fn is not None
    (o.sum() + ht.sum()).backward()
    assert inputs["q"].grad is not None
    assert torch.equal(o.detach(), plain[0]) and torch.equal(ht.detach(), plain[1])


def test_fake_tensors_go_through_the_op(op_calls):
    with FakeTensorMode():
        inputs = make_inputs(CASE)
        o, ht = _call(inputs)
    assert op_calls == [1]
    assert o.shape == (CASE.B, CASE.T, CASE.HV, CASE.V)
    assert ht.shape == (CASE.B, CASE.HV, CASE.K, CASE.V)


def test_needs_dispatch():
    x = torch.zeros(2, 3)
    assert not _ops.needs_dispatch(x, None, torch.nn.Parameter(torch.zeros(1), requires_grad=False))
    assert _ops.needs_dispatch(x, torch.zeros(1, requires_grad=True))
    with torch.no_grad():
        assert not _ops.needs_dispatch(x, torch.zeros(1, requires_grad=True))
    with FakeTensorMode():
        assert _ops.needs_dispatch(torch.zeros(1))

    class Sub(torch.Tensor):
        pass

    assert _ops.needs_dispatch(torch.zeros(1).as_subclass(Sub))
    seen = []
    torch.func.vmap(lambda t: seen.append(_ops.needs_dispatch(t)) or t)(x)
    assert seen == [True]


def test_gate_and_recurrent_skip_the_op_and_match(monkeypatch):
    gate_calls = _count(monkeypatch, "gate_fwd")
    rec_calls = _count(monkeypatch, "recurrent_fwd")
    inputs = make_inputs(CASE)
    args, kw = chunk_call(inputs, CASE)
    kw["output_final_state"] = True
    g, A_log, dt_bias = inputs["g"], inputs["A_log"], inputs["dt_bias"]
    y = openkda.fused_kda_gate(g, A_log, dt_bias=dt_bias)
    o, ht = openkda.fused_recurrent_kda(*args, **kw)
    assert gate_calls == [] and rec_calls == []
    # Forced through the ops: the same bits.
    monkeypatch.setattr(_ops, "needs_dispatch", lambda *tensors: True)
    y_op = openkda.fused_kda_gate(g, A_log, dt_bias=dt_bias)
    o_op, ht_op = openkda.fused_recurrent_kda(*args, **kw)
    assert gate_calls == [1] and rec_calls == [1]
    assert torch.equal(y_op, y) and torch.equal(o_op, o) and torch.equal(ht_op, ht)


def test_fake_tensors_reach_the_recurrent_op(monkeypatch):
    rec_calls = _count(monkeypatch, "recurrent_fwd")
    with FakeTensorMode():
        inputs = make_inputs(CASE)
        args, kw = chunk_call(inputs, CASE)
        kw["output_final_state"] = True
        o, ht = openkda.fused_recurrent_kda(*args, **kw)
    assert rec_calls == [1]
    assert o.shape == (CASE.B, CASE.T, CASE.HV, CASE.V)


def test_fused_recurrent_under_torch_compile_fullgraph(monkeypatch):
    """Dynamo traces fused_recurrent_kda (not compiler-disabled) into the op, as before the eager
    shortcut: needs_dispatch says so while compiling, before its untraceable checks."""
    inputs = make_inputs(CASE)
    args, kw = chunk_call(inputs, CASE)
    kw["output_final_state"] = True

    def step(*a):
        return openkda.fused_recurrent_kda(*a, **kw)

    eager = step(*args)
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)(*args)
    for e, c in zip(eager, compiled):
        assert torch.equal(e, c)
