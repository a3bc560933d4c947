"""W4A4 granularity chosen per layer from the GPU's tensor-core / CUDA-core ratio ρ (the APEX4
study's indicator): the C++ planner of include/nibble/quant_algorithms.h."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import _C, _arrays


def tensor_core_ratio(device: Any = "cuda") -> int:
    """ρ of a CUDA device ("cuda", "cuda:1", a torch.device) or of a compute capability
    (major, minor): int4 tensor-core (int8 where there is no int4 MMA) over f32 CUDA-core
    throughput per SM and clock — 64 (sm_80), 16 (sm_86/87), 8 (sm_89), 32 (sm_90); 0 if
    unknown."""
    if isinstance(device, tuple):
        return _C.tensor_core_ratio(int(device[0]), int(device[1]))
    kind, index = _arrays.parse_device(device)
    if kind != "cuda":
        raise _C.InvalidArgumentError(
            f"nibble::tensor_core_ratio: argument 'device' must be a CUDA device or a compute "
            f"capability (major, minor), got {device!r}")
    info = _C.cuda_device_info(index)
    return _C.tensor_core_ratio(info["cc_major"], info["cc_minor"])


def w4a4_group_time_factor(rho: int) -> float:
    """Modelled time of a w4a4_g128 layer over w4a4_pc at ratio ρ: 1 + ρ/64 (H100, ρ = 32:
    measured 1.46–1.59 at M ≥ 1024)."""
    return _C.w4a4_group_time_factor(int(rho))


def weight_quantization_error(w, format: str, input_mean_square=None) -> float:
    """‖(W − Ŵ)·D^½‖²_F / ‖W·D^½‖²_F for W (N, K) f32/f16/bf16 on the CPU quantized to the
    weight format (or linear format) ``format`` by round to nearest, D = diag of the layer's
    input mean squares (K float32 values; None: plain weight error)."""
    from .formats import to_weight_format
    ms = None
    if input_mean_square is not None:
        import numpy as np
        ms = np.ascontiguousarray(_arrays.to_numpy(input_mean_square), dtype=np.float32)
    return _C.weight_quantization_error(_arrays.arg(w), to_weight_format(format).name,
                                        None if ms is None else _arrays.arg(ms))


@dataclasses.dataclass(frozen=True)
class GranularityPlan:
    """The planner's result: ``formats`` maps each layer name to "w4a4_pc" or "w4a4_g128";
    ``time_vs_per_channel`` is the modelled time over an all-per-channel model; ``error`` the
    summed per-layer error; ``text`` explains every choice."""

    rho: int
    budget: float
    formats: Dict[str, str]
    time_vs_per_channel: float
    error: float
    group_factor: float
    text: str

    def __str__(self) -> str:
        return self.text


def plan_w4a4_granularity(layers: Sequence[Tuple[str, int, int, float, float]], rho: int,
                          budget: float = 0.1) -> GranularityPlan:
    """Mixed-granularity W4A4: ``layers`` are (name, n, k, error_per_channel, error_group).
    Every layer starts per channel; layers switch to g128 in decreasing order of error gain per
    modelled extra time (n·k·(w4a4_group_time_factor(ρ) − 1)) while the model's time stays
    within (1 + budget) × all-per-channel. A high ρ leaves fewer layers group-wise."""
    rows: List[Tuple[str, int, int, float, float]] = [
        (str(n), int(a), int(b), float(e1), float(e2)) for n, a, b, e1, e2 in layers]
    choices, time_ratio, error, factor, text = _C.plan_w4a4_granularity(rows, int(rho),
                                                                        float(budget))
    formats = {name: "w4a4_g128" if group else "w4a4_pc" for name, group, _, _ in choices}
    return GranularityPlan(int(rho), float(budget), formats, time_ratio, error, factor, text)
