"""Native CPU kernels, compiled on first use and loaded from a cache after that.

One shared library holds them all: the fp32 GEMV, the matmuls on
block-quantized weights, a fused RMSNorm and attention over the KV cache,
registered as `torch.ops.fastdecode.*`. Why on first use rather than at
install: building against torch inside pip's isolated build environment makes
pip resolve torch again (on most indexes a multi-GB CUDA wheel).

Why not torch.utils.cpp_extension.load: it runs whichever `ninja` is first on
PATH, and the venv's and the system's each took the other's build for stale,
so switching between them rebuilt the kernels every time. Here each
translation unit is one compiler process (as many at once as there are CPUs),
and a library once built is loaded directly, without running any tool. It
lives in `<cache>/kernels/torch-<version>-<hash>/`, the hash covering the
sources, the compiler and its flags; it is built in a temporary directory
beside that one and renamed into place, so a build that is interrupted never
leaves a half-built library under the real name, and of two processes
building at once the second to finish uses the first one's.

The math is in plain C++ translation units without torch headers (math.cpp,
attention.cpp and quant_kernel.h compiled once per instruction set by quant_avx2.cpp and
quant_vnni.cpp); ops.cpp, the one that includes torch, checks arguments,
allocates, splits rows across threads and registers the ops. Parsing torch's
headers once instead of in every file is most of what keeps a cold build short.

Without a C++ compiler, on a CPU without AVX2/FMA, with an unwritable cache,
after a failed build, or with FASTDECODE_NO_KERNELS=1, `load_kernels()`
returns False, with one warning saying why, and callers use the pure-PyTorch
reference paths. FASTDECODE_ISA=avx2|avx512-vnni forces the quantized
kernels' instruction set (as `set_isa` does), e.g. to test the AVX2 path on an
AVX-512 machine.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

import torch

from ..errors import FastDecodeError
from ..paths import remove_stale_tmp

log = logging.getLogger(__name__)

_HERE = Path(__file__).parent
# The quant units first, so that on two cores they start together and the rest fill in. Alone
# on a Zen 3: quant_vnni 22-25 s, quant_avx2 18-19 s, attention 14-19 s, ops 15-16 s, math 1-2 s;
# the build 33 s on both cores (the longest first, vnni, avx2, attention, ops: also 33 s).
_SOURCES = ("quant_avx2.cpp", "quant_vnni.cpp", "ops.cpp", "attention.cpp", "math.cpp")
_HEADERS = ("kernels.h", "quant_kernel.h", "quant_panel.h", "quant_dispatch.h", "simd.h")
_CFLAGS = ("-fPIC", "-std=c++20", "-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-ffp-contract=off")
_LDFLAGS = ("-shared", "-fopenmp")
_LIBS = ("-lc10", "-ltorch_cpu", "-ltorch")
_NAME = "fastdecode_kernels"
_LIBRARY = f"{_NAME}.so"
_MANIFEST = "build.json"  # written last: the library's size, so a truncated copy is never loaded
_loaded: Optional[bool] = None
_lib: Optional[ctypes.CDLL] = None
_prebuilding: Optional[threading.Thread] = None
# Why the kernels are unavailable, for stats and messages; None when they load.
unavailable_reason: Optional[str] = None

ISAS = {"avx2": 1, "avx512-vnni": 2}
_default_isa = 0  # set_isa(None)'s choice: FASTDECODE_ISA's code, or 0 to detect


class BuildError(Exception):
    """The kernels could not be built or loaded; the message is one line saying why."""


def _compiler() -> list[str]:
    return shlex.split(os.environ.get("CXX") or "c++")


def _defines() -> list[str]:
    return ["-DTORCH_API_INCLUDE_EXTENSION_H", f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"]


def build_dir() -> Path:
    """Where the library for these sources, this compiler and this torch lives."""
    from ..paths import cache_root

    h = hashlib.sha256()
    for name in _SOURCES + _HEADERS:
        h.update(name.encode() + b"\0" + (_HERE / name).read_bytes() + b"\0")
    h.update(json.dumps([_compiler(), _defines(), _CFLAGS, _LDFLAGS, _LIBS, torch.__version__]).encode())
    tag = torch.__version__.replace("+", "_")
    return cache_root() / "kernels" / f"torch-{tag}-{h.hexdigest()[:12]}"


def _unavailable(reason: str) -> bool:
    global unavailable_reason
    unavailable_reason = reason
    log.warning("native kernels unavailable, using the PyTorch reference path: %s", reason)
    return False


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes")


def _can_build() -> Optional[str]:
    """Why this process cannot use the kernels, or None."""
    if _env_flag("FASTDECODE_NO_KERNELS"):
        return "FASTDECODE_NO_KERNELS is set"
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        return "this CPU lacks AVX2/FMA"
    cxx = _compiler()
    if not cxx or shutil.which(cxx[0]) is None:
        return "no C++ compiler found; install one (apt-get install g++)"
    return None


def prebuild() -> None:
    """Start building the library in a thread, if it is not built yet, so that the build
    overlaps the checkpoint's reading and conversion; `load_kernels` waits for it. A
    failure here is ignored: load_kernels builds again and reports it."""
    global _prebuilding
    if _lib is not None or _loaded is not None or _prebuilding is not None or _can_build() is not None:
        return
    d = build_dir()
    if _complete(d):
        return
    # The build's one import, made here and not on the thread: while the thread imported it,
    # the main thread's imports (tokenizers, safetensors, even our own modules) could fail with
    # ModuleNotFoundError, about 1 run in 40 of the two imports on two threads.
    import torch.utils.cpp_extension  # noqa: F401

    def build() -> None:
        try:
            _build(d)
        except BuildError:
            pass

    _prebuilding = threading.Thread(target=build, name="fastdecode-kernel-build", daemon=True)
    _prebuilding.start()


def load_kernels() -> bool:
    """Build (once per machine) and register the `torch.ops.fastdecode` kernels; True when usable."""
    global _loaded, _lib, _default_isa
    if _loaded is not None:
        return _loaded
    _loaded = False
    reason = _can_build()
    if reason is not None:
        return _unavailable(reason)
    if _lib is None:  # else built and registered earlier in this process
        try:
            if _prebuilding is not None:
                _prebuilding.join()
            _lib = _open(build_dir())
        except BuildError as e:
            return _unavailable(str(e))
        except BaseException:  # interrupted: undecided, so that a later call tries again
            _loaded = None
            raise
        _register_fakes()
    _default_isa = _isa_from_env()
    _loaded = True
    return True


def kernels_loaded() -> bool:
    """Whether this process has registered the kernels already (never builds them)."""
    return _loaded is True


def _open(d: Path, retry: bool = True) -> ctypes.CDLL:
    """Load the library in `d`, building it first if it is not there (or not whole)."""
    built = False
    if not _complete(d):
        _build(d)
        built = True
    so = d / _LIBRARY
    try:
        # Global symbols, so an AOTInductor package can call the kernels' C
        # entry points (aoti_torch_cpu_*) when it is loaded.
        lib = ctypes.CDLL(str(so), mode=ctypes.RTLD_GLOBAL)
    except OSError as e:
        if built or not retry:
            raise BuildError(f"cannot load {so}: {_first_line(str(e))}") from None
        log.warning("the cached kernels in %s do not load (%s); rebuilding them", d, _first_line(str(e)))
        shutil.rmtree(d, ignore_errors=True)
        return _open(d, retry=False)
    torch.ops.load_library(str(so))  # the same handle; torch records it as loaded
    return lib


def _complete(d: Path) -> bool:
    try:
        size = json.loads((d / _MANIFEST).read_text(encoding="utf-8"))["size"]
        return (d / _LIBRARY).stat().st_size == size
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _build(d: Path) -> None:
    root = d.parent
    try:
        root.mkdir(parents=True, exist_ok=True)
        remove_stale_tmp(root)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{d.name}-", dir=root))
    except OSError as e:
        raise BuildError(f"cannot write the kernel cache {root} ({e.strerror or e}); "
                         "set FASTDECODE_CACHE to a writable directory") from None
    try:
        print(f"fastdecode: building native kernels for this CPU ({_cpu_label()}), once, into {d} ...",
              file=sys.stderr, flush=True)
        t0 = time.monotonic()
        _compile(tmp)
        for p in tmp.iterdir():  # keep the library only
            if p.name != _LIBRARY:
                p.unlink()
        os.chmod(tmp, 0o755)  # mkdtemp's 0700 would hide the cache from other users
        size = (tmp / _LIBRARY).stat().st_size
        (tmp / _MANIFEST).write_text(json.dumps({"size": size, "torch": torch.__version__,
                                                 "compiler": _compiler(), "created": time.time()}),
                                     encoding="utf-8")
        try:
            os.rename(tmp, d)
        except OSError:
            if not _complete(d):  # not another process's finished build: a broken one, replace it
                shutil.rmtree(d, ignore_errors=True)
                os.rename(tmp, d)
        print(f"fastdecode: native kernels built in {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    except OSError as e:
        raise BuildError(f"cannot write the kernel cache {root} ({e.strerror or e}); "
                         "set FASTDECODE_CACHE to a writable directory") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # a no-op once renamed


def _compile(out: Path) -> None:
    """Compile each source into `out` (one process per CPU at a time), then link the library."""
    from torch.utils.cpp_extension import include_paths, library_paths

    cxx = _compiler()
    inc = [a for p in include_paths() for a in ("-isystem", p)]
    steps = [(name, [*cxx, *_defines(), *inc, *_CFLAGS, "-c", str(_HERE / name), "-o", str(out / f"{name}.o")])
             for name in _SOURCES]
    try:
        jobs = len(os.sched_getaffinity(0))
    except AttributeError:
        jobs = os.cpu_count() or 1
    _run_all(steps, max(1, jobs), out)
    link = [*cxx, *[str(out / f"{name}.o") for name in _SOURCES], *_LDFLAGS,
            *[f"-L{p}" for p in library_paths()], *_LIBS, "-o", str(out / _LIBRARY)]
    _run_all([("link", link)], 1, out)


def _run_all(steps: list[tuple[str, list[str]]], jobs: int, out: Path) -> None:
    """Run the commands, `jobs` at a time; BuildError with the first error line if one fails."""
    pending = list(steps)
    running: list[tuple[str, subprocess.Popen, Path]] = []
    try:
        while pending or running:
            while pending and len(running) < jobs:
                name, cmd = pending.pop(0)
                err = out / f"{name}.log"
                with open(err, "wb") as f:
                    try:
                        p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
                                             env={**os.environ, "LC_ALL": "C"})  # plain ASCII messages
                    except OSError as e:
                        raise BuildError(f"cannot run the C++ compiler {cmd[0]} ({e.strerror or e}); "
                                         "install one (apt-get install g++)") from None
                running.append((name, p, err))
            time.sleep(0.02)
            for job in list(running):
                name, p, err = job
                if p.poll() is None:
                    continue
                running.remove(job)
                if p.returncode != 0:
                    raise BuildError(_failure(name, p.returncode, err.read_text(encoding="utf-8", errors="replace")))
    finally:
        for _, p, _ in running:  # after a failure or an interrupt, the other compilers stop too
            p.kill()
            p.wait()


def _failure(name: str, rc: int, output: str) -> str:
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    first = next((ln for ln in lines if re.search(r"error:|cannot find|undefined reference", ln)),
                 next((ln for ln in lines if "error" in ln), None))
    if first is None:
        how = f"was killed by signal {-rc}" if rc < 0 else f"exited with status {rc}"
        first = f"the compiler {how} on {name}" + (f": {lines[-1]}" if lines else "")
    return f"build failed: {first}"


def _first_line(s: str) -> str:
    s = s.strip()
    return s.splitlines()[0] if s else "no message"


def _cpu_label() -> str:
    try:
        flags = set(re.search(r"^flags\s*:(.*)$", Path("/proc/cpuinfo").read_text(), re.M).group(1).split())
    except (OSError, AttributeError):
        flags = set()
    return "avx512-vnni" if {"avx512_vnni", "avx512bw", "avx512vl"} <= flags else "avx2"


def _isa_from_env() -> int:
    """Apply FASTDECODE_ISA (one warning if it is unknown or this CPU lacks it); its code, 0 when unset."""
    raw = os.environ.get("FASTDECODE_ISA", "")
    name = raw.strip().lower()
    if not name:
        return 0
    if name not in ISAS:
        log.warning("FASTDECODE_ISA=%r is not one of %s; detecting the instruction set instead", raw, ", ".join(ISAS))
    elif _lib.fastdecode_set_isa(ISAS[name]) > 0:
        return ISAS[name]
    else:
        log.warning("FASTDECODE_ISA=%s: this CPU does not support it; detecting the instruction set instead", name)
    _lib.fastdecode_set_isa(0)
    return 0


def _register_fakes() -> None:
    """Shapes only, for tracing by torch.compile and torch.export."""

    @torch.library.register_fake("fastdecode::gemv")
    def _(x, w):
        return x.new_empty(x.shape[0], w.shape[0])

    @torch.library.register_fake("fastdecode::q4_linear")
    def _(x, qweight, scales, mins):
        return x.new_empty(x.shape[0], qweight.shape[0])

    @torch.library.register_fake("fastdecode::q8_linear")
    def _(x, qweight, scales):
        return x.new_empty(x.shape[0], qweight.shape[0])

    @torch.library.register_fake("fastdecode::q4k_linear")
    def _(x, qweight, sc, mn, d, dmin):
        return x.new_empty(x.shape[0], qweight.shape[0])

    @torch.library.register_fake("fastdecode::q5k_linear")
    def _(x, qweight, sc, mn, d, dmin):
        return x.new_empty(x.shape[0], qweight.shape[0])

    @torch.library.register_fake("fastdecode::q6k_linear")
    def _(x, qweight, qhigh, sc, d):
        return x.new_empty(x.shape[0], qweight.shape[0])

    @torch.library.register_fake("fastdecode::q5_linear")
    def _(x, qweight, qhigh, scales, mins):
        return x.new_empty(x.shape[0], qweight.shape[0])

    @torch.library.register_fake("fastdecode::q5s_linear")
    def _(x, qweight, qhigh, scales):
        return x.new_empty(x.shape[0], qweight.shape[0])

    @torch.library.register_fake("fastdecode::q4s_linear")
    def _(x, qweight, scales):
        return x.new_empty(x.shape[0], qweight.shape[0])

    @torch.library.register_fake("fastdecode::q4nl_linear")
    def _(x, qweight, d):
        return x.new_empty(x.shape[0], qweight.shape[0])

    @torch.library.register_fake("fastdecode::q4xs_linear")
    def _(x, qweight, sc, d):
        return x.new_empty(x.shape[0], qweight.shape[0])

    @torch.library.register_fake("fastdecode::q4mx_linear")
    def _(x, qweight, e):
        return x.new_empty(x.shape[0], qweight.shape[0])

    @torch.library.register_fake("fastdecode::attention")
    def _(q, k, v, input_pos, rows, window, scale, softcap=0.0):
        return q.new_empty(q.shape)

    @torch.library.register_fake("fastdecode::attention_sinks")
    def _(q, k, v, input_pos, rows, window, scale, softcap, sinks):
        return q.new_empty(q.shape)

    @torch.library.register_fake("fastdecode::rms_norm")
    def _(x, weight, eps):
        return torch.empty_like(x, memory_format=torch.contiguous_format)

    @torch.library.register_fake("fastdecode::rope")
    def _(pos, inv_freq):
        return inv_freq.new_empty(*pos.shape, inv_freq.shape[0]), inv_freq.new_empty(*pos.shape, inv_freq.shape[0])

    @torch.library.register_fake("fastdecode::silu_mul")
    def _(h):
        return h.new_empty(*h.shape[:-1], h.shape[-1] // 2)

    @torch.library.register_fake("fastdecode::gelu_tanh_mul")
    def _(h):
        return h.new_empty(*h.shape[:-1], h.shape[-1] // 2)

    @torch.library.register_fake("fastdecode::first_max")
    def _(x):
        return x.new_empty(x.shape[0], dtype=torch.long)


def set_isa(name: Optional[str]) -> str:
    """Force the quantized kernels' instruction set ("avx2", "avx512-vnni"), which the attention's
    wide paths (`set_wide`) follow too; returns the active one.

    None restores the default: FASTDECODE_ISA's choice if it is set (and valid
    here), else the best this CPU has. Raises RuntimeError if the native
    kernels are unavailable, and FastDecodeError (a ValueError) for an unknown
    name or one this CPU does not support.
    """
    if not load_kernels():
        raise RuntimeError(f"native kernels unavailable: {unavailable_reason}")
    if name is not None and name not in ISAS:
        raise FastDecodeError(f"unknown instruction set {name!r}; accepted: {', '.join(ISAS)} or None")
    code = _default_isa if name is None else ISAS[name]
    got = _lib.fastdecode_set_isa(code)
    if got < 0:
        raise FastDecodeError(f"this CPU does not support {name}")
    return active_isa()


def set_wide(on: Optional[bool]) -> bool:
    """Force the kernels' 512-bit paths (the attention's, and the quantized matmuls' 4-row tiles
    taking two groups a register) on (True) or off (False), or leave them to the CPU (None: on
    where 512-bit operations run at full width, AMD Zen 5 and later). They give the same bits as
    the 256-bit paths, so this only moves speed; they need the "avx512-vnni" instruction set
    active. Returns whether they are in use (for tests and benchmarks)."""
    if not load_kernels():
        raise RuntimeError(f"native kernels unavailable: {unavailable_reason}")
    return bool(_lib.fastdecode_set_wide(0 if on is None else 1 if on else -1))


def active_isa() -> str:
    if not load_kernels():
        return "reference"
    code = _lib.fastdecode_get_isa()
    return next(k for k, v in ISAS.items() if v == code)


def available_isas() -> list[str]:
    """The instruction sets the quantized kernels can run here (for tests)."""
    if not load_kernels():
        return []
    before = active_isa()
    out = [n for n, c in ISAS.items() if _lib.fastdecode_set_isa(c) > 0]
    set_isa(before)
    return out
