"""chunk_kda: the training and prefill path, signature-compatible with FLA 0.6.0."""

from __future__ import annotations

import warnings
from typing import Any

import torch

from . import _ops
from ._config import get_cpu_precision

__all__ = ["chunk_kda"]

# FLA's FLACPContext; only None is accepted here (context parallel is not implemented yet).
FLACPContext = Any


def _deprecated_state_layout(kwargs: dict, state_v_first: bool, stacklevel: int = 3) -> bool:
    """FLA's handling of the deprecated ``transpose_state_layout`` keyword."""
    if "transpose_state_layout" in kwargs:
        if state_v_first:
            raise ValueError(
                "Cannot pass both `state_v_first` and the deprecated `transpose_state_layout`.")
        warnings.warn(
            "`transpose_state_layout` is deprecated and renamed to `state_v_first`.",
            DeprecationWarning,
            stacklevel=stacklevel,
        )
        state_v_first = kwargs.pop("transpose_state_layout")
    return state_v_first


def _check_varlen(q: torch.Tensor, initial_state, cu_seqlens) -> None:
    """FLA's varlen ValueErrors (same wording)."""
    if cu_seqlens is None:
        return
    if q.shape[0] != 1:
        raise ValueError(
            f"The batch size is expected to be 1 rather than {q.shape[0]} when using `cu_seqlens`."
            f"Please flatten variable-length inputs before processing.",
        )
    if initial_state is not None and initial_state.shape[0] != len(cu_seqlens) - 1:
        raise ValueError(
            f"The number of initial states is expected to be equal to the number of input "
            f"sequences, i.e., {len(cu_seqlens) - 1} rather than {initial_state.shape[0]}.",
        )


def _check_fla_args(q, initial_state, cu_seqlens, cp_context, kwargs, use_gate_in_kernel,
                    lower_bound, safe_gate, allow_neg_eigval, use_beta_sigmoid_in_kernel) -> None:
    """FLA 0.6.0's own argument checks, in its order and wording (chunk_kda and supports())."""
    if cp_context is not None:
        raise NotImplementedError(
            "chunk_kda: cp_context: context parallel is not supported by OpenKDA yet; "
            "expected cp_context=None")
    _check_varlen(q, initial_state, cu_seqlens)
    if use_gate_in_kernel and kwargs.get("A_log") is None and lower_bound is None:
        raise ValueError(
            "`A_log` must be provided when `use_gate_in_kernel=True` and `lower_bound` is "
            "not set.")
    chunk_size = kwargs.get("chunk_size", 64)
    if chunk_size not in (32, 64):
        raise ValueError(f"`chunk_size` must be either 32 or 64 for KDA, got {chunk_size}.")
    if safe_gate and use_gate_in_kernel:
        if lower_bound is None:
            raise ValueError(
                "`lower_bound` must be specified when `safe_gate=True` and "
                "`use_gate_in_kernel=True`.")
        if not (-5 <= lower_bound < 0):
            raise ValueError(f"`lower_bound` must be in the safe range [-5, 0), got {lower_bound}.")
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        raise ValueError("`allow_neg_eigval=True` requires `use_beta_sigmoid_in_kernel=True`.")


def _num_chunks(T: int, chunk_size: int, cu_seqlens, cu_seqlens_cpu) -> int:
    """Chunks per batch row of ``h`` (reads cu_seqlens on the host; one sync if only on device)."""
    if cu_seqlens is None:
        return (T + chunk_size - 1) // chunk_size
    cu = cu_seqlens_cpu if cu_seqlens_cpu is not None else cu_seqlens.cpu()
    lens = (cu[1:] - cu[:-1]).to(torch.int64)
    return int(((lens + chunk_size - 1) // chunk_size).sum())


@torch.compiler.disable
def chunk_kda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    safe_gate: bool = False,
    lower_bound: float | None = None,
    disable_recompute: bool = False,
    return_intermediate_states: bool = False,
    state_v_first: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    cu_seqlens_cpu: torch.LongTensor | None = None,
    cp_context: FLACPContext | None = None,
    use_graph: bool = False,
    max_num_seqs: int | None = None,
    **kwargs,
):
    r"""Kimi Delta Attention, chunked algorithm (forward and backward), FLA 0.6.0 compatible.

    Per value head, with state ``S`` ``[K, V]`` and per token ``t``:
    ``S = Diag(exp(g_t)) S``; ``S = S + beta_t k_t (v_t - S^T k_t)^T``; ``o_t = scale * S^T q_t``.

    ==========================  =====================================  ==========================
    argument                    shape                                  dtype
    ==========================  =====================================  ==========================
    ``q``, ``k``                ``[B, T, H, K]``, ``K <= 256``          f16 | bf16 | f32 | f64
    ``v``                       ``[B, T, HV, V]``, ``HV % H == 0``      f16 | bf16 | f32 | f64
    ``g``                       ``[B, T, HV, K]``                       any float
    ``beta``                    ``[B, T, HV]``                          any float
    ``initial_state``           ``[N, HV, K, V]`` (``[N, HV, V, K]``)   f32 | bf16 | f64
    ``cu_seqlens``              ``[N + 1]`` (requires ``B == 1``)       i64 | i32
    ``A_log`` (kwargs)          ``HV`` elements (any shape)             any float (f32 in FLA)
    ``dt_bias`` (kwargs)        ``[HV * K]``                            any float (f32 in FLA)
    ==========================  =====================================  ==========================

    Args:
        scale: default ``K ** -0.5``.
        output_final_state: also return the state after the last token.
        use_qk_l2norm_in_kernel: ``x / sqrt(sum(x^2) + 1e-6)`` on q and k (over K).
        use_gate_in_kernel: ``g`` is the raw gate; the log-decay is
            ``-exp(A_log) * softplus(g + dt_bias)`` or, when ``lower_bound`` is set,
            ``lower_bound * sigmoid(exp(A_log) * (g + dt_bias))`` (``exp(A_log) -> 1`` when
            ``A_log`` is None). ``A_log`` is required unless ``lower_bound`` is set.
        use_beta_sigmoid_in_kernel: ``beta`` holds logits; ``beta <- sigmoid(beta)``.
        allow_neg_eigval: ``beta <- 2 * sigmoid(beta)``; requires use_beta_sigmoid_in_kernel.
        safe_gate: bounded-gate path; with use_gate_in_kernel requires ``lower_bound`` in
            ``[-5, 0)``.
        lower_bound: see use_gate_in_kernel; ignored for pre-computed gates.
        disable_recompute: accepted for compatibility; the backward always recomputes the forward
            intermediates (the result is the same).
        return_intermediate_states: return ``(o, final_state, h)`` with ``h``
            ``[B, NT, HV, K, V]`` (``[B, NT, HV, V, K]`` with state_v_first) in k's dtype: the
            state at the start of every chunk (NT: chunks per row; with ``cu_seqlens`` all chunks of
            all sequences). Only under ``torch.inference_mode()`` (as in FLA).
        state_v_first: state tensors use the ``[..., V, K]`` layout.
        cu_seqlens: cumulative sequence lengths (varlen, FlashAttention style).
        cu_seqlens_cpu: optional host copy of ``cu_seqlens`` (used to size ``h`` without a sync).
        cp_context: context parallel is not supported yet: anything but None raises
            NotImplementedError.
        use_graph, max_num_seqs: accepted for compatibility (the GPU path never syncs the host
            on ``cu_seqlens``, so graph capture needs no special mode; the one exception is
            sizing ``h`` for ``return_intermediate_states`` with varlen and no
            ``cu_seqlens_cpu``, as in FLA).
        **kwargs: ``A_log``, ``dt_bias`` (read only with use_gate_in_kernel), ``chunk_size``
            (32 or 64, default 64: the chunk of the ``h`` snapshots; the CUDA kernels always
            work in 32-token chunks), deprecated ``transpose_state_layout``. Other keys are ignored,
            as in FLA.

    Returns:
        ``(o, final_state)``: ``o`` ``[B, T, HV, V]`` in q's dtype; ``final_state``
        ``[N, HV, K, V]`` (``[N, HV, V, K]``) f32 or None when not requested. With
        ``return_intermediate_states``: ``(o, final_state, h)``.

    Every tensor is made contiguous before the core runs (a copy for non-contiguous inputs).
    Gradients flow to q, k, v, g, beta, A_log, dt_bias and initial_state; ``g``'s gradient is
    w.r.t. the raw gate in kernel-gate mode, ``beta``'s w.r.t. the logits with the in-kernel
    sigmoid. The CPU backend runs in fp32 (``openkda.cpu_precision("f64")`` for fp64).

    Raises:
        ValueError: invalid shapes, dtypes, devices or option combinations (the message names the
            argument, the value seen and the values expected).
        NotImplementedError: ``cp_context``, or a device/configuration without a kernel yet.
    """
    if "transpose_state_layout" in kwargs:
        # stacklevel 4: the warning names the caller's line (torch.compiler.disable adds a frame).
        state_v_first = _deprecated_state_layout(kwargs, state_v_first, stacklevel=4)

    _check_fla_args(q, initial_state, cu_seqlens, cp_context, kwargs, use_gate_in_kernel,
                    lower_bound, safe_gate, allow_neg_eigval, use_beta_sigmoid_in_kernel)
    A_log, dt_bias = None, None
    if use_gate_in_kernel:
        A_log, dt_bias = kwargs.get("A_log"), kwargs.get("dt_bias")
    chunk_size = kwargs.pop("chunk_size", 64)

    if return_intermediate_states:
        assert torch.is_inference_mode_enabled(), \
            "return_intermediate_states is only allowed in inference mode"
        assert disable_recompute is False, \
            "return_intermediate_states must be used with disable_recompute=False"

    if use_graph and cu_seqlens is not None and max_num_seqs is not None:
        assert cu_seqlens.shape[0] - 1 == max_num_seqs, (
            f"cu_seqlens must be padded with zero-length tail sequences to exactly "
            f"max_num_seqs + 1 entries, got {cu_seqlens.shape[0] - 1} sequences "
            f"with max_num_seqs={max_num_seqs}")

    if torch.is_grad_enabled() and q.is_cuda and any(
            t is not None and t.requires_grad
            for t in (q, k, v, g, beta, initial_state, A_log, dt_bias)):
        # Fail before the forward rather than at backward time. Remove when the CUDA backward
        # (the core's ChunkBwdArgs on CUDA) lands.
        raise NotImplementedError(
            "chunk_kda: inputs on cuda require grad, but the CUDA backward of chunk_kda is not "
            "built yet; expected CPU tensors for training, or torch.no_grad() / "
            "torch.inference_mode() for the CUDA forward")

    scale = _ops._resolve_scale("chunk_kda", scale, q.shape[-1])
    num_h_chunks = -1
    if return_intermediate_states:
        num_h_chunks = _num_chunks(q.shape[1], chunk_size, cu_seqlens, cu_seqlens_cpu)

    options = _ops.kernel_options(
        "chunk_kda", use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel,
        allow_neg_eigval, lower_bound, scale=scale, safe_gate=bool(safe_gate),
        chunk_size=int(chunk_size), state_v_first=bool(state_v_first),
        precision=get_cpu_precision(), algorithm="chunked")
    # The op (autograd, fake tensors, tracing) when anything needs it, else its computation
    # directly (no dispatcher, no placeholder outputs).
    if _ops.needs_dispatch(q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens):
        o, final_state, h = _ops.chunk_fwd(
            q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens,
            output_final_state=bool(output_final_state), num_h_chunks=num_h_chunks, **options)
    else:
        o, final_state, h = _ops.chunk_fwd_direct(
            q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, options,
            bool(output_final_state), num_h_chunks)
    final_state = final_state if output_final_state else None
    if return_intermediate_states:
        return o, final_state, h
    return o, final_state
