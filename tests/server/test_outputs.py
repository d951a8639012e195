"""Token strings of logprobs (outputs.py): they join to the choice's text, which the engine
decodes with the request's skip_special_tokens."""

from fastdecode.engine import RequestOutput
from fastdecode.engine.request import TokenLogprob
from fastdecode.server.outputs import (ChoiceState, chat_logprobs, completion_logprobs, prompt_pieces,
                                       vllm_prompt_logprobs)
from fastdecode.text.tokenizer import ByteTokenizer


class SpecialText(ByteTokenizer):
    """The byte tokenizer with text for its special tokens, as real vocabularies have."""

    NAMES = {ByteTokenizer.BOS: "<bos>", ByteTokenizer.EOS: "<eos>", ByteTokenizer.PAD: "<pad>"}

    def decode(self, ids, *, skip_special_tokens=True):
        if skip_special_tokens:
            return super().decode(ids)
        out, run = "", []
        for i in ids:
            if i in self.NAMES:
                out, run = out + super().decode(run) + self.NAMES[i], []
            else:
                run.append(i)
        return out + super().decode(run)


def test_token_strings_keep_special_tokens_when_the_text_does():
    tok = SpecialText()
    for skip in (True, False):
        ids = [ord("a"), tok.PAD, ord("b")]
        text = tok.decode(ids, skip_special_tokens=skip)  # what the engine hands out
        state = ChoiceState(tok, logprobs=True, skip_special_tokens=skip)
        _, tokens = state.add(RequestOutput("r", text, ids, [TokenLogprob(i, -1.0, []) for i in ids], finished=True))
        assert [s for s, _ in tokens] == (["a", "", "b"] if skip else ["a", "<pad>", "b"])
        pieces = prompt_pieces(tok, [tok.BOS, *ids], skip)  # echo's prompt text
        assert "".join(pieces) == ("ab" if skip else "<bos>a<pad>b")


def test_top_logprobs_keys_are_the_token_strings():
    tok = SpecialText()
    for skip in (True, False):
        lp = TokenLogprob(tok.PAD, -0.5, [(tok.PAD, -0.5), (ord("a"), -1.0)])
        name = "" if skip else "<pad>"
        out = completion_logprobs(tok, [(name, lp)], 0, chosen=True, skip_special_tokens=skip)
        assert out.top_logprobs == [{name: -0.5, "a": -1.0}]
        chat = chat_logprobs(tok, [(name, lp)], skip)
        assert [t.token for t in chat.content[0].top_logprobs] == [name, "a"]


def test_vllm_prompt_logprobs_decode_tokens_as_the_text():
    tok = SpecialText()
    for skip in (True, False):
        lp = TokenLogprob(tok.PAD, -0.5, [(ord("a"), -0.2), (tok.PAD, -0.5)], rank=2)
        (entry,) = vllm_prompt_logprobs(tok, [lp], 2, skip)
        name = "" if skip else "<pad>"
        assert {k: v.decoded_token for k, v in entry.items()} == {str(tok.PAD): name, str(ord("a")): "a"}
