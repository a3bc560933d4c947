"""Saving and loading quantized models with safetensors, bit-exactly.

The file holds the model's whole state_dict — QuantizedLinear layers as their logical
(canonical) buffers ``<name>.weight_q``, ``.weight_scales``, ``.weight_zeros``,
``.weight_group_scales`` (4-bit values as uint8 bytes, bf16 scales as bfloat16, ...) — plus
metadata: ``nibble.version`` and ``nibble.layers``, a JSON map from each quantized layer's
name to its format, in/out features and act_scale. Packed layouts are never stored: they are
rebuilt on load for the target device.
"""

from __future__ import annotations

import json
from typing import Dict, Optional, Union

import torch
from torch import nn

from .. import _C, ops
from ..formats import linear_format
from .nn import QuantizedLinear

_FIELDS = ("q", "scales", "zeros", "group_scales")


def save_quantized(model: nn.Module, path: str, metadata: Optional[Dict[str, str]] = None):
    """Writes ``model.state_dict()`` and the nibble layer table to a safetensors file. Tensors
    shared between entries (tied weights) are stored once; the metadata names the aliases."""
    from safetensors.torch import save_file

    model = getattr(model, "_orig_mod", model)  # a torch.compile'd model saves as its original
    layers = {}
    for name, mod in model.named_modules():
        if isinstance(mod, QuantizedLinear):
            layers[name] = {"format": mod.format, "in_features": mod.in_features,
                            "out_features": mod.out_features, "act_scale": mod.act_scale}
    tensors, aliases, seen = {}, {}, {}
    for key, t in model.state_dict().items():
        t = t.detach()
        ident = (t.device, t.data_ptr(), t.dtype, tuple(t.shape), t.stride()) \
            if t.numel() else None
        if ident is not None and ident in seen:
            aliases[key] = seen[ident]
            continue
        if ident is not None:
            seen[ident] = key
        tensors[key] = t.to("cpu").contiguous()
    meta = dict(metadata or {})
    meta.update({"nibble.version": _C.build_info()["version"],
                 "nibble.layers": json.dumps(layers), "nibble.aliases": json.dumps(aliases)})
    save_file(tensors, path, metadata=meta)


def load_quantized(model: nn.Module, path: str, *,
                   device: Union[str, torch.device, None] = None, layout: str = "auto",
                   strict: bool = True) -> nn.Module:
    """Loads a file written by save_quantized into ``model``, the float model's structure
    (its parameters may live on the meta device): each layer listed in the file becomes a
    QuantizedLinear with the stored buffers (bit-exact), on ``device`` (default: where the
    replaced layer's weight was, or the CPU for meta weights); the other entries are loaded
    with load_state_dict. Returns ``model``."""
    from safetensors import safe_open

    with safe_open(path, framework="pt") as f:
        meta = f.metadata() or {}
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    if "nibble.layers" not in meta:
        raise ValueError(f"{path} was not written by nibble.torch.save_quantized")
    for key, source in json.loads(meta.get("nibble.aliases", "{}")).items():
        tensors[key] = tensors[source]
    layers = json.loads(meta["nibble.layers"])
    for name, info in layers.items():
        old = model.get_submodule(name)
        target = device
        if target is None:
            w = getattr(old, "weight", None)
            target = "cpu" if w is None or w.device.type == "meta" else w.device
        lf = linear_format(info["format"])
        bufs = {f: tensors.pop(f"{name}.weight_{f}", None) for f in _FIELDS}
        qw = ops.QuantizedWeight(lf.weight.name, info["out_features"], info["in_features"],
                                 **bufs)
        bias = tensors.pop(f"{name}.bias", None)
        w = getattr(old, "weight", None)
        new = QuantizedLinear(qw, lf, bias, act_scale=info["act_scale"], device=target,
                              layout=layout, act_dtype=None if w is None else w.dtype)
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, new)
    meta_params = any(p.device.type == "meta" for p in model.parameters())
    missing, unexpected = model.load_state_dict(tensors, strict=False, assign=meta_params)
    quantized_prefixes = tuple(n + "." for n in layers)
    missing = [k for k in missing if not k.startswith(quantized_prefixes)]
    if strict and (missing or unexpected):
        raise RuntimeError(f"load_quantized: missing keys {missing}, unexpected keys "
                           f"{unexpected}")
    if device is not None:
        model.to(device)
    return model
