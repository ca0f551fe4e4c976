"""Exact Countdown solver (the original game's rules).

Each number is used exactly once; the operations are ``+ - * /``, where subtraction must not go
below zero and division must be exact, so every intermediate value is an integer >= 0.
Expressions are rendered with minimal parentheses and spaces around operators, e.g.
``(44 - 19) * 35``, and evaluate to the target under Python true division.

How it works (memoised over subsets): number the inputs' subsets by bitmask and compute, smallest
first, the set of values each proper subset can make by combining two disjoint smaller subsets.
The whole set is never tabulated: for each split of it into two parts and each value ``a`` of one
part, only the few partners ``b`` with ``a op b == target`` are looked up in the other part. A
solution tree is rebuilt the same way, top down. A 4-number check costs ~30 us.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import lru_cache
from typing import Union

Tree = Union[int, tuple["Tree", str, "Tree"]]
"""An expression: a number, or ``(left, op, right)``."""
Step = tuple[int, str, int, int]
"""One arithmetic step ``(a, op, b, result)``."""

OPS = ("+", "-", "*", "/")
_PREC = {"+": 1, "-": 1, "*": 2, "/": 2}


def apply(a: int, op: str, b: int) -> int | None:
    """``a op b`` under the game's rules, or None when not allowed (negative or inexact)."""
    if op == "+":
        return a + b
    if op == "-":
        return a - b if a >= b else None
    if op == "*":
        return a * b
    return a // b if b != 0 and a % b == 0 else None


@lru_cache(maxsize=None)
def _plan(n: int) -> dict[int, list[tuple[int, int]]]:
    """For ``n`` inputs: every subset of size >= 2 as a bitmask (smallest subsets first, the full
    set last) mapped to its unordered splits into two non-empty parts."""

    def splits(mask: int) -> list[tuple[int, int]]:
        out, sub = [], (mask - 1) & mask
        while sub:  # walks every non-empty proper submask
            if sub < mask ^ sub:
                out.append((sub, mask ^ sub))
            sub = (sub - 1) & mask
        return out

    masks = sorted((m for m in range(1, 1 << n) if m.bit_count() >= 2), key=int.bit_count)
    return {m: splits(m) for m in masks}


def _tables(nums: Sequence[int]) -> list[set[int] | None]:
    """``tables[mask]``: every value the numbers picked by ``mask`` can make (full set: None)."""
    tables: list[set[int] | None] = [None] * (1 << len(nums))
    for i, x in enumerate(nums):
        tables[1 << i] = {x}
    full = (1 << len(nums)) - 1
    for mask, splits in _plan(len(nums)).items():
        if mask == full:
            break
        out: set[int] = set()
        add = out.add
        for sub, other in splits:
            right = tables[other]
            for a in tables[sub]:
                for b in right:
                    hi, lo = (a, b) if a >= b else (b, a)
                    add(hi + lo)
                    add(hi - lo)
                    add(hi * lo)
                    if lo and hi % lo == 0:
                        add(hi // lo)
        tables[mask] = out
    return tables


def _match(a: int, t: int, values: set[int]) -> tuple[int, str, bool] | None:
    """A partner ``b`` in ``values`` with ``a op b == t`` (a_first) or ``b op a == t``.

    Returns ``(b, op, a_first)`` or None; operations are tried in the order + - * /.
    """
    candidates = [(t - a, "+", True), (a - t, "-", True), (a + t, "-", False)]
    if a == 0:
        if t == 0:
            candidates.append((min(values), "*", True))
    else:
        if t % a == 0:
            candidates.append((t // a, "*", True))
        if t and a % t == 0:
            candidates.append((a // t, "/", True))
        candidates.append((a * t, "/", False))
    for b, op, a_first in candidates:
        if b in values:
            return b, op, a_first
    return None


def _tree(nums: Sequence[int], tables: list, mask: int, target: int) -> Tree | None:
    """A tree over the numbers picked by ``mask`` that equals ``target``, or None."""
    if mask & (mask - 1) == 0:  # a single number
        x = nums[mask.bit_length() - 1]
        return x if x == target else None
    if target < 0 or (tables[mask] is not None and target not in tables[mask]):
        return None
    for sub, other in _plan(len(nums))[mask]:
        for a in sorted(tables[sub]):
            found = _match(a, target, tables[other])
            if found is not None:
                b, op, a_first = found
                ta, tb = _tree(nums, tables, sub, a), _tree(nums, tables, other, b)
                return (ta, op, tb) if a_first else (tb, op, ta)
    return None


def _find(nums: Sequence[int], target: int) -> Tree | None:
    if not nums:
        return None
    return _tree(nums, _tables(nums), (1 << len(nums)) - 1, target)


def is_solvable(nums: Sequence[int], target: int) -> bool:
    """Whether ``target`` can be made from ``nums``, each used exactly once."""
    if len(nums) <= 1:
        return list(nums) == [target]
    if target < 0:
        return False
    tables = _tables(nums)
    for sub, other in _plan(len(nums))[(1 << len(nums)) - 1]:
        small, big = sorted((tables[sub], tables[other]), key=len)
        if any(_match(a, target, big) is not None for a in small):
            return True
    return False


def reachable(nums: Sequence[int]) -> set[int]:
    """Every value ``nums`` can make using all of them (for tests and analysis)."""
    if len(nums) == 1:
        return {nums[0]}
    tables = _tables(nums)
    out = set()
    for sub, other in _plan(len(nums))[(1 << len(nums)) - 1]:
        for a in tables[sub]:
            for b in tables[other]:
                out.update(v for op in OPS for v in (apply(a, op, b), apply(b, op, a)) if v is not None)
    return out


def evaluate(tree: Tree) -> int:
    """The value of an expression tree."""
    if isinstance(tree, int):
        return tree
    left, op, right = tree
    value = apply(evaluate(left), op, evaluate(right))
    assert value is not None, f"invalid tree {tree}"
    return value


def render(tree: Tree) -> str:
    """Render a tree with minimal parentheses and spaces around operators, e.g. ``(44 - 19) * 35``."""
    if isinstance(tree, int):
        return str(tree)
    left, op, right = tree

    def part(child: Tree, is_right: bool) -> str:
        text = render(child)
        if isinstance(child, int):
            return text
        child_prec, prec = _PREC[child[1]], _PREC[op]
        # The right operand of - and / needs parentheses at equal precedence: a - (b + c).
        if child_prec < prec or (is_right and child_prec == prec and op in "-/"):
            return f"({text})"
        return text

    return f"{part(left, False)} {op} {part(right, True)}"


def steps(tree: Tree) -> list[Step]:
    """The steps of a tree in evaluation order (left subtree, right subtree, then the root)."""
    if isinstance(tree, int):
        return []
    left, op, right = tree
    a, b = evaluate(left), evaluate(right)
    return steps(left) + steps(right) + [(a, op, b, apply(a, op, b))]


def _all_trees(nums: Sequence[int], mask: int) -> Iterator[tuple[int, Tree]]:
    """Every ``(value, tree)`` over the numbers picked by ``mask``, without deduplication."""
    if mask & (mask - 1) == 0:
        x = nums[mask.bit_length() - 1]
        yield x, x
        return
    sub = (mask - 1) & mask
    while sub:
        if sub < mask ^ sub:
            right = list(_all_trees(nums, mask ^ sub))
            for a, ta in _all_trees(nums, sub):
                for b, tb in right:
                    for x, tx, y, ty in ((a, ta, b, tb), (b, tb, a, ta)):
                        for op in OPS:
                            v = apply(x, op, y)
                            if v is not None:
                                yield v, (tx, op, ty)
        sub = (sub - 1) & mask


def solve(nums: Sequence[int], target: int, *, max_solutions: int = 1) -> list[str]:
    """Up to ``max_solutions`` distinct expressions over ``nums`` equal to ``target`` ([] if none).

    The first is found by the fast table search; further ones need a full enumeration of
    expression trees (fine for 3-5 numbers). Distinct means distinct rendered text.
    """
    tree = _find(nums, target)
    if tree is None:
        return []
    solutions = [render(tree)]
    if max_solutions > 1:
        for value, other in _all_trees(nums, (1 << len(nums)) - 1):
            text = render(other)
            if value == target and text not in solutions:
                solutions.append(text)
                if len(solutions) >= max_solutions:
                    break
    return solutions[:max_solutions]


def solve_steps(nums: Sequence[int], target: int) -> list[Step] | None:
    """The steps of one solution, e.g. ``[(19, '+', 35, 54), (44, '+', 54, 98)]``, or None.

    Steps come in evaluation order; the last step's result is ``target`` ([] when ``nums`` is the
    single number ``target``).
    """
    tree = _find(nums, target)
    return None if tree is None else steps(tree)
