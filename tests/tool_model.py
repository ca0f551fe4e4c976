"""A tiny model that has learned to call a calculator: the tests of rollouts with tool calls need a policy that writes
complete calls (a random model almost never does). Trained here in a few seconds, seeded, on four prompts."""

from __future__ import annotations

import torch

from rlft.rollout.tools import format_observation

PROMPTS = ["Add 3 and 4.\n", "Add 12 and 5.\n", "Add these numbers: seven, nine.\n", "Add these numbers: two, one.\n"]
"""Two prompts in digits, two in the words of examples/envs/word_sum.py (whose test calls the tool with this model)."""
NAMES = "zero one two three four five six seven eight nine ten eleven twelve".split()


def _call(a: int, b: int) -> str:
    return '<tool_call>{"name": "add", "arguments": {"a": %d, "b": %d}}</tool_call>' % (a, b)


def add(a: int, b: int) -> int:
    """The tool the model calls."""
    return a + b


def segments(prompt: str) -> list[tuple[str, bool]]:
    """The trained completion of ``prompt`` as (text, the model's) segments: call, observation, answer."""
    words = [w.strip(".,\n") for w in prompt.split()]
    a, b = (int(w) if w.isdigit() else NAMES.index(w) for w in words if w.isdigit() or w in NAMES)
    return [(_call(a, b), True), (format_observation(str(a + b)), False), (f"Answer: {a + b}", True)]


def train_tool_model(tokenizer, make_tiny_model, steps: int = 100, seed: int = 0):
    """A 2-layer model trained on :data:`PROMPTS`' completions (observations masked, segments tokenized apart as the
    engine appends them); sampling at temperature 1 still varies."""
    model = make_tiny_model(len(tokenizer), seed=seed, hidden=64)
    rows = []
    for prompt in PROMPTS:
        ids = list(tokenizer(prompt)["input_ids"])
        mask = [0] * len(ids)
        for text, own in segments(prompt):
            part = list(tokenizer(text, add_special_tokens=False)["input_ids"])
            ids += part
            mask += [int(own)] * len(part)
        ids.append(tokenizer.eos_token_id)
        mask.append(1)
        rows.append((ids, mask))
    width = max(len(ids) for ids, _ in rows)
    input_ids = torch.full((len(rows), width), tokenizer.eos_token_id)
    loss_mask = torch.zeros((len(rows), width))
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    for r, (ids, mask) in enumerate(rows):
        input_ids[r, : len(ids)] = torch.tensor(ids)
        loss_mask[r, : len(ids)] = torch.tensor(mask, dtype=torch.float32)
        attention[r, : len(ids)] = 1
    torch.manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)
    model.train()
    for _ in range(steps):
        logits = model(input_ids=input_ids, attention_mask=attention).logits[:, :-1]
        loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), input_ids[:, 1:], reduction="none")
        loss = (loss * loss_mask[:, 1:]).sum() / loss_mask[:, 1:].sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    return model, float(loss.detach())
