"""The UltraFeedback demo's data: the preference split every stage reads, the SFT data choice, and the saved
responses the win-rates judge (:mod:`rlft.lab.demo_ultrafeedback` runs the stages)."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

from rlft.data.files import write_jsonl
from rlft.eval.winrate import prompt_key
from rlft.lab.demo_config import DemoConfig

log = logging.getLogger("rlft")

UF_CANDIDATES = ("../shared/data/ultrafeedback/train_clean.jsonl", "shared/data/ultrafeedback/train_clean.jsonl")
"""Local copies of the flattened UltraFeedback sample looked for when --data is None."""
UF_HUB = "HuggingFaceH4/ultrafeedback_binarized"
"""The Hub dataset read when --data is None and no local copy exists (split --uf-data-split)."""
READ_LIMIT = 2000
"""Rows read from --data: the demo samples its pairs from these."""


def resolve_data(cfg: DemoConfig) -> tuple[str, str]:
    """``(source, split)`` of the preference pairs: --data, else a local copy, else the H4 Hub dataset."""
    if cfg.data is not None:
        return cfg.data, cfg.uf_data_split
    local = next((p for p in UF_CANDIDATES if Path(p).is_file()), None)
    if local is None:
        log.info("no local UltraFeedback copy (%s): reading %s from the Hub", ", ".join(UF_CANDIDATES), UF_HUB)
        return UF_HUB, cfg.uf_data_split
    return local, cfg.uf_data_split


def _h4_row(pair) -> dict:
    """A pair in the H4 layout (chosen/rejected conversations), which every loader of the library reads."""
    return {
        "prompt": pair.prompt[-1]["content"],
        "chosen": [*pair.prompt, {"role": "assistant", "content": pair.chosen}],
        "rejected": [*pair.prompt, {"role": "assistant", "content": pair.rejected}],
        "score_chosen": pair.score_chosen,
        "score_rejected": pair.score_rejected,
    }


def _is_tie(pair) -> bool:
    return pair.score_chosen is not None and pair.score_chosen == pair.score_rejected


def split_preferences(source: str, split: str, tokenizer, out_dir: Path, *, train_pairs: int, eval_prompts: int,
                      max_prompt_tokens: int, seed: int, read_limit: int = READ_LIMIT) -> dict:
    """Write ``out_dir/train.jsonl`` and ``out_dir/eval.jsonl`` (H4 layout) and ``out_dir/split.json``.

    Reads the first ``read_limit`` rows of ``source`` (invalid rows skipped and counted, ties kept),
    sets aside pairs whose prompt, rendered with ``tokenizer``'s chat template and the generation
    prompt, is longer than ``max_prompt_tokens``, then shuffles the distinct prompts with ``seed``: the
    first ``eval_prompts`` are held out (all their pairs go to eval.jsonl), and ``train_pairs`` pairs of
    the other prompts, in a seeded order, go to train.jsonl. Returns the counts written to split.json.

    Raises:
        ValueError: too few usable prompts to hold ``eval_prompts`` out and train on the rest.
    """
    from rlft.data.chat import render_generation_prompt
    from rlft.data.preferences import load_preference_pairs

    pairs, counts = load_preference_pairs(source, split=split, limit=read_limit, skip_invalid=True, drop_ties=False)
    texts = [render_generation_prompt(tokenizer, p.prompt) for p in pairs]
    lengths = [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]] if texts else []
    usable = [p for p, n in zip(pairs, lengths) if n <= max_prompt_tokens]
    keys = list(dict.fromkeys(prompt_key(p.prompt) for p in usable))
    if len(keys) <= eval_prompts:
        raise ValueError(
            f"{source}: {len(keys)} distinct prompts of at most {max_prompt_tokens} tokens among {len(pairs)} "
            f"valid pairs: too few to hold out {eval_prompts} and train on the rest "
            "(lower --uf-eval-prompts or raise --uf-max-length)"
        )
    rng = random.Random(seed)
    rng.shuffle(keys)
    held = set(keys[:eval_prompts])
    eval_set = [p for p in usable if prompt_key(p.prompt) in held]
    pool = [p for p in usable if prompt_key(p.prompt) not in held]
    rng.shuffle(pool)
    train = pool[:train_pairs]
    write_jsonl(out_dir / "train.jsonl", (_h4_row(p) for p in train))
    write_jsonl(out_dir / "eval.jsonl", (_h4_row(p) for p in eval_set))
    stats = {
        "source": str(source),
        "split": split,
        "rows_read": counts["rows"],
        "skipped_invalid": counts["skipped_invalid"],
        "valid": len(pairs),
        "ties": counts["ties"],
        "max_prompt_tokens": max_prompt_tokens,
        "long_prompts_set_aside": len(pairs) - len(usable),
        "usable": len(usable),
        "eval_prompts": len(held),
        "eval_pairs": len(eval_set),
        "eval_ties": sum(map(_is_tie, eval_set)),
        "train_pairs": len(train),
        "train_ties": sum(map(_is_tie, train)),
        "unused": len(pool) - len(train),
        "seed": seed,
    }
    (out_dir / "split.json").write_text(json.dumps(stats, indent=2) + "\n")
    log.info("split of %s: %s", source, stats)
    return stats


def sft_data(cfg: DemoConfig, data_dir: Path, train_path: Path, limit: int) -> dict:
    """The SFT data: the first ``limit`` SmolTalk rows of --uf-sft-data when it can be read, else Pref-FT on
    train.jsonl. The decision is saved in ``data_dir/sft_source.json`` (the report reads it on resumed runs)."""
    from rlft.data.files import HubUnavailableError
    from rlft.data.preferences import load_chat_examples

    choice = {"kind": "pref-ft", "data": str(train_path), "note": None}
    if cfg.uf_sft_data is not None:
        wanted = limit
        try:
            examples, counts = load_chat_examples(cfg.uf_sft_data, split="train", limit=wanted, skip_invalid=True,
                                                  layout="chat")
            if not examples:
                raise ValueError(f"no conversations in the first {wanted} rows")
        except (HubUnavailableError, OSError, ValueError) as e:
            choice["note"] = (f"SmolTalk source {cfg.uf_sft_data} could not be read "
                              f"({type(e).__name__}: {str(e)[:200]}): Pref-FT instead")
            log.warning("%s", choice["note"])
        else:
            path = data_dir / "sft_smoltalk.jsonl"
            write_jsonl(path, ({"messages": ex.messages} for ex in examples))
            choice = {
                "kind": "smoltalk", "data": str(path),
                "note": f"SFT on the first {len(examples)} conversations of {cfg.uf_sft_data} "
                f"({counts['skipped_invalid']} invalid rows skipped)"
            }
    (data_dir / "sft_source.json").write_text(json.dumps(choice, indent=2) + "\n")
    return choice


def generate_responses(model_name: str, prompts: list, cfg: DemoConfig, path: Path,
                       chat_template: str | None = None) -> None:
    """Greedy responses of one model to the held-out prompts, as ``{"prompt", "response", "truncated"}``
    rows (the precomputed-responses format of ``rlft eval winrate``); the model is freed afterwards."""
    from rlft.data.chat import ensure_chat_template, render_generation_prompt
    from rlft.models import load_model, load_tokenizer, pick_device
    from rlft.rollout import HFEngine, SamplingParams

    spec = pick_device(cfg.device, cfg.dtype)
    tokenizer = load_tokenizer(model_name)
    if chat_template is not None:
        ensure_chat_template(tokenizer, chat_template)
    model = load_model(model_name, spec)
    texts = [render_generation_prompt(tokenizer, m) for m in prompts]
    params = SamplingParams(k=1, temperature=0.0, max_new_tokens=cfg.uf_max_new_tokens, seed=cfg.seed)
    log.info("generating %d responses with %s", len(texts), model_name)
    samples = HFEngine(model, tokenizer, batch_size=cfg.eval_batch_size, show_progress=True,
                       add_special_tokens=False).generate(texts, params)
    write_jsonl(path, ({"prompt": m, "response": s[0].text, "truncated": s[0].finish_reason == "length"}
                       for m, s in zip(prompts, samples)))
