"""One RLOO step on Countdown, written plainly in one file: what ``rlft rloo`` does each step.

    sample k completions per prompt           (the Hugging Face model's own ``generate``)
    score them                                (the Countdown rule: 0 no answer, 0.1 a wrong one, 1 a correct one)
    subtract beta x the sequence KL           (log pi(y|x) - log pi_ref(y|x), the RLOO paper's KL in the reward)
    leave-one-out advantages                  A_i = R_i - mean of the other k - 1 rewards of its prompt
    REINFORCE loss, sequence-level            -(1/N) sum_i A_i sum_t log pi(y_it | x_i, y_i<t)
    one AdamW step, the gradient norm clipped to 1

The library spreads this over ``rlft/rl/`` (sampling, log-probs, metrics) and ``rlft/recipes/rl.py`` (the loop) so
that one loop serves every estimator, loss, engine and scale. Here only its pure pieces are used: the advantages
(``rlft.losses.advantages``), the policy loss and the KL (``rlft.losses.pg``), the log-probs of the labels
(``rlft.ops``) and the Countdown score (``rlft.rewards.countdown``). ``tests/unit/test_rloo_minimal.py`` checks that
:func:`rloo_step` makes the update ``rlft rl --advantage rloo`` makes (the ``rlft rloo`` defaults) on a tiny model,
both fed the same sampled completions.

Shape legend: B prompts, k samples per prompt, N = B * k sequences (row ``b * k + j`` = sample j of prompt b), T tokens.

Run (a few steps on generated Countdown tasks, the built-in SmolLM2-135M by default)::

    python examples/rloo_minimal.py --steps 3 --prompts 4 --k 4
"""

from __future__ import annotations

import argparse
import copy
from typing import Callable

import torch

from rlft.losses.advantages import rloo_advantages
from rlft.losses.pg import policy_gradient_loss, sequence_kl
from rlft.ops import logprobs_from_logits
from rlft.rewards.countdown import score_completions

Completion = tuple[list[int], str]
"""One sampled completion: its token ids (up to and including the EOS, when it stopped) and its decoded text."""
Sampler = Callable[..., list[list[Completion]]]
"""``sampler(model, tokenizer, prompts, k=, temperature=, max_new_tokens=, seed=)``: k completions per prompt."""


@torch.no_grad()
def sample(model, tokenizer, prompts: list[str], *, k: int, temperature: float, max_new_tokens: int,
           seed: int) -> list[list[Completion]]:
    """k completions of each prompt from ``model.generate``, sampled from ``softmax(logits / temperature)`` with
    nothing cut off (no top-k, no top-p): the distribution the loss's log-probs are computed from."""
    torch.manual_seed(seed)
    eos = tokenizer.eos_token_id
    out = []
    for prompt in prompts:
        ids = torch.tensor([tokenizer(prompt)["input_ids"]])
        generated = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=temperature,
                                   top_k=0, top_p=1.0, num_return_sequences=k, max_new_tokens=max_new_tokens,
                                   pad_token_id=eos)[:, ids.shape[1]:]
        row = []
        for seq in generated.tolist():
            completion = seq[: seq.index(eos) + 1] if eos in seq else seq  # up to its first EOS, included
            row.append((completion, tokenizer.decode(completion, skip_special_tokens=True)))
        out.append(row)
    return out


def completion_logprobs(model, prompt_ids: list[list[int]], completions: list[list[int]],
                        temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher-force each ``prompt + completion`` (N sequences, right-padded) through ``model``.

    Returns:
        ``(logprobs, mask)``, both ``(N, T - 1)``: the log-prob of each next token at ``temperature``, and 1 where
        that token is a completion token (the EOS included), 0 on the prompt and the padding.
    """
    lengths = [len(p) + len(c) for p, c in zip(prompt_ids, completions)]
    width = max(lengths)
    input_ids = torch.zeros(len(lengths), width, dtype=torch.long)
    attention = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros(len(lengths), width)
    for i, (p, c) in enumerate(zip(prompt_ids, completions)):
        input_ids[i, : lengths[i]] = torch.tensor(p + c)
        attention[i, : lengths[i]] = 1
        mask[i, len(p) : lengths[i]] = 1.0
    logits = model(input_ids=input_ids, attention_mask=attention).logits[:, :-1].float()
    return logprobs_from_logits(logits, input_ids[:, 1:], temperature), mask[:, 1:]


def rloo_step(model, ref_model, optimizer, tokenizer, prompts: list[str], ground_truths: list[dict], *, k: int = 4,
              beta: float = 0.001, temperature: float = 1.0, max_new_tokens: int = 256, max_grad_norm: float = 1.0,
              seed: int = 0, sampler: Sampler = sample) -> dict[str, float]:
    """One RLOO step on ``prompts`` (B Countdown prompts, their ``{"target", "numbers"}`` ground truths): ``model``
    is updated in place by ``optimizer``; ``ref_model`` is the frozen start policy (beta > 0).

    Returns:
        ``reward/mean``, ``kl/mean``, ``adv/std``, ``loss/policy`` and ``grad_norm`` of the step.
    """
    # 1. Sample k completions per prompt, and score each with the Countdown rule: (B, k) rewards.
    model.eval()
    samples = sampler(model, tokenizer, prompts, k=k, temperature=temperature, max_new_tokens=max_new_tokens, seed=seed)
    model.train()
    flat = [completion for row in samples for completion in row]  # N = B * k, row b * k + j
    scores = score_completions([p for p in prompts for _ in range(k)], [text for _, text in flat],
                               [g for g in ground_truths for _ in range(k)])
    rewards = torch.tensor(scores, dtype=torch.float32).view(len(prompts), k)

    # 2. Log-probs of the sampled tokens: the policy's (with gradient) and the reference's.
    prompt_ids = [tokenizer(p)["input_ids"] for p in prompts for _ in range(k)]
    completions = [ids for ids, _ in flat]
    logprobs, mask = completion_logprobs(model, prompt_ids, completions, temperature)  # (N, T - 1) each
    with torch.no_grad():
        ref_logprobs, _ = completion_logprobs(ref_model, prompt_ids, completions, temperature)

    # 3. The KL in the reward, then the leave-one-out advantages of each prompt's k rewards.
    kl = sequence_kl(logprobs.detach(), ref_logprobs, mask).view(len(prompts), k)  # (B, k): sum_t (logp - ref)
    advantages = rloo_advantages(rewards - beta * kl)  # (B, k), each row sums to 0

    # 4. REINFORCE at ratio 1 (old log-probs = the current ones, detached), summed over each sequence's tokens and
    #    averaged over the N sequences ("seq_sum", the RLOO paper's sequence-level estimator); one optimizer step.
    loss, metrics = policy_gradient_loss(logprobs, logprobs.detach(), advantages.flatten(), mask, mode="seq_sum")
    loss.backward()
    params = [p for p in model.parameters() if p.requires_grad]
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return {"reward/mean": rewards.mean().item(), "kl/mean": kl.mean().item(),
            "adv/std": advantages.std(unbiased=False).item(), "loss/policy": metrics["loss/policy"],
            "grad_norm": float(grad_norm)}


def main(argv: list[str] | None = None) -> None:
    """A few RLOO steps on generated Countdown tasks, one line of metrics per step."""
    from rlft.models import load_model, load_tokenizer
    from rlft.tasks.countdown.generator import PRESETS, generate_tasks
    from rlft.tasks.countdown.prompts import render_prompt

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", help="built-in name, local folder or Hub id")
    parser.add_argument("--preset", default="easy3", choices=sorted(PRESETS))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=4, help="prompts per step (B)")
    parser.add_argument("--k", type=int, default=4, help="samples per prompt")
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--beta", type=float, default=0.001)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    tokenizer = load_tokenizer(args.model)
    model = load_model(args.model)
    ref_model = copy.deepcopy(model).eval().requires_grad_(False)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr, weight_decay=0.0)
    tasks = generate_tasks(PRESETS[args.preset], args.steps * args.prompts, seed=args.seed)
    for step in range(args.steps):
        batch = tasks[step * args.prompts : (step + 1) * args.prompts]
        prompts = [render_prompt("base", task, tokenizer) for task in batch]
        metrics = rloo_step(model, ref_model, optimizer, tokenizer, prompts, [t.ground_truth() for t in batch],
                            k=args.k, beta=args.beta, max_new_tokens=args.max_new_tokens, seed=args.seed + step)
        print(f"step {step + 1}: " + "  ".join(f"{key} {value:.4f}" for key, value in metrics.items()))


if __name__ == "__main__":
    main()
