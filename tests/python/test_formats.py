"""The format catalogue as Python sees it (include/nibble/formats.h, docs/formats.md)."""

import pytest

import nibble
from nibble import formats


def test_every_catalogue_format_parses_to_itself():
    for name in nibble.LINEAR_FORMATS:
        assert nibble.linear_format(name).name == name


def test_canonical_spelling_and_defaults():
    f = nibble.linear_format("w4a8_g128_sbf16")
    assert f.name == "w4a8_g128"
    assert f.weight.name == "w4_g128" and f.weight.scale_dtype == "bf16"
    assert f.act == "s8_per_token" and f.act_dtype == "s8"
    assert nibble.linear_format("w8a8").weight.scale_dtype == "f32"
    assert nibble.linear_format("w4a16_g64_fzp").weight.scheme == "u4_fzp"
    assert nibble.linear_format("w4a16_g128").weight_only
    assert nibble.linear_format("w8a8_static").static
    assert nibble.weight_format("w4_g128_2level").group_size == 128


@pytest.mark.parametrize("bad", ["w4a8_g128_asym", "w4a16_g128_2level", "w8a4_pc", "w4a8",
                                 "w4a8_g100", "nonsense"])
def test_invalid_formats_raise_invalid_argument(bad):
    with pytest.raises(nibble.InvalidArgumentError) as e:
        nibble.linear_format(bad)
    assert isinstance(e.value, ValueError) and isinstance(e.value, nibble.NibbleError)


def test_storage_matches_docs_table():
    st = nibble.weight_format("w4_g128_asym").storage(5, 256)
    assert st == {"q": ("u4", (5, 256)), "scales": ("bf16", (5, 2)), "zeros": ("u8", (5, 2)),
                  "group_scales": None}
    st = nibble.weight_format("w4_g64_2level").storage(3, 128)
    assert st["scales"] == ("f32", (3,)) and st["group_scales"] == ("u8", (3, 2))
    with pytest.raises(nibble.InvalidArgumentError, match="multiple of the group size"):
        nibble.weight_format("w4_g128").storage(3, 192)


def test_bits_and_limits():
    assert nibble.weight_format("w4_g128").effective_bits_per_weight(4096) == 4.125
    assert formats.max_int32_accumulation_k("s8", "s8") == 131071
    assert formats.max_int32_accumulation_k("s8", "s4") == 2097151


def test_packable_formats():
    assert nibble.linear_format("w4a8_g128").packable(4096)
    assert nibble.linear_format("w4a8_g128_2level_static").packable(256)
    assert not nibble.linear_format("w4a8_pc").packable(48)
    assert not nibble.linear_format("w8a8").packable(4096)
    assert nibble.linear_format("w4afp8_g128").packable(4096)
    assert not nibble.linear_format("w4afp8_pc").packable(48)
    assert nibble.linear_format("w4a16_g128").packable(4096)
    assert nibble.linear_format("w8a16").packable(4104)
    assert not nibble.linear_format("w4a16_pc").packable(44)  # the 16-bit kernels need K % 8
    assert not nibble.linear_format("w4a4_pc").packable(4096)


def test_build_info():
    info = nibble.build_info()
    assert info["version"] == nibble.__version__
    assert isinstance(info["cuda"], bool)
    if nibble.cuda_device_count() == 0:
        assert nibble.cuda_unavailable_reason()
