"""nibble.torch on CPU tensors: custom ops against the numpy path, QuantizedLinear and
quantize_ against float models, torch.compile tracing, safetensors round trips. (CUDA: see
test_torch_cuda.py.)"""

import warnings

import numpy as np
import pytest

import nibble
from nibble_testing import (REL_TOL_F32_OUT, REL_TOL_HALF_OUT, have_torch, rel_fro,
                            tol_vs_float, torch_skip_reason)

if not have_torch():
    pytest.skip(torch_skip_reason() + ": nibble.torch tests skipped", allow_module_level=True)

import torch  # noqa: E402
from torch import nn  # noqa: E402

import nibble.torch as nt  # noqa: E402


@pytest.fixture
def gen(rng):
    """A torch Generator seeded from the test's fresh seed."""
    return torch.Generator().manual_seed(int(rng.integers(1 << 62)))


def randn(gen, *shape, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape, generator=gen) * scale).to(dtype)


class Mlp(nn.Module):
    """A small Llama-shaped block: q/k/v/o projections and a gated MLP."""

    def __init__(self, d=256, ff=512, bias=False):
        super().__init__()
        self.q_proj = nn.Linear(d, d, bias=bias)
        self.k_proj = nn.Linear(d, d // 2, bias=bias)
        self.v_proj = nn.Linear(d, d // 2, bias=bias)
        self.o_proj = nn.Linear(d, d, bias=bias)
        self.gate_proj = nn.Linear(d, ff, bias=bias)
        self.up_proj = nn.Linear(d, ff, bias=bias)
        self.down_proj = nn.Linear(ff, d, bias=bias)

    def forward(self, x):
        h = x + self.o_proj(self.q_proj(x)) + torch.cat([self.k_proj(x), self.v_proj(x)], -1)
        return h + self.down_proj(nn.functional.silu(self.gate_proj(h)) * self.up_proj(h))


# ---- ops ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["w4a8_g128", "w8a8", "w4a16_g128_asym", "w4a4_pc",
                                 "w4afp8_g128", "w4a8_g64_2level"])
@pytest.mark.parametrize("m", [1, 3, 17])
def test_linear_op_equals_numpy_path(gen, fmt, m):
    x = randn(gen, m, 256)
    w = randn(gen, 24, 256, scale=0.05)
    bias = randn(gen, 24)
    qw = nibble.quantize_weight(w, fmt)  # torch tensors in, torch tensors out
    assert isinstance(qw.q, torch.Tensor)
    y = torch.ops.nibble.linear(x, qw.q, qw.scales, qw.zeros, qw.group_scales, bias, fmt, 0.0)
    qn = nibble.quantize_weight(w.numpy(), fmt)
    ref = nibble.quantized_linear(x.numpy(), qn, fmt, bias.numpy())
    np.testing.assert_array_equal(y.numpy(), ref)  # same C++ path, bit-exact


def test_quantize_activation_and_gemm_ops(gen):
    x = randn(gen, 5, 64)
    q, s = torch.ops.nibble.quantize_activation(x, "s8_per_token", 0.0)
    a = nibble.quantize_activation(x.numpy())
    np.testing.assert_array_equal(q.numpy(), a.q)
    np.testing.assert_array_equal(s.numpy(), a.scales)
    w = torch.randint(-128, 128, (7, 64), generator=gen, dtype=torch.int8)
    d = torch.ops.nibble.gemm_s32(q, w, "s8", "s8")
    assert torch.equal(d.long(), q.long() @ w.long().T)


def test_fp8_and_bf16_tensors_cross_as_their_dtypes(gen):
    x = randn(gen, 3, 128, dtype=torch.bfloat16)
    a = nibble.quantize_activation(x, "e4m3_per_token")
    assert a.q.dtype == torch.float8_e4m3fn
    assert rel_fro(nibble.dequantize_activation(a), x.float()) < 2 ** -4
    qw = nibble.quantize_weight(randn(gen, 8, 128), "w4_g128")
    assert qw.scales.dtype == torch.bfloat16
    y = nibble.linear(a, qw)
    assert y.dtype == torch.float32


@pytest.mark.parametrize("op,args", [
    ("linear", lambda g: (randn(g, 3, 128), *_w(g, "w4a8_g64"), None, "w4a8_g64", 0.0)),
    ("quantize_activation", lambda g: (randn(g, 3, 128), "s4_per_token", 0.0)),
    ("gemm_s32", lambda g: (torch.randint(-128, 128, (3, 64), generator=g, dtype=torch.int8),
                            torch.randint(0, 256, (5, 32), generator=g, dtype=torch.uint8),
                            "s8", "s4")),
])
def test_opcheck(gen, op, args):
    torch.library.opcheck(getattr(torch.ops.nibble, op), args(gen),
                          test_utils=("test_schema", "test_faketensor",
                                      "test_aot_dispatch_dynamic"))


def _w(g, fmt):
    qw = nibble.quantize_weight(randn(g, 16, 128), fmt)
    return qw.q, qw.scales, qw.zeros, qw.group_scales


def test_packed_op_on_cpu(gen):
    qw = nibble.quantize_weight(randn(gen, 20, 160), "w4_pc")
    p = nibble.pack_weight(qw)
    x = randn(gen, 3, 160)
    y = torch.ops.nibble.linear_packed(x, p.q, p.scales, None, None, None, "w4a8_pc", p.layout,
                                       20, 160, p.n_pad, p.k_pad, 0.0)
    z = torch.ops.nibble.linear(x, qw.q, qw.scales, None, None, None, "w4a8_pc", 0.0)
    assert torch.equal(y, z)
    # Weight-only: the same op with a w4_mma16_k128 weight and float activations as they are.
    qa = nibble.quantize_weight(randn(gen, 20, 256), "w4_g128_asym")
    pa = nibble.pack_weight(qa, "w4_mma16_k128")
    xa = randn(gen, 3, 256)
    y = torch.ops.nibble.linear_packed(xa, pa.q, pa.scales, None, pa.zeros, None,
                                       "w4a16_g128_asym", pa.layout, 20, 256, pa.n_pad, pa.k_pad,
                                       0.0)
    z = torch.ops.nibble.linear(xa, qa.q, qa.scales, qa.zeros, None, None, "w4a16_g128_asym", 0.0)
    assert torch.equal(y, z)


def test_errors_reach_torch_callers(gen):
    qw = nibble.quantize_weight(randn(gen, 8, 128), "w8_pc")
    with pytest.raises(nibble.InvalidArgumentError, match=r"argument 'a.q' must have K = 128"):
        torch.ops.nibble.linear(randn(gen, 2, 64), qw.q, qw.scales, None, None, None, "w8a8",
                                0.0)
    with pytest.raises(nibble.InvalidArgumentError,
                       match=r"argument 'x' must have dtype f32 or f16 or bf16, got f64"):
        torch.ops.nibble.linear(randn(gen, 2, 128).double(), qw.q, qw.scales, None, None, None,
                                "w8a8", 0.0)
    with pytest.raises(nibble.InvalidArgumentError, match=r"argument 'x' has element type int16"):
        torch.ops.nibble.linear((randn(gen, 2, 128) * 100).to(torch.int16), qw.q, qw.scales, None,
                                None, None, "w8a8", 0.0)
    with pytest.raises(nibble.InvalidArgumentError, match=r"contiguous last dimension"):
        nibble.quantize_activation(randn(gen, 128, 2).T)


# ---- QuantizedLinear and quantize_ --------------------------------------------------------------
@pytest.mark.parametrize("fmt", nibble.LINEAR_FORMATS)
def test_quantize_model_every_format_matches_float(gen, fmt):
    torch.manual_seed(int(torch.randint(1 << 30, (1,), generator=gen)))
    model = Mlp(bias=True)
    calib = [randn(gen, 4, 256) for _ in range(2)]
    x = torch.cat(calib)[:5]
    with torch.no_grad():
        ref = model(x)
        nt.quantize_(model, fmt, calibration_data=calib)
        assert all(isinstance(m, nt.QuantizedLinear) for n, m in model.named_modules()
                   if n.endswith("proj"))
        y = model(x)
        y3 = model(x.reshape(1, 5, 256))  # leading dimensions are flattened
    assert y.shape == ref.shape and y.dtype == ref.dtype
    assert rel_fro(y, ref) < tol_vs_float(fmt), fmt
    assert torch.equal(y3.reshape(5, -1), y)


def test_quantized_linear_against_ops_reference(gen):
    lin = nn.Linear(256, 40)
    ql = nt.QuantizedLinear.from_linear(lin, "w4a16_g128_fzp")
    assert ql.layout == "logical"
    x = randn(gen, 3, 256)
    qw = ql.logical_weight()
    ref = nibble.linear(x, qw, ql.bias)
    assert torch.equal(ql(x), ref)
    assert rel_fro(ql(x), nibble.linear(x.numpy(), nibble.QuantizedWeight(
        qw.format, qw.n, qw.k, qw.q.numpy(), nibble.ops._arrays.to_numpy(qw.scales),
        nibble.ops._arrays.to_numpy(qw.zeros)), ql.bias.detach().numpy())) < REL_TOL_F32_OUT


def test_bf16_model(gen):
    model = Mlp().to(torch.bfloat16)
    x = randn(gen, 3, 256, dtype=torch.bfloat16)
    with torch.no_grad():
        ref = model(x).float()
        nt.quantize_(model, nt.W8A8Config())
        y = model(x)
    assert y.dtype == torch.bfloat16
    assert rel_fro(y.float(), ref) < tol_vs_float("w8a8") + REL_TOL_HALF_OUT


def test_filters_and_incompatible_layers(gen):
    model = Mlp()
    model.odd = nn.Linear(100, 8)  # K = 100: not a multiple of 128
    nt.quantize_(model, nt.W4A8Config(group_size=128), include="*_proj",
                 exclude=["k_proj"], filter_fn=lambda m, n: m.out_features >= 256)
    kinds = {n: type(m).__name__ for n, m in model.named_children()}
    assert kinds["q_proj"] == kinds["gate_proj"] == kinds["down_proj"] == "QuantizedLinear"
    assert kinds["k_proj"] == kinds["v_proj"] == "Linear"  # excluded / filtered (128 out)
    assert kinds["odd"] == "Linear"
    with pytest.warns(UserWarning, match=r"odd \(K = 100 is not a multiple of the group size"):
        nt.quantize_(model, nt.W4A8Config(group_size=128))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        nt.quantize_(Mlp(), nt.W8A16Config())


def test_configs_name_formats():
    assert nt.W4A8Config().format == "w4a8_pc"
    assert nt.W4A8Config(128, two_level=True, static=True).format == "w4a8_g128_2level_static"
    assert nt.W8A8Config(static=True).format == "w8a8_static"
    assert nt.W4A16Config(zero_point="float").format == "w4a16_g128_fzp"
    assert nt.W4A16Config(64, zero_point="int").format == "w4a16_g64_asym"
    assert nt.W8A16Config().format == "w8a16"
    assert nt.W4A4Config(128).format == "w4a4_g128"
    assert nt.W4AFP8Config().format == "w4afp8_pc"
    with pytest.raises(nibble.InvalidArgumentError):
        nt.QuantizeConfig("w4a8_g100")


def test_static_format_needs_calibration():
    with pytest.raises(ValueError, match="calibration_data"):
        nt.quantize_(Mlp(), nt.W8A8Config(static=True))


# ---- torch.compile --------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["w4a8_g128", "w4a16_g128", "w8a8_static"])
def test_compile_fullgraph(gen, fmt):
    model = Mlp()
    x = randn(gen, 3, 256)
    nt.quantize_(model, fmt, calibration_data=[x])
    with torch.no_grad():
        eager = model(x)
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
        assert torch.equal(compiled(x), eager)
        assert compiled(randn(gen, 7, 256)).shape == (7, 256)


def test_compile_packed_layout_and_empty_batch(gen):
    model = nt.quantize_(Mlp(), nt.W4A8Config(group_size=128, layout="packed"))
    assert {m.layout for m in model.modules() if isinstance(m, nt.QuantizedLinear)} == {"packed"}
    x = randn(gen, 2, 256)
    with torch.no_grad():
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
        assert torch.equal(compiled(x), model(x))
        assert model(randn(gen, 0, 256)).shape == (0, 256)


# ---- save / load ---------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["w4a8_g128", "w4a16_g128_fzp", "w4a8_g64_2level_static",
                                 "w8a8", "w4a4_pc"])
def test_safetensors_round_trip_is_bit_exact(gen, tmp_path, fmt):
    pytest.importorskip("safetensors")
    model = Mlp(bias=True).to(torch.bfloat16)
    x = randn(gen, 3, 256, dtype=torch.bfloat16)
    nt.quantize_(model, fmt, calibration_data=[x])
    path = str(tmp_path / "model.safetensors")
    nt.save_quantized(torch.compile(model, backend="aot_eager"), path)  # saves the original
    with torch.device("meta"):
        skeleton = Mlp(bias=True).to(torch.bfloat16)
    loaded = nt.load_quantized(skeleton, path)
    for name, mod in model.named_modules():
        if isinstance(mod, nt.QuantizedLinear):
            other = loaded.get_submodule(name)
            assert isinstance(other, nt.QuantizedLinear) and other.format == mod.format
            assert other.act_scale == mod.act_scale
            a, b = mod.logical_weight().arrays(), other.logical_weight().arrays()
            for f in a:
                assert (a[f] is None) == (b[f] is None)
                if a[f] is not None:
                    assert a[f].dtype == b[f].dtype and torch.equal(a[f], b[f]), f
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))


def test_state_dict_round_trip_of_packed_layout(gen):
    lin = nn.Linear(256, 24)
    ql = nt.QuantizedLinear.from_linear(lin, "w4a8_g128", layout="packed")
    assert ql.layout == "packed" and ql.packed_q.dtype == torch.uint8
    sd = ql.state_dict()
    assert set(sd) == {"weight_q", "weight_scales", "bias"}
    other = nt.QuantizedLinear.from_linear(nn.Linear(256, 24), "w4a8_g128", layout="packed")
    other.load_state_dict(sd)
    x = randn(gen, 2, 256)
    assert torch.equal(other(x), ql(x))
    logical = nt.QuantizedLinear.from_linear(lin, "w4a8_g128", layout="logical")
    assert torch.equal(logical(x), ql(x))
