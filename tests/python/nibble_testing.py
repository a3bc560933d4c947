"""Shared pieces of the Python suite: seeded generators, named tolerances, float references,
skip markers. The C++ suite's counterparts are tests/cpp/test_util.h and cuda_test_util.h."""

import os
from typing import Optional

import numpy as np
import pytest

import nibble

# ---- tolerances (relative Frobenius error, the scale-invariant metric of tests/cpp) ------------
#: Float outputs computed from the same quantized operands as the reference: they differ only
#: by f32 summation order and the final rounding (tests/cpp/cuda_test_util.h kRelTolF32Out).
REL_TOL_F32_OUT = 1e-5
#: The same for f16 / bf16 outputs (kRelTolHalfOut).
REL_TOL_HALF_OUT = 8e-3
#: f32 outputs of the W4A-FP8 tensor-core kernel: the tensor cores add fp8 products with fewer
#: bits than f32 (tests/cpp/test_cuda_w4afp8.cpp kRelTolFp8F32Out; measured up to 4.7e-4).
REL_TOL_FP8_F32_OUT = 2e-3
#: A quantized model against its float original (random Gaussian weights, the hardest case for
#: min-max quantization, through a stack of Llama-shaped blocks): the quantization error itself,
#: measured about 0.2 for int4 weights, 0.37 for w4a4 and 0.03 for int8 in a two-block stack with
#: K = 256 and larger at K = 4096 (coarser per-channel steps). A wrong kernel, layout or scale
#: gives an error of 1 or more; exactness is checked by the per-op tests.
#: A CUDA graph of a torch.compile'd model against the same compiled model run directly (the
#: same kernels; only inductor's choices between the two traces can differ).
REL_TOL_COMPILED = 2e-2
REL_TOL_VS_FLOAT = {"w8": 0.06, "w4": 0.35, "w4a4": 0.6, "w4afp8": 0.35}


def _host_float64(x) -> np.ndarray:
    """numpy float64 copy of a numpy array or a torch tensor on any device."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # torch.Tensor (CUDA included)
        x = x.detach().float().cpu().numpy()
    return np.asarray(x, dtype=np.float64)


def rel_fro(got, ref) -> float:
    """‖got − ref‖_F / ‖ref‖_F in float64."""
    got = _host_float64(got)
    ref = _host_float64(ref)
    return float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-300))


def tol_vs_float(fmt: str) -> float:
    """REL_TOL_VS_FLOAT for a linear format string."""
    if fmt.startswith("w4a4"):
        return REL_TOL_VS_FLOAT["w4a4"]
    if fmt.startswith("w4afp8"):
        return REL_TOL_VS_FLOAT["w4afp8"]
    return REL_TOL_VS_FLOAT["w8" if fmt.startswith("w8") else "w4"]


# ---- data ------------------------------------------------------------------------------------------
def fresh_seed() -> int:
    """A new seed per test (NIBBLE_TEST_SEED pins it); tests print it so a failure can be
    replayed."""
    pinned = os.environ.get("NIBBLE_TEST_SEED")
    seed = int(pinned) if pinned else int.from_bytes(os.urandom(4), "little")
    print(f"seed = {seed} (rerun with NIBBLE_TEST_SEED={seed})")
    return seed


def normal(rng, shape, scale=1.0):
    """Gaussian f32 data, never all zeros."""
    x = (rng.standard_normal(shape) * scale).astype(np.float32)
    x.flat[0] = x.flat[0] if x.flat[0] != 0 else 1.0
    return x


def ints(rng, shape, lo, hi, dtype=np.int8):
    """Uniform integers in [lo, hi]."""
    return rng.integers(lo, hi + 1, size=shape).astype(dtype)


# ---- references ------------------------------------------------------------------------------------
def deq_activation(a: "nibble.QuantizedActivation") -> np.ndarray:
    """f32 activations of a host QuantizedActivation (via the C++ dequantizer)."""
    return np.asarray(nibble.dequantize_activation(a))


def linear_reference(x_or_a, qw: "nibble.QuantizedWeight", bias=None) -> np.ndarray:
    """float64 A·deq(W)ᵀ (+ bias) from the same (quantized) operands as the op under test."""
    a = deq_activation(x_or_a) if isinstance(x_or_a, nibble.QuantizedActivation) else x_or_a
    d = np.asarray(a, np.float64) @ np.asarray(nibble.dequantize_weight(qw), np.float64).T
    return d if bias is None else d + np.asarray(bias, np.float64)


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """uint16 bf16 bit patterns → float32."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


# ---- environment -----------------------------------------------------------------------------------
def _torch_import_error() -> Optional[str]:
    """Why `import torch` fails here (None when it works). A torch that is installed but does
    not load (a wheel half-extracted on a full disk, missing CUDA libraries) counts as absent
    with its reason in the skip message, instead of failing the whole suite at collection."""
    try:
        import torch  # noqa: F401
        return None
    except Exception as e:  # ImportError, or OSError from torch's own shared libraries
        return f"{type(e).__name__}: {e}"


_TORCH_IMPORT_ERROR = _torch_import_error()


def have_torch() -> bool:
    return _TORCH_IMPORT_ERROR is None


def torch_skip_reason() -> str:
    return "torch is not usable (" + (_TORCH_IMPORT_ERROR or "?") + ")"


def have_cuda() -> bool:
    return nibble.cuda_device_count() > 0


requires_torch = pytest.mark.skipif(not have_torch(), reason=torch_skip_reason())
requires_cuda = pytest.mark.skipif(
    not have_cuda(), reason="no CUDA device: " + (nibble.cuda_unavailable_reason() or "?"))
