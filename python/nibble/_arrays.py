"""Array-library adapters: allocating outputs like an input, devices, streams.

nibble's functions take any DLPack array. The allocating convenience wrappers create their
outputs with the library of their first array argument: numpy (CPU), torch (CPU or CUDA) or
cupy (CUDA). Where a library has no type for a nibble dtype the storage is an integer array of
the same width (see the table in `storage`), passed to the C++ API as a pair (array, dtype).
"""

from __future__ import annotations

import sys
from typing import Any, Optional, Sequence, Tuple

import numpy as np

# nibble dtype -> (numpy storage dtype, values per element of storage)
_NUMPY_STORAGE = {
    "f32": (np.float32, 1),
    "f16": (np.float16, 1),
    "bf16": (np.uint16, 1),  # bit container: numpy has no bfloat16
    "e4m3": (np.uint8, 1),   # bit container
    "s8": (np.int8, 1),
    "u8": (np.uint8, 1),
    "s4": (np.uint8, 2),     # two values per byte, element 2i in the low nibble
    "u4": (np.uint8, 2),
    "s32": (np.int32, 1),
}

_NUMPY_NATURAL = {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16",
                  np.dtype(np.int8): "s8", np.dtype(np.uint8): "u8", np.dtype(np.int32): "s32"}


def storage_shape(dtype: str, shape: Sequence[int]) -> Tuple[int, ...]:
    """Shape of the storage array of a nibble tensor: 4-bit tensors halve the last dimension."""
    shape = tuple(int(s) for s in shape)
    per = _NUMPY_STORAGE[dtype][1]
    if per == 2:
        if not shape or shape[-1] % 2:
            raise ValueError(f"a {dtype} tensor needs an even last dimension, got {shape}")
        shape = shape[:-1] + (shape[-1] // 2,)
    return shape


def library(x: Any) -> str:
    """'numpy', 'torch' or 'cupy': the library of an array."""
    mod = type(x).__module__.split(".")[0]
    if mod in ("numpy", "torch", "cupy"):
        return mod
    raise TypeError(
        f"nibble allocates outputs with numpy, torch or cupy, got a {type(x).__name__}; pass "
        "preallocated outputs (out=) for other DLPack arrays")


def _torch():
    import torch
    return torch


def natural_dtype(x: Any) -> Optional[str]:
    """The nibble dtype an array's own element type stands for (None if there is none)."""
    lib = library(x)
    if lib == "torch":
        torch = _torch()
        return {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16",
                torch.int8: "s8", torch.uint8: "u8", torch.int32: "s32",
                getattr(torch, "float8_e4m3fn", None): "e4m3"}.get(x.dtype)
    return _NUMPY_NATURAL.get(np.dtype(x.dtype))


def empty(dtype: str, shape: Sequence[int], like: Any) -> Any:
    """An uninitialised array holding a nibble `dtype` tensor of logical `shape`, created by
    the library and on the device of `like`."""
    sshape = storage_shape(dtype, shape)
    lib = library(like)
    if lib == "numpy":
        return np.empty(sshape, _NUMPY_STORAGE[dtype][0])
    if lib == "cupy":
        import cupy
        with cupy.cuda.Device(like.device.id):
            return cupy.empty(sshape, _NUMPY_STORAGE[dtype][0])
    torch = _torch()
    tdtype = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16,
              "e4m3": getattr(torch, "float8_e4m3fn", torch.uint8), "s8": torch.int8,
              "u8": torch.uint8, "s4": torch.uint8, "u4": torch.uint8, "s32": torch.int32}[dtype]
    return torch.empty(sshape, dtype=tdtype, device=like.device)


def arg(x: Any, dtype: Optional[str] = None) -> Any:
    """`x` as the C++ binding takes it: the array, or (array, dtype) when `dtype` is given.
    torch tensors are detached (DLPack refuses tensors that require grad), and float8 tensors
    travel as their uint8 bits."""
    if x is None:
        return None
    if "torch" in sys.modules and isinstance(x, sys.modules["torch"].Tensor):
        x = x.detach()
        if x.dtype == getattr(sys.modules["torch"], "float8_e4m3fn", None):
            x = x.view(sys.modules["torch"].uint8)
            dtype = dtype or "e4m3"
    return x if dtype is None else (x, dtype)


def device(x: Any) -> Tuple[str, int]:
    """('cpu', 0) or ('cuda', ordinal) for an array."""
    lib = library(x)
    if lib == "numpy":
        return ("cpu", 0)
    if lib == "cupy":
        return ("cuda", int(x.device.id))
    d = x.device
    return (d.type, d.index or 0) if d.type == "cuda" else (d.type, 0)


def parse_device(d: Any) -> Tuple[str, int]:
    """'cpu', 'cuda', 'cuda:1', a torch.device or a (type, index) pair → (type, index)."""
    if isinstance(d, tuple):
        return (str(d[0]), int(d[1]))
    if d is None:
        return ("cpu", 0)
    s = str(d)
    if ":" in s:
        t, i = s.split(":", 1)
        return (t, int(i))
    return (s, 0)


def current_stream(x: Any) -> int:
    """The stream a CUDA array's library is working on (its current stream), as an int
    handle; 0 for host arrays and arrays of other libraries."""
    try:
        kind, index = device(x)
    except TypeError:
        return 0
    if kind != "cuda":
        return 0
    if library(x) == "cupy":
        import cupy
        return int(cupy.cuda.get_current_stream().ptr)
    return int(_torch().cuda.current_stream(index).cuda_stream)


def stream_handle(stream: Any, like: Any) -> int:
    """An explicit stream (int handle, torch.cuda.Stream, cupy Stream) or None → the current
    stream of `like`'s library."""
    if stream is None:
        return current_stream(like)
    if isinstance(stream, int):
        return stream
    for attr in ("cuda_stream", "ptr"):
        if hasattr(stream, attr):
            return int(getattr(stream, attr))
    raise TypeError(f"stream must be an int handle or a torch/cupy stream, got {stream!r}")


def to_library(host: np.ndarray, like: Any) -> Any:
    """A numpy array copied into the library and onto the device of `like`."""
    lib = library(like)
    if lib == "numpy":
        return host
    if lib == "cupy":
        import cupy
        with cupy.cuda.Device(like.device.id):
            return cupy.asarray(host)
    return _torch().from_numpy(np.ascontiguousarray(host)).to(like.device)


def to_numpy(x: Any) -> np.ndarray:
    """A host numpy array with the same storage bytes as `x` (copied from the device)."""
    lib = library(x)
    if lib == "numpy":
        return x
    if lib == "cupy":
        return x.get()
    torch = _torch()
    x = x.detach().cpu()
    if x.dtype in (torch.bfloat16,):
        x = x.view(torch.uint16) if hasattr(torch, "uint16") else x.view(torch.int16)
    elif x.dtype == getattr(torch, "float8_e4m3fn", None):
        x = x.view(torch.uint8)
    return x.numpy()
