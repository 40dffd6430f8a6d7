"""KDA gate activations: the fused op (autograd-enabled) and the torch references, with FLA 0.6.0's
signatures (``fla.ops.kda.gate``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import _ops

__all__ = ["fused_kda_gate", "naive_kda_gate", "naive_kda_lowerbound_gate"]


def naive_kda_gate(
    g: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor | None = None,
    output_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Torch reference of the softplus gate: ``-exp(A_log[h]) * softplus(g + dt_bias[h, :])``.

    g ``[..., H, K]`` any float; A_log ``H`` elements; dt_bias ``[H * K]`` or None.
    Computed in fp32 (softplus with threshold 20, as ``F.softplus``); returns ``[..., H, K]`` in
    ``output_dtype``.
    """
    H, K = g.shape[-2:]
    x = g.float()
    if dt_bias is not None:
        x = x + dt_bias.float().reshape(H, K)
    a = A_log.float().reshape(H, 1).exp()
    return (-a * F.softplus(x)).to(output_dtype)


def naive_kda_lowerbound_gate(
    g: torch.Tensor,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    lower_bound: float = -5.0,
    output_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Torch reference of the lower-bound gate:
    ``lower_bound * sigmoid(exp(A_log[h]) * (g + dt_bias[h, :]))`` (``exp(A_log) -> 1`` when
    A_log is None).

    g ``[..., H, K]`` any float; A_log ``H`` elements or None; dt_bias ``[H * K]`` or None.
    Computed in fp32; returns ``[..., H, K]`` in ``output_dtype``.
    """
    H, K = g.shape[-2:]
    x = g.float()
    if dt_bias is not None:
        x = x + dt_bias.float().reshape(H, K)
    if A_log is not None:
        x = A_log.float().reshape(H, 1).exp() * x
    return (lower_bound * torch.sigmoid(x)).to(output_dtype)


@torch.compiler.disable
def fused_kda_gate(
    g: torch.Tensor,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    lower_bound: float | None = None,
    output_dtype: torch.dtype = torch.float32,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Fused KDA gate with autograd (gradients for g, A_log and dt_bias).

    ==============  ====================  ===========================================
    argument        shape                 dtype
    ==============  ====================  ===========================================
    ``g``           ``[..., HV, K]``      any float (raw gate)
    ``A_log``       ``HV`` elements       any float (required unless ``lower_bound`` is set)
    ``dt_bias``     ``[HV * K]``          any float
    ==============  ====================  ===========================================

    Returns ``y`` ``[..., HV, K]`` in ``output_dtype`` (default f32):
    ``-exp(A_log) * softplus(g + dt_bias)``, or with ``lower_bound``
    ``lower_bound * sigmoid(exp(A_log) * (g + dt_bias))`` (``exp(A_log) -> 1`` when A_log is None).
    Gradients: dg in g's dtype, dA_log in A_log's shape and dtype, ddt_bias in dt_bias's shape and
    dtype. Inputs are made contiguous.

    Raises:
        ValueError: A_log missing without lower_bound, or shape/dtype/device mismatches.
    """
    if output_dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        raise ValueError(f"fused_kda_gate: output_dtype = {output_dtype!r}; expected one of "
                         "torch.float16, torch.bfloat16, torch.float32, torch.float64")
    # The op (autograd, fake tensors, tracing) when anything needs it, else its implementation.
    forward = _ops.gate_fwd if _ops.needs_dispatch(g, A_log, dt_bias) else _ops._gate_fwd
    return forward(
        g, A_log, dt_bias,
        lower_bound=_ops._resolve_lower_bound("fused_kda_gate", lower_bound),
        output_dtype=output_dtype,
    )
