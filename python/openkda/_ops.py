"""torch.library custom ops over the C++ core (namespace ``openkda``).

=====================  =====================================================================
op                     role
=====================  =====================================================================
openkda::chunk_fwd     chunk_kda forward -> (o, final_state, h); autograd via chunk_bwd
openkda::chunk_bwd     chunk_kda backward -> (dq, dk, dv, dg, dbeta, dA_log, ddt_bias, dh0)
openkda::recurrent_fwd fused_recurrent_kda forward; writes o, final_state and (in place) the
                       state pool; returns nothing
openkda::gate_fwd      fused_kda_gate forward -> y; autograd via gate_bwd
openkda::gate_bwd      fused_kda_gate backward -> (dg, dA_log, ddt_bias)
=====================  =====================================================================

Custom ops cannot return None: outputs that were not requested come back as empty tensors
(``numel() == 0``) and the public wrappers map them back to None. The public wrappers call an
op's implementation (``chunk_fwd_direct``: ``_chunk_fwd`` without the placeholders;
``_recurrent_fwd``, ``_gate_fwd``) directly when ``needs_dispatch`` finds nothing that needs the
op (autograd, fake tensors, tracing, functorch, tensor subclasses): the same computation without
the dispatcher's host time. Each op allocates its outputs with torch and calls ``run_core``
(``_config.py``), which makes every tensor contiguous (``.detach().contiguous()``: a no-op for
contiguous tensors), allocates the workspace with torch and calls ``openkda._C`` on the current
CUDA stream (0 on CPU). Options are keyword-only arguments; ``setup_context`` reads inputs by
name.
"""

import inspect
from typing import Optional

import torch
from torch import Tensor
from torch.utils import _python_dispatch

from ._config import detached_contiguous, run_core, state_dtype

__all__ = ["chunk_fwd", "chunk_bwd", "recurrent_fwd", "gate_fwd", "gate_bwd", "needs_dispatch"]


def _empty(like: Tensor, dtype: Optional[torch.dtype] = None) -> Tensor:
    """The placeholder for an output that was not requested."""
    return like.new_empty(0, dtype=dtype or like.dtype)


def _state_shape(n: int, hv: int, k: int, v: int, v_first: bool) -> tuple:
    return (n, hv, v, k) if v_first else (n, hv, k, v)


def _resolve_scale(op: str, scale, K: int) -> float:
    """``scale`` as a float (default ``K ** -0.5``), or a ValueError that names it."""
    if scale is None:
        return K ** -0.5
    try:
        return float(scale)
    except (TypeError, ValueError):
        raise ValueError(f"{op}: scale = {scale!r}; expected a float or None") from None


def _resolve_lower_bound(op: str, lower_bound) -> Optional[float]:
    """``lower_bound`` as a float or None, or a ValueError that names it."""
    if lower_bound is None:
        return None
    try:
        return float(lower_bound)
    except (TypeError, ValueError):
        raise ValueError(f"{op}: lower_bound = {lower_bound!r}; expected a float or None") from None


def kernel_options(op: str, use_qk_l2norm_in_kernel, use_gate_in_kernel,
                   use_beta_sigmoid_in_kernel, allow_neg_eigval, lower_bound, **extra) -> dict:
    """The in-kernel options shared by chunk_fwd and recurrent_fwd, as the op schemas type them
    (FLA's callers pass truthy values and ints freely), and the op's own options ``extra``, in one
    dict (built on every call)."""
    return {
        "use_qk_l2norm_in_kernel": bool(use_qk_l2norm_in_kernel),
        "use_gate_in_kernel": bool(use_gate_in_kernel),
        "use_beta_sigmoid_in_kernel": bool(use_beta_sigmoid_in_kernel),
        "allow_neg_eigval": bool(allow_neg_eigval),
        "lower_bound": _resolve_lower_bound(op, lower_bound),
        **extra,
    }


def _num_seqs(q: Tensor, cu_seqlens: Optional[Tensor]) -> int:
    return q.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1


def _check_rank(op: str, name: str, t: Optional[Tensor], ndim: int, layout: str) -> None:
    """The core's rank message, raised before the shapes are used to allocate outputs."""
    if t is not None and t.dim() != ndim:
        raise ValueError(f"{op}: {name}: rank {t.dim()} {list(t.shape)}; expected rank {ndim} "
                         f"{layout}")


def _check_chunk_ranks(op: str, q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Optional[Tensor]):
    """The ranks of q, k, v and cu_seqlens; the usual all-right case returns after one test (this
    runs on every call's host path)."""
    if q.dim() == 4 and k.dim() == 4 and v.dim() == 4 and (
            cu_seqlens is None or cu_seqlens.dim() == 1):
        return
    _check_rank(op, "q", q, 4, "[B, T, H, K]")
    _check_rank(op, "k", k, 4, "[B, T, H, K]")
    _check_rank(op, "v", v, 4, "[B, T, HV, V]")
    _check_rank(op, "cu_seqlens", cu_seqlens, 1, "[N + 1]")


_PLAIN_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)


def needs_dispatch(*tensors: Optional[Tensor]) -> bool:
    """Whether a call must go through its torch.library op rather than the op's implementation:
    autograd will need the op's backward (grad mode on and an input requires grad), or something
    intercepts the dispatcher (torch.compile, a fake-tensor or tracing mode, a torch function mode,
    functorch transforms, tensor subclasses). A plain eager call skips the op: its dispatch costs
    ~12 us of host time per chunk_kda call (~30 % of it on a 2-core CI machine), and the
    implementation is exactly what the op runs. Under torch.compile (dynamo tracing a caller) it
    is always the op: the checks below are not traceable, and the compiled graph should hold the
    op."""
    if torch.compiler.is_compiling():
        return True
    if (torch._C._are_functorch_transforms_active()
            or _python_dispatch._get_current_dispatch_mode() is not None
            or torch._C._is_torch_function_mode_enabled()):
        return True
    grad = torch.is_grad_enabled()
    for t in tensors:
        if t is None:
            continue
        if type(t) not in _PLAIN_TENSOR_TYPES or (grad and t.requires_grad):
            return True
    return False


def _named(signature: inspect.Signature, inputs: tuple, keyword_only_inputs: dict) -> dict:
    """All arguments of one op call by name (what setup_context reads)."""
    bound = signature.bind(*inputs, **keyword_only_inputs)
    bound.apply_defaults()
    return dict(bound.arguments)


# ------------------------------------------------------------------------------------------------
# chunk_kda
# ------------------------------------------------------------------------------------------------

_CHUNK_OPTIONS = (
    "scale", "use_qk_l2norm_in_kernel", "use_gate_in_kernel", "use_beta_sigmoid_in_kernel",
    "allow_neg_eigval", "lower_bound", "safe_gate", "chunk_size", "state_v_first", "precision",
    "algorithm",
)


def _chunk_fwd(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
    A_log: Optional[Tensor], dt_bias: Optional[Tensor], initial_state: Optional[Tensor],
    cu_seqlens: Optional[Tensor],
    *,
    scale: float,
    output_final_state: bool = False,
    num_h_chunks: int = -1,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    lower_bound: Optional[float] = None,
    safe_gate: bool = False,
    chunk_size: int = 64,
    state_v_first: bool = False,
    precision: str = "f32",
    algorithm: str = "chunked",
) -> tuple[Tensor, Tensor, Tensor]:
    """chunk_kda forward.

    q, k ``[B, T, H, K]``; v ``[B, T, HV, V]``; g ``[B, T, HV, K]``; beta ``[B, T, HV]``;
    A_log HV elements; dt_bias ``[HV * K]``; initial_state ``[N, HV, K, V]`` (``[N, HV, V, K]``
    when state_v_first); cu_seqlens ``[N + 1]`` i32 | i64.
    Returns o ``[B, T, HV, V]`` (q's dtype), final_state ``[N, HV, K, V]`` f32 (f64 on CPU in f64
    precision; empty unless output_final_state) and h ``[B, num_h_chunks, HV, K, V]`` in k's dtype
    (empty when num_h_chunks < 0).
    """
    opts = locals()
    o, final_state, h = chunk_fwd_direct(
        q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens,
        {n: opts[n] for n in _CHUNK_OPTIONS}, output_final_state, num_h_chunks)
    return _placeholders(q, k, precision, o, final_state, h)


def chunk_fwd_direct(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
                     A_log: Optional[Tensor], dt_bias: Optional[Tensor],
                     initial_state: Optional[Tensor], cu_seqlens: Optional[Tensor], options: dict,
                     output_final_state: bool, num_h_chunks: int) -> tuple:
    """What ``_chunk_fwd`` computes, for the public wrapper's plain eager calls: ``options`` holds
    exactly the keys of ``_CHUNK_OPTIONS`` (as the op schema types them), and the outputs that were
    not requested come back as None instead of empty placeholders (no allocation for them).
    Returns ``(o, final_state or None, h or None)``."""
    _check_chunk_ranks("chunk_kda", q, k, v, cu_seqlens)
    o, final_state, h = _chunk_fwd_outputs(q, k, v, cu_seqlens, output_final_state, num_h_chunks,
                                           options["state_v_first"], options["precision"])
    run_core("chunk_fwd", q.device, dict(
        q=q, k=k, v=v, g=g, beta=beta, A_log=A_log, dt_bias=dt_bias, initial_state=initial_state,
        cu_seqlens=cu_seqlens, o=o, final_state=final_state, h=h), options)
    return o, final_state, h


def _placeholders(q: Tensor, k: Tensor, precision: str, o: Tensor, final_state, h) -> tuple:
    """The op's outputs: empty placeholders for the final_state and h that were not requested."""
    if final_state is None:
        final_state = _empty(q, state_dtype(q.device, precision))
    return o, final_state, _empty(k) if h is None else h


def _chunk_fwd_outputs(q, k, v, cu_seqlens, output_final_state: bool, num_h_chunks: int,
                       v_first: bool, precision: str) -> tuple:
    """o, and final_state and h when requested (else None)."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    o = q.new_empty((B, T, HV, V))
    final_state = h = None
    if output_final_state:
        final_state = q.new_empty(
            _state_shape(_num_seqs(q, cu_seqlens), HV, K, V, v_first),
            dtype=state_dtype(q.device, precision))
    if num_h_chunks >= 0:
        h = k.new_empty((B, num_h_chunks) + ((HV, V, K) if v_first else (HV, K, V)))
    return o, final_state, h


def _chunk_bwd(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
    A_log: Optional[Tensor], dt_bias: Optional[Tensor], initial_state: Optional[Tensor],
    cu_seqlens: Optional[Tensor], do: Tensor, dht: Optional[Tensor],
    *,
    scale: float,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    lower_bound: Optional[float] = None,
    safe_gate: bool = False,
    chunk_size: int = 64,
    state_v_first: bool = False,
    precision: str = "f32",
    algorithm: str = "chunked",
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """chunk_kda backward (recomputes the forward intermediates).

    do ``[B, T, HV, V]``; dht: state-shaped, may be None. Returns dq, dk ``[B, T, H, K]``,
    dv ``[B, T, HV, V]``, dg ``[B, T, HV, K]`` (w.r.t. the raw gate in kernel-gate mode), dbeta
    ``[B, T, HV]`` (w.r.t. the logits with in-kernel sigmoid), each in its input's dtype;
    dA_log (A_log's shape and dtype), ddt_bias ``[HV * K]`` (dt_bias's dtype) and dh0
    (state-shaped, f32, f64 on CPU in f64 precision) or empty tensors for absent inputs.
    """
    opts = locals()
    _check_chunk_ranks("chunk_kda_bwd", q, k, v, cu_seqlens)
    grads = _chunk_bwd_alloc(q, k, v, g, beta, A_log, dt_bias, initial_state, opts)
    dq, dk, dv, dg, dbeta, dA_log, ddt_bias, dh0 = grads
    tensors = dict(
        q=q, k=k, v=v, g=g, beta=beta, A_log=A_log, dt_bias=dt_bias, initial_state=initial_state,
        cu_seqlens=cu_seqlens, d_o=do, dht=dht,
        dq=dq, dk=dk, dv=dv, dg=dg, dbeta=dbeta,
        dA_log=dA_log if A_log is not None else None,
        ddt_bias=ddt_bias if dt_bias is not None else None,
        dh0=dh0 if initial_state is not None else None,
    )
    run_core("chunk_bwd", q.device, tensors, {n: opts[n] for n in _CHUNK_OPTIONS})
    return grads


def _param_grads(like, A_log, dt_bias):
    """dA_log (A_log's shape and dtype) and ddt_bias (flat [HV * K]); empty when not given."""
    dA_log = torch.empty_like(A_log, memory_format=torch.contiguous_format) \
        if A_log is not None else _empty(like, torch.float32)
    ddt_bias = dt_bias.new_empty(dt_bias.numel()) if dt_bias is not None \
        else _empty(like, torch.float32)
    return dA_log, ddt_bias


def _chunk_bwd_alloc(q, k, v, g, beta, A_log, dt_bias, initial_state, opts):
    sdt = state_dtype(q.device, opts["precision"])
    dA_log, ddt_bias = _param_grads(q, A_log, dt_bias)
    dh0 = initial_state.new_empty(initial_state.shape, dtype=sdt) if initial_state is not None \
        else _empty(q, sdt)
    return (
        q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), g.new_empty(g.shape),
        beta.new_empty(beta.shape), dA_log, ddt_bias, dh0,
    )


_CHUNK_FWD_SIG = inspect.signature(_chunk_fwd)
_CHUNK_BWD_SIG = inspect.signature(_chunk_bwd)
chunk_fwd = torch.library.custom_op("openkda::chunk_fwd", _chunk_fwd, mutates_args=())
chunk_bwd = torch.library.custom_op("openkda::chunk_bwd", _chunk_bwd, mutates_args=())


@chunk_fwd.register_fake
def _(q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, **opts):
    a = _named(_CHUNK_FWD_SIG, (q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens),
               opts)
    o, final_state, h = _chunk_fwd_outputs(q, k, v, cu_seqlens, a["output_final_state"],
                                           a["num_h_chunks"], a["state_v_first"], a["precision"])
    return _placeholders(q, k, a["precision"], o, final_state, h)


@chunk_bwd.register_fake
def _(q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, do, dht, **opts):
    full = _named(_CHUNK_BWD_SIG,
                  (q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, do, dht), opts)
    return _chunk_bwd_alloc(q, k, v, g, beta, A_log, dt_bias, initial_state, full)


def _chunk_setup_context(ctx, inputs, keyword_only_inputs, output):
    a = _named(_CHUNK_FWD_SIG, inputs, keyword_only_inputs)
    ctx.save_for_backward(a["q"], a["k"], a["v"], a["g"], a["beta"], a["A_log"], a["dt_bias"],
                          a["initial_state"], a["cu_seqlens"])
    ctx.options = {n: a[n] for n in _CHUNK_OPTIONS}
    ctx.output_final_state = a["output_final_state"]


def _chunk_backward(ctx, do, dht, dh):
    q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens = ctx.saved_tensors
    if not ctx.output_final_state:
        dht = None
    dq, dk, dv, dg, dbeta, dA_log, ddt_bias, dh0 = chunk_bwd(
        q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, do, dht, **ctx.options)
    return (
        dq, dk, dv, dg, dbeta,
        dA_log.view(A_log.shape) if A_log is not None else None,
        ddt_bias.view(dt_bias.shape) if dt_bias is not None else None,
        dh0.to(initial_state.dtype) if initial_state is not None else None,
        None,
    )


chunk_fwd.register_autograd(_chunk_backward, setup_context=_chunk_setup_context)


# ------------------------------------------------------------------------------------------------
# fused_recurrent_kda
# ------------------------------------------------------------------------------------------------

_RECURRENT_OPTIONS = (
    "scale", "use_qk_l2norm_in_kernel", "use_gate_in_kernel", "use_beta_sigmoid_in_kernel",
    "allow_neg_eigval", "lower_bound", "state_v_first", "inplace_final_state", "precision",
)


def _write_back(dst: Optional[Tensor], src: Optional[Tensor]) -> None:
    if dst is not None and src is not None and src.data_ptr() != dst.data_ptr():
        dst.copy_(src)


def _recurrent_fwd(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
    A_log: Optional[Tensor], dt_bias: Optional[Tensor], initial_state: Optional[Tensor],
    cu_seqlens: Optional[Tensor], ssm_state_indices: Optional[Tensor],
    num_accepted_tokens: Optional[Tensor], o: Tensor, final_state: Optional[Tensor],
    *,
    scale: float,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    lower_bound: Optional[float] = None,
    state_v_first: bool = False,
    inplace_final_state: bool = False,
    precision: str = "f32",
) -> None:
    """fused_recurrent_kda forward; writes ``o`` ``[B, T, HV, V]`` and, not in place,
    ``final_state`` (``[N, HV, K, V]``, or per token ``[B * T, HV, K, V]`` with
    ssm_state_indices), or, in place, the slots of ``initial_state`` (the pool). Buffers that are
    not contiguous are computed in a contiguous copy and copied back.
    """
    opts = locals()
    pool = None if initial_state is None else detached_contiguous(initial_state)
    o_c = o.contiguous()
    fs_c = final_state.contiguous() if final_state is not None else None
    tensors = dict(
        q=q, k=k, v=v, g=g, beta=beta, A_log=A_log, dt_bias=dt_bias, initial_state=pool,
        cu_seqlens=cu_seqlens, ssm_state_indices=ssm_state_indices,
        num_accepted_tokens=num_accepted_tokens, o=o_c, final_state=fs_c,
    )
    run_core("recurrent_fwd", q.device, tensors, {n: opts[n] for n in _RECURRENT_OPTIONS})
    _write_back(o, o_c)
    _write_back(final_state, fs_c)
    if inplace_final_state:
        _write_back(initial_state, pool)


recurrent_fwd = torch.library.custom_op(
    "openkda::recurrent_fwd", _recurrent_fwd, mutates_args=("initial_state", "o", "final_state"))


@recurrent_fwd.register_fake
def _(*args, **kwargs):
    return None


# ------------------------------------------------------------------------------------------------
# fused_kda_gate
# ------------------------------------------------------------------------------------------------

def _gate_fwd(
    g: Tensor, A_log: Optional[Tensor], dt_bias: Optional[Tensor],
    *,
    lower_bound: Optional[float] = None,
    output_dtype: torch.dtype = torch.float32,
) -> Tensor:
    """fused_kda_gate forward: g ``[..., HV, K]`` -> y ``[..., HV, K]`` in output_dtype."""
    y = g.new_empty(g.shape, dtype=output_dtype)
    run_core("gate_fwd", g.device,
             dict(g=g, A_log=A_log, dt_bias=dt_bias, y=y),
             dict(lower_bound=lower_bound))
    return y


_GATE_FWD_SIG = inspect.signature(_gate_fwd)
gate_fwd = torch.library.custom_op("openkda::gate_fwd", _gate_fwd, mutates_args=())


@gate_fwd.register_fake
def _(g, A_log, dt_bias, *, lower_bound=None, output_dtype=torch.float32):
    return g.new_empty(g.shape, dtype=output_dtype)


@torch.library.custom_op("openkda::gate_bwd", mutates_args=())
def gate_bwd(
    g: Tensor, A_log: Optional[Tensor], dt_bias: Optional[Tensor], dy: Tensor,
    *,
    lower_bound: Optional[float] = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """fused_kda_gate backward -> dg (g's shape and dtype), dA_log (A_log's shape and dtype),
    ddt_bias ``[HV * K]`` (dt_bias's dtype); empty tensors for absent A_log / dt_bias."""
    dg, dA_log, ddt_bias = _gate_bwd_alloc(g, A_log, dt_bias)
    run_core("gate_bwd", g.device,
             dict(g=g, A_log=A_log, dt_bias=dt_bias, dy=dy, dg=dg,
                  dA_log=dA_log if A_log is not None else None,
                  ddt_bias=ddt_bias if dt_bias is not None else None),
             dict(lower_bound=lower_bound))
    return dg, dA_log, ddt_bias


def _gate_bwd_alloc(g, A_log, dt_bias):
    dA_log, ddt_bias = _param_grads(g, A_log, dt_bias)
    return g.new_empty(g.shape), dA_log, ddt_bias


@gate_bwd.register_fake
def _(g, A_log, dt_bias, dy, *, lower_bound=None):
    return _gate_bwd_alloc(g, A_log, dt_bias)


def _gate_setup_context(ctx, inputs, keyword_only_inputs, output):
    a = _named(_GATE_FWD_SIG, inputs, keyword_only_inputs)
    ctx.save_for_backward(a["g"], a["A_log"], a["dt_bias"])
    ctx.lower_bound = a["lower_bound"]


def _gate_backward(ctx, dy):
    g, A_log, dt_bias = ctx.saved_tensors
    dg, dA_log, ddt_bias = gate_bwd(g, A_log, dt_bias, dy, lower_bound=ctx.lower_bound)
    return (
        dg,
        dA_log.view(A_log.shape) if A_log is not None else None,
        ddt_bias.view(dt_bias.shape) if dt_bias is not None else None,
    )


gate_fwd.register_autograd(_gate_backward, setup_context=_gate_setup_context)
