"""``rlft dpo``'s options: :class:`DPOConfig` (its own module, so :mod:`rlft.recipes.dpo_data` and
:mod:`rlft.recipes.dpo` both read it without importing each other)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rlft.lora import LoRAOptions
from rlft.options import DistributedOptions, MemoryOptions, OptimizerOptions, PackingOptions, RunOptions, SpeedOptions
from rlft.validation import require, validate_options


@dataclass(frozen=True)
class DPOConfig(RunOptions, OptimizerOptions, LoRAOptions, MemoryOptions, PackingOptions, SpeedOptions,
                DistributedOptions):
    """Preference optimisation (DPO / IPO / RPO) of a model, usually an SFT model, on chosen/rejected pairs."""

    model: str = "runs/sft/model"
    """Policy to train (usually the SFT model folder): built-in name, local HF folder, or Hub id."""
    ref_model: str | None = None
    """Reference model of the implicit reward; None: the initial --model. Must share its tokenizer."""
    data: str = "runs/pairs/countdown.jsonl"
    """Preference pairs: a .jsonl/.json/.parquet file or Hub dataset id: prompt/chosen/rejected text
    (e.g. written by `rlft pairs countdown`), or chat pairs (H4 UltraFeedback, flattened UF, HH-RLHF)."""
    data_split: str = "train"
    """Split to read when --data is a Hub dataset id (e.g. train_prefs for HuggingFaceH4/ultrafeedback_binarized)."""
    data_format: Literal["auto", "text", "chat"] = "auto"
    """'text': prompts already rendered (Countdown pairs), trained as prompt + response + EOS; 'chat':
    conversations rendered with the chat template, loss on the final reply + end-of-turn. auto: rows with
    nums/target, custom --*-field names, or a prompt containing '<|im_start|>' or 'Assistant:' (not an HH
    'Human:' transcript) -> text; else chat."""
    chat_template: str | None = None
    """Chat template for chat data (and the saved model): a name (chatml, llama3) or a path to a .jinja
    file; None: the tokenizer's own (an error for chat data when it has none)."""
    prompt_field: str = "prompt"
    """Column holding the prompt text (text format)."""
    chosen_field: str = "chosen"
    """Column holding the preferred response text (text format)."""
    rejected_field: str = "rejected"
    """Column holding the dispreferred response text (text format)."""
    skip_invalid: bool = False
    """Skip malformed rows (counted and reported) instead of stopping with an error."""
    drop_ties: bool = True
    """Chat format: drop pairs whose score_chosen equals score_rejected (counted): a tie states no preference.
    (Text pairs from `rlft pairs countdown` have their ties dropped already.)"""
    limit: int | None = None
    """Use at most this many pairs (after reading)."""
    loss_type: Literal["dpo", "ipo", "rpo"] = "dpo"
    """'dpo' (summed log-probs), 'ipo' (per-token-mean log-probs) or 'rpo' (DPO + NLL on chosen)."""
    beta: float = 0.1
    """Inverse temperature of the implicit reward beta*(log pi - log ref); larger keeps closer to the reference."""
    label_smoothing: float = 0.0
    """Conservative DPO: assumed probability in [0, 0.5] that a preference label is flipped (dpo, rpo)."""
    rpo_alpha: float = 1.0
    """Weight of the chosen-response NLL term (loss_type rpo)."""
    output_dir: str = "runs/dpo"
    """Run directory: checkpoints/, model/, metrics.jsonl, config.yaml, ref_logps.pt."""
    max_length: int = 512
    """Longest prompt + response in tokens; longer responses are cut at the end (counted), pairs that
    cannot fit are dropped (counted)."""
    max_prompt_length: int | None = None
    """Chat format: cut longer prompts to this many tokens, keeping their end (counted); None: keep whole
    prompts. Must be < --max-length."""
    batch_size: int = 16
    """Pairs per optimizer step."""
    micro_batch_size: int = 4
    """Pairs per forward/backward pass (2x as many sequences: chosen and rejected go through together);
    replaced by --max-tokens-per-micro-batch when that is set."""
    epochs: float = 1.0
    """Passes over the pairs (fractions allowed); ignored when --max-steps is set."""
    max_steps: int | None = None
    """Total optimizer steps (overrides --epochs)."""
    lr: float = 1e-6
    """Peak learning rate. DPO wants small rates: 5e-7 to 1e-6 is typical for a 0.5B model;
    small CPU demo models tolerate more (e.g. 1e-5)."""
    warmup_ratio: float = 0.1
    """Fraction of optimizer steps spent warming the learning rate up linearly from 0."""
    seed: int = 0
    """Seed for data order."""
    def __post_init__(self) -> None:
        validate_options(self)
        self._check_lora()
        self._check_distributed()
        require(self.beta > 0, f"--beta must be > 0 (the inverse temperature of the implicit reward), got {self.beta}")
        self._check_micro_batches()
        require(self.max_prompt_length is None or self.max_prompt_length < self.max_length,
                f"--max-prompt-length must be < --max-length ({self.max_length}), got {self.max_prompt_length}")
