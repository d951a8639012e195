from fastdecode.engine.stopping import StopText
from fastdecode.text.tokenizer import ByteTokenizer


def feed(text, stop):
    st = StopText(ByteTokenizer(), stop)
    out = ""
    for b in text.encode("utf-8"):
        out += st.push(b)
        if st.hit_stop:
            break
    return out + st.finish(), st


def test_stop_string_split_across_tokens_cuts_before_it():
    out, st = feed("hello wor" + "ld and more", ("world",))
    assert out == "hello " and st.hit_stop


def test_partial_stop_is_held_back_then_released():
    st = StopText(ByteTokenizer(), ("STOP",))
    pieces = [st.push(b) for b in b"aST"]
    assert "".join(pieces) == "a"  # "ST" could begin the stop string
    assert st.push(ord("x")) == "STx"  # it did not


def test_the_earliest_of_several_stop_strings_wins_and_multibyte_text_survives():
    out, _ = feed("héllo wörld 🎉 end", ("end", "🎉"))
    assert out == "héllo wörld "
    out, st = feed("no stop here at all", ("zzz",))
    assert out == "no stop here at all" and not st.hit_stop


def test_stop_of_the_wrong_type_is_a_one_line_error():
    import pytest

    from fastdecode.engine.request import GenerationConfig
    from fastdecode.errors import FastDecodeError

    for bad, match in ((5, "stop must be a string or a list of strings, got 5"), ([""], "non-empty strings"),
                       (["a", 3], "non-empty strings")):
        with pytest.raises(FastDecodeError, match=match):
            GenerationConfig(stop=bad)
    assert GenerationConfig(stop="x").stop == ("x",) and GenerationConfig(stop=None).stop == ()
