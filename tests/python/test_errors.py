"""Every invalid call raises ValueError (NotImplementedError for unsupported features) whose
message names the offending argument; nothing falls back silently."""

import re

import pytest
import torch

import openkda

B, T, H, HV, K, V = 1, 10, 2, 4, 16, 8


def base(**over):
    """Valid chunk_kda arguments; keyword overrides replace tensors or add options."""
    a = dict(
        q=torch.randn(B, T, H, K), k=torch.randn(B, T, H, K), v=torch.randn(B, T, HV, V),
        g=-torch.rand(B, T, HV, K), beta=torch.rand(B, T, HV),
    )
    a.update(over)
    return a


def chunk(**over):
    return lambda: openkda.chunk_kda(**base(**over))


def recurrent(**over):
    return lambda: openkda.fused_recurrent_kda(**base(**over))


def recurrent_fwd(**over):
    return lambda: openkda.fused_recurrent_kda_fwd(**base(**over))


GATE = dict(use_gate_in_kernel=True, A_log=torch.zeros(HV))
CU = torch.tensor([0, 4, 10])

CASES = [
    # shapes and ranks
    ("q_rank", chunk(q=torch.randn(T, H, K)), r"\bq\b.*rank 3"),
    ("k_shape", chunk(k=torch.randn(B, T, H, K + 1)), r"\bk\.shape"),
    ("v_rank", chunk(v=torch.randn(B, T, HV)), r"\bv\b.*rank"),
    ("v_T", chunk(v=torch.randn(B, T + 1, HV, V)), r"\bv\.shape"),
    ("g_shape", chunk(g=torch.randn(B, T, H, K)), r"\bg\.shape"),
    ("beta_shape", chunk(beta=torch.rand(B, T, H)), r"\bbeta\.shape"),
    ("beta_headwise_chunk", chunk(beta=torch.rand(B, T, HV, V)), r"\bbeta\b"),
    ("HV_not_multiple", chunk(v=torch.randn(B, T, 3, V), g=-torch.rand(B, T, 3, K),
                              beta=torch.rand(B, T, 3)), r"HV.*multiple of H"),
    ("K_too_large", chunk(q=torch.randn(B, T, H, 300), k=torch.randn(B, T, H, 300),
                          g=-torch.rand(B, T, HV, 300)), r"\(K\) = 300.*K <= 256"),
    # dtypes
    ("k_dtype", chunk(k=torch.randn(B, T, H, K, dtype=torch.float64)), r"\bk\.dtype"),
    ("q_int", chunk(q=torch.ones(B, T, H, K, dtype=torch.int32),
                    k=torch.ones(B, T, H, K, dtype=torch.int32)), r"\bq\.dtype"),
    # cu_seqlens
    ("cu_start", chunk(cu_seqlens=torch.tensor([1, 4, 10])), r"cu_seqlens\[0\]"),
    ("cu_monotone", chunk(cu_seqlens=torch.tensor([0, 6, 4, 10])), r"cu_seqlens\[2\]"),
    ("cu_end", chunk(cu_seqlens=torch.tensor([0, 4, 9])), r"cu_seqlens\[-1\]"),
    ("cu_dtype", chunk(cu_seqlens=torch.tensor([0.0, 4.0, 10.0])), r"cu_seqlens\.dtype"),
    ("cu_rank", chunk(cu_seqlens=torch.tensor([[0, 4, 10]])), r"cu_seqlens.*rank"),
    ("cu_batch", chunk(q=torch.randn(2, 5, H, K), k=torch.randn(2, 5, H, K),
                       v=torch.randn(2, 5, HV, V), g=-torch.rand(2, 5, HV, K),
                       beta=torch.rand(2, 5, HV), cu_seqlens=CU),
     r"batch size is expected to be 1.*`cu_seqlens`"),
    ("cu_num_states", chunk(cu_seqlens=CU, initial_state=torch.zeros(3, HV, K, V)),
     r"number of initial states.*2 rather than 3"),
    # initial_state
    ("h0_shape", chunk(initial_state=torch.zeros(1, HV, K, V + 1)), r"initial_state\.shape"),
    ("h0_layout", chunk(initial_state=torch.zeros(1, HV, K, V), state_v_first=True),
     r"initial_state\.shape.*state_v_first"),
    ("h0_dtype", chunk(initial_state=torch.zeros(1, HV, K, V, dtype=torch.float16)),
     r"initial_state\.dtype"),
    # gate options (FLA's messages)
    ("A_log_missing", chunk(use_gate_in_kernel=True), r"`A_log` must be provided"),
    ("A_log_numel", chunk(use_gate_in_kernel=True, A_log=torch.zeros(HV + 1)), r"A_log\.shape"),
    ("dt_bias_numel", chunk(dt_bias=torch.zeros(HV), **GATE), r"dt_bias\.shape"),
    ("safe_no_lb", chunk(safe_gate=True, **GATE), r"`lower_bound` must be specified"),
    ("safe_lb_low", chunk(safe_gate=True, lower_bound=-6.0, **GATE),
     r"`lower_bound` must be in the safe range \[-5, 0\), got -6"),
    ("safe_lb_zero", chunk(safe_gate=True, lower_bound=0.0, **GATE),
     r"`lower_bound` must be in the safe range"),
    ("neg_eig_no_sigmoid", chunk(allow_neg_eigval=True),
     r"`allow_neg_eigval=True` requires `use_beta_sigmoid_in_kernel=True`"),
    ("chunk_size_16", chunk(chunk_size=16), r"`chunk_size` must be either 32 or 64"),
    ("both_layout_kwargs", chunk(state_v_first=True, transpose_state_layout=True),
     r"Cannot pass both"),
    # fused_recurrent_kda / fused_recurrent_kda_fwd
    ("rec_q_rank", recurrent(q=torch.randn(T, H, K)), r"\bq\b.*rank"),
    ("rec_beta_shape", recurrent(beta=torch.rand(B, T, HV, V + 1)), r"\bbeta\.shape"),
    ("rec_cu_batch", recurrent(q=torch.randn(2, 5, H, K), k=torch.randn(2, 5, H, K),
                               v=torch.randn(2, 5, HV, V), g=-torch.rand(2, 5, HV, K),
                               beta=torch.rand(2, 5, HV), cu_seqlens=CU),
     r"batch size is expected to be 1"),
    ("rec_num_states", recurrent(cu_seqlens=CU, initial_state=torch.zeros(1, HV, K, V)),
     r"number of initial states"),
    ("rec_neg_eig", recurrent(allow_neg_eigval=True), r"`allow_neg_eigval=True` requires"),
    ("rec_h0_shape", recurrent(initial_state=torch.zeros(1, HV, V, K)), r"initial_state\.shape"),
    ("rec_inplace_no_state", recurrent_fwd(), r"initial_state"),
    ("rec_indices_N", recurrent_fwd(initial_state=torch.zeros(4, HV, K, V),
                                    ssm_state_indices=torch.tensor([0, 1])),
     r"ssm_state_indices"),
    ("rec_accepted_without_indices", recurrent_fwd(initial_state=torch.zeros(1, HV, K, V),
                                                   num_accepted_tokens=torch.tensor([1])),
     r"num_accepted_tokens"),
    ("rec_out_shape", recurrent_fwd(initial_state=torch.zeros(1, HV, K, V),
                                    out=torch.empty(B, T, HV, V + 1)), r"\bo\.shape"),
    ("rec_indices_dtype", recurrent_fwd(initial_state=torch.zeros(4, HV, K, V),
                                        ssm_state_indices=torch.tensor([0.0])),
     r"ssm_state_indices\.dtype"),
    ("rec_indices_rank", recurrent_fwd(initial_state=torch.zeros(4, HV, K, V),
                                       ssm_state_indices=torch.zeros(1, 10, 1, dtype=torch.int32)),
     r"ssm_state_indices: rank 3"),
    ("rec_indices_slot", recurrent_fwd(initial_state=torch.zeros(4, HV, K, V),
                                       ssm_state_indices=torch.tensor([[0] * 9 + [7]])),
     r"ssm_state_indices\[0, 9\] = 7.*\[0, 4\)"),
    ("rec_indices_few_columns", recurrent_fwd(initial_state=torch.zeros(4, HV, K, V),
                                              ssm_state_indices=torch.tensor([0])),
     r"ssm_state_indices\.shape \[1\].*max_tokens >= 10"),
    ("rec_accepted_dtype", recurrent_fwd(initial_state=torch.zeros(4, HV, K, V),
                                         ssm_state_indices=torch.tensor([list(range(T))]) % 4,
                                         num_accepted_tokens=torch.tensor([1.0])),
     r"num_accepted_tokens\.dtype f32"),
    ("rec_accepted_empty", recurrent_fwd(initial_state=torch.zeros(4, HV, K, V),
                                         ssm_state_indices=torch.tensor([list(range(T))]) % 4,
                                         num_accepted_tokens=torch.zeros(0, dtype=torch.int32)),
     r"num_accepted_tokens\.shape \[0\]"),
    ("rec_out_dtype", recurrent_fwd(initial_state=torch.zeros(1, HV, K, V),
                                    out=torch.empty(B, T, HV, V, dtype=torch.int32)),
     r"\bo\.dtype"),
    ("rec_lower_bound_text", recurrent(lower_bound="x", **GATE), r"lower_bound = 'x'"),
    # more dtypes, devices-free (CPU-only) checks
    ("v_int", chunk(v=torch.ones(B, T, HV, V, dtype=torch.int32)), r"\bv\.dtype"),
    ("g_int", chunk(g=torch.ones(B, T, HV, K, dtype=torch.int32)), r"\bg\.dtype"),
    ("beta_int", chunk(beta=torch.ones(B, T, HV, dtype=torch.int32)), r"\bbeta\.dtype"),
    ("A_log_int", chunk(use_gate_in_kernel=True, A_log=torch.zeros(HV, dtype=torch.int32)),
     r"A_log\.dtype"),
    ("h0_int", chunk(initial_state=torch.zeros(1, HV, K, V, dtype=torch.int32)),
     r"initial_state\.dtype"),
    ("scale_inf", chunk(scale=float("inf")), r"scale = inf"),
    ("lower_bound_text", chunk(lower_bound="x", **GATE), r"lower_bound = 'x'"),
]


@pytest.mark.parametrize("fn, pattern", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_invalid_arguments_raise_value_error(fn, pattern):
    with pytest.raises(ValueError) as info:
        fn()
    assert re.search(pattern, str(info.value)), str(info.value)


def test_core_messages_name_the_op():
    with pytest.raises(ValueError, match=r"^chunk_kda: "):
        chunk(k=torch.randn(B, T, H, K + 1))()
    with pytest.raises(ValueError, match=r"^fused_recurrent_kda: "):
        recurrent(beta=torch.rand(B, T, HV, V + 1))()


def test_cp_context_not_implemented():
    with pytest.raises(NotImplementedError, match="cp_context"):
        chunk(cp_context=object())()


@pytest.mark.parametrize("fn, pattern", [
    (lambda: openkda.fused_kda_gate(torch.randn(1, 4, HV, K)), r"A_log"),
    (lambda: openkda.fused_kda_gate(torch.randn(1, 4, HV, K), torch.zeros(HV + 1)),
     r"A_log\.shape"),
    (lambda: openkda.fused_kda_gate(torch.randn(1, 4, HV, K), torch.zeros(HV), torch.zeros(HV)),
     r"dt_bias\.shape"),
    (lambda: openkda.fused_kda_gate(torch.randn(K), lower_bound=-1.0), r"\bg\b.*rank"),
    (lambda: openkda.fused_kda_gate(torch.randn(1, 4, HV, K), lower_bound=float("inf")),
     r"lower_bound"),
    (lambda: openkda.fused_kda_gate(torch.randn(1, 4, HV, K), lower_bound="x"),
     r"lower_bound = 'x'"),
    (lambda: openkda.fused_kda_gate(torch.randn(1, 4, HV, K), torch.zeros(HV),
                                    output_dtype=torch.int32), r"output_dtype = torch\.int32"),
    (lambda: openkda.fused_kda_gate(torch.ones(1, 4, HV, K, dtype=torch.int32), torch.zeros(HV)),
     r"\bg\.dtype"),
], ids=["A_log_missing", "A_log_numel", "dt_bias_numel", "g_rank", "lower_bound_inf",
        "lower_bound_text", "output_dtype_int", "g_int"])
def test_gate_invalid_arguments(fn, pattern):
    with pytest.raises(ValueError) as info:
        fn()
    assert re.search(pattern, str(info.value)), str(info.value)


def test_supports():
    ok, reason = openkda.supports(**base())
    assert ok and reason == ""
    ok, reason = openkda.supports(**base(chunk_size=16))
    assert not ok and "chunk_size" in reason
    ok, reason = openkda.supports(**base(k=torch.randn(B, T, H, K + 1)))
    assert not ok and "k.shape" in reason
    ok, reason = openkda.supports(**base(cp_context=object()))
    assert not ok and "cp_context" in reason
    ok, reason = openkda.supports(q=torch.randn(B, T, H, K))
    assert not ok and "missing" in reason


def test_binding_rejects_unknown_names():
    from openkda import _C

    q = torch.randn(1, 2, 1, 4)
    with pytest.raises(ValueError, match="unknown tensor argument 'qq'"):
        _C.gate_fwd_workspace_bytes({"qq": q}, {})
    with pytest.raises(ValueError, match="unknown option 'lowerbound'"):
        _C.gate_fwd_workspace_bytes({"g": q}, {"lowerbound": -1.0})
    with pytest.raises(ValueError, match="precision = 'f16'"):
        _C.chunk_fwd_workspace_bytes({}, {"precision": "f16"})
    with pytest.raises(ValueError, match="expected a DLPack tensor"):
        _C.gate_fwd_workspace_bytes({"g": [1.0, 2.0]}, {})
    with pytest.raises(ValueError, match="fused_kda_gate: a int key; expected a str"):
        _C.gate_fwd_workspace_bytes({1: q}, {})
    with pytest.raises(ValueError, match="chunk_kda: a bytes key; expected a str"):
        _C.chunk_fwd_workspace_bytes({}, {b"scale": 1.0})


def _small_chunk_tensors(T=70, H=2, K=16):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, T, H, K, generator=gen) for _ in range(3))
    g = -torch.rand(1, T, H, K, generator=gen)
    beta = torch.rand(1, T, H, generator=gen)
    return dict(q=q, k=k, v=v, g=g, beta=beta, o=torch.full_like(v, float("nan")))


def test_binding_run_allocates_what_workspace_bytes_reports():
    """<op>_run: one call validates, asks for exactly workspace_bytes and runs; same o as the
    two-call path."""
    from openkda import _C

    opts = dict(scale=0.25)
    two = _small_chunk_tensors()
    nbytes = _C.chunk_fwd_workspace_bytes(two, opts)
    assert nbytes > 0
    _C.chunk_fwd(two, opts, torch.empty(nbytes, dtype=torch.uint8), 0)
    one = _small_chunk_tensors()
    seen = []

    def allocate(n):
        seen.append(n)
        return torch.empty(n, dtype=torch.uint8)

    _C.chunk_fwd_run(one, opts, allocate, 0)
    assert seen == [nbytes]
    assert torch.equal(one["o"], two["o"]) and not one["o"].isnan().any()


def test_binding_run_errors():
    from openkda import _C

    opts = dict(scale=0.25)
    seen = []
    bad = _small_chunk_tensors()
    bad["beta"] = bad["beta"][..., :1].contiguous()
    with pytest.raises(ValueError, match="beta"):  # invalid arguments: no allocation
        _C.chunk_fwd_run(bad, opts, lambda n: seen.append(n), 0)
    assert seen == []
    with pytest.raises(ValueError, match="workspace"):  # a buffer smaller than asked
        _C.chunk_fwd_run(_small_chunk_tensors(), opts,
                         lambda n: torch.empty(n - 16, dtype=torch.uint8), 0)

    def failing(n):
        raise RuntimeError("allocation failed")

    with pytest.raises(RuntimeError, match="allocation failed"):
        _C.chunk_fwd_run(_small_chunk_tensors(), opts, failing, 0)
    with pytest.raises(ValueError, match=r"allocate\(\d+\) returned None"):
        _C.chunk_fwd_run(_small_chunk_tensors(), opts, lambda n: None, 0)
    with pytest.raises(ValueError, match="workspace: a int; expected a DLPack tensor"):
        _C.chunk_fwd_run(_small_chunk_tensors(), opts, lambda n: n, 0)
    # A stride-0 view claims n bytes over one: rejected, not read as n bytes.
    with pytest.raises(ValueError, match="workspace: a strided view; expected a contiguous"):
        _C.chunk_fwd_run(_small_chunk_tensors(), opts,
                         lambda n: torch.empty(1, dtype=torch.uint8).expand(n), 0)


def test_ops_pass_dlpack_capsules(monkeypatch):
    """run_core hands the binding DLPack capsules (torch.utils.dlpack.to_dlpack), never tensors:
    the binding would call the Python Tensor.__dlpack__ of each, the largest share of the host
    time per call. Every op still runs with __dlpack__ disabled, with the same results."""
    from openkda import _C

    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 33, 2, 16, generator=gen) for _ in range(3))
    g = -torch.rand(1, 33, 2, 16, generator=gen)
    beta = torch.rand(1, 33, 2, generator=gen)
    h0 = torch.randn(1, 2, 16, 16, generator=gen)
    want_o, want_ht = openkda.chunk_kda(q, k, v, g, beta, initial_state=h0,
                                        output_final_state=True)
    want_r = openkda.fused_recurrent_kda(q, k, v, g, beta, initial_state=h0,
                                         output_final_state=True)
    seen = []
    real_run = _C.chunk_fwd_run

    def spy(tensors, options, allocate, stream):
        seen.extend(type(t).__name__ for t in tensors.values() if t is not None)
        return real_run(tensors, options, allocate, stream)

    def refuse(self, *args, **kwargs):
        raise AssertionError("Tensor.__dlpack__ called")

    monkeypatch.setattr(_C, "chunk_fwd_run", spy)
    monkeypatch.setattr(torch.Tensor, "__dlpack__", refuse)
    o, ht = openkda.chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    r = openkda.fused_recurrent_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    assert seen and set(seen) == {"PyCapsule"}
    assert torch.equal(o, want_o) and torch.equal(ht, want_ht)
    assert all(torch.equal(a, b) for a, b in zip(r, want_r))


@pytest.mark.parametrize("fn", ["chunk", "recurrent"])
def test_bad_scale_names_the_argument(fn):
    q = torch.randn(1, 4, 1, 8)
    v = torch.randn(1, 4, 1, 8)
    g = -torch.rand(1, 4, 1, 8)
    beta = torch.rand(1, 4, 1)
    call = openkda.chunk_kda if fn == "chunk" else openkda.fused_recurrent_kda
    with pytest.raises(ValueError, match="scale = 'a'; expected a float"):
        call(q, q, v, g, beta, scale="a")
