"""GGUF loading: metadata, Q/K un-permute, tied output, quantized tensors, bad input."""

import re
import shutil
import struct

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from gguf import quants

from fastdecode.checkpoints import load_checkpoint
from fastdecode.checkpoints.gguf_loader import unpermute_rows
from fastdecode.errors import FastDecodeError
from tiny_checkpoints import private_cache  # noqa: F401  (autouse fixture)
from tiny_checkpoints import VOCAB, byte_level_tokens, gguf_tensors, hf_model, llama_cpp_permute, write_gguf


def build_ours(ckpt):
    from fastdecode.quant import build_model  # what load() builds the model with

    return build_model(ckpt.args, ckpt.state_dict, torch.float32)[0].eval()


def hf_names(model):
    """Our key -> the HF tensor it should equal."""
    sd = model.state_dict()
    out = {"tok_embeddings.weight": sd["model.embed_tokens.weight"], "norm.weight": sd["model.norm.weight"]}
    pairs = {"attention_norm": "input_layernorm", "attention.wq": "self_attn.q_proj",
             "attention.wk": "self_attn.k_proj", "attention.wv": "self_attn.v_proj",
             "attention.wo": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
             "feed_forward.w1": "mlp.gate_proj", "feed_forward.w2": "mlp.down_proj", "feed_forward.w3": "mlp.up_proj"}
    for i in range(model.config.num_hidden_layers):
        for ours, theirs in pairs.items():
            for kind in ("weight", "bias"):
                key = f"model.layers.{i}.{theirs}.{kind}"
                if key in sd:
                    out[f"layers.{i}.{ours}.{kind}"] = sd[key]
    if not model.config.tie_word_embeddings:
        out["output.weight"] = sd["lm_head.weight"]
    return out


def test_unpermute_inverts_llama_cpp_permutation():
    w = np.random.default_rng(0).standard_normal((4 * 16, 8)).astype(np.float32)
    permuted = torch.from_numpy(llama_cpp_permute(w, 4))
    assert not torch.equal(permuted, torch.from_numpy(w))
    assert torch.equal(unpermute_rows(permuted, 4), torch.from_numpy(w))


@pytest.mark.parametrize("tie", [True, False])
def test_llama_gguf_weights_equal_hf_weights(tmp_path, tie):
    model = hf_model("llama", tie=tie)
    path = write_gguf(tmp_path / "tiny.gguf", gguf_tensors(model))
    ckpt = load_checkpoint(path, dtype=torch.float32, device="cpu", use_cache=False)
    a = ckpt.args
    assert (a.dim, a.n_layers, a.n_heads, a.n_kv_heads, a.head_dim, a.hidden_dim, a.vocab_size) == (
        64, 2, 4, 2, 16, 96, VOCAB)
    assert a.tie_embeddings is tie and a.qkv_bias is False and a.max_seq_len == 128
    assert ckpt.format == "gguf" and ckpt.load_seconds > 0
    expected = hf_names(model)
    assert set(ckpt.state_dict) == set(expected)
    for key, ref in expected.items():
        assert torch.equal(ckpt.state_dict[key], ref), key


def test_qwen2_gguf_has_biases_and_no_permutation(tmp_path):
    model = hf_model("qwen2", tie=True)
    path = write_gguf(tmp_path / "q.gguf", gguf_tensors(model, arch="qwen2"), arch="qwen2")
    ckpt = load_checkpoint(path, dtype=torch.float32, device="cpu", use_cache=False)
    assert ckpt.args.qkv_bias
    for key, ref in hf_names(model).items():
        assert torch.equal(ckpt.state_dict[key], ref), key


def test_tiny_gguf_logits_match_transformers_loading_the_same_file(tmp_path):
    transformers = pytest.importorskip("transformers")
    model = hf_model("llama", tie=False, seed=3)
    path = write_gguf(tmp_path / "tiny.gguf", gguf_tensors(model))
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file="tiny.gguf", dtype=torch.float32).eval()
    ours = build_ours(load_checkpoint(path, dtype=torch.float32, device="cpu", use_cache=False))
    tokens = torch.tensor([[5, 17, 200, 3, 99, 261, 42]])
    with torch.no_grad():
        diff = (ours(tokens, None) - ref(tokens).logits).abs().max().item()
    assert diff <= 1e-4


@pytest.mark.parametrize("qtype", [T.F16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1], ids=lambda t: t.name)
def test_quantized_model_tensors_dequantize_like_gguf(tmp_path, qtype):
    model = hf_model("llama", tie=True)
    tensors = gguf_tensors(model)
    quant = {n: qtype for n, a in tensors.items() if a.ndim == 2}
    path = write_gguf(tmp_path / "q.gguf", tensors, quant=quant)
    ckpt = load_checkpoint(path, dtype=torch.float32, device="cpu", use_cache=False)
    # The Q rows of layer 0 went through quantize -> dequantize -> un-permute.
    q = tensors["blk.0.attn_q.weight"]
    stored = q.astype(np.float16) if qtype == T.F16 else quants.quantize(q, qtype)
    expected = unpermute_rows(torch.from_numpy(quants.dequantize(stored, qtype).astype(np.float32)), 4)
    assert torch.equal(ckpt.state_dict["layers.0.attention.wq.weight"], expected)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_requested_dtype(tmp_path, dtype):
    path = write_gguf(tmp_path / "t.gguf", gguf_tensors(hf_model()))
    ckpt = load_checkpoint(path, dtype=dtype, device="cpu", use_cache=False)
    assert {t.dtype for t in ckpt.state_dict.values()} == {dtype}


# --- bad input: each one line naming the file and the problem ---------------------------------

@pytest.fixture
def good_gguf(tmp_path):
    return write_gguf(tmp_path / "good.gguf", gguf_tensors(hf_model()))


def one_line_error(path, match, **kwargs):
    with pytest.raises(FastDecodeError, match=match) as info:
        load_checkpoint(path, dtype=torch.float32, device="cpu", use_cache=False, **kwargs)
    message = str(info.value)
    assert "\n" not in message and str(path) in message
    return message


def test_missing_file(tmp_path):
    one_line_error(tmp_path / "nope.gguf", "not found")


def test_wrong_magic(tmp_path, good_gguf):
    data = bytearray(good_gguf.read_bytes())
    data[:4] = b"GGML"
    bad = tmp_path / "magic.gguf"
    bad.write_bytes(bytes(data))
    one_line_error(bad, "not a GGUF file")


@pytest.mark.parametrize("keep", [0.5, 0.999, 0.01])
def test_truncated_file(tmp_path, good_gguf, keep):
    data = good_gguf.read_bytes()
    bad = tmp_path / "cut.gguf"
    cut = max(8, int(len(data) * keep))
    bad.write_bytes(data[:cut])
    message = one_line_error(bad, "truncated")
    if keep > 0.1:  # cut inside the tensor data: the message names the tensor and where it stops
        m = re.search(r"tensor '([^']+)' \(bytes (\d+)-(\d+)\) is cut short at byte (\d+)", message)
        assert m, message
        end, at = int(m[3]), int(m[4])
        assert at == cut < end


def test_metadata_reads_as_gguf_reads_it(tmp_path):
    """The reader's metadata arrays, read in one pass (gguf_file._Reader), hold what gguf's own
    reader finds: strings (non-ASCII, empty), numbers, bools (gguf's writer leaves out empty arrays)."""
    import gguf
    from gguf import GGUFReader

    from fastdecode.checkpoints.gguf_file import GGUFFile

    path = tmp_path / "meta.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_array("t.strings", ["a", "", "ĠHello", "日本", "x" * 300])
    w.add_array("t.ints", [1, -2, 3])
    w.add_array("t.floats", [0.5, -1.25])
    w.add_array("t.bools", [True, False, True])
    w.add_uint64("t.u64", 2**40)
    w.add_string("t.string", "plain")
    w.add_tensor("w", np.ones((4, 8), np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    ours, ref = GGUFFile(path), GGUFReader(path)
    assert set(ours._reader.fields) == set(ref.fields)
    for key, field in ref.fields.items():
        assert ours._reader.fields[key].contents() == field.contents(), key
        assert ours._reader.fields[key].types == field.types, key
    assert ours.get("t.strings") == ["a", "", "ĠHello", "日本", "x" * 300]
    assert ours.get("t.ints") == [1, -2, 3] and ours.get("t.bools") == [True, False, True]
    assert [t.name for t in ours._reader.tensors] == ["w"]


def test_corrupt_array_count(tmp_path, good_gguf):
    """A string array whose count says 2^40 elements fails at once with the one-line error."""
    from gguf import GGUFReader

    field = GGUFReader(good_gguf).fields["tokenizer.ggml.tokens"]
    at = field.offset + sum(int(p.nbytes) for p in field.parts[:4])  # key length, key, type, item type
    data = bytearray(good_gguf.read_bytes())
    assert struct.unpack_from("<Q", data, at)[0] == len(field.data)
    struct.pack_into("<Q", data, at, 2**40)
    bad = tmp_path / "count.gguf"
    bad.write_bytes(bytes(data))
    one_line_error(bad, "truncated|corrupt")


def test_corrupt_header_entry_is_located(tmp_path, good_gguf):
    """A metadata key length or a tensor name length that runs past the file: the one-line error
    says which entry (the key before it, or the tensor description's first byte)."""
    from gguf import GGUFReader

    reader = GGUFReader(good_gguf)
    keys = list(reader.fields)
    entry = reader.fields[keys[4]]  # a key after the three header fields and one more
    tensor = reader.tensors[1].field
    bad = tmp_path / "entry.gguf"
    for at, expected in ((entry.offset, f"the metadata entry after '{keys[3]}'"),
                         (tensor.offset, f"the tensor description at byte {tensor.offset}")):
        data = bytearray(good_gguf.read_bytes())
        struct.pack_into("<Q", data, at, 2**50)  # the key's or the tensor name's length
        bad.write_bytes(bytes(data))
        assert expected in one_line_error(bad, "corrupt GGUF header")


def test_unknown_metadata_value_type_is_located(tmp_path, good_gguf):
    """A value type outside GGUF's 0-12, of an entry or of an array's items, is named with the entry;
    it read as "truncated or corrupt GGUF (the header or tensor data is cut short)"."""
    from gguf import GGUFReader

    reader = GGUFReader(good_gguf)
    keys = list(reader.fields)
    tokens = reader.fields["tokenizer.ggml.tokens"]
    before = keys[keys.index("tokenizer.ggml.tokens") - 1]
    entry_type = tokens.offset + 8 + len("tokenizer.ggml.tokens")  # after the key's length and text
    bad = tmp_path / "vtype.gguf"
    for at in (entry_type, entry_type + 4):  # the entry's type, then its items' type
        data = bytearray(good_gguf.read_bytes())
        struct.pack_into("<I", data, at, 99)
        bad.write_bytes(bytes(data))
        one_line_error(bad, f"the metadata entry after '{before}' has unknown value type 99; GGUF's are 0-12")


def test_tensor_shape_against_the_metadata(tmp_path, good_gguf):
    """A Q matrix whose rows disagree with the head count: named before the un-permute that
    reshapes by it (that reshape failed with a bare RuntimeError)."""
    from gguf import GGUFReader

    field = next(t for t in GGUFReader(good_gguf).tensors if t.name == "blk.0.attn_q.weight").field
    at = field.offset + sum(int(p.nbytes) for p in field.parts[:3])  # name length, name, n_dims
    data = bytearray(good_gguf.read_bytes())
    cols, rows = struct.unpack_from("<QQ", data, at)
    struct.pack_into("<QQ", data, at, cols, rows - 8)
    bad = tmp_path / "rows.gguf"
    bad.write_bytes(bytes(data))
    one_line_error(bad, re.escape(f"tensor 'blk.0.attn_q.weight' has shape [{rows - 8}, {cols}], "
                                  f"but the file's metadata makes it [{rows}, {cols}]"))


def test_random_header_damage_gets_one_line_or_loads(tmp_path, good_gguf):
    """1-8 bytes changed at random in the header (metadata and tensor descriptions), 60 times: each
    file either loads or fails with the one-line error, never with another exception."""
    import random

    from gguf import GGUFReader

    data = good_gguf.read_bytes()
    header_end = GGUFReader(good_gguf).data_offset
    bad = tmp_path / "damaged.gguf"
    rng = random.Random(0)
    outcomes = set()
    for _ in range(60):
        b = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(8, header_end)] = rng.randrange(256)
        bad.write_bytes(bytes(b))
        try:
            load_checkpoint(bad, dtype=torch.float32, device="cpu", use_cache=False)
            outcomes.add("loaded")
        except FastDecodeError as e:
            assert "\n" not in str(e) and str(bad) in str(e)
            outcomes.add("error")
    assert "error" in outcomes


def test_duplicate_metadata_key(tmp_path):
    import gguf

    path = tmp_path / "dup.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint32("t.a", 1)
    w.add_uint32("t.b", 2)
    w.add_tensor("w", np.ones((4, 8), np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    data = path.read_bytes()
    assert data.count(b"t.b") == 1
    path.write_bytes(data.replace(b"t.b", b"t.a"))
    one_line_error(path, "the metadata key 't.a' appears twice")


def test_file_cut_inside_the_metadata(tmp_path, good_gguf):
    """Cut at every 97th byte of the header (inside strings, lengths and arrays): one line each."""
    from gguf import GGUFReader

    data = good_gguf.read_bytes()
    header_end = GGUFReader(good_gguf).data_offset
    bad = tmp_path / "cut.gguf"
    for cut in range(8, header_end, 97):
        bad.write_bytes(data[:cut])
        one_line_error(bad, "truncated|corrupt")


def test_empty_file(tmp_path):
    bad = tmp_path / "empty.gguf"
    bad.write_bytes(b"")
    one_line_error(bad, "not a GGUF file")


def _type_field_offset(path, tensor_name):
    """Byte offset of a tensor's type id in the tensor-info section."""
    from gguf import GGUFReader

    reader = GGUFReader(path)
    t = next(t for t in reader.tensors if t.name == tensor_name)
    before = t.field.parts[:4]  # name length, name, n_dims, dims
    return t.field.offset + sum(int(p.nbytes) for p in before)


def test_unknown_tensor_type(tmp_path, good_gguf):
    at = _type_field_offset(good_gguf, "blk.0.attn_q.weight")
    data = bytearray(good_gguf.read_bytes())
    data[at:at + 4] = struct.pack("<I", 99)
    bad = tmp_path / "type.gguf"
    bad.write_bytes(bytes(data))
    message = one_line_error(bad, "unknown tensor type id 99")
    assert "Q4_K" in message  # lists what is supported


def _patched(tmp_path, good_gguf, tensor_name, part, fmt, *values, name="bad.gguf"):
    """good_gguf with part `part` of a tensor description (3: dims, 4: type, 5: data offset) rewritten."""
    from gguf import GGUFReader

    field = next(t for t in GGUFReader(good_gguf).tensors if t.name == tensor_name).field
    at = field.offset + sum(int(p.nbytes) for p in field.parts[:part])
    data = bytearray(good_gguf.read_bytes())
    struct.pack_into(fmt, data, at, *values)
    bad = tmp_path / name
    bad.write_bytes(bytes(data))
    return bad


@pytest.mark.parametrize("offset, match", [
    (3, r"tensor 'blk.0.attn_k.weight' starts at data offset 3, not a multiple of the file's alignment 32"),
    (0, r"tensor '(blk.0.attn_k|token_embd).weight' \(data bytes from 0\) overlaps tensor "
        r"'(token_embd|blk.0.attn_k).weight'"),
    # wraps past 2^64 to the header's bytes, which the reader would have taken as weights
    (2**64 - 64, r"tensor 'blk.0.attn_k.weight' \(bytes 1844674407370955\d+-\d+\) is cut short"),
])
def test_tensor_data_offsets_that_no_writer_makes(tmp_path, good_gguf, offset, match):
    """Offsets inside another tensor's bytes, off the alignment or wrapped past 2^64 loaded those bytes
    as weights (llama.cpp refuses such files)."""
    one_line_error(_patched(tmp_path, good_gguf, "blk.0.attn_k.weight", 5, "<Q", offset), match)


def test_duplicate_tensor_name(tmp_path, good_gguf):
    data = bytearray(good_gguf.read_bytes())
    at = data.find(b"blk.0.attn_k.weight")
    data[at:at + 19] = b"blk.0.attn_q.weight"
    bad = tmp_path / "dup.gguf"
    bad.write_bytes(bytes(data))
    one_line_error(bad, "tensor 'blk.0.attn_q.weight' appears twice")  # was "truncated or corrupt"


def test_rows_that_are_not_whole_blocks(tmp_path, good_gguf):
    bad = _patched(tmp_path, good_gguf, "blk.0.attn_q.weight", 4, "<I", int(T.Q4_K))
    one_line_error(bad, "tensor 'blk.0.attn_q.weight' of type Q4_K has rows of 64 values, not a whole number "
                        "of its 256-value blocks")


@pytest.mark.parametrize("alignment", [0, 48])
def test_alignment_that_is_not_a_power_of_two(tmp_path, alignment):
    path = write_gguf(tmp_path / "align.gguf", gguf_tensors(hf_model()), extra={"general.alignment": alignment})
    one_line_error(path, "general.alignment must be a uint32 power of two")


def test_known_but_unsupported_tensor_type(tmp_path):
    import gguf

    from fastdecode.checkpoints.gguf_file import GGUFFile

    path = tmp_path / "q8k.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("blk.0.attn_q.weight", np.zeros((2, 292), dtype=np.uint8), raw_dtype=T.Q8_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(FastDecodeError, match="unsupported type Q8_K; supported: F32"):
        GGUFFile(path).check_tensor_types()


def test_unsupported_architecture(tmp_path):
    path = write_gguf(tmp_path / "falcon.gguf", gguf_tensors(hf_model()), arch="falcon")
    message = one_line_error(path, "unsupported architecture 'falcon'")
    assert "llama" in message and "qwen2" in message


def test_missing_architecture(tmp_path, good_gguf):
    """A file without general.architecture read as "unsupported architecture None"."""
    from gguf import GGUFReader

    field = GGUFReader(good_gguf).fields["general.architecture"]
    data = bytearray(good_gguf.read_bytes())
    at = field.offset + 8  # the key's text, after its length
    data[at:at + len("general")] = b"GENERAL"  # the same entry under another key
    bad = tmp_path / "noarch.gguf"
    bad.write_bytes(bytes(data))
    assert "llama" in one_line_error(bad, "missing metadata key general.architecture; supported: ")


@pytest.mark.parametrize("key, value", [("n_heads", 0), ("dim", 0)])
def test_zero_heads_or_width(tmp_path, key, value):
    """A head count of 0 raised ZeroDivisionError (the head size's default divides by it)."""
    path = write_gguf(tmp_path / "zero.gguf", gguf_tensors(hf_model()), **{key: value})
    name = {"n_heads": "attention.head_count", "dim": "embedding_length"}[key]
    one_line_error(path, rf"llama\.{name} must be >= 1, got 0$")


@pytest.mark.parametrize("arch", ["llama", "gemma2", "gemma3"])
def test_block_count_past_the_layer_bound(tmp_path, arch):
    """Gemma 2's and 3's per-layer lists were built from block_count before ModelArgs bounded it: 2**32 - 1
    layers ran for minutes and took gigabytes before any error."""
    path = write_gguf(tmp_path / "layers.gguf", gguf_tensors(hf_model()), arch=arch, n_layers=2**32 - 1,
                      extra={f"{arch}.attention.sliding_window": 64} if arch == "gemma3" else None)
    one_line_error(path, rf"{arch}\.block_count must be 1\.\.4,096, got 4,294,967,295")


def test_tokenizer_larger_than_model_vocabulary(tmp_path):
    tokens = byte_level_tokens() + ["extra1", "extra2"]
    path = write_gguf(tmp_path / "vocab.gguf", gguf_tensors(hf_model()), tokens=tokens)
    one_line_error(path, f"tokenizer has {VOCAB + 2} tokens but the model's vocabulary is {VOCAB}")


def test_unexpected_tensor(tmp_path):
    tensors = gguf_tensors(hf_model())
    tensors["blk.0.attn_sinks.weight"] = np.zeros(4, dtype=np.float32)
    path = write_gguf(tmp_path / "extra.gguf", tensors)
    one_line_error(path, "unexpected tensor 'blk.0.attn_sinks.weight'")


def test_missing_tensor(tmp_path):
    tensors = gguf_tensors(hf_model())
    del tensors["blk.1.ffn_up.weight"]
    path = write_gguf(tmp_path / "missing.gguf", tensors)
    one_line_error(path, "missing tensor for layers.1.feed_forward.w3.weight")


def test_directory_is_not_a_gguf(tmp_path, good_gguf):
    shutil.copy(good_gguf, tmp_path / "copy.gguf")
    with pytest.raises(FastDecodeError, match="config.json"):
        load_checkpoint(tmp_path, dtype=torch.float32, device="cpu")


def llama3_factors(head_dim, theta, factor, low, high, orig):
    """llama.cpp's rope_freqs table, written from its converter's formula."""
    import math

    out = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi / (theta ** (-i / head_dim))
        if wavelen < orig / high:
            out.append(1.0)
        elif wavelen > orig / low:
            out.append(factor)
        else:
            smooth = (orig / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def test_llama3_rope_scaling_is_recovered_from_rope_freqs(tmp_path):
    tensors = gguf_tensors(hf_model())
    tensors["rope_freqs.weight"] = llama3_factors(16, 10000.0, 8.0, 1.0, 4.0, 8192)
    ckpt = load_checkpoint(write_gguf(tmp_path / "l3.gguf", tensors), dtype=torch.float32, use_cache=False)
    s = ckpt.args.rope_scaling
    assert (s.factor, s.low_freq_factor, s.high_freq_factor, s.original_max_position_embeddings) == (8, 1, 4, 8192)
    assert "rope_freqs.weight" not in ckpt.state_dict


def test_unrecognised_rope_freqs_table(tmp_path):
    tensors = gguf_tensors(hf_model())
    tensors["rope_freqs.weight"] = llama3_factors(16, 10000.0, 8.0, 2.0, 3.0, 8192)
    one_line_error(write_gguf(tmp_path / "odd.gguf", tensors), "not a Llama-3 RoPE scaling table")
