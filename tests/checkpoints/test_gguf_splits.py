"""Every `tokenizer.ggml.pre` split we apply, against llama.cpp tokenizing the same file.

The vocabulary's merges cross the boundaries where the split regexes differ
(tiny_checkpoints.BOUNDARY_MERGES), so a wrong split, or a missing ignore_merges, gives other ids.
llama.cpp's ids are recorded in gguf_splits_llama_cpp.json, so that the comparison runs
without llama-cpp-python too; where it is installed, the record is checked against it.
Record again with `python tests/checkpoints/test_gguf_splits.py` (needs llama-cpp-python).
"""

import json
import sys
from pathlib import Path

import pytest

from fastdecode.checkpoints.gguf_file import GGUFFile
from fastdecode.checkpoints.gguf_splits import PRE_SPLITS
from fastdecode.checkpoints.gguf_tokenizer import tokenizer_from_gguf
from tiny_checkpoints import BOUNDARY_MERGES, BOUNDARY_TEXTS, boundary_tokens, write_vocab
from conftest import need_llama_cpp

RECORD = Path(__file__).with_name("gguf_splits_llama_cpp.json")
NAMES = sorted(PRE_SPLITS)


def write_boundary_vocab(path: Path, pre: str) -> Path:
    return write_vocab(path, boundary_tokens(), BOUNDARY_MERGES, pre)


def llama_cpp_ids(path: Path) -> list[list[int]]:
    import llama_cpp

    ref = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    try:
        return [ref.tokenize(t.encode("utf-8"), add_bos=False, special=False) for t in BOUNDARY_TEXTS]
    finally:
        ref.close()


def recorded() -> dict:
    return json.loads(RECORD.read_text(encoding="utf-8"))


@pytest.mark.parametrize("pre", NAMES)
def test_split_gives_llama_cpps_ids(tmp_path, pre):
    ours = tokenizer_from_gguf(GGUFFile(write_boundary_vocab(tmp_path / "v.gguf", pre)))
    got = [ours.encode(t, add_special_tokens=False) for t in BOUNDARY_TEXTS]
    assert got == recorded()["ids"][pre]


def test_record_is_llama_cpps(tmp_path):
    """The record covers every name we split and the texts as they are, and llama.cpp gives it."""
    record = recorded()
    assert record["texts"] == BOUNDARY_TEXTS and sorted(record["ids"]) == NAMES
    need_llama_cpp()
    for pre in NAMES:
        assert llama_cpp_ids(write_boundary_vocab(tmp_path / f"{pre}.gguf", pre)) == record["ids"][pre], pre


def test_the_splits_are_not_all_alike(tmp_path):
    """The record tells the families apart (a table that split every name alike would fail)."""
    distinct = {json.dumps(ids) for ids in recorded()["ids"].values()}
    assert len(distinct) >= 10


if __name__ == "__main__":  # record llama.cpp's ids
    import tempfile

    sys.path.insert(0, str(Path(__file__).parent))
    with tempfile.TemporaryDirectory() as d:
        ids = {pre: llama_cpp_ids(write_boundary_vocab(Path(d) / f"{pre}.gguf", pre)) for pre in NAMES}
    import llama_cpp

    lines = ",\n".join(f"  {json.dumps(pre)}: {json.dumps(ids[pre])}" for pre in NAMES)
    RECORD.write_text(f'{{"llama_cpp": {json.dumps(llama_cpp.__version__)},\n"texts": '
                      f'{json.dumps(BOUNDARY_TEXTS, ensure_ascii=False)},\n"ids": {{\n{lines}\n}}}}\n', encoding="utf-8")
    print(f"wrote {RECORD} ({len(ids)} names)")
