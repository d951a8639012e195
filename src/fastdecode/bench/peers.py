"""The peers users would pick instead, measured on the same weights in the same run.

- Hugging Face transformers `generate` on the same checkpoint, with its dynamic
  cache, its static cache, and its static cache under `torch.compile`;
- llama.cpp through llama-cpp-python, on the same GGUF file.

A peer that is not installed raises `PeerSkipped` with the command that installs it.
"""

from __future__ import annotations

import importlib.util
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch

from ..errors import FastDecodeError
from .contenders import Contender, PeerSkipped, StepClock, Timing
from .options import PEERS, BenchSettings

INSTALL = {
    "transformers": 'pip install "transformers>=4.45" accelerate',
    "llama_cpp": "pip install llama-cpp-python",
}


@dataclass
class Checkpoint:
    """The files a peer loads: a GGUF file, or a Hugging Face directory."""

    directory: Path
    gguf_file: Optional[str]  # a file name inside `directory`, or None for an HF directory

    @property
    def gguf_path(self) -> Optional[Path]:
        return self.directory / self.gguf_file if self.gguf_file else None


def peer_checkpoint(model: Optional[str]) -> Checkpoint:
    """The checkpoint behind `model` (a BenchSettings.model value), for the peers."""
    from ..model.args import PRESETS
    from ..config import DEFAULT_MODEL

    if model in PRESETS:
        raise PeerSkipped(f"model {model!r} is a random-weight preset; peers need a checkpoint file")
    path = _named_checkpoint(model or DEFAULT_MODEL) or Path(model or DEFAULT_MODEL)
    if path.is_dir():
        return Checkpoint(path, None)
    if path.is_file() and path.suffix == ".gguf":
        return Checkpoint(path.parent, path.name)
    raise PeerSkipped(f"model {model!r} is not a GGUF file or a Hugging Face directory")


def _named_checkpoint(name: str) -> Optional[Path]:
    from .. import checkpoints

    try:
        found = checkpoints.resolve_checkpoint_name(name)
    except FastDecodeError as e:  # e.g. the package holding the default GGUF is missing
        raise PeerSkipped(str(e)) from None
    return None if found is None else Path(found)


def require_transformers() -> None:
    if importlib.util.find_spec("transformers") is None:
        raise PeerSkipped(f"transformers is not installed; install with: {INSTALL['transformers']}")


def load_hf_model(ckpt: Checkpoint, device: torch.device, dtype: torch.dtype):
    """The checkpoint as a transformers model on `device`, in eval mode (a GGUF file is dequantized to `dtype`)."""
    from transformers import AutoModelForCausalLM

    extra = {"gguf_file": ckpt.gguf_file} if ckpt.gguf_file else {}
    model = AutoModelForCausalLM.from_pretrained(str(ckpt.directory), dtype=dtype, **extra)
    return model.to(device).eval()


def require_llama_cpp(ckpt: Checkpoint, device: str) -> None:
    """PeerSkipped unless llama-cpp-python is installed and can run `ckpt` on `device`."""
    from ..evaluation.perplexity import llama_cpp_problem

    if importlib.util.find_spec("llama_cpp") is None:
        raise PeerSkipped(f"llama-cpp-python is not installed; install with: {INSTALL['llama_cpp']}")
    if problem := llama_cpp_problem():
        raise PeerSkipped(problem)
    if ckpt.gguf_path is None:
        raise PeerSkipped("llama.cpp needs a GGUF file; the model is a Hugging Face directory")
    if device != "cpu":
        raise PeerSkipped(f"llama.cpp peer runs on the CPU only here; device={device}")


def load_llama(ckpt: Checkpoint, *, n_ctx: int, n_batch: int, threads: int, **options: Any):
    """llama-cpp-python's `Llama` on the GGUF file (call `require_llama_cpp` first); `options` go to `Llama`."""
    from llama_cpp import Llama

    return Llama(model_path=str(ckpt.gguf_path), n_ctx=n_ctx, n_batch=n_batch, n_threads=threads,
                 n_threads_batch=threads, verbose=False, **options)


def make_peer(name: str, s: BenchSettings, shared: dict[str, Any]) -> Contender:
    """Build peer `name`; `shared` keeps one loaded HF model for the three HF peers."""
    if name not in PEERS:
        raise FastDecodeError(f"unknown peer {name!r}; accepted: {', '.join(PEERS)}")
    ckpt = peer_checkpoint(s.model)
    if name == "llama.cpp":
        return LlamaCppPeer(s, ckpt)
    return HFPeer(name, s, ckpt, shared)


def _weight_bytes(model: torch.nn.Module, tied: bool) -> int:
    """Bytes one decode step reads: every weight, minus the embedding table unless
    it doubles as the output head (then it is read whole)."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    if not tied:
        emb = model.get_input_embeddings().weight
        total -= emb.numel() * emb.element_size()
    return total


class _HFClock:
    """A transformers streamer: `put` is called once with the prompt, then once
    per new token, so it marks the step boundaries."""

    def __init__(self, clock: StepClock):
        self.clock, self.seen_prompt = clock, False

    def put(self, value: torch.Tensor) -> None:
        if self.seen_prompt:
            self.clock.mark()
        self.seen_prompt = True

    def end(self) -> None:
        pass


class HFPeer(Contender):
    engine = "transformers"

    def __init__(self, name: str, s: BenchSettings, ckpt: Checkpoint, shared: dict[str, Any]):
        require_transformers()
        from ..config import resolve_device, resolve_dtype

        self.name = name
        self.device = resolve_device(s.device)
        self.torch_dtype = resolve_dtype(s.dtype, self.device)
        self.dtype = str(self.torch_dtype).removeprefix("torch.")
        self.compiles = name == "hf-static+compile"
        key = f"{ckpt.directory}|{ckpt.gguf_file}|{self.device}|{self.dtype}"
        t0 = time.perf_counter()
        if shared.get("hf_key") != key:
            shared.clear()
            shared["hf_key"], shared["hf_model"] = key, load_hf_model(ckpt, self.device, self.torch_dtype)
        self.load_s = time.perf_counter() - t0  # 0 when an earlier HF peer loaded it
        self.model = shared["hf_model"]
        self.weight_bytes_per_token = _weight_bytes(self.model, bool(self.model.config.tie_word_embeddings))
        self.vocab_size = int(self.model.config.vocab_size)
        self.source = str(ckpt.gguf_path or ckpt.directory)
        self.options = self._options(name)

    def _options(self, name: str) -> dict[str, Any]:
        if name == "hf-dynamic":
            return {"disable_compile": True}
        # transformers compiles a static-cache forward by itself on GPUs; hf-static
        # turns that off so the row measures the cache alone.
        if name == "hf-static":
            return {"cache_implementation": "static", "disable_compile": True}
        from transformers import CompileConfig

        mode = "reduce-overhead" if self.device.type == "cuda" else "default"  # CUDA graphs on CUDA
        cfg = CompileConfig(fullgraph=False, mode=mode)
        cfg._compile_all_devices = True  # transformers compiles only on accelerators unless told
        return {"cache_implementation": "static", "compile_config": cfg}

    def run(self, prompts: list[list[int]], new_tokens: int) -> Timing:
        from ..engine import timing

        ids = torch.tensor(prompts, device=self.device)  # [B, T], equal lengths: no padding
        timing.reset_peak_memory(self.device)
        clock = StepClock(self.device)
        clock.begin()
        with torch.inference_mode():
            self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                min_new_tokens=new_tokens, do_sample=False, streamer=_HFClock(clock),
                                pad_token_id=0, **self.options)
        return clock.timing(timing.peak_memory_bytes(self.device))

    def close(self) -> None:
        self.model = None


class LlamaCppPeer(Contender):
    """llama.cpp on the same GGUF file, batched through llama-cpp-python's ctypes API.

    `Llama` loads the model; a second context of our own holds one KV-cache
    stream per sequence (seq_id = row). All B prompts are prefilled in one
    llama_decode, then every step decodes one token of each of the B sequences in
    one llama_decode, greedy (argmax), EOS ignored. Batch 1 takes the same path:
    it measured the same as `Llama.generate` or a little faster (5.9 against 6.1
    ms/step on the 2-core dev machine: argmax in numpy instead of its sampler
    chain), and gives the same tokens; `Llama.generate` is the tests' reference.
    """

    engine = "llama.cpp"

    def __init__(self, s: BenchSettings, ckpt: Checkpoint):
        require_llama_cpp(ckpt, s.device)
        self.name = "llama.cpp"
        self.dtype = "gguf"
        seq_len = max(s.prompt_lengths) + max(s.new_tokens)
        threads = s.threads or torch.get_num_threads()
        t0 = time.perf_counter()
        # Its own context is not timed; it serves `Llama.generate` as the tests' reference.
        self.llama = load_llama(ckpt, n_ctx=seq_len + 8, n_batch=max(s.prompt_lengths), threads=threads)
        # Larger batches than max_batch_size never reach run(): the runner rejects them.
        n_seq = min(max(s.batch_sizes), s.max_batch_size)
        self.decoder = GreedyBatchDecoder(self.llama, n_seq, seq_len, max(s.prompt_lengths), threads)
        self.load_s = time.perf_counter() - t0
        # llama.cpp computes on the quantized blocks, so a step reads the file's tensor data.
        self.weight_bytes_per_token = os.path.getsize(ckpt.gguf_path)
        self.vocab_size = int(self.llama.n_vocab())
        self.source = str(ckpt.gguf_path)

    def run(self, prompts: list[list[int]], new_tokens: int) -> Timing:
        clock = StepClock(torch.device("cpu"))
        self.decoder.clear()  # the previous run's KV cells, outside the timed part
        clock.begin()
        self.decoder.generate(prompts, new_tokens, on_step=clock.mark)
        return clock.timing(None)

    def close(self) -> None:
        if self.decoder is not None:
            self.decoder.close()  # before the model it was built on goes
        self.decoder = self.llama = None


class GreedyBatchDecoder:
    """A llama.cpp context for up to `n_seq` sequences of `seq_len` tokens, decoded greedily together."""

    def __init__(self, llama: Any, n_seq: int, seq_len: int, prompt_len: int, threads: int):
        import llama_cpp

        self.lib = llama_cpp
        if n_seq > llama_cpp.llama_max_parallel_sequences():
            raise FastDecodeError(f"llama.cpp takes at most {llama_cpp.llama_max_parallel_sequences()} "
                                  f"sequences; asked for {n_seq}")
        self.n_seq, self.seq_len, self.n_vocab = n_seq, seq_len, int(llama.n_vocab())
        self.n_batch = n_seq * prompt_len  # the prefill submits every prompt at once
        self.ctx = llama_cpp.llama_init_from_model(llama.model, self._params(threads))
        if not self.ctx:
            raise FastDecodeError("llama.cpp could not create a context for the batched peer")
        # One seq_id per token is all we need; the batch holds the largest prefill.
        self.batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)

    def _params(self, threads: int):
        p = self.lib.llama_context_default_params()
        # Not unified: each sequence gets its own KV stream of n_ctx / n_seq_max cells
        # and attends over its own cells only. llama.cpp pads a stream to 256 cells;
        # padding here keeps n_ctx divisible (no warning, same size).
        p.n_seq_max = self.n_seq
        p.kv_unified = False
        p.n_ctx = self.n_seq * -(-self.seq_len // 256) * 256
        p.n_batch = self.n_batch
        p.n_ubatch = min(self.n_batch, 512)  # as `Llama` sets it
        p.n_threads = p.n_threads_batch = threads
        # llama.cpp's own default ("auto": flash attention where supported), its fastest
        # setting here (6-10% over `Llama`'s default of off); we measure against its best.
        p.flash_attn_type = self.lib.LLAMA_FLASH_ATTN_TYPE_AUTO
        return p

    def clear(self) -> None:
        """Forget every sequence (metadata only: emptied cells are never read)."""
        self.lib.llama_memory_clear(self.lib.llama_get_memory(self.ctx), False)

    def generate(self, prompts: list[list[int]], new_tokens: int,
                 on_step: Callable[[], None] = lambda: None) -> list[list[int]]:
        """`new_tokens` greedy tokens per prompt; `on_step` runs once each step has
        its B tokens (the first after the prefill). Call `clear()` first."""
        self._check(prompts, new_tokens)
        rows = [(seq, pos, tok, pos == len(p) - 1) for seq, p in enumerate(prompts) for pos, tok in enumerate(p)]
        out = [[t] for t in self._decode(rows)]
        on_step()
        for i in range(1, new_tokens):
            # the token sampled last goes in at the position after the prompt's and earlier ones'
            rows = [(seq, len(p) + i - 1, out[seq][-1], True) for seq, p in enumerate(prompts)]
            for seq, t in enumerate(self._decode(rows)):
                out[seq].append(t)
            on_step()
        return out

    def _check(self, prompts: list[list[int]], new_tokens: int) -> None:
        if not 1 <= len(prompts) <= self.n_seq:
            raise FastDecodeError(f"llama.cpp context holds {self.n_seq} sequences; got {len(prompts)}")
        if sum(map(len, prompts)) > self.n_batch or max(map(len, prompts)) + new_tokens > self.seq_len:
            raise FastDecodeError(f"prompts of {[len(p) for p in prompts]} tokens + {new_tokens} new do not "
                                  f"fit the llama.cpp context ({self.seq_len} tokens per sequence)")

    def _decode(self, rows: list[tuple[int, int, int, bool]]) -> list[int]:
        """One llama_decode of (seq_id, position, token, wants logits) rows; the
        argmax token of each row that wanted logits, in row order."""
        b = self.batch
        for i, (seq, pos, tok, wants) in enumerate(rows):
            b.token[i], b.pos[i], b.n_seq_id[i], b.seq_id[i][0], b.logits[i] = tok, pos, 1, seq, wants
        b.n_tokens = len(rows)
        rc = self.lib.llama_decode(self.ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        return [self._argmax(i) for i, row in enumerate(rows) if row[3]]

    def _argmax(self, i: int) -> int:
        logits = self.lib.llama_get_logits_ith(self.ctx, i)
        if not logits:
            raise RuntimeError(f"llama.cpp has no logits for batch entry {i}")
        return int(np.ctypeslib.as_array(logits, shape=(self.n_vocab,)).argmax())

    def close(self) -> None:
        if self.ctx:
            self.lib.llama_batch_free(self.batch)
            self.lib.llama_free(self.ctx)
            self.ctx = None
