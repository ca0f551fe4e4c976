"""One benchmark command in separate processes, with and without extra environment variables, interleaved.

For settings a process reads once at its start, such as glibc's malloc tunables
(``docs/results/speed/page_faults_cpu.md``): each round runs the command once as ``A`` (the environment as given) and
once as ``B`` (with ``--set NAME=VALUE`` added), alternating which goes first (A B, B A, ...), one process at a time.
Printed per process: the arm, wall seconds, minor and major page faults, user and system CPU seconds (the child's
own ``rusage``, from ``os.wait4``), and the last ``--tail`` lines of its output (the command's own measurement).
Then per arm the median wall seconds and minor faults, and B's wall time as a ratio of A's.

    python bench/env_ab.py --set GLIBC_TUNABLES=glibc.malloc.hugetlb=1 --rounds 2 \\
        -- python bench/sft_throughput.py --path rlft --steps 6

Exits with the first failing process's status (its output printed).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rlft.fsio import atomic_write_text
from rlft.lab.script_io import ArgumentParser, check_outputs, run_script


def parse_assignments(items: list[str]) -> dict[str, str]:
    """``["NAME=VALUE", ...]`` as a dict; SystemExit naming an item without ``=`` or with an empty name."""
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise SystemExit(f"--set {item!r}: expected NAME=VALUE")
        out[name] = value
    return out


def arm_order(rounds: int) -> list[str]:
    """The arms in run order: A B, then B A, alternating, ``rounds`` times (so neither always runs first)."""
    return [arm for r in range(rounds) for arm in (("A", "B") if r % 2 == 0 else ("B", "A"))]


def run_once(command: list[str], env: dict[str, str]) -> dict:
    """Run ``command`` under ``env``; its wall seconds, page faults, CPU seconds, exit status and output."""
    with tempfile.TemporaryFile() as log:
        t0 = time.perf_counter()
        proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        log.seek(0)
        output = log.read().decode(errors="replace")
    return {"wall_s": wall, "minflt": usage.ru_minflt, "majflt": usage.ru_majflt, "user_s": usage.ru_utime,
            "sys_s": usage.ru_stime, "rc": proc.returncode, "output": output}


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="B's extra environment variable")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of A and B (A B, B A, ...)")
    parser.add_argument("--tail", type=int, default=3, help="lines of each process's output to print")
    parser.add_argument("--output", type=Path, default=None, help="also write the printed lines here")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    args = parser.parse_args(argv)
    check_outputs({"--output": args.output}, overwrite=args.overwrite)  # before any work
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise SystemExit("no command: env_ab.py [options] -- COMMAND ...")
    if args.rounds < 1:
        raise SystemExit(f"--rounds {args.rounds}: must be at least 1")
    extra = parse_assignments(args.set)
    if not extra:
        raise SystemExit("--set NAME=VALUE: B needs at least one variable")
    envs = {"A": dict(os.environ), "B": {**os.environ, **extra}}
    lines: list[str] = []

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    say(f"command: {' '.join(command)}")
    say("A: the environment as given" + "".join(f"; {k}={os.environ[k]!r}" for k in extra if k in os.environ))
    say("B: A plus " + " ".join(f"{k}={v}" for k, v in extra.items()))
    results: dict[str, list[dict]] = {"A": [], "B": []}
    for i, arm in enumerate(arm_order(args.rounds)):
        r = run_once(command, envs[arm])
        say(f"[{i + 1}] {arm}: {r['wall_s']:.1f} s wall, {r['minflt']:,} minor / {r['majflt']:,} major faults, "
            f"user {r['user_s']:.1f} s, sys {r['sys_s']:.1f} s, rc {r['rc']}")
        if r["rc"] != 0:  # the whole output, once
            say(r["output"])
            return r["rc"]
        for line in r["output"].strip().splitlines()[-args.tail:]:
            say(f"    {line}")
        results[arm].append(r)
    wall = {arm: statistics.median(r["wall_s"] for r in rs) for arm, rs in results.items()}
    for arm, rs in results.items():
        say(f"{arm}: median {wall[arm]:.1f} s wall, {statistics.median(r['minflt'] for r in rs):,.0f} minor faults "
            f"({len(rs)} processes)")
    say(f"B / A wall time: {wall['B'] / wall['A']:.3f} (A / B: {wall['A'] / wall['B']:.2f}x)")
    if args.output:
        args.output.expanduser().parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(args.output.expanduser(), "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":  # a bad option, an existing --output: one line, exit 2
    run_script(lambda argv: sys.exit(main(argv)))
