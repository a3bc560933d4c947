"""nibble for PyTorch: custom ops, QuantizedLinear, quantize_ and safetensors save/load.

    import nibble.torch as nt
    nt.quantize_(model, nt.W4A8Config(group_size=128))      # nn.Linear -> QuantizedLinear
    model = torch.compile(model, fullgraph=True)             # custom ops with fake impls
    nt.save_quantized(model, "model.safetensors")            # logical buffers, bit-exact
    nt.load_int4_checkpoint(model, "Qwen2.5-7B-Instruct-AWQ")  # GPTQ / AWQ, as they are

Ops (``torch.ops.nibble.*``): quantize_activation, linear, linear_packed, gemm_s32; they run
on the current CUDA stream and allocate with torch, so CUDA graphs can capture them (after the
usual side-stream warm-up: see nibble.torch._ops).
"""

from . import _ops  # noqa: F401  (registers torch.ops.nibble.*)
from .io import load_int4_checkpoint, load_quantized, save_quantized
from .nn import QuantizedLinear
from .quantize import (QuantizeConfig, W4A4Config, W4A4MixedConfig, W4A8Config, W4A16Config,
                       W4AFP8Config, W8A8Config, W8A16Config, calibrate, plan_w4a4_mixed,
                       quantize_)

__all__ = ["QuantizedLinear", "QuantizeConfig", "W4A8Config", "W8A8Config", "W4A16Config",
           "W8A16Config", "W4A4Config", "W4A4MixedConfig", "W4AFP8Config", "quantize_",
           "calibrate", "plan_w4a4_mixed",
           "save_quantized", "load_quantized", "load_int4_checkpoint"]
