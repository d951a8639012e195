"""Our dequantizers against gguf's own numpy reference, for every supported type."""

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T
from gguf import quants

from fastdecode.checkpoints import dequant
from fastdecode.checkpoints.gguf_file import GGUFFile

# Byte offsets of each type's fp16 scale/min fields: random bytes there could be
# NaN or inf, so those get real fp16 values (MXFP4's scale is an exponent byte: any is valid).
FP16_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208], T.IQ4_NL: [0], T.IQ4_XS: [0], T.MXFP4: [],
}


def random_blocks(qtype: T, rows: int, blocks_per_row: int, seed: int = 0) -> np.ndarray:
    """[rows, row_bytes] uint8 of random blocks with finite fp16 scales."""
    rng = np.random.default_rng(seed)
    _, block_bytes = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(rows * blocks_per_row, block_bytes), dtype=np.uint8)
    if qtype == T.MXFP4:  # exponents up to 250: 2^122 x 12 stays finite
        raw[:, 0] = rng.integers(0, 251, size=raw.shape[0])
    for at in FP16_FIELDS[qtype]:
        scales = rng.standard_normal(raw.shape[0]).astype(np.float16)
        raw[:, at:at + 2] = scales.view(np.uint8).reshape(-1, 2)
    return raw.reshape(rows, -1)


def test_supported_types_are_the_issue_list_and_the_requantized_ones():
    assert set(dequant.SUPPORTED_TYPES) == {
        "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS",
        "Q2_K", "Q3_K", "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "TQ1_0", "TQ2_0", "MXFP4"}


@pytest.mark.parametrize("qtype", list(FP16_FIELDS), ids=lambda t: t.name)
def test_quantized_types_match_gguf_reference(qtype):
    block_size, _ = GGML_QUANT_SIZES[qtype]
    raw = random_blocks(qtype, rows=6, blocks_per_row=3)
    expected = quants.dequantize(raw, qtype)
    got = dequant.dequantize(raw, qtype, (6, 3 * block_size), torch.float32)
    assert got.dtype == torch.float32 and got.shape == (6, 3 * block_size)
    np.testing.assert_array_equal(got.numpy(), expected)


@pytest.mark.parametrize("qtype", [T.F32, T.F16, T.BF16], ids=lambda t: t.name)
def test_float_types_match_gguf_reference(qtype):
    values = np.random.default_rng(1).standard_normal((5, 8)).astype(np.float32)
    raw = quants.quantize(values, qtype).view(np.uint8)
    expected = quants.dequantize(quants.quantize(values, qtype), qtype)
    got = dequant.dequantize(raw, qtype, (5, 8), torch.float32)
    np.testing.assert_array_equal(got.numpy(), expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_output_dtype_is_the_requested_one(dtype):
    raw = random_blocks(T.Q4_1, rows=2, blocks_per_row=1)
    got = dequant.dequantize(raw, T.Q4_1, (2, 32), dtype)
    assert got.dtype == dtype
    ref = torch.from_numpy(quants.dequantize(raw, T.Q4_1)).to(dtype)
    assert torch.equal(got, ref)


def test_every_type_through_a_gguf_file(tmp_path):
    """Write one tensor per type with gguf's writer and read it back through GGUFFile."""
    import gguf

    w = gguf.GGUFWriter(str(tmp_path / "types.gguf"), "llama")
    expected = {}
    for i, qtype in enumerate(FP16_FIELDS):
        raw = random_blocks(qtype, rows=4, blocks_per_row=2, seed=i)
        w.add_tensor(f"t.{qtype.name}", raw, raw_dtype=qtype)
        expected[f"t.{qtype.name}"] = quants.dequantize(raw, qtype)
    floats = np.random.default_rng(9).standard_normal((3, 32)).astype(np.float32)
    w.add_tensor("t.F32", floats)
    w.add_tensor("t.F16", floats.astype(np.float16))
    w.add_tensor("t.BF16", quants.quantize(floats, T.BF16), raw_dtype=T.BF16)
    expected["t.F32"] = floats
    expected["t.F16"] = floats.astype(np.float16).astype(np.float32)
    expected["t.BF16"] = quants.dequantize(quants.quantize(floats, T.BF16), T.BF16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    f = GGUFFile(tmp_path / "types.gguf")
    f.check_tensor_types()
    for name, ref in expected.items():
        np.testing.assert_array_equal(f.tensor(name, torch.float32).numpy(), ref, err_msg=name)
