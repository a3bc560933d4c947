"""QuantizedLinear: an nn.Linear replacement that runs a nibble linear format."""

from __future__ import annotations

from typing import Dict, Optional, Union

import torch
from torch import Tensor, nn

from .. import ops
from ..formats import LinearFormat, linear_format
from . import _ops  # noqa: F401  (registers torch.ops.nibble.*)

_FIELDS = ("q", "scales", "zeros", "group_scales")
_PACKED_FIELDS = ("q", "scales", "group_params", "zeros")


def _packed_kernel_available(device: torch.device) -> bool:
    return (device.type == "cuda" and torch.cuda.is_available()
            and torch.cuda.get_device_capability(device) >= (8, 0))


class QuantizedLinear(nn.Module):
    """y = x · deq(W)ᵀ (+ bias), W (out_features, in_features) quantized in a nibble linear
    format; x (..., in_features) f32/f16/bf16, y (..., out_features) in x's dtype.

    Activations are quantized on the fly as the format says: int8 / int4 / fp8 per token, int8
    per tensor with the calibrated ``act_scale`` for ``_static`` formats, or not at all for the
    weight-only (``a16``) formats. The forward pass is one custom op
    (``torch.ops.nibble.linear`` or ``linear_packed``), so it works under torch.compile and
    CUDA-graph capture.

    Storage (``layout``): ``"logical"`` keeps the format's canonical buffers as module buffers
    (``weight_q``, ``weight_scales``, ``weight_zeros``, ``weight_group_scales``);
    ``"packed"`` keeps the kernel layout of ``nibble.pack_weight`` (``packed_q``,
    ``packed_scales``, ``packed_group_params``, ``packed_zeros``) on the device, for the
    tensor-core kernels, and the logical buffers on the host for saving; ``"auto"`` (default)
    packs on a CUDA device of compute capability ≥ 8.0 when the format has a packed layout
    (W4A8 with K % 32 == 0; W4A16 / W8A16 with K % 8 == 0 when ``act_dtype`` — the layer's
    dtype in `from_linear` — is bf16 or f16, since those kernels take 16-bit activations).
    Either way ``state_dict()`` holds the logical buffers, so saving and loading round-trip
    bit-exactly.
    """

    def __init__(self, weight: ops.QuantizedWeight, format: Union[str, LinearFormat],
                 bias: Optional[Tensor] = None, *, act_scale: Optional[float] = None,
                 device: Union[str, torch.device, None] = None, layout: str = "auto",
                 act_dtype: Optional[torch.dtype] = None):
        super().__init__()
        lf = format if isinstance(format, LinearFormat) else linear_format(format)
        if lf.weight.name != weight.weight_format.name:
            raise ValueError(f"weight format {weight.format} does not belong to {lf.name}")
        if lf.static and not (act_scale is not None and act_scale > 0):
            raise ValueError(f"{lf.name} is a static format and needs a positive act_scale "
                             "(calibrate with quantize_(..., calibration_data=...))")
        if layout not in ("auto", "logical", "packed"):
            raise ValueError(f"layout must be 'auto', 'logical' or 'packed', got {layout!r}")
        self.format = lf.name
        self.in_features = int(weight.k)
        self.out_features = int(weight.n)
        self.act_scale = float(act_scale) if lf.static else None
        device = torch.device(device) if device is not None else weight.q.device
        if layout == "auto":
            # The weight-only kernels take bf16/f16 activations as they are: pack those only
            # when the activations are known to be 16-bit (from_linear: the layer's dtype).
            sixteen = act_dtype in (torch.bfloat16, torch.float16)
            layout = ("packed" if lf.packable(weight.k) and _packed_kernel_available(device)
                      and (sixteen or not lf.weight_only) else "logical")
        elif layout == "packed" and not lf.packable(weight.k):
            raise ValueError(f"{lf.name} with K = {weight.k} has no packed layout")
        self.layout = layout
        self._lf = lf
        self._logical: Dict[str, Optional[Tensor]] = {}
        self._set_weight({f: getattr(weight, f) for f in _FIELDS}, device)
        self.register_buffer("bias", None if bias is None else bias.detach().to(device))

    # ---- construction ------------------------------------------------------------------------
    @classmethod
    def from_linear(cls, linear: nn.Linear, format: Union[str, LinearFormat], *,
                    act_scale: Optional[float] = None, layout: str = "auto") -> "QuantizedLinear":
        """Quantizes an nn.Linear's weight (on the host, with nibble.quantize_weight) and keeps
        its bias and device."""
        lf = format if isinstance(format, LinearFormat) else linear_format(format)
        w = linear.weight.detach().to("cpu")
        if w.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            w = w.float()
        qw = ops.quantize_weight(w.contiguous(), lf.weight)
        return cls(qw, lf, linear.bias, act_scale=act_scale, device=linear.weight.device,
                   layout=layout, act_dtype=linear.weight.dtype)

    def _set_weight(self, logical: Dict[str, Optional[Tensor]], device: torch.device):
        logical = {f: None if t is None else t.detach() for f, t in logical.items()}
        if self.layout == "packed":
            self._logical = {f: None if t is None else t.to("cpu") for f, t in logical.items()}
            qw = ops.QuantizedWeight(self._lf.weight.name, self.out_features, self.in_features,
                                     **self._logical)
            p = ops.pack_weight(qw, ops.packed_layout(self._lf))
            self._packed_sizes = (p.n_pad, p.k_pad)
            self._packed_layout = p.layout
            for f in _PACKED_FIELDS:
                t = getattr(p, f)
                self.register_buffer("packed_" + f, None if t is None else t.to(device),
                                     persistent=False)
        else:
            for f in _FIELDS:
                t = logical[f]
                self.register_buffer("weight_" + f, None if t is None else t.to(device))

    def logical_weight(self) -> ops.QuantizedWeight:
        """The weight in its logical format (host tensors when packed)."""
        if self.layout == "packed":
            bufs = self._logical
        else:
            bufs = {f: getattr(self, "weight_" + f) for f in _FIELDS}
        return ops.QuantizedWeight(self._lf.weight.name, self.out_features, self.in_features,
                                   **bufs)

    # ---- forward -----------------------------------------------------------------------------
    def forward(self, x: Tensor) -> Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        if x2.shape[0] == 0:  # the C++ API takes no empty tensors; nn.Linear does
            return x.new_empty((*lead, self.out_features))
        if x2.stride(-1) != 1:
            x2 = x2.contiguous()
        scale = self.act_scale or 0.0
        if self.layout == "packed":
            if self._lf.weight_only and x2.dtype not in (torch.bfloat16, torch.float16):
                raise ValueError(f"{self.format} packed for the 16-bit tensor cores needs bf16 "
                                 f"or f16 input, got {x2.dtype}; build the layer with "
                                 "layout='logical' for float32 input")
            n_pad, k_pad = self._packed_sizes
            y = torch.ops.nibble.linear_packed(
                x2, self.packed_q, self.packed_scales, self.packed_group_params,
                self.packed_zeros, self.bias, self.format, self._packed_layout,
                self.out_features, self.in_features, n_pad, k_pad, scale)
        else:
            y = torch.ops.nibble.linear(
                x2, self.weight_q, self.weight_scales, self.weight_zeros,
                self.weight_group_scales, self.bias, self.format, scale)
        return y.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        s = (f"in_features={self.in_features}, out_features={self.out_features}, "
             f"bias={self.bias is not None}, format={self.format}, layout={self.layout}")
        return s + (f", act_scale={self.act_scale:g}" if self.act_scale is not None else "")

    # ---- state dict: always the logical buffers ----------------------------------------------
    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if self.layout == "packed":
            for f, t in self._logical.items():
                if t is not None:
                    destination[prefix + "weight_" + f] = t

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        if self.layout == "packed":
            keys = {prefix + "weight_" + f: f for f in _FIELDS}
            logical = {}
            for key, f in keys.items():
                if key in state_dict:
                    logical[f] = state_dict[key]
                elif self._logical.get(f) is not None:
                    missing_keys.append(key)
            if all(k in logical or self._logical.get(k) is None for k in _FIELDS):
                self._set_weight({f: logical.get(f) for f in _FIELDS}, self.packed_q.device)
            state_dict = {k: v for k, v in state_dict.items() if k not in keys}
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)
