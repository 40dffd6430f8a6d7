"""OpenKDA: Kimi Delta Attention in C++/CUDA, a drop-in for ``fla.ops.kda`` (FLA 0.6.0).

Public API (FLA 0.6.0 signatures):
    chunk_kda, fused_recurrent_kda, fused_recurrent_kda_fwd,
    fused_kda_gate, naive_kda_gate, naive_kda_lowerbound_gate
Extras:
    supports(**chunk_kda_kwargs) -> (ok, reason)
    build_config() -> {'cuda': bool, 'cuda_archs': str, 'version': str}
    cpu_precision("f32" | "f64")   context manager for the CPU backend's precision
                                   (default from the environment variable OPENKDA_CPU_PRECISION)

Custom ops live under ``torch.ops.openkda`` (chunk_fwd, chunk_bwd, recurrent_fwd, gate_fwd,
gate_bwd).
"""

from . import _ops  # noqa: F401  (registers torch.ops.openkda.*)
from ._config import build_config, cpu_precision, get_cpu_precision
from ._support import supports
from .chunk import chunk_kda
from .fused_recurrent import fused_recurrent_kda, fused_recurrent_kda_fwd
from .gate import fused_kda_gate, naive_kda_gate, naive_kda_lowerbound_gate


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("openkda")
    except Exception:  # not installed as a distribution (e.g. a source tree on sys.path)
        return build_config().get("version", "0.0.0") or "0.0.0"


__version__ = _version()

__all__ = [
    "__version__",
    "build_config",
    "chunk_kda",
    "cpu_precision",
    "fused_kda_gate",
    "fused_recurrent_kda",
    "fused_recurrent_kda_fwd",
    "get_cpu_precision",
    "naive_kda_gate",
    "naive_kda_lowerbound_gate",
    "supports",
]
