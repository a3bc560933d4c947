"""GPTQ and AWQ checkpoints: nibble.unpack_int4_checkpoint against packers written here from
AutoGPTQ's and AutoAWQ's layouts (random codes, zeros and scales, fresh seeds), their refusals,
int4_packing_of, and nibble.torch.load_int4_checkpoint on a small model against the same
numbers given directly as nibble weights."""

import json

import numpy as np
import pytest

import nibble
from nibble_testing import have_torch, torch_skip_reason

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # AutoAWQ: nibble i of a word holds column 8c + AWQ_ORDER[i]


def pack_words(v, order=range(8)):
    """(rows, cols) values 0..15 → (rows, cols/8) int32, nibble i = column 8c + order[i]."""
    v = v.astype(np.uint32).reshape(v.shape[0], -1, 8)
    word = np.zeros(v.shape[:2], dtype=np.uint32)
    for i, col in enumerate(order):
        word |= (v[:, :, col] & np.uint32(0xF)) << np.uint32(4 * i)
    return word.view(np.int32)


def random_layer(rng, n, k, g, min_zero=0):
    q = rng.integers(0, 16, size=(n, k))
    z = rng.integers(min_zero, 16, size=(n, k // g))
    s = rng.uniform(1e-3, 0.05, size=(n, k // g)).astype(np.float16)
    return q, z, s


def pack(packing, q, z, s, g):
    """The checkpoint tensors (qweight, qzeros, scales, g_idx) of one layer."""
    n, k = q.shape
    if packing == "awq":
        return pack_words(q.T, AWQ_ORDER), pack_words(z.T, AWQ_ORDER), np.ascontiguousarray(s.T), None
    stored_z = z - 1 if packing == "gptq" else z
    qweight = pack_words(np.ascontiguousarray(q.T.reshape(k // 8, 8, n).transpose(0, 2, 1))
                         .reshape(-1, 8)).reshape(k // 8, n)  # [i, c]: q[c, 8i + j] at bits 4j
    g_idx = (np.arange(k) // g).astype(np.int32)
    return qweight, pack_words(stored_z.T), np.ascontiguousarray(s.T), g_idx


def expected_weight(q, z, s, g):
    n, k = q.shape
    qb = (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8)
    return nibble.QuantizedWeight(f"w4_g{g}_asym_sf16", n, k, q=qb, scales=s,
                                  zeros=z.astype(np.uint8))


@pytest.mark.parametrize("packing", ["gptq", "gptq_v2", "awq"])
@pytest.mark.parametrize("n,k,g", [(8, 64, 32), (24, 256, 128), (40, 512, 64), (16, 256, 256)])
def test_unpack_matches_the_packers(rng, packing, n, k, g):
    q, z, s = random_layer(rng, n, k, g, min_zero=1 if packing == "gptq" else 0)
    got = nibble.unpack_int4_checkpoint(packing, *pack(packing, q, z, s, g), group_size=g)
    want = expected_weight(q, z, s, g)
    assert got.format == want.format and (got.n, got.k) == (n, k)
    for field in ("q", "scales", "zeros"):
        np.testing.assert_array_equal(np.asarray(getattr(got, field)), getattr(want, field))
    # the numbers: w = s·(q − z) per group, in f32
    deq = nibble.dequantize_weight(got)
    ref = s.astype(np.float32).repeat(g, axis=1) * (q - z.repeat(g, axis=1)).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(deq), ref)


def test_act_order_and_overflowing_zeros_are_refused(rng):
    q, z, s = random_layer(rng, 16, 256, 64, min_zero=1)
    qweight, qzeros, scales, g_idx = pack("gptq", q, z, s, 64)
    with pytest.raises(nibble.UnsupportedError, match="act-order"):
        nibble.unpack_int4_checkpoint("gptq", qweight, qzeros, scales, rng.permutation(g_idx),
                                      group_size=64)
    z[3, 1] = 0  # the v1 format stores z − 1 = −1 as 15, which reads back as 16
    with pytest.raises(nibble.UnsupportedError, match="stores 15"):
        nibble.unpack_int4_checkpoint("gptq", *pack("gptq", q, z, s, 64), group_size=64)
    with pytest.raises(nibble.InvalidArgumentError, match="qweight"):
        nibble.unpack_int4_checkpoint("gptq", qweight[:-1], qzeros, scales, None, group_size=64)
    with pytest.raises(nibble.InvalidArgumentError, match="scales"):
        nibble.unpack_int4_checkpoint("awq", *pack("awq", q, z, s.astype(np.float32), 64)[:3],
                                      group_size=64)


def test_int4_packing_of_quantization_configs():
    assert nibble.int4_packing_of({"quant_method": "gptq", "bits": 4, "group_size": 128,
                                   "desc_act": False, "sym": True}) == ("gptq", 128)
    assert nibble.int4_packing_of({"quant_method": "gptq", "bits": 4, "group_size": 32,
                                   "checkpoint_format": "gptq_v2"}) == ("gptq_v2", 32)
    assert nibble.int4_packing_of({"quant_method": "AWQ", "w_bit": 4, "q_group_size": 64,
                                   "version": "GEMM", "zero_point": True}) == ("awq", 64)
    for qc, words in [({"quant_method": "gptq", "bits": 8, "group_size": 128}, "'bits'"),
                      ({"quant_method": "gptq", "bits": 4, "group_size": -1}, "'group_size'"),
                      ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"},
                       "'version'"),
                      ({"quant_method": "gptq", "bits": 4, "group_size": 128, "lm_head": True},
                       "'lm_head'"),
                      ({"quant_method": "bitsandbytes"}, "'quant_method'")]:
        with pytest.raises(nibble.UnsupportedError, match=words):
            nibble.int4_packing_of(qc)


@pytest.mark.skipif(not have_torch(), reason=torch_skip_reason() if not have_torch() else "")
@pytest.mark.parametrize("packing", ["gptq", "awq"])
def test_load_int4_checkpoint_runs_the_checkpoints_numbers(rng, tmp_path, packing):
    import torch
    from safetensors.torch import save_file
    from torch import nn

    import nibble.torch as nt

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(256)
            self.up = nn.Linear(256, 128, bias=True)
            self.down = nn.Linear(128, 64, bias=False)

        def forward(self, x):
            return self.down(torch.relu(self.up(self.norm(x))))

    g = 64
    layers = {"up": random_layer(rng, 128, 256, g, 1), "down": random_layer(rng, 64, 128, g, 1)}
    tensors = {"norm.weight": torch.from_numpy(rng.standard_normal(256).astype(np.float32)),
               "norm.bias": torch.from_numpy(rng.standard_normal(256).astype(np.float32)),
               "up.bias": torch.from_numpy(rng.standard_normal(128).astype(np.float32))}
    for name, (q, z, s) in layers.items():
        qweight, qzeros, scales, g_idx = pack(packing, q, z, s, g)
        tensors[f"{name}.qweight"] = torch.from_numpy(qweight)
        tensors[f"{name}.qzeros"] = torch.from_numpy(qzeros)
        tensors[f"{name}.scales"] = torch.from_numpy(scales)
        if g_idx is not None:
            tensors[f"{name}.g_idx"] = torch.from_numpy(g_idx)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    qc = ({"quant_method": "gptq", "bits": 4, "group_size": g, "desc_act": False}
          if packing == "gptq" else
          {"quant_method": "awq", "bits": 4, "group_size": g, "version": "gemm", "zero_point": True})
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": qc}))

    loaded = nt.load_int4_checkpoint(Block(), str(tmp_path))
    direct = Block()
    direct.norm.load_state_dict({"weight": tensors["norm.weight"], "bias": tensors["norm.bias"]})
    for name, (q, z, s) in layers.items():
        qw = expected_weight(q, z, s, g)
        qw = nibble.QuantizedWeight(qw.format, qw.n, qw.k, q=torch.from_numpy(qw.q),
                                    scales=torch.from_numpy(qw.scales),
                                    zeros=torch.from_numpy(qw.zeros))
        bias = tensors.get(f"{name}.bias")
        setattr(direct, name, nt.QuantizedLinear(qw, f"w4a16_g{g}_asym_sf16", bias))
    assert isinstance(loaded.up, nt.QuantizedLinear) and loaded.up.format == "w4a16_g64_asym_sf16"
    x = torch.from_numpy(rng.standard_normal((5, 256)).astype(np.float32))
    assert torch.equal(loaded(x), direct(x))
    with pytest.raises(ValueError, match="is 128×256"):
        class Wrong(Block):
            def __init__(self):
                super().__init__()
                self.up = nn.Linear(256, 96)
        nt.load_int4_checkpoint(Wrong(), str(tmp_path))
