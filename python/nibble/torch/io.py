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
        lf = linear_format(info["format"])
        bufs = {f: tensors.pop(f"{name}.weight_{f}", None) for f in _FIELDS}
        qw = ops.QuantizedWeight(lf.weight.name, info["out_features"], info["in_features"],
                                 **bufs)
        _replace_linear(model, name, qw, lf, tensors.pop(f"{name}.bias", None),
                        info["act_scale"], device, layout)
    return _load_the_rest(model, tensors, layers, device, strict, "load_quantized")


def load_int4_checkpoint(model: nn.Module, path: str, *,
                         device: Union[str, torch.device, None] = None, layout: str = "auto",
                         strict: bool = True) -> nn.Module:
    """Loads a GPTQ or AWQ checkpoint — a Hugging Face directory with config.json (its
    ``quantization_config``) and model.safetensors or model.safetensors.index.json + shards —
    into ``model``, the float model's structure (parameters may be on the meta device): each
    4-bit layer (``<name>.qweight``, ``.qzeros``, ``.scales``, ``.g_idx``) becomes a
    QuantizedLinear of format ``w4a16_g<G>_asym_sf16`` holding the checkpoint's own numbers
    (nibble.unpack_int4_checkpoint: nothing is quantized again), on ``device`` (default: where
    the replaced layer's weight was, or the CPU for meta weights); the other entries are loaded
    with load_state_dict. Which checkpoints are taken: nibble.int4_packing_of. Returns
    ``model``."""
    import os

    from safetensors.torch import load_file

    config_path = os.path.join(path, "config.json")
    with open(config_path) as f:
        config = json.load(f)
    if not config.get("quantization_config"):
        raise ValueError(f"{config_path} has no quantization_config (not a GPTQ / AWQ "
                         "checkpoint)")
    packing, group = ops.int4_packing_of(config["quantization_config"])
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    tensors: Dict[str, torch.Tensor] = {}
    for name in files:
        tensors.update(load_file(os.path.join(path, name)))
    lf = linear_format(f"w4a16_g{group}_asym_sf16")
    layers = sorted(k[:-len(".qweight")] for k in tensors if k.endswith(".qweight"))
    for name in layers:
        qw = ops.unpack_int4_checkpoint(packing, tensors.pop(f"{name}.qweight"),
                                        tensors.pop(f"{name}.qzeros"),
                                        tensors.pop(f"{name}.scales"),
                                        tensors.pop(f"{name}.g_idx", None), group_size=group)
        old = model.get_submodule(name)
        if (getattr(old, "out_features", qw.n), getattr(old, "in_features", qw.k)) != (qw.n, qw.k):
            raise ValueError(f"load_int4_checkpoint: {name} is {qw.n}×{qw.k} in {path}, the "
                             f"model's layer is {old.out_features}×{old.in_features}")
        _replace_linear(model, name, qw, lf, tensors.pop(f"{name}.bias", None), None, device,
                        layout)
    return _load_the_rest(model, tensors, layers, device, strict, "load_int4_checkpoint")


def _replace_linear(model, name, qw, lf, bias, act_scale, device, layout):
    """Puts a QuantizedLinear of qw in place of the module `name`, on `device` or where the old
    layer's weight was (the CPU for meta weights)."""
    old = model.get_submodule(name)
    w = getattr(old, "weight", None)
    target = device
    if target is None:
        target = "cpu" if w is None or w.device.type == "meta" else w.device
    new = QuantizedLinear(qw, lf, bias, act_scale=act_scale, device=target, layout=layout,
                          act_dtype=None if w is None else w.dtype)
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, new)


def _load_the_rest(model, tensors, layers, device, strict, who):
    meta_params = any(p.device.type == "meta" for p in model.parameters())
    missing, unexpected = model.load_state_dict(tensors, strict=False, assign=meta_params)
    quantized_prefixes = tuple(n + "." for n in layers)
    missing = [k for k in missing if not k.startswith(quantized_prefixes)]
    if strict and (missing or unexpected):
        raise RuntimeError(f"{who}: missing keys {missing}, unexpected keys {unexpected}")
    if device is not None:
        model.to(device)
    return model
