"""nibble on CUDA tensors (skipped without a GPU): ops bit-exact or within the named
tolerances of the CPU reference, packed kernels against logical weights, streams, and a stack
of Llama-shaped blocks quantized with quantize_ for every format, compared with the float
model, under torch.compile and CUDA-graph capture. Timing is not a test: see
bench/python/model_bench.py."""

import numpy as np
import pytest

import nibble
from nibble_testing import (REL_TOL_COMPILED, REL_TOL_F32_OUT, REL_TOL_FP8_F32_OUT,
                            REL_TOL_HALF_OUT, have_cuda,
                            have_torch, rel_fro, tol_vs_float, torch_skip_reason)

if not have_torch():
    pytest.skip(torch_skip_reason() + ": nibble.torch CUDA tests skipped",
                allow_module_level=True)
if not have_cuda():
    pytest.skip("no CUDA device for nibble: " + nibble.cuda_unavailable_reason(),
                allow_module_level=True)

import torch  # noqa: E402

import nibble.torch as nt  # noqa: E402
from llama_stack import capture, make_stack  # noqa: E402

if not torch.cuda.is_available():
    pytest.skip("torch sees no CUDA device", allow_module_level=True)

CUDA = torch.device("cuda")


@pytest.fixture
def gen(rng):
    return torch.Generator().manual_seed(int(rng.integers(1 << 62)))


def randn(gen, *shape, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape, generator=gen) * scale).to(dtype)


def cuda_weight(qw):
    return nibble.QuantizedWeight(qw.format, qw.n, qw.k, **{
        f: None if t is None else t.to(CUDA) for f, t in qw.arrays().items()})


# ---- ops against the CPU reference ---------------------------------------------------------------
@pytest.mark.parametrize("scheme", ["s8_per_token", "s4_per_token", "e4m3_per_token"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m", [1, 3, 17, 130])
def test_quantize_activation_bit_exact(gen, scheme, dtype, m):
    x = randn(gen, m, 4096 + 64, dtype=dtype, scale=3.0)
    a = nibble.quantize_activation(x.to(CUDA), scheme)
    ref = nibble.quantize_activation(x, scheme)
    assert torch.equal(a.q.cpu().view(torch.uint8), ref.q.view(torch.uint8))
    assert torch.equal(a.scales.cpu(), ref.scales)


@pytest.mark.parametrize("m", [1, 3, 17, 64, 257])
def test_integer_gemms_exact(gen, m):
    k = 4096
    a8 = torch.randint(-128, 128, (m, k), generator=gen, dtype=torch.int8)
    w8 = torch.randint(-128, 128, (72, k), generator=gen, dtype=torch.int8)
    w4 = torch.randint(0, 256, (72, k // 2), generator=gen, dtype=torch.uint8)
    a4 = torch.randint(0, 256, (m, k // 2), generator=gen, dtype=torch.uint8)
    for a, w, fn in ((a8, w8, nibble.gemm_s8s8), (a8, w4, nibble.gemm_s8s4),
                     (a4, w4, nibble.gemm_s4s4)):
        assert torch.equal(fn(a.to(CUDA), w.to(CUDA)).cpu(), fn(a, w))
    packed = nibble.pack_s4_matrix(w4.to(CUDA))
    assert packed.q.is_cuda
    assert torch.equal(nibble.gemm_s8s4(a8.to(CUDA), packed).cpu(), nibble.gemm_s8s4(a8, w4))


@pytest.mark.parametrize("fmt", nibble.LINEAR_FORMATS + ("w4a8_g32", "w4a8_g256_2level"))
@pytest.mark.parametrize("m", [1, 3, 17, 100])
@pytest.mark.parametrize("out", [torch.float32, torch.bfloat16])
def test_linear_every_format_against_cpu(gen, fmt, m, out):
    n, k = 200, 1024
    lf = nibble.linear_format(fmt)
    x = randn(gen, m, k)
    qw = nibble.quantize_weight(randn(gen, n, k, scale=0.03), fmt)
    bias = randn(gen, n)
    scale = float(x.abs().max()) / 127
    xg = x.to(CUDA, out)
    got = nibble.quantized_linear(xg, cuda_weight(qw), fmt, bias.to(CUDA), act_scale=scale)
    # The reference from the same quantized activations (bit-exact on both devices).
    ref = nibble.quantized_linear(xg.cpu(), qw, fmt, bias, act_scale=scale)
    tol = REL_TOL_F32_OUT if out == torch.float32 else REL_TOL_HALF_OUT
    assert got.dtype == out and rel_fro(got.cpu().float(), ref.float()) < tol
    if lf.act == "e4m3_per_token" and out == torch.float32:
        tol = REL_TOL_FP8_F32_OUT  # the packed path runs fp8 tensor cores on Hopper
    # The same through the format's packed layout (s4_sym g128 weights pack for W4A8 or W4A16).
    # The 16-bit tensor cores take 16-bit activations: W4A16 / W8A16 with f32 x stay unpacked.
    if lf.packable(k) and not (lf.weight_only and out == torch.float32):
        p = nibble.pack_weight(cuda_weight(qw), nibble.packed_layout(lf))
        if lf.weight_only:
            a = xg
        elif lf.static:
            a = nibble.quantize_activation_static(xg, scale)
        else:
            a = nibble.quantize_activation(xg, lf)
        gp = nibble.linear(a, p, bias.to(CUDA), out_dtype={torch.float32: "f32",
                                                           torch.bfloat16: "bf16"}[out])
        assert rel_fro(gp.cpu().float(), ref.float()) < tol


def test_explain_names_the_kernel():
    s = nibble.explain("w4a8_g128", 1, 4096, 4096, "cuda")
    assert "sm80_w4a8_gemm" in s
    assert "cuda:0" in s


def test_side_stream_and_explicit_stream(gen):
    qw = cuda_weight(nibble.quantize_weight(randn(gen, 512, 1024), "w4_g128"))
    x = randn(gen, 4, 1024).to(CUDA)
    ref = nibble.quantized_linear(x, qw, "w4a8_g128")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        y1 = nibble.quantized_linear(x, qw, "w4a8_g128")
    y2 = nibble.quantized_linear(x, qw, "w4a8_g128", stream=s)
    torch.cuda.synchronize()
    assert torch.equal(y1, ref) and torch.equal(y2, ref)


def test_mixed_devices_rejected(gen):
    qw = nibble.quantize_weight(randn(gen, 16, 128), "w8_pc")
    with pytest.raises(nibble.InvalidArgumentError, match=r"must be on cuda:0"):
        nibble.quantized_linear(randn(gen, 2, 128).to(CUDA), qw, "w8a8")
    with pytest.raises(nibble.UnsupportedError, match=r"must be on the CPU"):
        nibble.quantize_weight(randn(gen, 16, 128).to(CUDA), "w8_pc")


# ---- the Llama-shaped stack ------------------------------------------------------------------------
DIMS = dict(d=2048, heads=16, kv_heads=4, ff=5632)  # Llama-shaped, small enough for a test


@pytest.fixture(scope="module")
def float_model():
    return make_stack(2, seed=1234, **DIMS)


@pytest.mark.parametrize("fmt", nibble.LINEAR_FORMATS)
def test_llama_stack_every_format(float_model, fmt):
    import copy
    torch.manual_seed(0)
    xs = [torch.randn(m, DIMS["d"], device=CUDA, dtype=torch.bfloat16) for m in (1, 5, 16)]
    model = copy.deepcopy(float_model)
    nt.quantize_(model, fmt, calibration_data=[x for x in xs])
    lf = nibble.linear_format(fmt)
    layouts = {m.layout for m in model.modules() if isinstance(m, nt.QuantizedLinear)}
    assert layouts == {"packed" if lf.packable(DIMS["d"]) else "logical"}
    with torch.no_grad():
        for x in xs:
            ref = float_model(x).float()
            y = model(x)
            assert y.dtype == torch.bfloat16
            assert rel_fro(y.float(), ref) < tol_vs_float(fmt), fmt
        x = xs[0]
        eager = model(x)
        graph, out = capture(model, x)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager)
        x.copy_(xs[0] * 0.5)  # the graph reads its static input
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, model(x))


@pytest.mark.parametrize("fmt", ["w4a16_g128", "w8a8", "w4a8_pc"])
def test_graph_captured_after_a_side_stream_warm_up(gen, fmt):
    """PyTorch's recipe: warm up on a side stream, then torch.cuda.graph captures on a stream of
    its own, where nibble has never run. Long K and few channels make the decode kernels split K
    through the per-stream workspace (allocated during the capture)."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(8192, 512, bias=False, device=CUDA, dtype=torch.bfloat16)
    q = nt.QuantizedLinear.from_linear(lin, fmt)
    x = torch.randn(1, 8192, device=CUDA, dtype=torch.bfloat16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.no_grad():
        with torch.cuda.stream(side):
            for _ in range(2):
                eager = q(x)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = q(x)
        graph.replay()
        torch.cuda.synchronize()
    assert torch.equal(out, eager)


@pytest.mark.parametrize("fmt", ["w4a8_g128", "w8a8_static", "w4a16_g128_fzp", "w4a4_pc"])
def test_llama_stack_compile(float_model, fmt):
    """torch.compile(fullgraph=True) with inductor (one format per kernel path: packed W4A8,
    static int8, weight-only, int4 activations; every format is traced on the CPU by
    test_torch.py), then a CUDA graph of the compiled model."""
    import copy
    x = torch.randn(3, DIMS["d"], device=CUDA, dtype=torch.bfloat16)
    model = nt.quantize_(copy.deepcopy(float_model), fmt, calibration_data=[x])
    with torch.no_grad():
        ref = float_model(x).float()
        compiled = torch.compile(model, fullgraph=True)
        got = compiled(x)
        # Inductor fuses the norms and SiLU with other bf16 roundings, which flips single
        # activation codes (measured on the H100: 2-2.5% from eager for int8 activations, 29%
        # for int4), so the compiled model is held to the float model's tolerance, like eager.
        assert rel_fro(got.float(), ref) < tol_vs_float(fmt), fmt
        graph, out = capture(compiled, x)
        graph.replay()
        torch.cuda.synchronize()
        assert rel_fro(out.float(), got.float()) < REL_TOL_COMPILED


def test_reduce_overhead_compile(float_model):
    import copy
    model = nt.quantize_(copy.deepcopy(float_model), nt.W4A8Config(group_size=128))
    x = torch.randn(1, DIMS["d"], device=CUDA, dtype=torch.bfloat16)
    with torch.no_grad():
        ref = float_model(x).float()
        compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
        for _ in range(3):  # warm-up, record, replay
            y = compiled(x)
        assert rel_fro(y.float(), ref) < tol_vs_float("w4a8_g128")


def test_save_load_on_cuda_is_bit_exact(float_model, tmp_path):
    import copy
    model = nt.quantize_(copy.deepcopy(float_model), nt.W4A8Config(group_size=128))
    path = str(tmp_path / "m.safetensors")
    nt.save_quantized(model, path)
    with torch.device("meta"):
        skeleton = copy.deepcopy(float_model).to("meta")
    loaded = nt.load_quantized(skeleton, path, device=CUDA)
    x = torch.randn(3, DIMS["d"], device=CUDA, dtype=torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))
