"""quantize_(model, config): replace nn.Linear layers by QuantizedLinear, torchao-style."""

from __future__ import annotations

import dataclasses
import fnmatch
import warnings
from typing import Callable, Iterable, List, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from ..formats import linear_format
from ..granularity import (GranularityPlan, plan_w4a4_granularity, tensor_core_ratio,
                           weight_quantization_error)
from .nn import QuantizedLinear


@dataclasses.dataclass(frozen=True)
class QuantizeConfig:
    """What quantize_ does to each selected nn.Linear: the linear ``format`` (any canonical
    string, e.g. "w4a8_g128") and the weight ``layout`` ("auto", "logical", "packed"; see
    QuantizedLinear). The per-format constructors below build one."""

    format: str
    layout: str = "auto"

    def __post_init__(self):
        object.__setattr__(self, "format", linear_format(self.format).name)


def _g(group_size: Optional[int]) -> str:
    return "pc" if group_size is None else f"g{group_size}"


def W4A8Config(group_size: Optional[int] = None, *, two_level: bool = False,
               static: bool = False, layout: str = "auto") -> QuantizeConfig:
    """int4 symmetric weights (per channel, or per group of 32/64/128/256; ``two_level``: the
    QServe two-level scheme, needs a group), int8 activations per token (``static``: one
    calibrated scale per tensor). w4a8_pc, w4a8_g128, w4a8_g128_2level, w4a8_pc_static, ..."""
    fmt = "w4a8_" + _g(group_size) + ("_2level" if two_level else "") + (
        "_static" if static else "")
    return QuantizeConfig(fmt, layout)


def W8A8Config(group_size: Optional[int] = None, *, static: bool = False) -> QuantizeConfig:
    """int8 symmetric weights, int8 activations per token or per tensor: w8a8, w8a8_static."""
    return QuantizeConfig("w8a8" + ("" if group_size is None else f"_g{group_size}")
                          + ("_static" if static else ""))


def W4A16Config(group_size: Optional[int] = 128, *,
                zero_point: Optional[str] = None) -> QuantizeConfig:
    """Weight-only int4 (activations stay f32/f16/bf16): symmetric, or with an integer
    (``zero_point="int"``, AWQ-like, w4a16_g128_asym) or float (``"float"``, tinygemm,
    w4a16_g128_fzp) zero point."""
    suffix = {None: "", "int": "_asym", "float": "_fzp"}[zero_point]
    return QuantizeConfig("w4a16_" + _g(group_size) + suffix)


def W8A16Config(group_size: Optional[int] = None) -> QuantizeConfig:
    """Weight-only int8: w8a16."""
    return QuantizeConfig("w8a16" + ("" if group_size is None else f"_g{group_size}"))


def W4A4Config(group_size: Optional[int] = None) -> QuantizeConfig:
    """int4 weights and int4 activations per token: w4a4_pc, w4a4_g128."""
    return QuantizeConfig("w4a4_" + _g(group_size))


@dataclasses.dataclass(frozen=True)
class W4A4MixedConfig:
    """W4A4 with the granularity chosen per layer from the GPU's ρ (nibble.tensor_core_ratio):
    each selected layer becomes w4a4_pc or w4a4_g128 by nibble.plan_w4a4_granularity — g128
    where it lowers the layer's output error most per unit of modelled extra time, within
    ``budget`` (a fraction over the all-per-channel time). ``rho``: the target GPU's ratio
    (default: that of the model's CUDA device; required for a model on the CPU). Errors are
    weighted by each layer's input mean squares when quantize_ gets calibration_data. Layers
    whose K is not a multiple of 128 stay per channel. quantize_ stores the plan as
    ``model.nibble_w4a4_plan``."""

    budget: float = 0.1
    rho: Optional[int] = None
    layout: str = "auto"


def W4AFP8Config(group_size: Optional[int] = None) -> QuantizeConfig:
    """int4 weights, fp8 e4m3 activations per token: w4afp8_pc, w4afp8_g128."""
    return QuantizeConfig("w4afp8_" + _g(group_size))


def _fits(fmt, linear: nn.Linear) -> Optional[str]:
    """Why the format cannot take this layer's shape (None if it can)."""
    k = linear.in_features
    wf = fmt.weight
    if wf.bits == 4 and k % 2:
        return f"K = {k} is odd"
    if wf.group_size and k % wf.group_size:
        return f"K = {k} is not a multiple of the group size {wf.group_size}"
    if fmt.act == "s4_per_token" and k % 2:
        return f"K = {k} is odd"
    return None


def _targets(model, filter_fn, include, exclude) -> List[Tuple[str, nn.Linear]]:
    def matches(name, patterns):
        return any(fnmatch.fnmatchcase(name, p) for p in patterns)

    include = [include] if isinstance(include, str) else include
    exclude = [exclude] if isinstance(exclude, str) else (exclude or [])
    out = []
    for name, mod in model.named_modules():
        if not isinstance(mod, nn.Linear):
            continue
        if include is not None and not matches(name, include):
            continue
        if matches(name, exclude):
            continue
        if filter_fn is not None and not filter_fn(mod, name):
            continue
        out.append((name, mod))
    return out


def _select(model, fmt, what, filter_fn, include, exclude) -> List[Tuple[str, nn.Linear]]:
    """The selected layers whose shape ``fmt`` takes; warns (naming ``what``) about the others,
    which stay as they are."""
    layers, skipped = [], []
    for name, mod in _targets(model, filter_fn, include, exclude):
        why = _fits(fmt, mod)
        if why:
            skipped.append(f"{name} ({why})")
        else:
            layers.append((name, mod))
    if skipped:
        warnings.warn(f"nibble.torch.quantize_: {what} left {len(skipped)} layer(s) "
                      f"unquantized: {', '.join(skipped)}", stacklevel=3)
    return layers


def _set(model: nn.Module, name: str, module: nn.Module):
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, module)


def _observe_inputs(model: nn.Module, layers: Sequence[Tuple[str, nn.Linear]],
                    calibration_data: Iterable, observe: Callable[[str, torch.Tensor], None]):
    """Runs ``model`` on every item of ``calibration_data`` (a tensor, a tuple of positional
    arguments or a dict of keyword arguments) under no_grad, calling observe(name, input) for
    each selected layer's input."""
    hooks = [mod.register_forward_pre_hook(lambda _m, args, name=name: observe(name, args[0]))
             for name, mod in layers]
    try:
        with torch.no_grad():
            for batch in calibration_data:
                if isinstance(batch, dict):
                    model(**batch)
                elif isinstance(batch, (tuple, list)):
                    model(*batch)
                else:
                    model(batch)
    finally:
        for h in hooks:
            h.remove()


def calibrate(model: nn.Module, layers: Sequence[Tuple[str, nn.Linear]],
              calibration_data: Iterable) -> dict:
    """{name: max |x|} over the inputs each layer sees while ``model`` runs on every item of
    ``calibration_data`` (a tensor, a tuple of positional arguments or a dict of keyword
    arguments)."""
    amax = {name: 0.0 for name, _ in layers}

    def observe(name, x):
        amax[name] = max(amax[name], float(x.detach().abs().max()))

    _observe_inputs(model, layers, calibration_data, observe)
    return amax


def input_mean_squares(model: nn.Module, layers: Sequence[Tuple[str, nn.Linear]],
                       calibration_data: Iterable) -> dict:
    """{name: float32 tensor (K,)}: the mean over calibration rows of each input column's square,
    for every layer, while ``model`` runs on ``calibration_data`` (as calibrate)."""
    sums, rows = {}, {}

    def observe(name, x):
        x = x.detach().reshape(-1, x.shape[-1]).double()
        s = (x * x).sum(dim=0).cpu()
        sums[name] = s if name not in sums else sums[name] + s
        rows[name] = rows.get(name, 0) + x.shape[0]

    _observe_inputs(model, layers, calibration_data, observe)
    return {name: (sums[name] / rows[name]).float() for name in sums}


def plan_w4a4_mixed(model: nn.Module, config: W4A4MixedConfig,
                    layers: Sequence[Tuple[str, nn.Linear]],
                    calibration_data: Optional[Iterable] = None) -> GranularityPlan:
    """The per-layer plan quantize_ follows for a W4A4MixedConfig (see there)."""
    rho = config.rho
    if rho is None:
        dev = next((m.weight.device for _, m in layers if m.weight.is_cuda), None)
        if dev is None:
            raise ValueError("W4A4MixedConfig: the model is not on a CUDA device; pass rho "
                             "(nibble.tensor_core_ratio((major, minor)) of the target GPU)")
        rho = tensor_core_ratio(dev)
        if rho == 0:
            raise ValueError(f"W4A4MixedConfig: rho is unknown for {dev}; pass rho")
    moments = input_mean_squares(model, layers, calibration_data) if calibration_data else {}
    rows = []
    for name, mod in layers:
        w = mod.weight.detach().to("cpu")
        if w.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            w = w.float()
        w = w.contiguous()
        ms = moments.get(name)
        e_pc = weight_quantization_error(w, "w4a4_pc", ms)
        # g128 needs K % 128 == 0; elsewhere the layer can only stay per channel.
        e_g = weight_quantization_error(w, "w4a4_g128", ms) if w.shape[1] % 128 == 0 else e_pc
        rows.append((name, int(w.shape[0]), int(w.shape[1]), e_pc, e_g))
    return plan_w4a4_granularity(rows, rho, config.budget)


def quantize_(model: nn.Module, config: Union[QuantizeConfig, W4A4MixedConfig, str], *,
              filter_fn: Optional[Callable[[nn.Linear, str], bool]] = None,
              include: Union[str, Sequence[str], None] = None,
              exclude: Union[str, Sequence[str], None] = None,
              calibration_data: Optional[Iterable] = None) -> nn.Module:
    """Replaces, in place, the nn.Linear layers of ``model`` by QuantizedLinear in
    ``config.format`` (a QuantizeConfig from W4A8Config, W8A8Config, W4A16Config, W8A16Config,
    W4A4Config, W4AFP8Config, or a format string) and returns ``model``.

    Selection: every nn.Linear, narrowed by ``include`` / ``exclude`` (glob patterns on the
    qualified name, e.g. ``"layers.*.mlp.*"``) and ``filter_fn(linear, name)`` (e.g. by shape:
    ``lambda m, n: m.out_features % 128 == 0``). Layers whose shape the format cannot take (odd
    K for 4-bit, K not a multiple of the group size) are left as they are, with a warning.

    Static formats (``_static``) need ``calibration_data``: batches the model is run on first
    (under no_grad), each layer's act_scale = max |input| / 127.

    W4A4MixedConfig chooses w4a4_pc or w4a4_g128 per layer from the GPU's ρ and a time budget
    (nibble.plan_w4a4_granularity); ``calibration_data``, when given, weights each layer's
    error by its input's mean squares. The plan is kept as ``model.nibble_w4a4_plan``.
    """
    if isinstance(config, W4A4MixedConfig):
        layers = _select(model, linear_format("w4a4_pc"), "W4A4 mixed", filter_fn, include,
                         exclude)
        plan = plan_w4a4_mixed(model, config, layers, calibration_data)
        for name, mod in layers:
            _set(model, name, QuantizedLinear.from_linear(mod, plan.formats[name],
                                                          layout=config.layout))
        model.nibble_w4a4_plan = plan
        return model
    cfg = config if isinstance(config, QuantizeConfig) else QuantizeConfig(config)
    fmt = linear_format(cfg.format)
    layers = _select(model, fmt, fmt.name, filter_fn, include, exclude)
    scales = {}
    if fmt.static:
        if calibration_data is None:
            raise ValueError(f"{fmt.name} is a static format: pass calibration_data")
        amax = calibrate(model, layers, calibration_data)
        scales = {name: max(a, 1e-12) / 127.0 for name, a in amax.items()}
    for name, mod in layers:
        _set(model, name, QuantizedLinear.from_linear(mod, fmt, act_scale=scales.get(name),
                                                      layout=cfg.layout))
    return model

