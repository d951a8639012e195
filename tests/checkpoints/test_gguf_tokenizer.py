"""Tokenizers rebuilt from GGUF metadata, against transformers reading the same file."""

import gguf
import pytest

from fastdecode.checkpoints.gguf_file import GGUFFile
from fastdecode.checkpoints.gguf_tokenizer import merges_from_scores, tokenizer_from_gguf
from fastdecode.text.tokenizer import StreamDecoder
from tiny_checkpoints import private_cache  # noqa: F401  (autouse fixture)
from tiny_checkpoints import MERGES, byte_level_tokens, write_vocab

transformers = pytest.importorskip("transformers")

SPM_PIECES = [("▁", -1.0), ("a", -2.0), ("b", -2.1), ("c", -2.2), ("h", -2.3), ("e", -2.4), ("l", -2.5),
              ("o", -2.6), ("he", -3.0), ("ll", -3.1), ("▁h", -3.2), ("▁he", -4.0), ("llo", -4.1),
              ("▁hello", -5.0), ("▁a", -3.3), ("ab", -3.4), ("▁ab", -4.2)]

TEXTS = ["hello", " hello abc", "hello\nworld", "ab ab  ab", "é and 🤖", "<s>hello</s>", "", "  ",
         "x<|im_start|>y"]


def write_spm_gguf(path, add_bos=None, arch="llama"):
    w = gguf.GGUFWriter(str(path), arch)
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *(p for p, _ in SPM_PIECES)]
    types = [2, 3, 3, *([6] * 256), *([1] * len(SPM_PIECES))]
    scores = [0.0, 0.0, 0.0, *([0.0] * 256), *(s for _, s in SPM_PIECES)]
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_scores(scores)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    if add_bos is not None:
        w.add_add_bos_token(add_bos)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_bpe_gguf(path, pre=None):
    w = gguf.GGUFWriter(str(path), "llama")
    tokens = byte_level_tokens()
    w.add_tokenizer_model("gpt2")
    if pre is not None:
        w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([3 if t.startswith("<|") else 1 for t in tokens])
    w.add_token_merges([f"{a} {b}" for a, b in MERGES])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_uint32("tokenizer.ggml.eot_token_id", 0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def check_against_transformers(path):
    ours = tokenizer_from_gguf(GGUFFile(path))
    ref = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    for text in TEXTS:
        ids = ref(text)["input_ids"]
        assert ours.encode(text) == ids, text
        assert ours.encode(text, add_special_tokens=False) == ref(text, add_special_tokens=False)["input_ids"]
        assert ours.decode(ids) == ref.decode(ids, skip_special_tokens=True), text
        assert ours.decode(ids, skip_special_tokens=False) == ref.decode(ids, skip_special_tokens=False), text
    return ours


@pytest.mark.parametrize("add_bos", [None, True, False])
def test_sentencepiece_type_matches_transformers(tmp_path, add_bos):
    ours = check_against_transformers(write_spm_gguf(tmp_path / "spm.gguf", add_bos))
    # llama.cpp's rule: a SentencePiece vocabulary gets BOS unless the file says no.
    assert ours.add_bos is (add_bos is not False)
    assert (ours.encode("hello")[0] == 1) is ours.add_bos


def test_phi3_sentencepiece_puts_a_space_before_every_piece_of_text(tmp_path):
    """Phi-3's tokenizer prepends "▁" to each stretch of text between special tokens, and to text that
    starts with a space, as transformers reads a phi3 file (and llama.cpp any such vocabulary): "<s>hello"
    is <s> ▁hello, not <s> he llo."""
    ours = check_against_transformers(write_spm_gguf(tmp_path / "phi3.gguf", arch="phi3"))
    pieces = ours.backend.id_to_token
    assert [pieces(i) for i in ours.encode("<s>hello</s>", add_special_tokens=False)] == ["<s>", "▁hello", "</s>"]
    assert [pieces(i) for i in ours.encode(" hello", add_special_tokens=False)] == ["▁", "▁hello"]
    assert ours.decode(ours.encode(" hello abc")) == " hello abc"


@pytest.mark.parametrize("pre", [None, "llama-bpe", "qwen2", "smollm"])
def test_byte_level_type_matches_transformers(tmp_path, pre):
    ours = check_against_transformers(write_bpe_gguf(tmp_path / "bpe.gguf", pre))
    assert not ours.add_bos
    assert ours.eos_ids == frozenset({0, 2})  # eos plus the end-of-turn id
    assert ours.encode("<|im_start|>")[0] == 1  # special strings stay whole


# Merges that cross the boundaries where the split regexes differ: digits (alone, in threes,
# or in runs), a lower-to-upper case change, and a contraction kept on its word or not.
SPLIT_MERGES = [("Ġ", "1"), ("1", "2"), ("Ġ1", "2"), ("12", "3"), ("a", "B"), ("aB", "c"), ("'", "s"),
                ("x", "'s"), ("?", "/")]
SPLIT_TEXTS = ["a 123 1234 aBc x's X'S", "HelloWorld ?/\nz", "12345678 ab1c", "aBaB'saB"]


@pytest.mark.parametrize("pre", [None, "llama-bpe", "qwen2", "tekken", "gpt-4o", "pixtral"])
def test_each_split_regex_matches_transformers(tmp_path, pre):
    """A vocabulary whose merges cross the regexes' boundaries, so a wrong split gives other ids."""
    from fastdecode.checkpoints.gguf_tokenizer import byte_alphabet

    tokens = ["<|endoftext|>", *byte_alphabet().values(), *(a + b for a, b in SPLIT_MERGES)]
    path = write_vocab(tmp_path / "split.gguf", tokens, SPLIT_MERGES, pre)
    ours = tokenizer_from_gguf(GGUFFile(path))
    ref = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    for text in SPLIT_TEXTS:
        assert ours.encode(text, add_special_tokens=False) == ref(text, add_special_tokens=False)["input_ids"], text


def test_merges_from_scores_prefers_higher_scores():
    tokens = ["a", "b", "c", "ab", "bc", "abc"]
    scores = [0, 0, 0, -1.0, -0.5, -2.0]
    assert merges_from_scores(tokens, scores) == [("b", "c"), ("a", "b"), ("ab", "c"), ("a", "bc")]


def test_unsupported_tokenizer_model(tmp_path):
    from fastdecode.errors import FastDecodeError

    w = gguf.GGUFWriter(str(tmp_path / "t5.gguf"), "llama")
    w.add_tokenizer_model("t5")
    w.add_token_list(["a"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(FastDecodeError, match="unsupported tokenizer type 't5'; supported: gpt2, llama"):
        tokenizer_from_gguf(GGUFFile(tmp_path / "t5.gguf"))


def test_streaming_never_emits_broken_utf8(tmp_path):
    tok = tokenizer_from_gguf(GGUFFile(write_bpe_gguf(tmp_path / "bpe.gguf")))
    text = "hé 🤖 日本 the world"
    ids = tok.encode(text)
    assert len(ids) > len(text.encode("utf-8")) // 2  # mostly single bytes: characters span tokens
    stream = StreamDecoder(tok)
    pieces = [stream.push([i]) for i in ids] + [stream.flush()]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == text


def test_merge_of_unknown_tokens_is_a_one_line_error(tmp_path):
    from fastdecode.errors import FastDecodeError

    w = gguf.GGUFWriter(str(tmp_path / "bad.gguf"), "llama")
    w.add_tokenizer_model("gpt2")
    w.add_token_list(["a", "b"])
    w.add_token_merges(["a q"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(FastDecodeError, match="bad.gguf: cannot build the tokenizer"):
        tokenizer_from_gguf(GGUFFile(tmp_path / "bad.gguf"))


def test_streaming_sentencepiece_keeps_word_spaces(tmp_path):
    tok = tokenizer_from_gguf(GGUFFile(write_spm_gguf(tmp_path / "spm.gguf")))
    ids = tok.encode("hello ab hello é", add_special_tokens=False)
    stream = StreamDecoder(tok)
    pieces = [stream.push([i]) for i in ids] + [stream.flush()]
    assert "".join(pieces) == tok.decode(ids) == "hello ab hello é"
    assert all("\ufffd" not in p for p in pieces)


def test_the_tool_use_template_is_read_and_cached(tmp_path):
    """llama.cpp writes a checkpoint's named templates as tokenizer.chat_template.<name>: the
    "tool_use" one renders chats that offer tools, also from the conversion cache."""
    import torch

    from fastdecode.checkpoints import load_checkpoint
    from tiny_checkpoints import gguf_tensors, hf_model, write_gguf

    path = write_gguf(tmp_path / "t.gguf", gguf_tensors(hf_model()),
                      extra={"tokenizer.chat_template.tool_use": "tools:{{ tools | length }}"})
    chat = [{"role": "user", "content": "x"}]
    for _ in range(2):  # converted, then read back from the cache
        tok = load_checkpoint(path, dtype=torch.float32).tokenizer
        assert tok.apply_chat_template(chat, tools=[{"type": "function"}]) == "tools:1"
        assert tok.apply_chat_template(chat).startswith("<|im_start|>user\nx")


def test_byte_fallback_keeps_the_valid_characters_of_a_broken_run(tmp_path):
    """Byte tokens whose bytes are not all valid UTF-8 decode with only the bad bytes as U+FFFD, one
    each (SentencePiece's rule; llama.cpp gives the same bytes): <0x33><0xF4> is "3\ufffd", where the
    backend's ByteFallback alone made it "\ufffd\ufffd". A stream that had shown the "3" then saw the
    longer decode disagree and emitted nothing more. Found against llama.cpp on Gemma 3's vocabulary,
    where ids [445, 256193, 49718, 289, 482, 32652] decode to '\ufffdarel3\ufffd \\' as llama_detokenize's."""
    tok = tokenizer_from_gguf(GGUFFile(write_spm_gguf(tmp_path / "spm.gguf")))
    byte = lambda b: 3 + b  # noqa: E731  (<0x00> is id 3)
    a = tok.backend.token_to_id("a")
    ids = [a, byte(0x33), byte(0xF4), a, byte(0xE4), byte(0xB8), byte(0x33), byte(0xE4), byte(0xB8), byte(0xAD)]
    assert tok.decode(ids) == "a3\ufffda\ufffd\ufffd3中"
    # A skipped special token between bytes does not cut their run, as the backend drops it first.
    assert tok.decode([byte(0xE4), byte(0xB8), 2, byte(0xAD)]) == "中"
    assert tok.decode([byte(0xE4), byte(0xB8), 2, byte(0xAD)], skip_special_tokens=False) == "\ufffd\ufffd</s>\ufffd"
    assert tok.decode([byte(0xE4), byte(0xB8), tok.vocab_size, byte(0xAD)]) == "中"  # an unknown id is dropped
    for step in (1, 2, 3):
        stream = StreamDecoder(tok)
        pieces = [stream.push(ids[i:i + step]) for i in range(0, len(ids), step)] + [stream.flush()]
        assert "".join(pieces) == tok.decode(ids)


def write_bpe_with(path, key, value, vtype, sub_type=None):
    """write_bpe_gguf's vocabulary with `key` replaced by (or added as) `value` of GGUF type `vtype`."""
    from gguf import GGUFValueType as V

    tokens = byte_level_tokens()
    fields = {"tokenizer.ggml.model": ("gpt2", V.STRING, None), "tokenizer.ggml.tokens": (tokens, V.ARRAY, V.STRING),
              "tokenizer.ggml.token_type": ([3 if t.startswith("<|") else 1 for t in tokens], V.ARRAY, V.INT32),
              "tokenizer.ggml.merges": ([f"{a} {b}" for a, b in MERGES], V.ARRAY, V.STRING),
              "tokenizer.ggml.bos_token_id": (1, V.UINT32, None), "tokenizer.ggml.eos_token_id": (2, V.UINT32, None),
              "tokenizer.chat_template": ("{{ messages[0]['content'] }}", V.STRING, None),
              key: (value, vtype, sub_type)}
    w = gguf.GGUFWriter(str(path), "llama")
    for k, (v, t, sub) in fields.items():
        w.add_key_value(k, v, t, sub_type=sub)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("key, value, vtype, sub_type, match", [
    ("tokenizer.ggml.merges", 7, "UINT32", None, "tokenizer.ggml.merges must be an array of strings, got int 7"),
    ("tokenizer.ggml.merges", [1, 2], "ARRAY", "INT32", "merges must be an array of strings, got an array of other"),
    ("tokenizer.ggml.tokens", [1, 2], "ARRAY", "INT32", "tokens must be an array of strings"),
    ("tokenizer.ggml.token_type", 3, "UINT32", None, "token_type must be an array of integers, got int 3"),
    ("tokenizer.ggml.model", 1, "UINT32", None, "tokenizer.ggml.model must be a string, got int 1"),
    ("tokenizer.ggml.bos_token_id", "one", "STRING", None, "bos_token_id must be an integer, got 'one'"),
    ("tokenizer.ggml.eos_token_id", 1.5, "FLOAT32", None, "eos_token_id must be an integer, got 1.5"),
    ("tokenizer.ggml.eot_token_id", [0], "ARRAY", "INT32", "eot_token_id must be an integer, got an array"),
    ("tokenizer.ggml.eom_token_id", "x", "STRING", None, "eom_token_id must be an integer, got 'x'"),
    ("tokenizer.chat_template", 5, "UINT32", None, "tokenizer.chat_template must be a string, got int 5"),
    ("tokenizer.chat_template.tool_use", True, "BOOL", None, "tool_use must be a string, got bool True"),
    ("tokenizer.ggml.pre", 2, "INT32", None, "tokenizer.ggml.pre must be a string"),
])
def test_tokenizer_metadata_of_the_wrong_type_is_named(tmp_path, key, value, vtype, sub_type, match):
    """Each key the tokenizer reads, written with another GGUF type: one line naming the file and the
    key (these failed with a TypeError or AttributeError from inside the tokenizer's construction)."""
    from gguf import GGUFValueType as V

    from fastdecode.errors import FastDecodeError

    path = write_bpe_with(tmp_path / "typed.gguf", key, value, V[vtype], V[sub_type] if sub_type else None)
    with pytest.raises(FastDecodeError, match=f"typed.gguf: .*{match}"):
        tokenizer_from_gguf(GGUFFile(path))


def test_merge_without_a_space_is_named(tmp_path):
    """A merge that is not 'left right' failed as "failed to extract enum PyMerges", naming neither."""
    from gguf import GGUFValueType as V

    from fastdecode.errors import FastDecodeError

    merges = [f"{a} {b}" for a, b in MERGES] + ["hello"]
    path = write_bpe_with(tmp_path / "m.gguf", "tokenizer.ggml.merges", merges, V.ARRAY, V.STRING)
    with pytest.raises(FastDecodeError, match=f"m.gguf: tokenizer.ggml.merges entry {len(MERGES)} \\('hello'\\) is not two"):
        tokenizer_from_gguf(GGUFFile(path))
