"""How a byte-level GGUF vocabulary splits text before its merges run, by `tokenizer.ggml.pre`.

Each name maps to the regexes its original tokenizer applies, in order: each one cuts the pieces
the one before left (the matches and the text between them become pieces), so a vocabulary
whose merges were learned on digits alone or on words split at a case change gets the same ids
as llama.cpp and the model's own tokenizer. A name not listed here (GPT-2's, or one we do not
know) splits as GPT-2 does.
"""

from __future__ import annotations

from typing import Optional

_CONTRACTIONS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Llama 3's, with runs of spaces taken in powers of two (Jais 2).
_JAIS2 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    + "".join(rf"|\s{{{n}}}(?!\S)" for n in (512, 256, 128, 64, 32, 16, 8, 4)) + r"|\s{1,2}(?!\S)|\s{1}"
)
_QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN35 = (  # Qwen 2's, with combining marks kept on their letters
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Mistral's tekken (Mistral NeMo, Ministral, Mistral Small 3): words split at a lower-to-upper
# case change, every digit alone.
_UPPER, _LOWER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]", r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_TEKKEN = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# o200k (GPT-4o's) vocabularies: tekken's case split with contractions kept on the word, digits
# in threes.
_GPT4O = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTIONS}?"
    rf"|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_CONTRACTIONS}?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
_DEEPSEEK3 = (
    r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"""
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_NORDIC = " ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+"  # Poro, Viking, BLOOM

_SPLITS: dict[tuple[str, ...], tuple[str, ...]] = {
    ("llama3", "llama-v3", "llama-bpe", "smaug-bpe", "dbrx", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
     "jina-v5-nano", "chatglm-bpe", "glm4", "glm5"): (_LLAMA3,),
    ("jais-2",): (_JAIS2,),
    ("qwen2", "deepseek-r1-qwen", "megrez", "kormo", "f2llmv2", "stablelm2", "hunyuan", "solar-open",
     "grok-2"): (_QWEN2,),
    ("qwen35",): (_QWEN35,),
    ("ufakzeka",): (r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",),
    ("seed-coder",): (
        _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+",),
    ("tekken",): (_TEKKEN,),
    ("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"): (_GPT4O,),
    # GPT-2's split after every digit is cut off alone (StarCoder's vocabulary and its heirs).
    ("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b", "mellum2"): (r"\p{N}", _GPT2),
    ("falcon",): (r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, "[0-9][0-9][0-9]"),
    ("deepseek-coder",): ("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}"),
    ("deepseek-v3", "hunyuan-dense", "joyai-llm", "hy_v4"): (
        r"\p{N}{1,3}", "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+", _DEEPSEEK3),
    ("poro-chat", "bloom", "gpt3-finnish"): (_NORDIC,),
    ("viking",): (_NORDIC, r"\p{N}"),
    # What llama.cpp applies to a file that names "default".
    ("default",): (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]"),
}
PRE_SPLITS: dict[str, tuple[str, ...]] = {name: regexes for names, regexes in _SPLITS.items() for name in names}

# Vocabularies whose tokenizers take a piece that is itself a token whole, before any merge
# (tokenizer.json's ignore_merges: Llama 3's, tekken's, GLM 4's).
IGNORE_MERGES = frozenset(("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
                           "jina-v5-nano", "tekken", "glm4", "glm5"))


def splits(pre: Optional[str]) -> Optional[tuple[str, ...]]:
    """The regexes, in order, that split text for vocabulary `pre`; None: GPT-2's split."""
    return PRE_SPLITS.get(pre or "")
