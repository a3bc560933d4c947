"""torch.library custom ops over nibble's C++ API (namespace ``nibble``).

Each op is functional (no mutated inputs), allocates its outputs with torch's allocator on the
input's device, runs on the current CUDA stream and never synchronizes, and has a fake (meta)
implementation, so ``torch.compile(fullgraph=True)`` traces through it and CUDA-graph capture
records it. Shapes: x (M, K) with a contiguous last dimension; weights as in
``nibble.QuantizedWeight`` / ``nibble.PackedWeight``.

  torch.ops.nibble.quantize_activation(x, scheme, scale) -> (q, scales)
  torch.ops.nibble.linear(x, q, scales, zeros, group_scales, bias, format, act_scale) -> y
  torch.ops.nibble.linear_packed(x, q, scales, group_params, zeros, bias, format, layout, n, k,
                                 n_pad, k_pad, act_scale) -> y
  torch.ops.nibble.gemm_s32(a, w, a_dtype, w_dtype) -> d

CUDA-graph note: the tensor-core kernels keep split-K and activation workspaces per (device,
stream), allocated on the first call with a given size on that stream — also during a capture,
so the usual warm-up on a side stream before torch.cuda.graph is enough.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from .. import _C
from .._arrays import arg, storage_shape
from ..formats import linear_format, weight_format

_ACT_DTYPE = {"s8_per_token": "s8", "s8_per_tensor": "s8", "s4_per_token": "s4",
              "e4m3_per_token": "e4m3"}
_TORCH_STORAGE = {"s8": torch.int8, "s4": torch.uint8, "e4m3": torch.uint8, "s32": torch.int32}


def _stream(t: Tensor) -> int:
    return torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else 0


def _act_buffers(x: Tensor, scheme: str) -> Tuple[Tensor, Tensor]:
    m, k = x.shape
    dtype = _ACT_DTYPE[scheme]
    q = torch.empty(storage_shape(dtype, (m, k)), dtype=_TORCH_STORAGE[dtype], device=x.device)
    scales = torch.empty((1 if scheme == "s8_per_tensor" else m,), dtype=torch.float32,
                         device=x.device)
    return q, scales


def _quantize(x: Tensor, scheme: str, scale: float, stream: int):
    q, scales = _act_buffers(x, scheme)
    a = (scheme, (q, _ACT_DTYPE[scheme]), (scales, "f32"))
    if scheme == "s8_per_tensor":
        _C.quantize_activation_static(arg(x), scale, a, stream)
    else:
        _C.quantize_activation(arg(x), a, stream)
    return a, q, scales


def _weight_k(wf, q: Tensor) -> int:
    return int(q.shape[1]) * (2 if wf.bits == 4 else 1)


def _weight_tuple(wf, q, scales, zeros, group_scales):
    n, k = int(q.shape[0]), _weight_k(wf, q)
    st = wf.storage(n, k)

    def a(t, field):
        return None if t is None else arg(t, st[field][0] if st[field] else None)

    return (wf.name, n, k, a(q, "q"), a(scales, "scales"), a(zeros, "zeros"),
            a(group_scales, "group_scales"))


# ---- quantize_activation -----------------------------------------------------------------------
@torch.library.custom_op("nibble::quantize_activation", mutates_args=())
def quantize_activation(x: Tensor, scheme: str, scale: float) -> Tuple[Tensor, Tensor]:
    """(q, scales) of x (M, K) f32/f16/bf16: dynamic per token (s8_per_token, s4_per_token,
    e4m3_per_token: s[m] = max|x[m]|/qmax, q = round(x/s)) or static s8_per_tensor with the
    given scale. q: int8 (M, K), uint8 (M, K/2) packed s4, or uint8 e4m3 bits; scales f32 (M)
    or (1)."""
    _, q, scales = _quantize(x, scheme, scale, _stream(x))
    return q, scales


@quantize_activation.register_fake
def _(x, scheme, scale):
    return _act_buffers(x, scheme)


# ---- linear (logical weights) ------------------------------------------------------------------
@torch.library.custom_op("nibble::linear", mutates_args=())
def linear(x: Tensor, q: Tensor, scales: Tensor, zeros: Optional[Tensor],
           group_scales: Optional[Tensor], bias: Optional[Tensor], format: str,
           act_scale: float) -> Tensor:
    """y (M, N), x's dtype = x (M, K) · deq(W)ᵀ (+ bias) in the linear `format`: x quantized
    per the format (per token, or per tensor with `act_scale` for _static formats; weight-only
    formats use x as is), then nibble's linear on the logical weight buffers (see
    nibble.QuantizedWeight)."""
    lf = linear_format(format)
    w = _weight_tuple(lf.weight, q, scales, zeros, group_scales)
    out = torch.empty((x.shape[0], q.shape[0]), dtype=x.dtype, device=x.device)
    s = _stream(x)
    if lf.weight_only:
        _C.linear_a16(arg(x), w, arg(bias), out, s)
    else:
        a, _, _ = _quantize(x, lf.act, act_scale, s)
        _C.linear(a, w, arg(bias), out, s)
    return out


@linear.register_fake
def _(x, q, scales, zeros, group_scales, bias, format, act_scale):
    return x.new_empty((x.shape[0], q.shape[0]))


# ---- linear (packed weights) ---------------------------------------------------------------------
@torch.library.custom_op("nibble::linear_packed", mutates_args=())
def linear_packed(x: Tensor, q: Tensor, scales: Tensor, group_params: Optional[Tensor],
                  zeros: Optional[Tensor], bias: Optional[Tensor], format: str, layout: str,
                  n: int, k: int, n_pad: int, k_pad: int, act_scale: float) -> Tensor:
    """Same as nibble::linear with weights packed by nibble.pack_weight in `layout`: W4A8 or
    W4A-FP8 (w4_mma_k128; x quantized per the format first) or W4A16 / W8A16 (w4_mma16_k128,
    w8_mma16_k128; x bf16/f16 used as it is). On CUDA the tensor-core kernels."""
    lf = linear_format(format)
    s = _stream(x)
    w = (layout, 1, lf.weight.name, True, n, k, n_pad, k_pad, arg(q, "u8"),
         arg(scales, "f32"), arg(group_params, "u8"), arg(zeros, "f32"))
    out = torch.empty((x.shape[0], n), dtype=x.dtype, device=x.device)
    if lf.weight_only or (layout == "w4_mma_k128" and lf.act == "s8_per_token"):
        # weight-only: x used as it is; W4A8 dynamic: x quantized per token inside the C++ call
        # (in C++: the activation kernel, then the int8 GEMM)
        _C.linear_packed_a16(arg(x), w, arg(bias), out, s)
    else:
        a, _, _ = _quantize(x, lf.act, act_scale, s)
        _C.linear_packed(a, w, arg(bias), out, s)
    return out


@linear_packed.register_fake
def _(x, q, scales, group_params, zeros, bias, format, layout, n, k, n_pad, k_pad, act_scale):
    return x.new_empty((x.shape[0], n))


# ---- gemm_s32 ------------------------------------------------------------------------------------
@torch.library.custom_op("nibble::gemm_s32", mutates_args=())
def gemm_s32(a: Tensor, w: Tensor, a_dtype: str, w_dtype: str) -> Tensor:
    """d (M, N) int32 = a (M, K) · w (N, K)ᵀ exactly, a_dtype/w_dtype "s8" (int8 tensor) or
    "s4" (uint8 (·, K/2) packed bytes); pairs s8×s8, s8×s4, s4×s4."""
    out = torch.empty((a.shape[0], w.shape[0]), dtype=torch.int32, device=a.device)
    _C.gemm_s32(arg(a, a_dtype), arg(w, w_dtype), out, _stream(a))
    return out


@gemm_s32.register_fake
def _(a, w, a_dtype, w_dtype):
    return a.new_empty((a.shape[0], w.shape[0]), dtype=torch.int32)


def weight_k(format: str, q: Tensor) -> int:
    """K of a logical weight from its stored values q."""
    return _weight_k(weight_format(format), q)
