"""fused_recurrent_kda (decode / reference recurrence) and the serving entry point
fused_recurrent_kda_fwd (state pool, speculative decoding), signature-compatible with FLA 0.6.0."""

from __future__ import annotations

import torch

from . import _ops
from ._config import get_cpu_precision, state_dtype
from .chunk import _check_varlen, _deprecated_state_layout

__all__ = ["fused_recurrent_kda", "fused_recurrent_kda_fwd"]


def fused_recurrent_kda_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    initial_state: torch.Tensor | None = None,
    scale: float | None = None,
    output_final_state: bool = False,
    inplace_final_state: bool = True,
    state_v_first: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    ssm_state_indices: torch.Tensor | None = None,
    num_accepted_tokens: torch.Tensor | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    lower_bound: float | None = None,
    out: torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Recurrent KDA forward, FLA's serving entry point (vLLM-style state pool). Forward only.

    =========================  ==========================================  ===================
    argument                   shape                                       dtype
    =========================  ==========================================  ===================
    ``q``, ``k``               ``[B, T, H, K]``                            any float
    ``v``                      ``[B, T, HV, V]``                           any float
    ``g``                      ``[B, T, HV, K]``                           any float
    ``beta``                   ``[B, T, HV]`` or headwise ``[B, T, HV, V]``  any float
    ``A_log``, ``dt_bias``     ``HV`` and ``[HV * K]`` elements            any float (f32 in FLA)
    ``initial_state``          ``[N, HV, K, V]``; with ``ssm_state_indices``  any float
                               a pool ``[num_slots, HV, K, V]``
    ``ssm_state_indices``      ``[N]`` or ``[N, max_tokens]``              i32 | i64
    ``num_accepted_tokens``    ``[N]`` (with ``ssm_state_indices``)        i32 | i64
    ``out``                    ``[B, T, HV, V]`` output buffer             any float
    =========================  ==========================================  ===================

    (``[.., V, K]`` state layouts with ``state_v_first``.)

    * ``inplace_final_state=True`` (default, as in FLA): the states are written into
      ``initial_state``: the final state of sequence ``n`` into ``initial_state[n]``, or, with
      ``ssm_state_indices``, the state after token ``t`` into pool slot
      ``ssm_state_indices[n, t]`` (1-D indices: slot ``ssm_state_indices[n]``, one token per
      sequence). Slots that are not indexed are never touched. The returned final state is
      ``initial_state`` itself.
    * otherwise, with ``output_final_state``: a new f32 tensor ``[N, HV, K, V]``, or, with
      ``ssm_state_indices``, the state after every token ``[B * T, HV, K, V]``.
    * the initial state of sequence ``n`` is ``initial_state[n]``, or pool slot
      ``ssm_state_indices[n, num_accepted_tokens[n] - 1]`` (``[n, 0]`` without
      ``num_accepted_tokens``).

    Returns ``(o, final_state)``: ``o`` is ``out`` when given, else a new tensor in v's dtype.
    Inputs are made contiguous; a non-contiguous ``out`` or state pool is updated through a
    contiguous copy (correct, but it copies the whole pool: pass contiguous buffers).
    With ``use_gate_in_kernel``, ``A_log=None`` and no ``lower_bound`` the gate uses
    ``exp(A_log) = e``, as FLA's kernel does.
    """
    _ops._check_chunk_ranks("fused_recurrent_kda", q, k, v, cu_seqlens)
    scale = _ops._resolve_scale("fused_recurrent_kda", scale, k.shape[-1])
    B, T, _, K = k.shape
    HV, V = v.shape[2], v.shape[3]
    N = _ops._num_seqs(q, cu_seqlens)
    precision = get_cpu_precision()

    if out is None:
        # Zero-filled like FLA's: rows past cu_seqlens[-1] (padding) read as 0.
        out = torch.zeros_like(v, memory_format=torch.contiguous_format)
    o = out
    if inplace_final_state:
        final_state = initial_state
        buffer = None
    elif output_final_state:
        rows = B * T if ssm_state_indices is not None else N
        shape = (rows, HV, V, K) if state_v_first else (rows, HV, K, V)
        final_state = q.new_empty(shape, dtype=state_dtype(q.device, precision))
        buffer = final_state
    else:
        final_state = buffer = None

    # The op (fake tensors, tracing) when anything needs it, else its implementation.
    tensors = (q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, ssm_state_indices,
               num_accepted_tokens, o, buffer)
    forward = _ops.recurrent_fwd if _ops.needs_dispatch(*tensors) else _ops._recurrent_fwd
    forward(*tensors, **_ops.kernel_options(
        "fused_recurrent_kda", use_qk_l2norm_in_kernel, use_gate_in_kernel,
        use_beta_sigmoid_in_kernel, allow_neg_eigval, lower_bound, scale=scale,
        state_v_first=bool(state_v_first), inplace_final_state=bool(inplace_final_state),
        precision=precision))
    return o, final_state


def fused_recurrent_kda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    scale: float | None = None,
    initial_state: torch.Tensor = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    lower_bound: float | None = None,
    state_v_first: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Kimi Delta Attention, token-by-token recurrence (forward only), FLA 0.6.0 compatible.

    ==========================  =====================================  ==========================
    argument                    shape                                  dtype
    ==========================  =====================================  ==========================
    ``q``, ``k``                ``[B, T, H, K]``                        any float
    ``v``                       ``[B, T, HV, V]``, ``HV % H == 0``      any float
    ``g``                       ``[B, T, HV, K]``                       any float
    ``beta``                    ``[B, T, HV]`` or ``[B, T, HV, V]``     any float
    ``A_log``                   ``HV`` elements                         any float (f32 in FLA)
    ``dt_bias``                 ``[HV * K]``                            any float (f32 in FLA)
    ``initial_state``           ``[N, HV, K, V]`` (``[N, HV, V, K]``)   any float
    ``cu_seqlens``              ``[N + 1]`` (requires ``B == 1``)       i64 | i32
    ==========================  =====================================  ==========================

    Flags as in :func:`openkda.chunk_kda`. With ``use_gate_in_kernel``, ``A_log=None`` and no
    ``lower_bound``, the gate uses ``exp(A_log) = e`` (FLA's behaviour). Only the deprecated
    ``transpose_state_layout`` is read from ``**kwargs``.

    Returns:
        ``(o, final_state)``: ``o`` ``[B, T, HV, V]`` in v's dtype; ``final_state``
        ``[N, HV, K, V]`` (``[N, HV, V, K]``) f32, or None when not requested.

    Inputs are made contiguous (a copy for non-contiguous ones). The outputs carry no gradient.
    """
    state_v_first = _deprecated_state_layout(kwargs, state_v_first)
    _check_varlen(q, initial_state, cu_seqlens)
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        raise ValueError("`allow_neg_eigval=True` requires `use_beta_sigmoid_in_kernel=True`.")
    return fused_recurrent_kda_fwd(
        q=q,
        k=k,
        v=v,
        g=g,
        beta=beta,
        A_log=A_log,
        dt_bias=dt_bias,
        scale=scale,
        initial_state=initial_state,
        inplace_final_state=False,
        output_final_state=output_final_state,
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        use_gate_in_kernel=use_gate_in_kernel,
        use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
        allow_neg_eigval=allow_neg_eigval,
        lower_bound=lower_bound,
        cu_seqlens=cu_seqlens,
        state_v_first=state_v_first,
    )
