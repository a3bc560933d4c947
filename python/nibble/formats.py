"""The format catalogue (docs/formats.md), read from the C++ library.

A *weight format* (``w4_g128``, ``w4_g128_asym``, ``w8_pc``, ...) says how W[N,K] is
quantized; a *linear format* (``w4a8_g128``, ``w8a8``, ``w4a16_g128_asym``, ...) pairs it with
an activation scheme. Strings are parsed and canonicalised by the C++ library, so Python and
C++ always agree.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Dict, Optional, Tuple

from . import _C

#: The linear formats, one per family, with the default group size 128 where a group applies
#: (any of 32, 64, 128, 256 is accepted by every function, e.g. ``w4a8_g64``).
LINEAR_FORMATS: Tuple[str, ...] = (
    "w4a8_pc", "w4a8_g128", "w4a8_g128_2level", "w4a8_pc_static", "w4a8_g128_static",
    "w4a8_g128_2level_static", "w4afp8_pc", "w4afp8_g128", "w8a8", "w8a8_static",
    "w4a16_g128", "w4a16_g128_asym", "w4a16_g128_fzp", "w8a16", "w4a4_pc", "w4a4_g128",
)


@dataclasses.dataclass(frozen=True)
class WeightFormat:
    """A weight format: ``scheme`` s4_sym / u4_asym / u4_fzp / s8_sym / s4_two_level,
    ``group_size`` (0 = per output channel), the dtypes of scales and stored values, and the
    range [qmin, qmax] of the stored integers."""

    name: str
    scheme: str
    group_size: int
    scale_dtype: str
    value_dtype: str
    qmin: int
    qmax: int

    @property
    def bits(self) -> int:
        """4 or 8: bits of each stored weight value."""
        return 4 if self.value_dtype in ("s4", "u4") else 8

    def storage(self, n: int, k: int) -> Dict[str, Optional[Tuple[str, Tuple[int, ...]]]]:
        """{'q', 'scales', 'zeros', 'group_scales'} → (dtype, logical shape) or None: the
        buffers an N×K weight of this format needs (C++ ``weight_storage``)."""
        return _storage(self.name, int(n), int(k))

    def effective_bits_per_weight(self, k: int) -> float:
        """Stored bits per weight including scales and zeros, for K-long rows."""
        return _C.effective_bits_per_weight(self.name, int(k))


@dataclasses.dataclass(frozen=True)
class LinearFormat:
    """A linear format: weight format × activation scheme (none, s8_per_token,
    s8_per_tensor, s4_per_token, e4m3_per_token)."""

    name: str
    weight: WeightFormat
    act: str
    act_dtype: Optional[str]

    @property
    def weight_only(self) -> bool:
        """True for the A16 formats: activations stay f32/f16/bf16."""
        return self.act == "none"

    @property
    def static(self) -> bool:
        """True for ``_static`` formats: one calibrated per-tensor int8 activation scale."""
        return self.act == "s8_per_tensor"

    def packable(self, k: int) -> bool:
        """Whether `pack_weight` has a kernel layout for this format at this K: W4A8 (int4
        symmetric or two-level weights, int8 activations; w4_mma_k128) and W4A-FP8 (int4
        symmetric weights, e4m3 activations; w4_mma_k128) with K % 32 == 0, or W4A16 / W8A16
        (w4_mma16_k128, w8_mma16_k128) with K % 8 == 0. (`nibble.explain` states the same on a
        CUDA device.)"""
        if self.act in ("s8_per_token", "s8_per_tensor"):
            return self.weight.scheme in ("s4_sym", "s4_two_level") and k % 32 == 0
        if self.act == "e4m3_per_token":
            return self.weight.scheme == "s4_sym" and k % 32 == 0
        return (self.act == "none" and self.weight.scheme in ("s4_sym", "u4_asym", "u4_fzp",
                                                             "s8_sym") and k % 8 == 0)


@functools.lru_cache(maxsize=None)
def weight_format(name: str) -> WeightFormat:
    """Parses a weight format string, e.g. ``weight_format("w4_g128")``. Raises
    InvalidArgumentError for an unknown one."""
    return WeightFormat(**_C.weight_format(name))


@functools.lru_cache(maxsize=None)
def linear_format(name: str) -> LinearFormat:
    """Parses a linear format string, e.g. ``linear_format("w4a8_g128")``; its ``name`` is the
    canonical spelling. Raises InvalidArgumentError for a pair not in the catalogue."""
    d = _C.linear_format(name)
    return LinearFormat(name=d["name"], weight=WeightFormat(**d["weight"]), act=d["act"],
                        act_dtype=d["act_dtype"])


def to_weight_format(fmt) -> WeightFormat:
    """A WeightFormat from a weight format, a linear format (its weight part) or a string of
    either."""
    if isinstance(fmt, WeightFormat):
        return fmt
    if isinstance(fmt, LinearFormat):
        return fmt.weight
    try:
        return weight_format(fmt)
    except ValueError:
        return linear_format(fmt).weight


@functools.lru_cache(maxsize=4096)
def _storage(name: str, n: int, k: int):
    return {key: (None if v is None else (v[0], tuple(v[1])))
            for key, v in _C.weight_storage(name, n, k).items()}


def max_int32_accumulation_k(a: str, w: str) -> int:
    """Largest K whose int32 accumulation of a·w products cannot overflow, for integer dtypes
    a, w ∈ {s8, s4, u4} (|a|max·|w|max·K ≤ 2³¹−1)."""
    return _C.max_int32_accumulation_k(a, w)
