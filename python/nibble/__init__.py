"""nibble: low-bit (int4/int8) GEMMs and quantized linear layers for LLM inference.

    D[M,N] = A[M,K] · W[N,K]ᵀ (+ bias[N])     A = activations, W like nn.Linear

``nibble`` works on any DLPack array (numpy on the CPU backend, torch and cupy on CUDA):
quantize and pack weights, quantize activations, raw integer GEMMs, the quantized linear layer
of every format (``nibble.formats.LINEAR_FORMATS``) and ``explain``. ``nibble.torch`` adds
torch.library custom ops, ``QuantizedLinear``, ``quantize_(model, config)`` and safetensors
save/load. docs/python.md has the overview; every function's docstring gives its formula,
shapes and dtypes. The ``nibble`` command-line tool is installed beside the package.
"""

import os
import shutil
import sysconfig

from . import _C
from ._C import (CudaError, InternalError, InvalidArgumentError, NibbleError, NibbleIOError,
                 OutOfRangeError, UnsupportedError)
from .granularity import (GranularityPlan, plan_w4a4_granularity, tensor_core_ratio,
                          w4a4_group_time_factor, weight_quantization_error)
from .formats import (LINEAR_FORMATS, LinearFormat, WeightFormat, linear_format,
                      weight_format)
from .ops import (PackedWeight, QuantizedActivation, QuantizedWeight, dequantize_activation,
                  dequantize_weight, empty_activation, empty_weight, explain, gemm_s32,
                  gemm_s4s4, gemm_s8s4, gemm_s8s8, int4_packing_of, linear, pack_int4,
                  pack_s4_matrix, pack_weight, packed_layout, quantize_activation,
                  quantize_activation_static, quantize_weight, quantized_linear, unpack_int4,
                  unpack_int4_checkpoint)

__version__ = _C.build_info()["version"]


def build_info() -> dict:
    """What this build contains: version, cuda (bool), cuda_archs, cuda_runtime, compiler,
    build_type."""
    return _C.build_info()


def cuda_device_count() -> int:
    """CUDA devices nibble can use: 0 in a CPU-only build or without a GPU/driver."""
    return _C.cuda_device_count()


def cuda_unavailable_reason() -> str:
    """Why no GPU can be used ('' when cuda_device_count() > 0)."""
    return _C.cuda_unavailable_reason()


def cuda_device_info(ordinal: int = 0) -> dict:
    """Properties read from a CUDA device: name, cc_major/minor, sm_count, l2_bytes, ..."""
    return _C.cuda_device_info(ordinal)


def cli_path() -> str:
    """Path of the installed `nibble` command-line tool, or raises FileNotFoundError."""
    beside = os.path.join(sysconfig.get_path("scripts"), "nibble")
    path = beside if os.path.exists(beside) else shutil.which("nibble")
    if path is None:
        raise FileNotFoundError(
            "the `nibble` executable is not on PATH; reinstall with `pip install .` from the "
            "nibble source tree")
    return os.path.realpath(path)


__all__ = [
    "NibbleError", "InvalidArgumentError", "UnsupportedError", "OutOfRangeError", "CudaError",
    "NibbleIOError", "InternalError",
    "LINEAR_FORMATS", "LinearFormat", "WeightFormat", "linear_format", "weight_format",
    "QuantizedWeight", "QuantizedActivation", "PackedWeight",
    "empty_weight", "empty_activation", "quantize_weight", "dequantize_weight",
    "quantize_activation", "quantize_activation_static", "dequantize_activation",
    "pack_int4", "unpack_int4", "pack_weight", "packed_layout", "pack_s4_matrix",
    "int4_packing_of", "unpack_int4_checkpoint",
    "gemm_s32", "gemm_s8s8", "gemm_s8s4", "gemm_s4s4", "linear", "quantized_linear",
    "explain", "tensor_core_ratio", "w4a4_group_time_factor", "weight_quantization_error",
    "plan_w4a4_granularity", "GranularityPlan", "build_info", "cuda_device_count", "cuda_unavailable_reason",
    "cuda_device_info", "cli_path", "__version__",
]
