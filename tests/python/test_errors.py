"""Every kind of bad argument is rejected with the C++ library's message, naming the argument,
as the matching Python exception class."""

import numpy as np
import pytest

import nibble
from nibble import _C
from nibble_testing import have_cuda, ints, normal


def test_exception_hierarchy():
    assert issubclass(nibble.InvalidArgumentError, nibble.NibbleError)
    assert issubclass(nibble.InvalidArgumentError, ValueError)
    assert issubclass(nibble.OutOfRangeError, ValueError)
    assert issubclass(nibble.UnsupportedError, NotImplementedError)
    assert issubclass(nibble.CudaError, RuntimeError)
    assert issubclass(nibble.NibbleIOError, OSError)


def test_wrong_dtype_names_argument_and_type(rng):
    x = normal(rng, (3, 64))
    with pytest.raises(nibble.InvalidArgumentError,
                       match=r"nibble::quantize_activation: argument 'x' has element type "
                             r"int16"):
        nibble.quantize_activation((x * 100).astype(np.int16))
    with pytest.raises(nibble.InvalidArgumentError,
                       match=r"nibble::quantize_activation: argument 'x' must have dtype .*got f64"):
        nibble.quantize_activation(x.astype(np.float64))
    w = ints(rng, (5, 64), -8, 7)
    with pytest.raises(nibble.InvalidArgumentError, match=r"argument 'a' must have dtype s8 or s4, got s32"):
        nibble.gemm_s32(w.astype(np.int32), w, a_dtype=None)


def test_declared_dtype_needs_a_matching_container(rng):
    w = normal(rng, (2, 64))
    with pytest.raises(nibble.InvalidArgumentError,
                       match=r"argument 'w' is declared s4, which an array of float32 cannot"):
        _C.gemm_s32((ints(rng, (1, 64), -1, 1), "s8"), (w, "s4"), np.empty((1, 2), np.int32))


def test_wrong_shape(rng):
    x = normal(rng, (3, 128))
    qw = nibble.quantize_weight(normal(rng, (8, 128)), "w8_pc")
    a = nibble.quantize_activation(x)
    with pytest.raises(nibble.InvalidArgumentError, match=r"argument 'bias' must have shape \[8\]"):
        nibble.linear(a, qw, normal(rng, (7,)))
    with pytest.raises(nibble.InvalidArgumentError, match=r"argument 'a.q' must have K = 128"):
        nibble.linear(nibble.quantize_activation(normal(rng, (3, 64))), qw)
    with pytest.raises(nibble.InvalidArgumentError, match=r"argument 'd' must have shape"):
        nibble.linear(a, qw, out=np.empty((3, 9), np.float32))


def test_non_contiguous_rows_rejected(rng):
    x = normal(rng, (3, 128))[:, ::2]
    with pytest.raises(nibble.InvalidArgumentError,
                       match=r"argument 'x' must have a contiguous last dimension \(stride 1\), "
                             r"got stride 2"):
        nibble.quantize_activation(x)
    w = ints(rng, (4, 32), -8, 7)
    a = ints(rng, (2, 64), -128, 127)
    with pytest.raises(nibble.InvalidArgumentError, match=r"argument 'w' must have a contiguous"):
        nibble.gemm_s8s4(a, np.ascontiguousarray(np.tile(w.view(np.uint8), 2))[:, ::2])
    with pytest.raises(nibble.InvalidArgumentError, match=r"argument 'w' must have a contiguous"):
        nibble.quantize_weight(normal(rng, (64, 8)).T, "w8_pc")


def test_output_must_be_writable(rng):
    x = normal(rng, (2, 32))
    w = nibble.quantize_weight(normal(rng, (4, 32)), "w8_pc")
    out = np.empty((2, 4), np.float32)
    out.flags.writeable = False
    with pytest.raises(nibble.InvalidArgumentError, match=r"argument 'd' is an output and must "
                                                          r"be writable"):
        nibble.linear(x, w, out=out)


def test_non_arrays_are_type_errors():
    with pytest.raises(TypeError, match=r"argument 'x' must be an array"):
        nibble.quantize_activation([[1.0, 2.0]], out=nibble.empty_activation(
            "s8_per_token", 1, 2, np.empty(1)))


def test_k_limit_is_out_of_range():
    k = 131072  # one above the s8×s8 bound
    with pytest.raises(nibble.OutOfRangeError, match=r"at most 131071"):
        nibble.gemm_s8s8(np.ones((1, k), np.int8), np.ones((1, k), np.int8))


def test_format_and_weight_errors(rng):
    with pytest.raises(nibble.InvalidArgumentError, match=r"must be finite"):
        w = normal(rng, (2, 64))
        w[0, 1] = np.inf
        nibble.quantize_weight(w, "w4_pc")
    with pytest.raises(nibble.InvalidArgumentError, match=r"multiple of the group size"):
        nibble.quantize_weight(normal(rng, (2, 96)), "w4_g64")
    x = normal(rng, (2, 128))
    qw = nibble.quantize_weight(normal(rng, (3, 128)), "w4_g128_asym")
    with pytest.raises(nibble.InvalidArgumentError, match=r"not a format in the catalogue"):
        nibble.linear(nibble.quantize_activation(x), qw)  # asym weights need a16
    with pytest.raises(nibble.InvalidArgumentError, match=r"static and needs act_scale"):
        nibble.quantized_linear(x, nibble.quantize_weight(normal(rng, (3, 128)), "w8_pc"),
                                "w8a8_static")


def test_packed_weights_need_int8_activations(rng):
    x = normal(rng, (2, 128))
    p = nibble.pack_weight(nibble.quantize_weight(normal(rng, (8, 128)), "w4_pc"))
    with pytest.raises(nibble.InvalidArgumentError, match=r"'a.scheme' must be s8_per_token"):
        nibble.linear(nibble.quantize_activation(x, "s4_per_token"), p)
    with pytest.raises(nibble.UnsupportedError,
                       match=r"'w.format' must be a weight scheme that layout w4_mma_k128 holds"):
        nibble.pack_weight(nibble.quantize_weight(normal(rng, (8, 128)), "w8_pc"), "w4_mma_k128")


@pytest.mark.skipif(have_cuda(), reason="checks the CPU-only / no-GPU message")
def test_cuda_without_gpu_is_unsupported():
    with pytest.raises(nibble.UnsupportedError, match=r"argument 'device'"):
        nibble.explain("w4a8_g128", 1, 64, 64, "cuda:0")
