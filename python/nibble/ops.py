"""nibble's operations on DLPack arrays (numpy on the CPU, torch on the CPU or CUDA, cupy).

One GEMM convention throughout::

    D[M,N] = A[M,K] · W[N,K]ᵀ (+ bias[N])     A = activations (row-major), W like nn.Linear

Every function validates its arguments in the C++ library before touching an output and raises
a subclass of ``nibble.NibbleError`` naming the argument: ``InvalidArgumentError`` (also a
ValueError) for a wrong shape, dtype, stride, device or value, ``UnsupportedError`` (also a
NotImplementedError) for a valid request this build or device cannot run, ``OutOfRangeError``
for sizes beyond a documented limit, ``CudaError`` for CUDA failures.

Arrays and dtypes. Tensors are 2-D (M, K) / (N, K) / (M, N), rows with a contiguous last
dimension (row strides are free). nibble dtypes map to array element types as follows; the
types an array library lacks are held in integer arrays of the same width:

    nibble   numpy / cupy          torch                 meaning
    f32      float32               float32
    f16      float16               float16
    bf16     uint16 (bits)         bfloat16
    e4m3     uint8 (bits)          float8_e4m3fn         OCP FP8 E4M3 "FN"
    s8 / u8  int8 / uint8          int8 / uint8
    s4 / u4  uint8, (R, C/2)       uint8, (R, C/2)       two values per byte, element 2i in
                                                         the low nibble; C values per row
    s32      int32                 int32

Each function has an ``out=`` form that writes into preallocated arrays and returns them, and
allocates its outputs with the input's library and device otherwise. CUDA work is queued on
``stream`` (an int handle such as ``torch.cuda.current_stream().cuda_stream``, or a torch/cupy
stream object); the default is the current stream of the input's library (0, the legacy default
stream, for other arrays). Nothing synchronizes.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Union

from . import _C
from . import _arrays
from .formats import LinearFormat, WeightFormat, linear_format, to_weight_format

Array = Any


# ---- quantized tensors ---------------------------------------------------------------------------

@dataclasses.dataclass
class QuantizedWeight:
    """A weight matrix W[N,K] in a logical format (docs/formats.md, table 1).

    Attributes:
      format: canonical weight format string, e.g. ``"w4_g128"``.
      n, k: logical sizes.
      q: (N, K) stored values: s4/u4 as uint8 (N, K/2), s8 as int8.
      scales: (N) per channel or (N, K/G) per group, in the format's scale dtype (f32 per
        channel, bf16 per group by default); two-level: the f32 channel scale s_ch (N).
      zeros: u4_asym: (N, K/G) u8 integer zeros z ∈ [0, 15]; u4_fzp: (N, K/G) float zeros in
        the scale dtype; two-level: (N, K/G) u8 g_z; otherwise None.
      group_scales: two-level only: (N, K/G) u8 integer group scales g_s ∈ [1, 255].

    Dequantization: s4/s8 symmetric w = s·q; u4_asym w = s·(q − z); u4_fzp w = s·(q − 8) + z;
    two-level w = s_ch·g_s·(q − g_z).
    """

    format: str
    n: int
    k: int
    q: Array
    scales: Array
    zeros: Optional[Array] = None
    group_scales: Optional[Array] = None

    @property
    def weight_format(self) -> WeightFormat:
        return to_weight_format(self.format)

    def _c(self):
        st = self.weight_format.storage(self.n, self.k)

        def a(field):
            x = getattr(self, field)
            return None if x is None else _arrays.arg(x, st[field][0] if st[field] else None)

        return (self.format, int(self.n), int(self.k), a("q"), a("scales"), a("zeros"),
                a("group_scales"))

    def arrays(self):
        """{'q', 'scales', 'zeros', 'group_scales'} → array or None."""
        return {f: getattr(self, f) for f in ("q", "scales", "zeros", "group_scales")}


@dataclasses.dataclass
class QuantizedActivation:
    """Quantized activations A[M,K]: ``scheme`` s8_per_token / s8_per_tensor / s4_per_token /
    e4m3_per_token; ``q`` (M, K) s8 (int8), s4 (uint8 (M, K/2)) or e4m3; ``scales`` f32 (M)
    per token or (1) per tensor. a[m,k] = scales[m]·q[m,k] (scales[0] per tensor)."""

    scheme: str
    q: Array
    scales: Array

    def _c(self):
        return (self.scheme, _arrays.arg(self.q, _ACT_DTYPE[self.scheme]),
                _arrays.arg(self.scales, "f32"))


_ACT_DTYPE = {"s8_per_token": "s8", "s8_per_tensor": "s8", "s4_per_token": "s4",
              "e4m3_per_token": "e4m3"}


@dataclasses.dataclass
class PackedWeight:
    """A weight in a kernel-native layout made by `pack_weight` (docs/layouts.md).

    ``layout`` (``version`` 1): ``"w4_mma_k128"``, int4 weights for the W4A8 tensor-core
    kernels; ``"w4_mma16_k128"`` / ``"w8_mma16_k128"``, int4 / int8 weights for the W4A16 /
    W8A16 kernels (bf16/f16 activations). ``q``: uint8 (n_pad · k_pad · bits / 8) bytes;
    ``scales``: f32 (n_pad) or (⌈k_pad/G⌉, n_pad); ``group_params``: two-level only, u8
    (k_pad/G, 2·n_pad); ``zeros``: u4_asym / u4_fzp in the 16-bit layouts, f32 like the scales.
    ``n_pad`` is N rounded up to 8, ``k_pad`` K rounded up to 128. ``format`` is the logical
    weight format it came from; ``has_scales`` is False for a raw s4 matrix
    (`pack_s4_matrix`)."""

    layout: str
    version: int
    format: str
    has_scales: bool
    n: int
    k: int
    n_pad: int
    k_pad: int
    q: Array
    scales: Optional[Array]
    group_params: Optional[Array]
    zeros: Optional[Array] = None

    def _c(self):
        return (self.layout, self.version, self.format, self.has_scales, self.n, self.k,
                self.n_pad, self.k_pad, _arrays.arg(self.q, "u8"),
                _arrays.arg(self.scales, "f32"), _arrays.arg(self.group_params, "u8"),
                _arrays.arg(self.zeros, "f32"))

    def to(self, like: Array) -> "PackedWeight":
        """A copy whose arrays are in the library and on the device of `like`."""
        def move(x):
            return None if x is None else _arrays.to_library(_arrays.to_numpy(x), like)
        return dataclasses.replace(self, q=move(self.q), scales=move(self.scales),
                                   group_params=move(self.group_params),
                                   zeros=move(self.zeros))


# ---- quantization --------------------------------------------------------------------------------

def empty_weight(format: Union[str, WeightFormat, LinearFormat], n: int, k: int,
                 like: Array) -> QuantizedWeight:
    """Uninitialised buffers of an N×K quantized weight, in `like`'s library and device."""
    wf = to_weight_format(format)
    st = wf.storage(n, k)
    bufs = {f: None if s is None else _arrays.empty(s[0], s[1], like) for f, s in st.items()}
    return QuantizedWeight(wf.name, int(n), int(k), **bufs)


def quantize_weight(w: Array, format: Union[str, WeightFormat, LinearFormat], *,
                    out: Optional[QuantizedWeight] = None) -> QuantizedWeight:
    """Quantizes weights W (N, K) f32/f16/bf16 into a logical weight format (CPU only).

    ``format`` is a weight format (``"w4_g128"``) or a linear format (``"w4a8_g128"``, whose
    weight part is used). Round-to-nearest of min-max statistics, per output channel or per
    group of G columns, ties to even (docs/formats.md, table 1):
      s4/s8 symmetric  s = max|w| / qmax (7 or 127), q = round(w / s)
      u4_asym          s = (max − min) / 15 over the range widened to include 0,
                       z = round(−min / s), q = round(w / s) + z
      u4_fzp           s = (max − min) / 15, z = min + 8s (float), q = round((w − z) / s) + 8
      two-level        int8 per channel (s_ch = max|w| / 119), then uint4 per group with an
                       integer scale g_s and zero g_z
    Scales are rounded to their dtype before q is computed, so dequantization reproduces
    exactly what the C++ reference and the kernels use. Returns a QuantizedWeight (see its
    shapes); raises InvalidArgumentError for non-finite weights or shapes the format does not
    take (K even for 4-bit, K % G == 0).
    """
    if out is None:
        n, k = (int(s) for s in w.shape) if len(w.shape) == 2 else (0, 0)
        if len(w.shape) != 2:
            raise _C.InvalidArgumentError(
                f"nibble::quantize_weight: argument 'w' must be a matrix (N, K), got shape "
                f"{tuple(w.shape)}")
        out = empty_weight(format, n, k, w)
    _C.quantize_weight(_arrays.arg(w), out._c())
    return out


def dequantize_weight(w: QuantizedWeight, *, out: Optional[Array] = None) -> Array:
    """The f32 (N, K) weights a QuantizedWeight stands for (CPU only): the exact inverse
    mapping of its format, evaluated in f32."""
    if out is None:
        out = _arrays.empty("f32", (w.n, w.k), w.q)
    _C.dequantize_weight(w._c(), _arrays.arg(out))
    return out


def int4_packing_of(quantization_config: dict) -> tuple:
    """(packing, group_size) of a GPTQ or AWQ checkpoint from its config.json
    ``quantization_config``: packing "gptq" (AutoGPTQ / GPTQModel / optimum's original format,
    zeros stored minus 1), "gptq_v2" or "awq" (AutoAWQ's GEMM packing). Raises
    UnsupportedError naming the key for what nibble does not import: other methods, bits other
    than 4, group sizes other than 32, 64, 128, 256, other GPTQ checkpoint formats, AWQ GEMV or
    without zero points, a quantized lm_head."""
    qc = quantization_config or {}

    def first(*keys, default):
        for key in keys:
            if qc.get(key) is not None:
                return qc[key]
        return default

    group = int(first("group_size", "q_group_size", default=0))
    packing = _C.int4_packing_of(str(first("quant_method", default="")),
                                 int(first("bits", "w_bit", default=0)), group,
                                 str(first("checkpoint_format", default="gptq")),
                                 str(first("version", default="gemm")),
                                 bool(first("zero_point", default=True)),
                                 bool(first("lm_head", default=False)))
    return packing, group


def unpack_int4_checkpoint(packing: str, qweight: Array, qzeros: Array, scales: Array,
                           g_idx: Optional[Array] = None, *, group_size: int) -> QuantizedWeight:
    """One 4-bit layer of a GPTQ or AWQ checkpoint (CPU arrays) as the QuantizedWeight holding
    the same numbers, format ``w4_g<G>_asym_sf16``: w = s·(q − z) per group, f16 scales, nothing
    rounded again; N × K with (K/G, N) = scales.shape. Layouts (``packing``, see
    int4_packing_of): gptq qweight (K/8, N) int32 packed along K, qzeros (K/G, N/8) int32 packed
    along N (minus 1 in "gptq"), g_idx (K) int32 or None; awq qweight (K, N/8) and qzeros
    packed along N in AutoAWQ's order 0 2 4 6 1 3 5 7; scales (K/G, N) float16. Raises
    UnsupportedError for an act-order g_idx (it permutes the inputs) and for a "gptq" zero
    that overflows to 16, InvalidArgumentError for shapes and dtypes."""
    groups, n = (int(x) for x in scales.shape)
    out = empty_weight(f"w4_g{int(group_size)}_asym_sf16", n, groups * int(group_size), scales)
    _C.unpack_int4_checkpoint(packing, _arrays.arg(qweight), _arrays.arg(qzeros),
                              _arrays.arg(scales), _arrays.arg(g_idx), out._c())
    return out


def _act_scheme(scheme: Union[str, LinearFormat]) -> str:
    if isinstance(scheme, LinearFormat):
        return scheme.act
    if scheme in _ACT_DTYPE or scheme == "none":
        return scheme
    return linear_format(scheme).act


def empty_activation(scheme: str, m: int, k: int, like: Array) -> QuantizedActivation:
    """Uninitialised buffers of quantized activations (M, K) in `like`'s library and device."""
    scheme = _act_scheme(scheme)
    if scheme not in _ACT_DTYPE:
        raise _C.InvalidArgumentError(
            f"nibble: activation scheme must be one of {sorted(_ACT_DTYPE)}, got '{scheme}'")
    rows = 1 if scheme == "s8_per_tensor" else m
    return QuantizedActivation(scheme, _arrays.empty(_ACT_DTYPE[scheme], (m, k), like),
                               _arrays.empty("f32", (rows,), like))


def _fusion_args(x, rms_weight, rms_eps, smooth, normed_out, return_normed):
    """The C++ fusion arguments, allocating `normed_out` like x when asked to return it."""
    if return_normed and normed_out is None:
        if rms_weight is None:
            raise _C.InvalidArgumentError(
                "nibble: return_normed needs rms_weight (normed is the RMSNorm output)")
        normed_out = _arrays.empty(_arrays.natural_dtype(x) or "f32",
                                   (int(x.shape[0]), int(x.shape[-1])), x)
    return (dict(rms_weight=_arrays.arg(rms_weight), rms_eps=float(rms_eps),
                 smooth=_arrays.arg(smooth), normed=_arrays.arg(normed_out)), normed_out)


def quantize_activation(x: Array, scheme: Union[str, LinearFormat] = "s8_per_token", *,
                        rms_weight: Optional[Array] = None, rms_eps: float = 1e-6,
                        smooth: Optional[Array] = None, normed_out: Optional[Array] = None,
                        return_normed: bool = False,
                        out: Optional[QuantizedActivation] = None,
                        stream: Any = None):
    """Dynamic per-token quantization of activations X (M, K) f32/f16/bf16, on x's device,
    optionally with RMSNorm and a SmoothQuant divide fused in front (one kernel on the GPU).

    The values quantized, per row m (docs/formats.md §6.1 gives the exact rounding points):

      RMSNorm (``rms_weight`` (K) in x's dtype or f32):
          r = 1 / sqrt(mean_k x[m,k]² + rms_eps)        (the mean is exact: an integer sum)
          y[m,k] = round_x(round_x(x[m,k] · r) · rms_weight[k])      (round_x: to x's dtype)
      SmoothQuant (``smooth`` (K) f32/f16/bf16, positive):  v = y / smooth[k]
      without them y = x and v = y.

    Then amax = max_k |v[m,k]|, s[m] = amax / qmax (one f32 division; qmax 127 for
    ``s8_per_token``, 7 for ``s4_per_token``, 448 for ``e4m3_per_token``), q = round(v / s)
    clamped to [−qmax, qmax] (e4m3: converted with saturation). A row of zeros gets s = 0 and
    q = 0. ``scheme`` may also be a linear format string (its activation scheme is used).
    ``normed_out`` (M, K) in x's dtype (x itself for in place) receives y; with
    ``return_normed=True`` it is allocated like x and the call returns (activation, normed).
    Returns QuantizedActivation(q (M, K) s8 / s4 / e4m3, scales f32 (M)). On the CPU, NaN or
    infinite inputs (or fused values) raise InvalidArgumentError; on the GPU such a row gets a
    non-finite scale.
    """
    scheme = _act_scheme(scheme)
    if out is None:
        out = empty_activation(scheme, int(x.shape[0]), int(x.shape[-1]), x)
    fusion, normed_out = _fusion_args(x, rms_weight, rms_eps, smooth, normed_out, return_normed)
    _C.quantize_activation(_arrays.arg(x), out._c(), _arrays.stream_handle(stream, x), **fusion)
    return (out, normed_out) if return_normed else out


def quantize_activation_static(x: Array, scale: float, *, rms_weight: Optional[Array] = None,
                               rms_eps: float = 1e-6, smooth: Optional[Array] = None,
                               normed_out: Optional[Array] = None, return_normed: bool = False,
                               out: Optional[QuantizedActivation] = None,
                               stream: Any = None):
    """Static per-tensor int8 quantization with a calibrated scale: q = clamp(round(v / scale),
    −127, 127), where v is x, or x after the fused RMSNorm and SmoothQuant divide exactly as
    in `quantize_activation` (``rms_weight``, ``rms_eps``, ``smooth``, ``normed_out``,
    ``return_normed``). x (M, K) f32/f16/bf16; returns QuantizedActivation("s8_per_tensor",
    q (M, K) int8, scales f32 (1) = [scale]). ``scale`` must be positive and finite and is
    the calibrated scale of v."""
    if out is None:
        out = empty_activation("s8_per_tensor", int(x.shape[0]), int(x.shape[-1]), x)
    fusion, normed_out = _fusion_args(x, rms_weight, rms_eps, smooth, normed_out, return_normed)
    _C.quantize_activation_static(_arrays.arg(x), float(scale), out._c(),
                                  _arrays.stream_handle(stream, x), **fusion)
    return (out, normed_out) if return_normed else out


def dequantize_activation(a: QuantizedActivation, *, out: Optional[Array] = None) -> Array:
    """f32 (M, K) = scales[m]·q[m,k] (CPU only)."""
    if out is None:
        m = int(a.q.shape[0])
        k = int(a.q.shape[1]) * (2 if a.scheme == "s4_per_token" else 1)
        out = _arrays.empty("f32", (m, k), a.q)
    _C.dequantize_activation(a._c(), _arrays.arg(out))
    return out


def pack_int4(x: Array, *, out: Optional[Array] = None) -> Array:
    """Packs int8 (R, C) values in [−8, 7] into s4, or uint8 values in [0, 15] into u4: a
    uint8 (R, C/2) array, element 2i in the low nibble of byte i (CPU only; C even). Values
    outside the 4-bit range raise InvalidArgumentError."""
    signed = _arrays.natural_dtype(x) == "s8"
    dtype = "s4" if signed else "u4"
    if out is None:
        out = _arrays.empty(dtype, tuple(x.shape), x)
    _C.pack_int4(_arrays.arg(x), _arrays.arg(out, dtype))
    return out


def unpack_int4(packed: Array, *, signed: bool = True, out: Optional[Array] = None) -> Array:
    """The inverse of pack_int4: uint8 (R, C/2) bytes → int8 (R, C) sign-extended s4 values
    (``signed=True``) or uint8 (R, C) u4 values (CPU only)."""
    src, dst = ("s4", "s8") if signed else ("u4", "u8")
    if out is None:
        out = _arrays.empty(dst, (packed.shape[0], 2 * packed.shape[1]), packed)
    _C.unpack_int4(_arrays.arg(packed, src), _arrays.arg(out, dst))
    return out


# ---- packed layouts --------------------------------------------------------------------------------

def _from_tuple(t, like) -> PackedWeight:
    p = PackedWeight(*t)
    if _arrays.library(like) == "numpy":
        return p
    return p.to(like)


def packed_layout(format: Union[str, LinearFormat]) -> Optional[str]:
    """The packed layout the tensor-core kernels of a linear format read, or None when the
    format has none: W4A8 (s8 activations, int4 symmetric or two-level weights) and W4A-FP8
    (e4m3 activations, int4 symmetric weights) → ``"w4_mma_k128"``; W4A16 (s4_sym, u4_asym, u4_fzp) → ``"w4_mma16_k128"``; W8A16 →
    ``"w8_mma16_k128"``."""
    name = format.name if isinstance(format, LinearFormat) else format
    return _C.packed_layout(name)


def pack_weight(w: QuantizedWeight, layout: Optional[str] = None) -> PackedWeight:
    """Repacks a quantized weight into a tensor-core layout (docs/layouts.md): ``layout`` as
    `packed_layout(linear format)` names it. By default: w4_mma_k128 (W4A8) for int4 symmetric
    and two-level weights, w4_mma16_k128 for u4_asym / u4_fzp, w8_mma16_k128 for int8 — pass
    ``"w4_mma16_k128"`` to pack int4 symmetric weights for W4A16. The packing runs on the host;
    the result's arrays are in w's library and on w.q's device. Bit-exact: every value, scale
    and zero is kept (scales and zeros become f32)."""
    if layout is None:
        scheme = w.weight_format.scheme
        layout = {"u4_asym": "w4_mma16_k128", "u4_fzp": "w4_mma16_k128",
                  "s8_sym": "w8_mma16_k128"}.get(scheme, "w4_mma_k128")
    host = QuantizedWeight(w.format, w.n, w.k,
                           **{f: None if x is None else _arrays.to_numpy(x)
                              for f, x in w.arrays().items()})
    return _from_tuple(_C.pack_weight(host._c(), layout), w.q)


def pack_s4_matrix(w: Array) -> PackedWeight:
    """Packs a raw s4 matrix W (N, K) (uint8 (N, K/2) bytes) into w4_mma_k128 for
    `gemm_s32(a, packed)`; it carries no scales. The result is in w's library and device."""
    return _from_tuple(_C.pack_s4_matrix(_arrays.arg(_arrays.to_numpy(w), "s4")), w)


# ---- GEMMs -----------------------------------------------------------------------------------------

def gemm_s32(a: Array, w: Union[Array, PackedWeight], *, a_dtype: Optional[str] = None,
             w_dtype: Optional[str] = None, out: Optional[Array] = None,
             stream: Any = None) -> Array:
    """Exact integer GEMM: D (M, N) int32 = A (M, K) · W (N, K)ᵀ.

    Operand pairs: s8×s8, s8×s4 (A int8, W int4) and s4×s4. ``a_dtype`` / ``w_dtype`` name
    each operand's dtype ("s8" or "s4"); by default an int8 array is s8 and a uint8 array holds
    packed s4 values (shape (R, K/2)). ``w`` may also be a PackedWeight from pack_s4_matrix or
    pack_weight (s8×s4 only; scales ignored; the tensor-core kernel on CUDA). K must not
    exceed max_int32_accumulation_k (131071 for s8×s8, 2097151 for s8×s4, 33554431 for s4×s4),
    else OutOfRangeError.
    """
    def operand_dtype(x, given):
        if given is not None:
            return given
        return "s4" if _arrays.natural_dtype(x) == "u8" else _arrays.natural_dtype(x)

    ad = operand_dtype(a, a_dtype)
    if isinstance(w, PackedWeight):
        n = w.n
    else:
        n = int(w.shape[0])
    if out is None:
        out = _arrays.empty("s32", (int(a.shape[0]), n), a)
    s = _arrays.stream_handle(stream, a)
    if isinstance(w, PackedWeight):
        _C.gemm_s32_packed(_arrays.arg(a, ad), w._c(), _arrays.arg(out), s)
    else:
        _C.gemm_s32(_arrays.arg(a, ad), _arrays.arg(w, operand_dtype(w, w_dtype)),
                    _arrays.arg(out), s)
    return out


def gemm_s8s8(a: Array, w: Array, **kw) -> Array:
    """D (M, N) int32 = A (M, K) int8 · W (N, K)ᵀ int8, exact (see gemm_s32)."""
    return gemm_s32(a, w, a_dtype="s8", w_dtype="s8", **kw)


def gemm_s8s4(a: Array, w: Union[Array, PackedWeight], **kw) -> Array:
    """D (M, N) int32 = A (M, K) int8 · W (N, K)ᵀ int4, W as uint8 (N, K/2) packed s4 bytes
    or a PackedWeight, exact (see gemm_s32)."""
    return gemm_s32(a, w, a_dtype="s8", w_dtype=None if isinstance(w, PackedWeight) else "s4",
                    **kw)


def gemm_s4s4(a: Array, w: Array, **kw) -> Array:
    """D (M, N) int32 = A (M, K) int4 · W (N, K)ᵀ int4, both uint8 (·, K/2) packed s4 bytes,
    exact (see gemm_s32)."""
    return gemm_s32(a, w, a_dtype="s4", w_dtype="s4", **kw)


def linear(a: Union[QuantizedActivation, Array], w: Union[QuantizedWeight, PackedWeight],
           bias: Optional[Array] = None, *, out: Optional[Array] = None,
           out_dtype: Optional[str] = None, stream: Any = None) -> Array:
    """Quantized linear layer, D (M, N) = A (M, K) · W (N, K)ᵀ (+ bias (N)).

    With quantized activations ``a`` (QuantizedActivation) — W4A8, W8A8, W4A4, W4A8-FP8:
      per-channel weights:  D[m,n] = sa[m] · sw[n] · Σ_k qa[m,k]·qw[n,k]
      group-wise weights:   D[m,n] = sa[m] · Σ_g sw[n,g] · Σ_{k∈g} qa[m,k]·qw[n,k]
      two-level weights:    D[m,n] = sa[m] · s_ch[n] · Σ_k qa[m,k]·w8[n,k]
    integer products summed exactly in int32 (fp8: f32), rescaled and summed in f32.
    With float activations ``a`` (M, K) f32/f16/bf16 — weight-only W4A16 / W8A16:
      D = a · deq(W)ᵀ, products and sums in f32; or, with a W4A8 PackedWeight, ``a`` is first
      quantized per token to int8 exactly as `quantize_activation` does (on CUDA inside the
      GEMM for M <= 4 where each CTA's rows of its K range fit in 16 KB; see explain()).
    ``w`` is a QuantizedWeight, or a PackedWeight: W4A8 with s8 activations (on CUDA the
    int8 tensor-core kernels, K % 32 == 0), or W4A16 / W8A16 with float activations (on CUDA
    the 16-bit tensor-core kernel: ``a`` bf16/f16, K % 8 == 0; group-wise weights are rounded
    once to a's dtype after their scale). The pair (weight format, activation scheme)
    must be a linear format of the catalogue. ``bias``: None or (N) f32/f16/bf16. The output
    is f32/f16/bf16 (``out_dtype``; default: the dtype of float activations, f32 otherwise).
    """
    quantized = isinstance(a, QuantizedActivation)
    x = a.q if quantized else a
    dtype = out_dtype
    if dtype is None and not quantized:
        dtype = _arrays.natural_dtype(a)
    if dtype not in ("f32", "f16", "bf16"):
        dtype = out_dtype or "f32"
    if out is None:
        out = _arrays.empty(dtype, (int(x.shape[0]), w.n), x)
    d = _arrays.arg(out, out_dtype)
    s = _arrays.stream_handle(stream, x)
    b = _arrays.arg(bias)
    if isinstance(w, PackedWeight):
        if quantized:
            _C.linear_packed(a._c(), w._c(), b, d, s)
        else:
            _C.linear_packed_a16(_arrays.arg(a), w._c(), b, d, s)
    elif quantized:
        _C.linear(a._c(), w._c(), b, d, s)
    else:
        _C.linear_a16(_arrays.arg(a), w._c(), b, d, s)
    return out


def quantized_linear(x: Array, w: Union[QuantizedWeight, PackedWeight],
                     format: Union[str, LinearFormat], bias: Optional[Array] = None, *,
                     act_scale: Optional[float] = None, out: Optional[Array] = None,
                     stream: Any = None) -> Array:
    """Y (M, N) = linear layer of float activations X (M, K) f32/f16/bf16 in a linear
    ``format``: the activations are quantized as the format says (dynamic per token, or static
    with the calibrated ``act_scale`` for ``_static`` formats; weight-only formats use X as
    is), then `linear` runs. The output has X's dtype unless ``out`` is given."""
    lf = format if isinstance(format, LinearFormat) else linear_format(format)
    s = _arrays.stream_handle(stream, x)
    if lf.weight_only:
        return linear(x, w, bias, out=out, stream=s)
    if isinstance(w, PackedWeight) and w.layout == "w4_mma_k128" and lf.act == "s8_per_token":
        # One call: per-token quantization (the same codes and scales as quantize_activation),
        # then the int8 GEMM, in C++.
        return linear(x, w, bias, out=out, stream=s)
    if lf.static:
        if act_scale is None:
            raise _C.InvalidArgumentError(
                f"nibble::quantized_linear: format {lf.name} is static and needs act_scale")
        a = quantize_activation_static(x, act_scale, stream=s)
    else:
        a = quantize_activation(x, lf.act, stream=s)
    return linear(a, w, bias, out=out, out_dtype=_arrays.natural_dtype(x), stream=s)


def explain(format: Union[str, LinearFormat], m: int, n: int, k: int,
            device: Any = "cpu") -> str:
    """Which implementation would run `linear` for this format and shape on ``device``
    ("cpu", "cuda", "cuda:1", a torch.device) and why: the kernel, its tile and split-K, or
    the fallback and the reason."""
    name = format.name if isinstance(format, LinearFormat) else format
    kind, index = _arrays.parse_device(device)
    return _C.explain(name, int(m), int(n), int(k), kind, index)
