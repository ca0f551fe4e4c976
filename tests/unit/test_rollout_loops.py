"""rlft.rollout.loops: the repeated-line detector on hand-made strings, and the decoders stopping on it."""

from __future__ import annotations

import pytest

from rlft.rollout import HFEngine, SamplingParams
from rlft.rollout.loops import LoopStop, loop_cut, newline_token_ids
from tests.unit.test_rollout_hf import PROMPTS, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")


def test_loop_cut_on_hand_made_strings():
    text = "a\nb\na\nc\na\nd\n"
    assert loop_cut(text, 3) == len("a\nb\na\nc\na\n")
    assert loop_cut(text, 2) == len("a\nb\na\n")
    assert loop_cut(text, 4) is None
    # stripped before comparing; whitespace-only lines never count
    assert loop_cut(" 7+5=12, no. \n\n   \n7+5=12, no.\n\t\n", 2) == len(" 7+5=12, no. \n\n   \n7+5=12, no.\n")
    assert loop_cut("\n\n\n\n  \n", 2) is None
    # only complete lines: the third "x" has no newline yet
    assert loop_cut("x\nx\nx", 3) is None and loop_cut("x\nx\nx\n", 3) == 6
    # lines differing in one character are different lines
    assert loop_cut("65-7=58, no.\n65-7=59, no.\n65-7=58, no.\n", 3) is None
    assert loop_cut("", 2) is None
    with pytest.raises(ValueError, match="repeats"):
        loop_cut("a\na\n", 1)


def test_loop_stop_on_token_ids(smol_tokenizer):
    tok = smol_tokenizer
    stop = LoopStop(tok, 3)
    nl = tok.convert_tokens_to_ids("Ċ")
    assert nl in stop.trigger_ids and tok.convert_tokens_to_ids("x") not in stop.trigger_ids
    assert newline_token_ids(tok) is stop.trigger_ids  # computed once per tokenizer
    ids = tok("12+3=15, no.\n12-3=9, no.\n12+3=15, no.\n12+3=15, no.\n12*3=36\n")["input_ids"]
    cut = stop.cut(ids)
    assert tok.decode(ids[:cut]) == "12+3=15, no.\n12-3=9, no.\n12+3=15, no.\n12+3=15, no.\n"
    assert stop.looped(ids[:cut]) and not stop.looped(ids[: cut - 1])
    assert stop.cut(ids[: cut - 1]) is None
    with pytest.raises(ValueError, match="stop_repeats"):
        LoopStop(tok, 1)
    with pytest.raises(ValueError, match="stop_repeats"):
        SamplingParams(stop_repeats=1).validate()


class Cycle:
    """Hooks that make the model write ``x y <newline>`` for ever: the next token's logit is raised by 1000 according
    to the last input token of each row (x -> y -> newline -> x; anything else -> x)."""

    def __init__(self, model, tokenizer):
        x, y, nl = (tokenizer.convert_tokens_to_ids(t) for t in ("x", "y", "Ċ"))
        self.next = {x: y, y: nl, nl: x}
        self.x = x
        self.last = None
        self.handles = [model.model.embed_tokens.register_forward_hook(self.inputs),
                        model.lm_head.register_forward_hook(self.logits)]

    def inputs(self, module, args, output):
        self.last = args[0][:, -1].tolist()

    def logits(self, module, args, logits):
        logits = logits.clone()
        for r, token in enumerate(self.last):
            logits[r, -1, self.next.get(token, self.x)] += 1000.0
        return logits


@pytest.mark.parametrize("decoder,temperature", [("refill", 1.0), ("drop", 0.0), ("drop", 1.0), ("generate", 0.0),
                                                 ("refill", 0.0)])
def test_decoders_stop_after_the_nth_repeat(smol_tokenizer, decoder, temperature):
    """Every decoder ends a looping row right after the newline of the 3rd identical line: 9 tokens, marked looped,
    finish_reason 'length', with its 9 log-probs; without the stop the rows run to max_new_tokens."""
    tok = smol_tokenizer
    model = tiny_model(tok)
    Cycle(model, tok)
    params = SamplingParams(k=2, temperature=temperature, max_new_tokens=20, seed=0, stop_repeats=3)
    out = HFEngine(model, tok, batch_size=3, decoder=decoder).generate(PROMPTS[:3], params)
    for s in (s for row in out for s in row):
        assert s.text == "xy\nxy\nxy\n" and len(s.completion_ids) == 9
        assert s.looped and s.finish_reason == "length"
        assert s.logprobs is None if decoder == "generate" else len(s.logprobs) == 9
    free = HFEngine(model, tok, batch_size=3, decoder=decoder).generate(PROMPTS[:3], SamplingParams(
        k=1, temperature=temperature, max_new_tokens=20, seed=0))
    assert all(len(s.completion_ids) == 20 and not s.looped for row in free for s in row)
