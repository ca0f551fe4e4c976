"""Win-rate of a policy against a reference model, judged by a reward model (``rlft eval winrate``).

For every evaluation prompt: one response from the policy and one from the reference (generated with
:class:`rlft.rollout.HFEngine` from the chat generation prompt, greedy by default, or read from a JSONL
of precomputed ``{"prompt", "response"}`` rows), both scored by the judge, a local reward-model folder
(:class:`rlft.rewards.reward_model.RewardModelScorer`) or a remote OpenAI-compatible reward API
(:class:`rlft.rewards.remote.RemoteRewardJudge`, e.g. Llama-3.1-Nemotron-70B-Reward). Each prompt is
labelled 1 when the policy's reward is higher, 0.5 on an exact tie, 0 otherwise; the win-rate is the
mean label (ties count as half a win), reported with a 95% Wilson score interval
(:func:`winrate_summary`).

Outputs in ``output_dir``:

- ``winrate.jsonl``: one row per prompt: ``prompt`` (messages), ``policy_response``,
  ``reference_response``, ``policy_reward``, ``reference_reward``, ``label``;
- ``winrate.json``: the summary (win_rate, ci_low, ci_high, n, wins, ties, losses, mean rewards, what
  was compared);
- ``report.md``: the summary and the first few examples;
- ``policy_responses.jsonl`` / ``reference_responses.jsonl``: generated responses as ``{"prompt",
  "response"}`` rows (pass them back as --policy / --reference to re-judge without generating);
- ``judge_cache.jsonl`` (remote judge): scored pairs, so an interrupted run resumes without re-scoring;
- ``policy_candidates.jsonl`` (``--best-of-n``): per prompt, the N sampled ``responses``, their ``selector_scores``
  and the ``chosen`` index.

Best-of-N (test-time scaling, ``--best-of-n N --selector-model RM``): the policy samples N responses per prompt (at
--temperature / --top-p) and a reward model, the *selector*, keeps the one it scores highest
(:func:`rlft.eval.best_of_n.pick_best`); the kept responses are judged against the reference's as above. The judge
must be another model than the selector (a policy picked by the judge itself would win by construction): the remote
judge, or a reward model trained on a disjoint split. A typical baseline is the same policy's greedy answer:
``--reference`` the policy itself with ``--reference-temperature 0``, or its precomputed greedy responses.
"""

from __future__ import annotations

import gc
import logging
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from rlft.console import console
from rlft.data.files import write_jsonl
from rlft.eval.report import markdown_table
from rlft.eval.stats import Z_95
from rlft.fsio import atomic_write_json, atomic_write_text
from rlft.options import DeviceOptions
from rlft.eval.winrate_data import is_precomputed, load_prompts, load_responses, prompt_key  # noqa: F401 (re-exported)
from rlft.rewards.reward_model import Messages
from rlft.validation import require, validate_options

log = logging.getLogger("rlft")


@dataclass(frozen=True)
class WinrateConfig(DeviceOptions):
    """Win-rate of a policy against a reference model, judged by a (local or remote) reward model."""

    policy: str = "runs/dpo/model"
    """The policy: a model (built-in name, local HF folder, Hub id) to generate with, or a .jsonl/.json file
    of precomputed {"prompt", "response"} rows."""
    reference: str = "Qwen/Qwen2.5-0.5B-Instruct"
    """The reference: a model or a precomputed .jsonl/.json file, as for --policy."""
    judge: str = "remote"
    """'remote' (an OpenAI-compatible reward API, see --base-url/--judge-model) or a local reward-model
    folder (e.g. runs/rm/model, written by `rlft rm`)."""
    base_url: str = "https://integrate.api.nvidia.com/v1"
    """API root of the remote judge."""
    judge_model: str = "nvidia/llama-3.1-nemotron-70b-reward"
    """Model name of the remote judge."""
    api_key_env: str = "NVIDIA_API_KEY"
    """Environment variable holding the remote judge's API key (never logged or written)."""
    max_concurrency: int = 4
    """Most requests in flight to the remote judge."""
    max_retries: int = 5
    """Retries per request to the remote judge on HTTP 429 / 5xx / connection errors / bad replies (exponential
    backoff). A pair takes at most (max_retries + 1) x --timeout plus the backoff delays."""
    timeout: float = 60.0
    """Seconds each request to the remote judge may take (connecting, sending, each read) before it counts as failed."""
    data: str | None = "HuggingFaceH4/ultrafeedback_binarized"
    """Evaluation prompts: a preference file or Hub id (its prompts are used), or a .jsonl/.json/.parquet file
    of {"prompt": text or message list} rows. None: the prompts of the precomputed --policy file (or --reference)."""
    data_split: str = "test_prefs"
    """Split to read when --data is a Hub dataset id."""
    limit: int | None = 200
    """Evaluate at most this many prompts (the first ones, after removing duplicates). None: all."""
    max_new_tokens: int = 512
    """Most tokens generated per response."""
    temperature: float = 0.0
    """Sampling temperature for generated responses; 0 is greedy decoding."""
    top_p: float = 1.0
    """Nucleus sampling mass (temperature > 0 only)."""
    batch_size: int = 8
    """Prompts per generation batch, and pairs per forward pass of a local judge."""
    chat_template: str | None = None
    """Chat template for the generation prompts of both models: a name (chatml, llama3) or a path to a .jinja
    file; None: each tokenizer's own."""
    output_dir: str = "runs/winrate"
    """Where winrate.jsonl, winrate.json, report.md and generated responses go (a folder already holding them is
    refused unless --overwrite; a file or a model folder always)."""
    overwrite: bool = False
    """Replace the results of an earlier win-rate in --output-dir (its judge_cache.jsonl is kept and reused)."""
    report_examples: int = 3
    """How many example prompts report.md shows."""
    seed: int = 0
    """Sampling seed (temperature > 0)."""
    reference_temperature: float | None = None
    """Sampling temperature of a generated reference; None: --temperature. 0 with --best-of-n: best-of-N against a
    greedy answer (e.g. --reference the policy itself)."""
    best_of_n: int = 1
    """Sample this many responses per prompt from the policy (a model) and keep the one --selector-model scores
    highest; 1: one response, no selection."""
    selector_model: str | None = None
    """The reward model that picks the best of the --best-of-n responses (a folder written by `rlft rm`); never the
    judge."""

    def __post_init__(self) -> None:
        validate_options(self)
        require(self.best_of_n >= 1, f"--best-of-n must be >= 1, got {self.best_of_n}")
        if self.best_of_n == 1:
            require(self.selector_model is None, "--selector-model is only read with --best-of-n N > 1")
            return
        require(self.selector_model is not None,
                "--best-of-n needs --selector-model (the reward model that picks the best)")
        require(not is_precomputed(self.policy),
                f"--best-of-n samples the policy: --policy {self.policy} must be a model, "
                "not a precomputed file")
        require(self.temperature > 0,
                "--best-of-n needs --temperature > 0: greedy samples of a prompt are all the same")
        require(
            self.judge == "remote" or not same_model(self.judge, self.selector_model),
            f"--judge {self.judge} is the --selector-model: a judge rates the responses it picked highest, "
            "so best-of-N would win by construction; use the remote judge (--judge remote) or a reward model trained "
            "on a disjoint split")

    def check_outputs(self) -> None:
        """Refuse an --output-dir that is a file or a model folder, or (unless --overwrite) that holds the results of
        an earlier win-rate (:data:`RESULT_FILES`; not the precomputed --policy / --reference files read from it).
        Writes nothing.

        Raises:
            rlft.run_folder.OutputPathError: see above (the CLI exits with code 2).
        """
        from rlft.run_folder import OutputPathError, check_output_file, model_folder_file

        folder = Path(self.output_dir).expanduser()
        if folder.exists() and not folder.is_dir():
            raise OutputPathError(f"--output-dir {self.output_dir} is a file, not a folder")
        if (found := model_folder_file(folder)) is not None:
            raise OutputPathError(
                f"--output-dir {self.output_dir} is a model folder (it holds {found}); choose another --output-dir")
        inputs = {Path(name).expanduser().resolve() for name in (self.policy, self.reference) if is_precomputed(name)}
        for name in RESULT_FILES:
            if (folder / name).resolve() not in inputs:
                check_output_file(folder / name, option="--output-dir", overwrite=self.overwrite)


RESULT_FILES = ("winrate.json", "winrate.jsonl", "report.md", "policy_responses.jsonl", "reference_responses.jsonl",
                "policy_candidates.jsonl")
"""The files a win-rate writes in --output-dir (besides the remote judge's resumable judge_cache.jsonl)."""


def same_model(a: str, b: str) -> bool:
    """Whether two model names are the same folder (or the same Hub id): equal once resolved as paths."""
    return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()


# --------------------------------------------------------------------------- arithmetic


def winrate_label(policy_reward: float, reference_reward: float) -> float:
    """1.0 if the policy's reward is higher, 0.5 on an exact tie, 0.0 otherwise."""
    if policy_reward > reference_reward:
        return 1.0
    if policy_reward == reference_reward:
        return 0.5
    return 0.0


def winrate_summary(labels: list[float], *, z: float = Z_95) -> dict:
    """Win-rate and its Wilson score interval from per-prompt labels in {0, 0.5, 1}.

    ``win_rate = (wins + ties / 2) / n``. The interval is Wilson's (1927) for a binomial proportion
    ``p`` over ``n`` trials::

        center = (p + z^2 / (2n)) / (1 + z^2 / n)
        half   = z / (1 + z^2 / n) * sqrt(p (1 - p) / n + z^2 / (4 n^2))

    applied to the mean label. With ties a label's variance, ``(wins + ties/4)/n - p^2``, is at most
    the Bernoulli ``p (1 - p)``, so the interval is then slightly conservative (too wide), never too
    narrow. Unlike the normal approximation it stays inside [0, 1] and does not collapse to a point at
    0% or 100%.

    Returns:
        ``{"win_rate", "ci_low", "ci_high", "n", "wins", "ties", "losses"}``.
    Raises:
        ValueError: no labels, or a label outside {0, 0.5, 1}.
    """
    labels = [float(x) for x in labels]
    if not labels:
        raise ValueError("no labels: the win-rate of zero prompts is undefined")
    if bad := [x for x in labels if x not in (0.0, 0.5, 1.0)]:
        raise ValueError(f"labels must be 0, 0.5 or 1, got {bad[:5]}")
    n = len(labels)
    wins, ties = labels.count(1.0), labels.count(0.5)
    p = (wins + 0.5 * ties) / n
    denom = 1.0 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1.0 - p) / n + z * z / (4 * n * n))
    return {
        "win_rate": p,
        "ci_low": 0.0 if p == 0.0 else max(0.0, center - half),  # exact ends (no 1 - 1e-16)
        "ci_high": 1.0 if p == 1.0 else min(1.0, center + half),
        "n": n,
        "wins": wins,
        "ties": ties,
        "losses": n - wins - ties,
    }


# --------------------------------------------------------------------------- responses


def generate_responses(model_name: str, prompts: list[Messages], cfg: WinrateConfig, *, k: int = 1,
                       temperature: float | None = None) -> list[list[str]]:
    """``k`` responses per prompt from ``model_name``, ``(B, k)`` (chat generation prompt; at ``temperature``, None:
    --temperature; 0 is greedy). The model is freed before returning."""
    from rlft.data.chat import ensure_chat_template, render_generation_prompt
    from rlft.models import load_model, load_tokenizer, pick_device
    from rlft.rollout import HFEngine, SamplingParams

    spec = pick_device(cfg.device, cfg.dtype)
    tokenizer = load_tokenizer(model_name)
    if cfg.chat_template is not None:
        ensure_chat_template(tokenizer, cfg.chat_template)
    model = load_model(model_name, spec.for_inference())
    texts = [render_generation_prompt(tokenizer, m) for m in prompts]
    temperature = cfg.temperature if temperature is None else temperature
    params = SamplingParams(k=k, temperature=temperature, top_p=cfg.top_p, max_new_tokens=cfg.max_new_tokens,
                            seed=cfg.seed)
    log.info("generating %d x %d responses with %s", len(texts), k, model_name)
    samples = HFEngine(model, tokenizer, batch_size=cfg.batch_size, show_progress=True,
                       add_special_tokens=False).generate(texts, params)
    del model
    _free()
    return [[s.text for s in row] for row in samples]


def _free() -> None:
    """Return freed model memory (CUDA's cache too)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _responses(side: str, name: str, prompts: list[Messages], cfg: WinrateConfig, run_dir: Path,
               temperature: float | None = None) -> list[str]:
    if is_precomputed(name):
        table = load_responses(name)
        missing = [m for m in prompts if prompt_key(m) not in table]
        if missing:
            raise ValueError(
                f"{name} has no {side} response for {len(missing)} of {len(prompts)} prompts, e.g. {missing[0]!r:.200}")
        return [table[prompt_key(m)][1] for m in prompts]
    responses = [row[0] for row in generate_responses(name, prompts, cfg, temperature=temperature)]
    write_jsonl(run_dir / f"{side}_responses.jsonl", ({"prompt": m, "response": r} for m, r in zip(prompts, responses)))
    return responses


def eval_prompts(cfg: WinrateConfig) -> list[Messages]:
    """The prompts to evaluate: from --data, else from the precomputed --policy (or --reference) file."""
    if cfg.data is not None:
        return load_prompts(cfg.data, cfg.data_split, cfg.limit)
    for name in (cfg.policy, cfg.reference):
        if is_precomputed(name):
            prompts = [m for m, _ in load_responses(name).values()]
            return prompts[: cfg.limit] if cfg.limit is not None else prompts
    raise ValueError("--data is None but neither --policy nor --reference is a precomputed .jsonl/.json file")


def make_selector(cfg: WinrateConfig):
    """The --selector-model of best-of-N: anything with ``score(prompts, responses) -> list[float]``."""
    from rlft.rewards.reward_model import RewardModelScorer

    return RewardModelScorer(cfg.selector_model, batch_size=cfg.batch_size, device=cfg.device, dtype=cfg.dtype)


def best_of_n_responses(prompts: list[Messages], cfg: WinrateConfig, run_dir: Path) -> list[str]:
    """The policy's best of ``cfg.best_of_n`` sampled responses per prompt by the selector's score; writes
    ``policy_candidates.jsonl`` (every candidate, its score, the chosen index) and ``policy_responses.jsonl``."""
    from rlft.eval.best_of_n import pick_best

    candidates = generate_responses(cfg.policy, prompts, cfg, k=cfg.best_of_n)
    selector = make_selector(cfg)
    chosen, scores = pick_best(selector, prompts, candidates)
    del selector
    _free()
    write_jsonl(run_dir / "policy_candidates.jsonl", ({"prompt": m, "responses": c, "selector_scores": s, "chosen": i}
                                                      for m, c, s, i in zip(prompts, candidates, scores, chosen)))
    responses = [c[i] for c, i in zip(candidates, chosen)]
    write_jsonl(run_dir / "policy_responses.jsonl", ({"prompt": m, "response": r} for m, r in zip(prompts, responses)))
    return responses


def make_judge(cfg: WinrateConfig, run_dir: Path):
    """The judge named by ``cfg.judge``: anything with ``score(prompts, responses) -> list[float]``."""
    if cfg.judge == "remote":
        from rlft.rewards.remote import RemoteRewardJudge

        return RemoteRewardJudge(cfg.base_url, cfg.judge_model, api_key_env=cfg.api_key_env,
                                 max_concurrency=cfg.max_concurrency, max_retries=cfg.max_retries,
                                 timeout_s=cfg.timeout, cache_path=run_dir / "judge_cache.jsonl")
    from rlft.rewards.reward_model import RewardModelScorer

    return RewardModelScorer(cfg.judge, batch_size=cfg.batch_size, device=cfg.device, dtype=cfg.dtype)


# --------------------------------------------------------------------------- run


def _clip(text: str, n: int = 1500) -> str:
    return text if len(text) <= n else text[:n] + " [...]"


def _picked(summary: dict) -> str:
    if summary.get("best_of_n", 1) <= 1:
        return ""
    return (f" (best of {summary['best_of_n']} samples at temperature {summary['temperature']}, picked by the selector "
            f"`{summary['selector']}`)")


def write_report(path: Path, summary: dict, rows: list[dict], examples: int) -> None:
    """``report.md``: the summary table and the first ``examples`` prompts with both responses."""
    lines = [
        "# Win-rate",
        "",
        f"Policy `{summary['policy']}`{_picked(summary)} vs reference `{summary['reference']}`, "
        f"judged by `{summary['judge']}`.",
        "",
        markdown_table(
            [
                "win-rate", "95% CI (Wilson)", "n", "wins", "ties", "losses", "mean reward policy",
                "mean reward reference"
            ],
            [[
                summary["win_rate"], f"[{summary['ci_low']:.3f}, {summary['ci_high']:.3f}]", summary["n"],
                summary["wins"], summary["ties"], summary["losses"], summary["mean_policy_reward"],
                summary["mean_reference_reward"]
            ]],
        ),
        "",
        "Label 1 when the policy's reward is higher, 0.5 on an exact tie, 0 otherwise; the win-rate is the mean label.",
    ]
    for i, row in enumerate(rows[:examples]):
        prompt = "\n\n".join(f"**{m['role']}**: {m['content']}" for m in row["prompt"])
        lines += [
            "",
            f"## Example {i + 1} (label {row['label']})",
            "",
            _clip(prompt),
            "",
            f"**Policy** (reward {row['policy_reward']:.3f}):",
            "",
            "```text\n" + _clip(row["policy_response"]).replace("```", "'''") + "\n```",
            "",
            f"**Reference** (reward {row['reference_reward']:.3f}):",
            "",
            "```text\n" + _clip(row["reference_response"]).replace("```", "'''") + "\n```",
        ]
    atomic_write_text(path, "\n".join(lines) + "\n")


def run_winrate(cfg: WinrateConfig) -> dict:
    """Generate (or read), judge, label and summarise; returns the summary written to ``winrate.json``.

    Raises:
        UsageError: launched by torchrun; an --output-dir that must not be
            written (:meth:`WinrateConfig.check_outputs`); both before anything is loaded.
    """
    from rlft.distributed import require_one_process

    require_one_process("rlft eval winrate")
    cfg.check_outputs()
    run_dir = Path(cfg.output_dir).expanduser()
    run_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    prompts = eval_prompts(cfg)
    if not prompts:
        raise ValueError("no evaluation prompts")
    log.info("win-rate on %d prompts: policy %s vs reference %s", len(prompts), cfg.policy, cfg.reference)
    if cfg.best_of_n > 1:
        policy = best_of_n_responses(prompts, cfg, run_dir)
    else:
        policy = _responses("policy", cfg.policy, prompts, cfg, run_dir)
    reference = _responses("reference", cfg.reference, prompts, cfg, run_dir, cfg.reference_temperature)

    judge = make_judge(cfg, run_dir)
    rewards = judge.score(prompts + prompts, policy + reference)
    n = len(prompts)
    bad = [i for i, r in enumerate(rewards) if not isinstance(r, (int, float)) or not math.isfinite(r)]
    if bad:  # never scored, never written: a NaN reward would count as a loss
        i = bad[0]
        side = "policy" if i < n else "reference"
        raise ValueError(
            f"the judge {cfg.judge!r} gave {len(bad)} non-finite reward(s), e.g. {rewards[i]!r} for the {side} "
            f"response to prompt {i % n}; nothing was written")
    policy_rewards, reference_rewards = rewards[:n], rewards[n:]
    labels = [winrate_label(p, r) for p, r in zip(policy_rewards, reference_rewards)]
    rows = [{
        "prompt": m, "policy_response": pr, "reference_response": rr, "policy_reward": pw, "reference_reward": rw,
        "label": lab
    } for m, pr, rr, pw, rw, lab in zip(prompts, policy, reference, policy_rewards, reference_rewards, labels)]
    write_jsonl(run_dir / "winrate.jsonl", rows)

    judge_name = f"remote:{cfg.judge_model}" if cfg.judge == "remote" else cfg.judge
    summary = {
        **winrate_summary(labels),
        "confidence": 0.95,
        "ci_method": "wilson",
        "mean_policy_reward": sum(policy_rewards) / n,
        "mean_reference_reward": sum(reference_rewards) / n,
        "policy": cfg.policy,
        "reference": cfg.reference,
        "judge": judge_name,
        "data": cfg.data,
        "data_split": cfg.data_split,
        "temperature": cfg.temperature,
        "reference_temperature": cfg.temperature if cfg.reference_temperature is None else cfg.reference_temperature,
        "best_of_n": cfg.best_of_n,
        "selector": cfg.selector_model,
        "max_new_tokens": cfg.max_new_tokens,
    }
    atomic_write_json(run_dir / "winrate.json", summary)
    write_report(run_dir / "report.md", summary, rows, cfg.report_examples)
    console.print(
        f"[green]win-rate[/] {summary['win_rate']:.3f} (95% CI {summary['ci_low']:.3f}-{summary['ci_high']:.3f}; "
        f"{summary['wins']} wins, {summary['ties']} ties, {summary['losses']} losses of {n}); written to {run_dir}"
    )
    return summary
