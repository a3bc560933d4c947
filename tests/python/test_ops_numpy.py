"""nibble's operations on numpy arrays (the CPU reference backend): quantizers against numpy
mirrors of docs/formats.md, integer GEMMs bit-exact against numpy int64 products, linear layers
against float64 references computed from the same quantized operands."""

import math

import numpy as np
import pytest

import nibble
from nibble import _C
from nibble_testing import (REL_TOL_F32_OUT, REL_TOL_HALF_OUT, bf16_to_f32, ints,
                            linear_reference, normal, rel_fro)

M_EDGE = (1, 3, 17)


def pack_nibbles(v: np.ndarray) -> np.ndarray:
    """numpy mirror of docs/formats.md section 9: element 2i in the low nibble of byte i."""
    u = v.astype(np.int16) & 0xF
    return (u[:, 0::2] | (u[:, 1::2] << 4)).astype(np.uint8)


def unpack_s4(b: np.ndarray) -> np.ndarray:
    lo = (b & 0xF).astype(np.int8)
    hi = (b >> 4).astype(np.int8)
    v = np.empty((b.shape[0], 2 * b.shape[1]), np.int8)
    v[:, 0::2], v[:, 1::2] = lo, hi
    return np.where(v > 7, v - 16, v).astype(np.int8)


# ---- int4 packing --------------------------------------------------------------------------------
def test_pack_unpack_int4_signed_and_unsigned(rng):
    s = ints(rng, (7, 34), -8, 7)
    p = nibble.pack_int4(s)
    assert p.dtype == np.uint8 and p.shape == (7, 17)
    np.testing.assert_array_equal(p, pack_nibbles(s))
    np.testing.assert_array_equal(nibble.unpack_int4(p), s)
    u = ints(rng, (3, 8), 0, 15, np.uint8)
    np.testing.assert_array_equal(nibble.unpack_int4(nibble.pack_int4(u), signed=False), u)


def test_pack_int4_rejects_out_of_range_values():
    s = np.zeros((2, 4), np.int8)
    s[1, 3] = 8
    with pytest.raises(nibble.InvalidArgumentError, match=r"\[-8, 7\], got 8 at \(1, 3\)"):
        nibble.pack_int4(s)


# ---- weight quantization -------------------------------------------------------------------------
def test_w4_pc_matches_numpy_mirror_bit_exactly(rng):
    w = normal(rng, (9, 64))
    qw = nibble.quantize_weight(w, "w4_pc")
    amax = np.abs(w).max(axis=1)
    s = (amax / np.float32(7)).astype(np.float32)
    for i in range(len(s)):  # stored_scale: nudged up until it covers the range
        while s[i] * np.float32(7) < amax[i]:
            s[i] = np.nextafter(s[i], np.float32(np.inf))
    q = np.clip(np.rint(w / s[:, None]), -8, 7).astype(np.int8)
    np.testing.assert_array_equal(qw.scales, s)
    np.testing.assert_array_equal(unpack_s4(qw.q), q)


def group_expand(a, g):
    return np.repeat(a, g, axis=1)


@pytest.mark.parametrize("fmt", ["w4_pc", "w4_g32", "w4_g128", "w8_pc", "w8_g64",
                                 "w4_g128_asym", "w4_g64_fzp", "w4_g128_2level"])
def test_quantize_weight_error_bounds(rng, fmt):
    n, k = 5, 256
    w = normal(rng, (n, k), 0.05)
    qw = nibble.quantize_weight(w, fmt)
    wf = qw.weight_format
    st = wf.storage(n, k)
    for field, spec in st.items():
        arr = getattr(qw, field)
        assert (arr is None) == (spec is None)
        if spec is not None:  # uint8 storage of 4-bit values: half the columns
            cols = spec[1][-1] // (2 if spec[0] in ("s4", "u4") else 1)
            assert arr.shape[-1] == cols
    deq = nibble.dequantize_weight(qw)
    assert deq.dtype == np.float32 and deq.shape == (n, k)
    err = np.abs(deq.astype(np.float64) - w)
    scales = bf16_to_f32(qw.scales) if wf.scale_dtype == "bf16" else qw.scales.astype(np.float32)
    if wf.scheme == "s4_two_level":
        gs = group_expand(qw.group_scales.astype(np.float64), wf.group_size)
        bound = scales[:, None].astype(np.float64) * (1 + gs) / 2
    else:
        s = scales[:, None] if wf.group_size == 0 else group_expand(scales, wf.group_size)
        bound = s.astype(np.float64) / 2
        if wf.scheme == "u4_fzp":
            z = group_expand(bf16_to_f32(qw.zeros), wf.group_size).astype(np.float64)
            bound = bound + np.abs(z) * 2.0 ** -8  # half an ulp of the bf16 zero
    assert np.all(err <= bound * (1 + 1e-5) + 1e-12), float((err - bound).max())


def test_quantize_weight_accepts_a_linear_format_and_out(rng):
    w = normal(rng, (4, 128))
    out = nibble.empty_weight("w4_g128", 4, 128, w)
    got = nibble.quantize_weight(w, "w4a8_g128", out=out)
    assert got is out and got.format == "w4_g128"
    np.testing.assert_array_equal(got.q, nibble.quantize_weight(w, "w4_g128").q)


def test_quantize_weight_f16_input(rng):
    w = normal(rng, (3, 64))
    a = nibble.quantize_weight(w.astype(np.float16), "w8_pc")
    b = nibble.quantize_weight(w.astype(np.float16).astype(np.float32), "w8_pc")
    np.testing.assert_array_equal(a.q, b.q)
    np.testing.assert_array_equal(a.scales, b.scales)


# ---- activation quantization ---------------------------------------------------------------------
@pytest.mark.parametrize("m", M_EDGE)
def test_quantize_activation_s8_matches_numpy_mirror(rng, m):
    x = normal(rng, (m, 96), 3.0)
    a = nibble.quantize_activation(x)
    s = (np.abs(x).max(axis=1) / np.float32(127)).astype(np.float32)
    q = np.clip(np.rint(x / s[:, None]), -127, 127).astype(np.int8)
    assert a.scheme == "s8_per_token"
    np.testing.assert_array_equal(a.scales, s)
    np.testing.assert_array_equal(a.q, q)


def test_quantize_activation_s4_and_fp8(rng):
    x = normal(rng, (3, 64))
    a = nibble.quantize_activation(x, "s4_per_token")
    assert a.q.shape == (3, 32) and a.q.dtype == np.uint8
    s = (np.abs(x).max(axis=1) / np.float32(7)).astype(np.float32)
    np.testing.assert_array_equal(unpack_s4(a.q), np.clip(np.rint(x / s[:, None]), -7, 7))
    f = nibble.quantize_activation(x, "w4afp8_pc")  # scheme taken from a linear format
    assert f.scheme == "e4m3_per_token" and f.q.dtype == np.uint8
    deq = nibble.dequantize_activation(f)
    assert rel_fro(deq, x) < 2.0 ** -4


def test_quantize_activation_static(rng):
    x = normal(rng, (5, 32))
    scale = float(np.abs(x).max()) / 100  # some values clip at ±127
    a = nibble.quantize_activation_static(x, scale)
    assert a.scheme == "s8_per_tensor" and a.scales.shape == (1,)
    np.testing.assert_array_equal(
        a.q, np.clip(np.rint(x / np.float32(scale)), -127, 127).astype(np.int8))


def test_quantize_activation_rejects_non_finite(rng):
    x = normal(rng, (2, 16))
    x[1, 5] = np.nan
    with pytest.raises(nibble.InvalidArgumentError, match=r"finite.*\(1, 5\)"):
        nibble.quantize_activation(x)


# ---- integer GEMMs -------------------------------------------------------------------------------
# ---- fused RMSNorm / SmoothQuant divide (docs/formats.md §6.1) ----------------------------------
def rmsnorm_mirror(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """numpy mirror of the fused RMSNorm: the mean of squares as an exact integer sum on the
    grid of the row's largest |x|, r = 1/sqrt(ms + eps) in f32, y = round_x(round_x(x·r)·w)."""
    k = x.shape[1]
    bits = 62 - (k - 1).bit_length()  # 62 − ceil(log2 K)
    y = np.empty(x.shape, x.dtype)
    for m in range(x.shape[0]):
        row = x[m].astype(np.float32)
        amax = float(np.abs(row).max())
        ms = np.float32(0)
        if amax != 0:
            e = math.frexp(amax)[1]
            terms = np.rint(np.ldexp(row.astype(np.float64) ** 2, bits - 2 * e)).astype(np.uint64)
            total = int(terms.sum(dtype=np.uint64))
            ms = np.float32(math.ldexp(float(total), 2 * e - bits) * (1.0 / k))
        r = np.float32(1) / np.sqrt(np.float32(ms) + np.float32(eps))
        n = (row * r).astype(x.dtype).astype(np.float32)
        y[m] = (n * w.astype(np.float32)).astype(x.dtype)
    return y


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("k", [2, 34, 4096])
def test_fused_quantize_activation_matches_numpy_mirror(rng, dtype, k):
    x = (normal(rng, (5, k)) * 3).astype(dtype)
    x[1] = 0  # a zero row
    w = (1 + normal(rng, (k,), 0.5)).astype(dtype)
    smooth = np.exp2(rng.uniform(-3, 3, k)).astype(np.float32)
    normed = np.full(x.shape, np.nan, dtype)
    a = nibble.quantize_activation(x, rms_weight=w, rms_eps=1e-5, smooth=smooth,
                                   normed_out=normed)
    y = rmsnorm_mirror(x, w, 1e-5)
    np.testing.assert_array_equal(normed, y)
    v = y.astype(np.float32) / smooth
    s = (np.abs(v).max(axis=1) / np.float32(127)).astype(np.float32)
    safe = np.where(s == 0, np.float32(1), s)
    q = np.where(s[:, None] == 0, 0, np.clip(np.rint(v / safe[:, None]), -127, 127))
    np.testing.assert_array_equal(a.scales, s)
    np.testing.assert_array_equal(a.q, q.astype(np.int8))
    # The unfused composition: quantizing v as an f32 matrix gives the same bytes.
    b = nibble.quantize_activation(v)
    np.testing.assert_array_equal(a.q, b.q)
    np.testing.assert_array_equal(a.scales, b.scales)


def test_fused_quantize_activation_static_s4_fp8_and_return_normed(rng):
    x = normal(rng, (4, 64), 2.0)
    w = (1 + normal(rng, (64,), 0.3)).astype(np.float32)
    smooth = np.exp2(rng.uniform(-2, 2, 64)).astype(np.float32)
    a, y = nibble.quantize_activation_static(x, 0.02, rms_weight=w, smooth=smooth,
                                             return_normed=True)
    np.testing.assert_array_equal(y, rmsnorm_mirror(x, w, 1e-6))
    v = y / smooth
    np.testing.assert_array_equal(
        a.q, np.clip(np.rint(v / np.float32(0.02)), -127, 127).astype(np.int8))
    for scheme in ("s4_per_token", "e4m3_per_token"):
        fused = nibble.quantize_activation(x, scheme, rms_weight=w, smooth=smooth)
        plain = nibble.quantize_activation(v, scheme)
        np.testing.assert_array_equal(fused.q, plain.q)
        np.testing.assert_array_equal(fused.scales, plain.scales)
    inplace = x.copy()  # normed may be x itself
    b = nibble.quantize_activation(inplace, rms_weight=w, normed_out=inplace)
    np.testing.assert_array_equal(inplace, y)
    np.testing.assert_array_equal(b.q, nibble.quantize_activation(y).q)


def test_fused_quantize_activation_errors(rng):
    x = normal(rng, (2, 16))
    w = np.ones(16, np.float32)
    smooth = np.ones(16, np.float32)
    smooth[3] = 0
    with pytest.raises(nibble.InvalidArgumentError, match=r"'fusion.smooth' must be positive.*at 3"):
        nibble.quantize_activation(x, smooth=smooth)
    with pytest.raises(nibble.InvalidArgumentError, match=r"'fusion.normed'.*needs fusion.rms_weight"):
        nibble.quantize_activation(x, normed_out=np.empty_like(x))
    with pytest.raises(nibble.InvalidArgumentError, match=r"'fusion.rms_eps' must be positive"):
        nibble.quantize_activation(x, rms_weight=w, rms_eps=0.0)
    with pytest.raises(nibble.InvalidArgumentError, match=r"'fusion.rms_weight' must have shape \[16\]"):
        nibble.quantize_activation(x, rms_weight=np.ones(8, np.float32))
    with pytest.raises(nibble.InvalidArgumentError, match="return_normed needs rms_weight"):
        nibble.quantize_activation(x, return_normed=True)


@pytest.mark.parametrize("m", M_EDGE)
def test_gemm_s8s8_exact(rng, m):
    a = ints(rng, (m, 96), -128, 127)
    w = ints(rng, (33, 96), -128, 127)
    d = nibble.gemm_s8s8(a, w)
    assert d.dtype == np.int32 and d.shape == (m, 33)
    np.testing.assert_array_equal(d, a.astype(np.int64) @ w.astype(np.int64).T)


@pytest.mark.parametrize("m", M_EDGE)
def test_gemm_s8s4_and_s4s4_exact(rng, m):
    a8 = ints(rng, (m, 128), -128, 127)
    a4 = ints(rng, (m, 128), -8, 7)
    w4 = ints(rng, (24, 128), -8, 7)
    ref8 = a8.astype(np.int64) @ w4.astype(np.int64).T
    np.testing.assert_array_equal(nibble.gemm_s8s4(a8, pack_nibbles(w4)), ref8)
    np.testing.assert_array_equal(nibble.gemm_s32(a8, pack_nibbles(w4)), ref8)  # uint8 = s4
    np.testing.assert_array_equal(nibble.gemm_s4s4(pack_nibbles(a4), pack_nibbles(w4)),
                                  a4.astype(np.int64) @ w4.astype(np.int64).T)
    packed = nibble.pack_s4_matrix(pack_nibbles(w4))
    assert not packed.has_scales and packed.n_pad == 24 and packed.k_pad == 128
    np.testing.assert_array_equal(nibble.gemm_s8s4(a8, packed), ref8)


def test_gemm_out_and_strided_rows(rng):
    big = ints(rng, (3, 160), -128, 127)
    a = big[:, :96]  # row stride 160: allowed, rows are contiguous
    w = ints(rng, (5, 96), -128, 127)
    out = np.full((3, 5), 7, np.int32)
    assert nibble.gemm_s8s8(a, w, out=out) is out
    np.testing.assert_array_equal(out, a.astype(np.int64) @ w.astype(np.int64).T)


# ---- linear layers -------------------------------------------------------------------------------
GROUP_VARIANTS = ("w4a8_g32", "w4a8_g64_2level", "w8a8_g128", "w4a16_g32_asym", "w4a4_g64",
                  "w4afp8_g256", "w8a16_g128")


@pytest.mark.parametrize("fmt", nibble.LINEAR_FORMATS + GROUP_VARIANTS)
@pytest.mark.parametrize("m", M_EDGE)
def test_linear_every_format_against_float64_reference(rng, fmt, m):
    n, k = 19, 256
    lf = nibble.linear_format(fmt)
    x = normal(rng, (m, k))
    w = normal(rng, (n, k), 0.05)
    bias = normal(rng, (n,))
    qw = nibble.quantize_weight(w, fmt)
    if lf.weight_only:
        a = x
    elif lf.static:
        a = nibble.quantize_activation_static(x, float(np.abs(x).max()) / 127)
    else:
        a = nibble.quantize_activation(x, fmt)
    d = nibble.linear(a, qw, bias)
    assert d.dtype == np.float32 and d.shape == (m, n)
    ref = linear_reference(a, qw, bias)
    assert rel_fro(d, ref) < REL_TOL_F32_OUT
    h = nibble.linear(a, qw, bias, out_dtype="f16")
    assert h.dtype == np.float16 and rel_fro(h, ref) < REL_TOL_HALF_OUT
    y = nibble.quantized_linear(x, qw, fmt, bias,
                                act_scale=float(np.abs(x).max()) / 127 if lf.static else None)
    np.testing.assert_array_equal(y, d)


def test_linear_bf16_output_in_a_numpy_bit_container(rng):
    x = normal(rng, (3, 128))
    qw = nibble.quantize_weight(normal(rng, (8, 128)), "w8_pc")
    a = nibble.quantize_activation(x)
    d = nibble.linear(a, qw, out_dtype="bf16")
    assert d.dtype == np.uint16
    assert rel_fro(bf16_to_f32(d), linear_reference(a, qw)) < REL_TOL_HALF_OUT


@pytest.mark.parametrize("fmt,k", [("w4a8_pc", 352), ("w4a8_g128", 384),
                                   ("w4a8_g64_2level", 320), ("w4a8_g32_static", 416),
                                   ("w4afp8_pc", 352), ("w4afp8_g128", 384), ("w4afp8_g64", 320)])
@pytest.mark.parametrize("m", M_EDGE)
def test_packed_linear_on_cpu_equals_logical(rng, fmt, k, m):
    n = 21  # N not a multiple of 8, K (but for g128) not of 128: the layout pads both
    lf = nibble.linear_format(fmt)
    x = normal(rng, (m, k))
    qw = nibble.quantize_weight(normal(rng, (n, k)), fmt)
    p = nibble.pack_weight(qw)
    assert (p.layout, p.version, p.n_pad, p.k_pad) == ("w4_mma_k128", 1, 24, -(-k // 128) * 128)
    a = (nibble.quantize_activation_static(x, 0.05) if lf.static
         else nibble.quantize_activation(x, lf))
    bias = normal(rng, (n,))
    np.testing.assert_array_equal(nibble.linear(a, p, bias), nibble.linear(a, qw, bias))


@pytest.mark.parametrize("fmt,k", [("w4a16_pc", 352), ("w4a16_g128", 384),
                                   ("w4a16_g64_asym", 320), ("w4a16_g32_fzp", 416),
                                   ("w8a16", 200)])
@pytest.mark.parametrize("m", [1, 3, 17])
def test_packed_weight_only_linear_on_cpu_equals_logical(rng, fmt, k, m):
    n = 21
    lf = nibble.linear_format(fmt)
    layout = nibble.packed_layout(lf)
    assert layout == ("w8_mma16_k128" if lf.weight.scheme == "s8_sym" else "w4_mma16_k128")
    assert lf.packable(k)
    x = normal(rng, (m, k))
    qw = nibble.quantize_weight(normal(rng, (n, k)), fmt)
    p = nibble.pack_weight(qw, layout)
    assert (p.layout, p.n_pad, p.k_pad) == (layout, 24, -(-k // 128) * 128)
    assert (p.zeros is not None) == (lf.weight.scheme in ("u4_asym", "u4_fzp"))
    bias = normal(rng, (n,))
    np.testing.assert_array_equal(nibble.linear(x, p, bias), nibble.linear(x, qw, bias))


def test_packed_layout_names():
    assert nibble.packed_layout("w4a8_g128") == "w4_mma_k128"
    assert nibble.packed_layout("w4a16_g128_asym") == "w4_mma16_k128"
    assert nibble.packed_layout("w8a16") == "w8_mma16_k128"
    assert nibble.packed_layout("w4afp8_g128") == "w4_mma_k128"
    assert nibble.packed_layout("w8a8") is None


def test_pack_weight_is_a_bijection_on_the_values(rng):
    n, k = 9, 160
    qw = nibble.quantize_weight(normal(rng, (n, k)), "w4_g32")
    p = nibble.pack_weight(qw)
    q = unpack_s4(qw.q)
    got = np.array([[_C.packed_weight_value(p._c(), i, j) for j in range(k)] for i in range(n)])
    np.testing.assert_array_equal(got, q)
    byte, shift = _C.w4_mma_k128_index(3, 37, p.k_pad)
    assert ((int(p.q[byte]) >> shift) & 0xF) == (int(q[3, 37]) + 8) & 0xF


def test_explain_on_cpu():
    s = nibble.explain("w4a8_g128", 1, 4096, 4096)
    assert "CPU reference" in s and "w4a8_g128" in s
    s = nibble.explain(nibble.linear_format("w8a8"), 3, 5, 64, "cpu")
    assert s.startswith("w8a8 M=3 N=5 K=64")
