"""W4A4 granularity per layer from ρ: nibble.tensor_core_ratio, weight_quantization_error,
plan_w4a4_granularity (numpy), and nibble.torch's W4A4MixedConfig (torch on the CPU)."""

import copy

import numpy as np
import pytest

import nibble
from nibble_testing import have_torch, rel_fro, tol_vs_float, torch_skip_reason


def test_rho_of_the_gpus_and_the_time_model():
    assert [nibble.tensor_core_ratio(cc) for cc in [(8, 0), (8, 6), (8, 9), (9, 0), (7, 5)]] == \
        [64, 16, 8, 32, 0]
    assert nibble.w4a4_group_time_factor(32) == 1.5
    with pytest.raises(nibble.InvalidArgumentError, match="device"):
        nibble.tensor_core_ratio("cpu")


def test_weight_error_is_the_dequantized_error_weighted_by_input_moments(rng):
    w = (rng.standard_normal((16, 256)) * 0.05).astype(np.float32)
    w[:, ::37] *= 6  # outlier columns: per channel suffers, g128 much less
    ms = rng.uniform(0.1, 1.1, 256).astype(np.float32)
    e_pc = nibble.weight_quantization_error(w, "w4a4_pc", ms)
    assert e_pc > nibble.weight_quantization_error(w, "w4a4_g128", ms) > 0
    deq = nibble.dequantize_weight(nibble.quantize_weight(w, "w4_pc")).astype(np.float64)
    want = ((w - deq) ** 2 * ms).sum() / ((w.astype(np.float64) ** 2) * ms).sum()
    assert e_pc == pytest.approx(want, rel=1e-12)
    assert nibble.weight_quantization_error(w, "w4_pc") == pytest.approx(
        ((w - deq) ** 2).sum() / (w.astype(np.float64) ** 2).sum(), rel=1e-12)
    with pytest.raises(nibble.InvalidArgumentError, match="input_mean_square"):
        nibble.weight_quantization_error(w, "w4_pc", ms[:100])


LAYERS = [("a", 64, 64, 0.50, 0.30), ("b", 32, 64, 0.60, 0.20), ("c", 128, 128, 0.40, 0.35),
          ("d", 32, 32, 0.20, 0.10), ("e", 64, 64, 0.10, 0.15)]


def test_planner_spends_the_budget_on_the_best_gain_per_cost():
    macs = sum(n * k for _, n, k, _, _ in LAYERS)
    budget = (32 * 64 + 32 * 32) / macs  # at rho = 64 (g128 = 2x): exactly b and d
    plan = nibble.plan_w4a4_granularity(LAYERS, 64, budget)
    assert plan.formats == {"a": "w4a4_pc", "b": "w4a4_g128", "c": "w4a4_pc",
                            "d": "w4a4_g128", "e": "w4a4_pc"}
    assert plan.time_vs_per_channel == pytest.approx(1 + budget)
    assert plan.error == pytest.approx(0.5 + 0.2 + 0.4 + 0.1 + 0.1)
    assert "b: w4a4_g128" in str(plan) and "rho = 64" in str(plan)
    for budget in (0.02, 0.05, 0.1, 0.2):
        count = {rho: list(nibble.plan_w4a4_granularity(LAYERS, rho, budget).formats.values())
                 .count("w4a4_g128") for rho in (8, 64)}
        assert count[8] >= count[64]
    assert "w4a4_g128" not in nibble.plan_w4a4_granularity(LAYERS, 64, 0.0).formats.values()
    with pytest.raises(nibble.InvalidArgumentError, match="rho"):
        nibble.plan_w4a4_granularity(LAYERS, 0, 0.1)
    with pytest.raises(nibble.InvalidArgumentError, match="budget"):
        nibble.plan_w4a4_granularity(LAYERS, 32, -1.0)


@pytest.mark.skipif(not have_torch(), reason=torch_skip_reason())
def test_quantize_mixed_follows_the_plan_and_stays_close_to_float(rng):
    import torch
    from torch import nn

    import nibble.torch as nt

    torch.manual_seed(int(rng.integers(1 << 30)))
    model = nn.Sequential(nn.Linear(256, 512), nn.SiLU(), nn.Linear(512, 256), nn.SiLU(),
                          nn.Linear(256, 96), nn.SiLU(), nn.Linear(96, 32))  # K = 96: pc only
    with torch.no_grad():
        model[2].weight[:, ::37] *= 8
    calib = [torch.randn(8, 256) for _ in range(2)]
    x = torch.randn(5, 256)
    with torch.no_grad():
        ref = model(x)
    with pytest.raises(ValueError, match="rho"):  # a CPU model names no GPU
        nt.quantize_(copy.deepcopy(model), nt.W4A4MixedConfig())
    plans = {}
    for rho in (8, 64):
        q = nt.quantize_(copy.deepcopy(model), nt.W4A4MixedConfig(budget=10.0, rho=rho),
                         calibration_data=calib)
        plan = q.nibble_w4a4_plan
        plans[rho] = plan
        for name, fmt in plan.formats.items():
            layer = q.get_submodule(name)
            assert isinstance(layer, nt.QuantizedLinear) and layer.format == fmt
        assert plan.formats["6"] == "w4a4_pc"  # K = 96 cannot be g128
        with torch.no_grad():
            assert rel_fro(q(x), ref) < tol_vs_float("w4a4_pc")
    # An unlimited budget takes every layer g128 improves, whatever rho; a tight one fewer at
    # high rho.
    assert plans[8].formats == plans[64].formats
    assert plans[64].time_vs_per_channel > plans[8].time_vs_per_channel
    tight = nt.quantize_(copy.deepcopy(model), nt.W4A4MixedConfig(budget=0.05, rho=64),
                         calibration_data=calib).nibble_w4a4_plan
    assert list(tight.formats.values()).count("w4a4_g128") <= \
        list(plans[64].formats.values()).count("w4a4_g128")
