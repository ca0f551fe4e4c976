"""`rlft demo --track ultrafeedback`: the preference-tuning story on one CPU.

From UltraFeedback-style preference pairs (``--data``: the flattened ``train_clean.jsonl``, H4
``ultrafeedback_binarized``, or any layout :func:`rlft.data.preferences.load_preference_pairs` reads):

0. **split**: valid pairs (invalid rows skipped and counted) whose rendered prompt leaves room for a
   reply (at most ``uf_max_length - uf_max_new_tokens`` tokens; longer ones are set aside, counted) are
   split by prompt, seeded by ``split_seed``, into ``uf_eval_prompts`` held-out prompts and
   ``uf_train_pairs`` training pairs with other prompts. Both are written in the H4 layout to
   ``data/train.jsonl`` and ``data/eval.jsonl`` (counts in ``data/split.json``), which every stage reads;
1. **SFT** from the base model: SmolTalk when ``--uf-sft-data`` can be read, else Pref-FT (the chosen
   replies of the training pairs, ``data_format="chat"``);
2. **DPO** from SFT on the training pairs (chat path; score ties dropped and counted);
3. **reward model** (Bradley-Terry, from the base model) on the training pairs; its held-out pairwise
   accuracy on the held-out prompts' non-tie pairs goes to ``rm/eval.json``;
4. **RLOO** from SFT on the training prompts, rewarded by that reward model, with a truncation penalty
   (``uf_truncation_penalty``, added to the score of samples cut at ``uf_max_new_tokens``: at that
   length a cut reply is the norm, and the penalty rewards replies that finish);
5. **win-rates**: each model (base, SFT, DPO, RLOO) answers the held-out prompts once, greedy, saved in
   ``responses/<model>.jsonl``; SFT, DPO and RLOO are compared with the base model's saved responses by
   :func:`rlft.eval.winrate.run_winrate` (judge: the trained reward model; ``winrate/<model>_vs_base/``).
   DPO and RLOO vs SFT reuse the judge's scores of those runs prompt by prompt (identical responses
   count as ties, as inside one run) -> ``winrate/<model>_vs_sft.json``. 95% Wilson intervals throughout;
6. ``report.md``: results table, reward-model accuracy, data counts, training curves, a win-rate chart
   with the intervals, example responses side by side, stage timings.

With ``--resume`` every finished stage (data split, model folders, saved responses, win-rate runs) is
reused and an interrupted training stage continues from its last checkpoint.

Budget: the defaults aim at <= 45 minutes for the 135M model in float32 on a 2-core CPU, where a
training step (forward + backward + AdamW) runs ~140 tokens/s, a no-grad forward ~3x that, and greedy
generation of 50 x 64 tokens takes 20-30 s. Prompts are <= 128 tokens (mean ~67 on train_clean.jsonl),
sequences are cut at 192 tokens (mean ~173; ~70% of replies are truncated). Measured on
train_clean.jsonl (560 usable pairs: 96 held-out prompts, 400 training pairs):

==========================  ==================================================  ==========
stage                       tokens                                              seconds
==========================  ==================================================  ==========
SFT (Pref-FT)               30 steps x 8 x 173 = 42k trained                    343
DPO                         192 pairs x 2 x 173 = 66k forward (reference)       639
                            24 steps x 8 pairs x 2 x 173 = 66k trained
reward model                45 steps x 8 pairs (top 6 of 30 blocks trained,     423
                            ~370 tokens/s) + 87 held-out pairs
RLOO                        10 steps x 16 samples x ~131 (generate 64 tokens,   461
                            score, reference + policy forward, train)
win-rate generation         4 models x 96 prompts x 64 new tokens               180
win-rate judging            3 runs x 192 x ~131 = 75k forward                   137
total                                                                           2181 (36 min)
==========================  ==================================================  ==========
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from functools import partial
from pathlib import Path

from rlft.checkpoint import read_metrics
from rlft.console import console
from rlft.data.files import read_jsonl
from rlft.eval.report import markdown_table, plot_curve
from rlft.eval.winrate import WinrateConfig, load_prompts, prompt_key, run_winrate, winrate_label, winrate_summary
from rlft.lab.demo_config import DemoConfig
from rlft.lab.demo_ultrafeedback_data import READ_LIMIT, generate_responses, resolve_data, sft_data
from rlft.lab.demo_ultrafeedback_data import split_preferences  # noqa: F401  (part of this track's interface)
from rlft.lab.pipeline import StageTimes, run_stage

log = logging.getLogger("rlft")

UF_OUTPUT_DIR = "runs/demo-ultrafeedback"
"""The run folder when --output-dir is left at the Countdown track's default."""

BATCH = 8
"""SFT conversations, DPO pairs and reward-model pairs per optimizer step."""
DPO_MICRO = 4
"""DPO pairs per forward/backward pass: 8 sequences, whose 49k-vocabulary logits at 192 tokens are ~300 MB in fp32."""
RLOO_PROMPTS = 4
"""RLOO prompts per step (x uf_rloo_k samples each)."""
LR = {"sft": 5e-5, "dpo": 1e-5, "rm": 5e-5, "rloo": 2e-5}
"""Peak learning rates. The base model is an instruct model already: SFT stays gentle; DPO gets the higher end
of small-model rates so 24 steps move it; the reward model trains only its top blocks (uf_rm_train_layers) at a
higher rate, its new head faster still (uf_rm_head_lr); RLOO keeps the Countdown rate."""
MODELS = ("base", "sft", "dpo", "rloo")
EXAMPLES = 3
"""Held-out prompts shown with every model's response in the report."""


# --------------------------------------------------------------------------- win-rates


def compare_judged(policy_rows: list[dict], reference_rows: list[dict]) -> dict:
    """Win-rate of one policy over another from two ``winrate.jsonl`` files judged against the same
    reference: per prompt, the two policies' judge rewards (``policy_reward``) are compared; identical
    responses are ties, as inside one run of ``run_winrate`` (which scores identical inputs once)."""
    other = {prompt_key(r["prompt"]): r for r in reference_rows}
    labels, mine, theirs = [], [], []
    for row in policy_rows:
        ref = other.get(prompt_key(row["prompt"]))
        if ref is None:
            raise ValueError(f"no judged response for prompt {row['prompt']!r:.200}")
        same = row["policy_response"] == ref["policy_response"]
        labels.append(0.5 if same else winrate_label(row["policy_reward"], ref["policy_reward"]))
        mine.append(row["policy_reward"])
        theirs.append(ref["policy_reward"])
    return {**winrate_summary(labels), "confidence": 0.95, "ci_method": "wilson",
            "mean_policy_reward": sum(mine) / len(mine), "mean_reference_reward": sum(theirs) / len(theirs)}


def wilson_accuracy(accuracy: float, n: int) -> dict:
    """Wilson 95% interval of a pairwise accuracy measured on ``n`` pairs."""
    wins = round(accuracy * n)
    return winrate_summary([1.0] * wins + [0.0] * (n - wins))


# --------------------------------------------------------------------------- report


def plot_winrates(results: dict[str, dict[str, dict]], path: Path) -> Path:
    """Bars of win-rates with their 95% intervals as error bars: ``results[model][against] = summary``."""
    from rlft.eval.report import plt

    groups = list(results)
    series = list(dict.fromkeys(s for g in groups for s in results[g]))
    width = 0.8 / max(len(series), 1)
    fig, ax = plt.subplots(figsize=(max(5, 1.6 * len(groups) + 2), 3.5))
    for i, name in enumerate(series):
        xs, ys, lows, highs = [], [], [], []
        for g, model in enumerate(groups):
            if name in results[model]:
                s = results[model][name]
                xs.append(g + (i - (len(series) - 1) / 2) * width)
                ys.append(s["win_rate"])
                lows.append(s["win_rate"] - s["ci_low"])
                highs.append(s["ci_high"] - s["win_rate"])
        ax.bar(xs, ys, width, yerr=[lows, highs], capsize=4, label=f"vs {name}")
        for x, y in zip(xs, ys):  # at the foot of the bar, clear of the error bar
            ax.text(x, 0.02, f"{y:.2f}", ha="center", va="bottom", fontsize=8, color="white")
    ax.axhline(0.5, color="grey", linestyle="--", linewidth=1)
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("win-rate (95% CI)")
    ax.set_title("Win-rates judged by the trained reward model")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _curves(title: str, stage: str, metrics_path: Path, keys: list[tuple[str, str]], run_dir: Path) -> str:
    records = read_metrics(metrics_path) if metrics_path.is_file() else []
    if not records:
        return ""
    lines = [f"### {title}", ""]
    for key, label in keys:
        values = [r[key] for r in records if key in r]
        if values:
            png = plot_curve(records, key, run_dir / f"{stage}_{key.replace('/', '_')}.png", title=f"{title}: {label}")
            lines += [
                f"{label}: first {values[0]:.3f}, last {values[-1]:.3f}.", "", f"![{title} {label}]({png.name})", ""
            ]
    return "\n".join(lines)


def _cell(text: str, n: int = 400) -> str:
    text = text.strip()
    text = text if len(text) <= n else text[:n] + " [...]"
    return text.replace("|", "\\|").replace("\r", "").replace("\n", "<br>") or "(empty)"


def _ci(s: dict | None) -> str:
    return "—" if s is None else f"[{s['ci_low']:.3f}, {s['ci_high']:.3f}]"


def _verdict(s: dict | None) -> str:
    if s is None:
        return "not measured"
    if s["ci_low"] > 0.5:
        return "above 50%, significantly (the 95% CI excludes 0.5)"
    if s["win_rate"] > 0.5:
        return "above 50%, but the 95% CI includes 0.5"
    return "not above 50%"


def _json(path: Path) -> dict:
    """A JSON object a stage wrote (ValueError naming a missing or damaged file: :func:`.script_io.read_json`)."""
    from rlft.lab.script_io import read_json

    value = read_json(path, "a JSON object an earlier stage of the demo wrote")
    if not isinstance(value, dict):
        raise ValueError(
            f"{path}: not a JSON object (an earlier stage of the demo wrote it; delete it to redo that stage)")
    return value


def write_report(cfg: DemoConfig, run_dir: Path, split: dict, vs_base: dict[str, dict], vs_sft: dict[str, dict],
                 responses: dict[str, list[dict]], judged: dict[str, list[dict]], timings: dict[str, float],
                 notes: list[str]) -> Path:
    """``report.md`` with the results table, reward-model accuracy, data counts, plots, examples and timings."""
    base_reward = next(iter(vs_base.values()))["mean_reference_reward"]
    rows = []
    for model in MODELS:
        if model not in responses:
            continue
        truncated = sum(r.get("truncated", False) for r in responses[model]) / len(responses[model])
        if model == "base":
            rows.append([model, "— (reference)", "—", "—", "—", base_reward, truncated])
            continue
        wb, ws = vs_base.get(model), vs_sft.get(model)
        rows.append([model, wb["win_rate"], _ci(wb), ws["win_rate"] if ws else "—", _ci(ws), wb["mean_policy_reward"],
                     truncated])
    plot_winrates({m: {"base": vs_base[m], **({"sft": vs_sft[m]} if m in vs_sft else {})} for m in vs_base},
                  run_dir / "winrates.png")

    rm_eval = _json(run_dir / "rm" / "eval.json")
    if rm_eval.get("accuracy") is not None and rm_eval.get("n"):
        rm_ci = wilson_accuracy(rm_eval["accuracy"], rm_eval["n"])
        rm_line = (f"**RM accuracy** (held-out pairs with r_chosen > r_rejected): {rm_eval['accuracy']:.3f} "
                   f"(95% CI {_ci(rm_ci)}) on {rm_eval['n']} pairs: {_verdict(rm_ci)}.")
    else:
        rm_line = "**RM accuracy**: not measured (no non-tie held-out pairs)."

    sft_stats, dpo_stats = _json(run_dir / "sft" / "data_stats.json"), _json(run_dir / "dpo" / "data_stats.json")
    rm_data = rm_eval.get("data", {})
    rm_train, rm_heldout = rm_data.get("train", {}), rm_data.get("eval", {})
    rloo_metrics = run_dir / "rloo" / "metrics.jsonl"
    rloo_records = read_metrics(rloo_metrics) if rloo_metrics.is_file() else []
    rloo_trunc = [r["completion/truncated_frac"] for r in rloo_records if "completion/truncated_frac" in r]
    sft_choice = _json(run_dir / "data" / "sft_source.json")
    counts = [
        ["rows read", split["rows_read"], f"the first {READ_LIMIT} rows at most of `{split['source']}`"],
        ["invalid rows", split["skipped_invalid"], "skipped (empty replies, bad fields), counted by the loader"],
        ["score ties among valid pairs", split["ties"], "kept in the split files; DPO and the reward model drop them"],
        ["long prompts set aside", split["long_prompts_set_aside"],
         f"rendered prompt > {split['max_prompt_tokens']} tokens"],
        ["held-out prompts", split["eval_prompts"], f"{split['eval_pairs']} pairs, {split['eval_ties']} ties"],
        ["training pairs", split["train_pairs"], f"{split['train_ties']} ties; {split['unused']} usable pairs unused"],
        ["DPO ties dropped", dpo_stats.get("dropped_ties", "—"), f"{dpo_stats.get('pairs', '—')} pairs trained"],
        ["DPO truncated replies",
         f"{dpo_stats.get('chosen_truncated', '—')} chosen / {dpo_stats.get('rejected_truncated', '—')} rejected",
         f"cut at {cfg.uf_max_length} tokens"],
        ["SFT truncated conversations", f"{sft_stats.get('truncated', '—')} of {sft_stats.get('examples', '—')}",
         f"{sft_choice.get('kind', '?')} data, cut at {cfg.uf_max_length} tokens"],
        ["RM truncated replies (train)",
         f"{rm_train.get('chosen_truncated', '—')} chosen / {rm_train.get('rejected_truncated', '—')} rejected",
         f"{rm_train.get('pairs', '—')} pairs trained, {rm_heldout.get('pairs', '—')} held out"],
        ["RLOO truncated samples", f"{sum(rloo_trunc) / len(rloo_trunc):.2f} of samples" if rloo_trunc else "—",
         f"hit {cfg.uf_max_new_tokens} new tokens (penalty {cfg.uf_truncation_penalty})"],
    ]

    curves = [
        _curves("SFT", "sft", run_dir / "sft" / "metrics.jsonl", [("loss/sft", "training loss")], run_dir),
        _curves("DPO", "dpo", run_dir / "dpo" / "metrics.jsonl",
                [("loss/dpo", "loss"), ("rewards/accuracy", "implicit reward accuracy")], run_dir),
        _curves("Reward model", "rm", run_dir / "rm" / "metrics.jsonl",
                [("loss/bt", "Bradley-Terry loss"), ("rm/accuracy", "training-batch accuracy")], run_dir),
        _curves("RLOO", "rloo", run_dir / "rloo" / "metrics.jsonl",
                [("reward/mean", "mean reward-model score per step"), ("kl/mean", "KL to SFT"),
                 ("completion/truncated_frac", "truncated fraction")], run_dir),
    ]

    examples = []
    prompts = [r["prompt"] for r in responses["base"]]
    rewards = {m: {prompt_key(r["prompt"]): r["policy_reward"] for r in rows_} for m, rows_ in judged.items()}
    base_rewards = {prompt_key(r["prompt"]): r["reference_reward"] for r in next(iter(judged.values()))}
    for i, prompt in enumerate(prompts[:EXAMPLES]):
        key = prompt_key(prompt)
        table_rows = []
        for model in MODELS:
            if model in responses:
                reward = base_rewards.get(key) if model == "base" else rewards.get(model, {}).get(key)
                table_rows.append([model, "—" if reward is None else f"{reward:.3f}",
                                   _cell(responses[model][i]["response"])])
        question = "\n".join(f"> **{m['role']}**: {_cell(m['content'], 600)}" for m in prompt)
        examples += [f"### Example {i + 1}", "", question, "",
                     markdown_table(["model", "judge reward", "response"], table_rows), ""]

    targets = [f"- {m} vs SFT: {vs_sft[m]['win_rate']:.3f} {_ci(vs_sft[m])}: {_verdict(vs_sft[m])}"
               for m in ("dpo", "rloo") if m in vs_sft]
    sft_what = ("SmolTalk conversations" if sft_choice.get("kind") == "smoltalk"
                else "the chosen replies of the training pairs (Pref-FT)")
    header = ["model", "win-rate vs base", "95% CI", "win-rate vs SFT", "95% CI", "mean judge reward",
              "truncated responses"]
    text = f"""# rlft UltraFeedback demo: {run_dir.name}

Base model `{cfg.model}`; data `{split['source']}`. SFT on {sft_what} ({cfg.uf_sft_steps} steps of {BATCH}, \
lr {LR['sft']});
DPO from SFT on the training pairs ({cfg.uf_pref_steps} steps of {BATCH}, lr {LR['dpo']}, beta {cfg.dpo_beta}); \
a Bradley-Terry
reward model from the base model on all training pairs ({cfg.uf_rm_steps} steps of {BATCH}; \
top {cfg.uf_rm_train_layers} blocks at lr
{LR['rm']}, {cfg.uf_rm_head_init}-initialised head at lr {cfg.uf_rm_head_lr}); RLOO from SFT on the
training prompts rewarded by that reward model ({cfg.uf_rloo_steps} steps of {RLOO_PROMPTS} prompts \
x k={cfg.uf_rloo_k}, lr {LR['rloo']},
beta {cfg.uf_rloo_beta}, truncation penalty {cfg.uf_truncation_penalty}). Sequences are cut at {cfg.uf_max_length} \
tokens; responses
are greedy, at most {cfg.uf_max_new_tokens} new tokens.

## Win-rates on {split['eval_prompts']} held-out prompts (judge: the trained reward model)

{markdown_table(header, rows)}

Per prompt: 1 when the model's judge reward is higher, 0.5 on a tie (identical responses, or equal rewards), \
0 otherwise;
the win-rate is the mean, with a 95% Wilson interval. Win-rates vs SFT use the judge scores of the runs against the base
model (`winrate/<model>_vs_base/winrate.jsonl`).

Targets:

{chr(10).join(targets) if targets else "- no DPO/RLOO results"}
- {rm_line}

![win-rates](winrates.png)

## Data

{markdown_table(["count", "value", "note"], counts)}

## Training curves

{chr(10).join(c for c in curves if c)}

## Example responses (held-out prompts, greedy)

{chr(10).join(examples)}

## Notes

{chr(10).join(f"- {n}" for n in notes) if notes else "none"}

## Timings

{markdown_table(["stage", "seconds"], [[k, f"{v:.1f}"] for k, v in timings.items()])}
"""
    path = run_dir / "report.md"
    path.write_text(text)
    return path


# --------------------------------------------------------------------------- the pipeline


def run_ultrafeedback_demo(cfg: DemoConfig) -> Path:
    """Run the UltraFeedback track (see the module docstring); returns the report path. With --resume, every stage
    whose outputs are there is skipped (:func:`rlft.lab.pipeline.run_stage`)."""
    from rlft.models import load_tokenizer
    from rlft.recipes.dpo import DPOConfig, train_dpo
    from rlft.recipes.reward_model import RMConfig, train_rm
    from rlft.recipes.rl import train_rl
    from rlft.recipes.sft import SFTConfig, train_sft
    from rlft.rl.config import rloo_config
    from rlft.run_folder import claim_run_dir, write_run_config

    cfg = cfg.effective()
    if cfg.output_dir == DemoConfig.output_dir:
        cfg = replace(cfg, output_dir=UF_OUTPUT_DIR)
    run_dir = claim_run_dir(cfg).open()  # an earlier demo: --resume or --overwrite
    data_dir = run_dir / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    write_run_config(run_dir, cfg)
    timings = StageTimes(run_dir / "timings.json", cfg.resume)  # a resumed demo adds to the earlier run's seconds
    notes: list[str] = []
    stage = partial(run_stage, timings=timings, resume=cfg.resume, keep_checkpoints=cfg.keep_checkpoints)
    device = dict(device=cfg.device, dtype=cfg.dtype)
    train_path, eval_path = data_dir / "train.jsonl", data_dir / "eval.jsonl"
    max_prompt_tokens = cfg.uf_max_length - cfg.uf_max_new_tokens

    tokenizer = load_tokenizer(cfg.model)
    # A base model without a chat template gets ChatML everywhere (SFT saves it, so DPO and RLOO inherit it).
    template = None if getattr(tokenizer, "chat_template", None) else "chatml"
    if template is not None:
        from rlft.data.chat import ensure_chat_template

        ensure_chat_template(tokenizer, template)
        notes.append(f"{cfg.model} has no chat template: ChatML is used for every stage")

    stage("data split", [data_dir / "split.json", train_path, eval_path], lambda: split_preferences(
        *resolve_data(cfg), tokenizer, data_dir, train_pairs=cfg.uf_train_pairs, eval_prompts=cfg.uf_eval_prompts,
        max_prompt_tokens=max_prompt_tokens, seed=cfg.split_seed))
    split = _json(data_dir / "split.json")

    def sft_stage():
        choice = sft_data(cfg, data_dir, train_path, limit=cfg.uf_sft_steps * BATCH)
        return train_sft(SFTConfig(
            model=cfg.model, data=choice["data"], data_format="chat", chat_template=template,
            output_dir=str(run_dir / "sft"), max_length=cfg.uf_max_length, batch_size=BATCH, micro_batch_size=BATCH,
            max_steps=cfg.uf_sft_steps, lr=LR["sft"],
            limit=cfg.uf_sft_steps * BATCH,  # one epoch; Pref-FT: the chosen replies of the first training pairs
            save_every=max(cfg.uf_sft_steps // 3, 1), seed=cfg.seed, resume=cfg.resume, **device))

    sft = stage("SFT", run_dir / "sft" / "model", sft_stage)
    if note := _json(data_dir / "sft_source.json").get("note"):
        notes.append(note)

    dpo = stage("DPO", run_dir / "dpo" / "model", lambda: train_dpo(DPOConfig(
        model=str(sft), data=str(train_path), data_format="chat", drop_ties=True, output_dir=str(run_dir / "dpo"),
        beta=cfg.dpo_beta, max_length=cfg.uf_max_length, batch_size=BATCH, micro_batch_size=DPO_MICRO,
        max_steps=cfg.uf_pref_steps, limit=cfg.uf_pref_steps * BATCH, lr=LR["dpo"],
        save_every=max(cfg.uf_pref_steps // 3, 1), seed=cfg.seed, resume=cfg.resume, **device)))

    rm = stage("reward model", [run_dir / "rm" / "model", run_dir / "rm" / "eval.json"], lambda: train_rm(RMConfig(
        model=cfg.model, data=str(train_path), eval_data=str(eval_path), drop_ties=True, eval_limit=None,
        chat_template=template, output_dir=str(run_dir / "rm"), max_length=cfg.uf_max_length, batch_size=BATCH,
        micro_batch_size=BATCH, eval_batch_size=BATCH, max_steps=cfg.uf_rm_steps, lr=LR["rm"],
        head_lr=cfg.uf_rm_head_lr, head_init=cfg.uf_rm_head_init, train_layers=cfg.uf_rm_train_layers, eval_every=0,
        save_every=max(cfg.uf_rm_steps // 3, 1), seed=cfg.seed, resume=cfg.resume, **device)))

    rloo = stage("RLOO", run_dir / "rloo" / "model", lambda: train_rl(rloo_config(  # `rlft rloo`'s defaults
        model=str(sft), prompts_data=str(train_path), reward_model=str(rm), output_dir=str(run_dir / "rloo"),
        k=cfg.uf_rloo_k, prompts_per_step=RLOO_PROMPTS, max_steps=cfg.uf_rloo_steps, lr=LR["rloo"],
        beta=cfg.uf_rloo_beta, max_new_tokens=cfg.uf_max_new_tokens, truncation_penalty=cfg.uf_truncation_penalty,
        eval_every=0, eval_prompts=0, max_prompt_tokens=max_prompt_tokens, micro_batch_size=8,
        gen_batch_size=RLOO_PROMPTS * cfg.uf_rloo_k, save_every=max(cfg.uf_rloo_steps // 3, 1), seed=cfg.seed,
        resume=cfg.resume, **device)))

    prompts = load_prompts(str(eval_path), limit=None)
    models = {"base": cfg.model, "sft": str(sft), "dpo": str(dpo), "rloo": str(rloo)}
    responses: dict[str, list[dict]] = {}
    for label, name in models.items():
        path = stage(f"generate {label}", run_dir / "responses" / f"{label}.jsonl", lambda: generate_responses(
            name, prompts, cfg, run_dir / "responses" / f"{label}.jsonl",
            chat_template=template if label == "base" else None))
        responses[label] = read_jsonl(path)

    vs_base: dict[str, dict] = {}
    judged: dict[str, list[dict]] = {}
    for label in ("sft", "dpo", "rloo"):
        out = run_dir / "winrate" / f"{label}_vs_base"
        stage(f"judge {label} vs base", [out / "winrate.json", out / "winrate.jsonl"], lambda: run_winrate(
            WinrateConfig(policy=str(run_dir / "responses" / f"{label}.jsonl"),
                          reference=str(run_dir / "responses" / "base.jsonl"), judge=str(rm), data=None, limit=None,
                          max_new_tokens=cfg.uf_max_new_tokens, batch_size=cfg.eval_batch_size, output_dir=str(out),
                          seed=cfg.seed, **device)))
        vs_base[label] = _json(out / "winrate.json")
        judged[label] = read_jsonl(out / "winrate.jsonl")
    vs_sft: dict[str, dict] = {}
    for label in ("dpo", "rloo"):
        vs_sft[label] = {**compare_judged(judged[label], judged["sft"]), "policy": label, "reference": "sft",
                         "judge": str(rm)}
        path, text = run_dir / "winrate" / f"{label}_vs_sft.json", json.dumps(vs_sft[label], indent=2) + "\n"
        if not (path.is_file() and path.read_text() == text):  # derived: rewritten only when it changes
            path.write_text(text)

    timings.with_total()
    report = write_report(cfg, run_dir, split, vs_base, vs_sft, responses, judged, timings, notes)
    console.print(f"[bold green]Report written to {report}[/]")
    return report
