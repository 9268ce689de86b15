"""The ``weight-sync`` command: read an RL run's launch script or config and say how it moves its
weights from trainer to rollout every round.

    weight-sync RUN [--params 7e9] [--dtype bf16]

RUN is a verl launch script (``.sh``), a verl YAML config (nested or flat dotted keys), or a
NeMo RL YAML config (with its ``defaults:`` chain). Any problem with the input -- a missing
file, bad YAML, a script that runs no trainer, a file that is neither framework's config, a wrong
value -- is one line on stderr and exit status 2. A value the input cannot give (``???``, a
shell variable only known at run time) is named in the report, which covers everything else.
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
import traceback
from pathlib import Path

from snippets.rl import refit_cost
from snippets.rl.weight_sync import facts, nemo_rl, report, verl
from snippets.rl.weight_sync.shell import looks_like_script, read_script
from snippets.rl.weight_sync.values import ConfigError, read_yaml, unflatten


def build(path: str, params: float | None, dtype: str | None, size_from: str) -> list[str]:
    """The report's lines for the input at ``path`` (ConfigError on a problem)."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"{path} is a directory; give a launch script or a config file")
    if p.exists() and not p.is_file():  # /dev/null, a FIFO (reading one would wait), a socket
        raise ConfigError(f"{path} is not a regular file; give a launch script or a config file")
    if not p.is_file():
        raise ConfigError(f"no such file: {path}")
    with open(p, errors="replace", newline="") as f:  # newline="": keep \r\n as bash sees it
        text = f.read()
    if "\0" in text[:4096]:
        raise ConfigError(f"{path} is a binary file, not a launch script or a YAML config")
    if looks_like_script(path, text):
        command = read_script(path, text)
        tree, head, separate = verl.from_script(path, command)
        return _verl(path, tree, head, separate, params, dtype, size_from)
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path} is neither a verl nor a NeMo RL config: expected a mapping of "
            f"sections, got {type(data).__name__}"
        )
    if verl.is_verl(unflatten(data)):
        tree, head, separate = verl.from_yaml(path, data)
        return _verl(path, tree, head, separate, params, dtype, size_from)
    tree, chain = nemo_rl.load(path)
    if not nemo_rl.is_nemo_rl(tree):
        raise ConfigError(
            f"{path} is neither a verl config (no actor_rollout_ref section) nor a "
            "NeMo RL config (no policy section with generation, dtensor_cfg or "
            "megatron_cfg)"
        )
    return _nemo_rl(path, tree, chain, params, dtype, size_from)


def _verl(path, tree, head, separate, params, dtype, size_from):
    reader = report.Reader(tree, "verl")
    try:
        run = verl.read_run(reader, separate)
        lines, moved, kept = verl.explain(run)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None
    params, size_from = _size(params, size_from, run.model_path, "model.path")
    return (
        head
        + reader.lines()
        + lines
        + report.bytes_lines(params, dtype or "bf16", size_from, moved=moved, kept=kept)
    )


def _nemo_rl(path, tree, chain, params, dtype, size_from):
    reader = report.Reader(tree, "NeMo RL", "set on the command line")
    try:
        run = nemo_rl.read_run(reader)
        lines, moved, kept = nemo_rl.explain(run)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None
    head = [f"NeMo RL config {path} (read against NeMo RL {nemo_rl.SHORT})"]
    if len(chain) > 1:
        names = " <- ".join(Path(c).name for c in reversed(chain))
        head.append(f"defaults   {names}, merged as {nemo_rl.code('inheritance')} does")
    params, size_from = _size(params, size_from, run.model, "policy.model_name")
    return (
        head
        + reader.lines()
        + lines
        + report.bytes_lines(params, dtype or nemo_rl.dtype(run), size_from, moved=moved, kept=kept)
    )


def _size(params, size_from, name, key):
    if params is None and name:
        found = refit_cost.params_from_name(name)
        if found:
            return found, f" (from {key} {name})"
    return params, size_from


def versions() -> list[str]:
    """Which versions go together, as read at the pinned commits (facts.VERSIONS)."""
    lines = []
    for framework, core, bridge, where in facts.VERSIONS:
        lines += [framework, f"  Megatron Core    {core}", f"  Megatron-Bridge  {bridge}"]
        lines += textwrap.wrap(
            where,
            96,
            initial_indent="  pinned in        ",
            subsequent_indent=" " * 19,
            break_on_hyphens=False,
        )
    return lines


EPILOG = """\
inputs:
  a verl launch script   .sh/.bash, or a file starting with a shell #! line; the first
                         `python3 -m verl.trainer.main_ppo` (or verl's fully_async_main /
                         one_step_off_policy.main_ppo, or a recipe.*.main_*) is read
  a verl YAML config     nested like ppo_trainer.yaml, or flat dotted keys
  a NeMo RL YAML config  with its defaults: chain, _override_, ${...} and add/mul/div/max

how a script is read (as bash would run it, without running it):
  NAME=value, export/local/declare NAME=value, ${NAME}, ${NAME:-d} ${NAME-d} ${NAME:=d}
  ${NAME:+x} ${NAME:?}, ${#NAME}, '...' and "..." quotes, backslash-newline (also inside
  "..."); $((arithmetic)) as bash computes it (64-bit wrap, / and % toward zero, 010 0x1F
  2#101); a here-document's body is data, not a command; arrays NAME=(...) and NAME+=(...)
  with comments and newlines inside, "${NAME[@]}" (one word per element), ${NAME[*]},
  ${NAME[N]}, ${#NAME[@]}; unquoted values are split at blanks; `case`, `if [ test ];
  then/elif/else/fi` and `[ test ] && A || B` run only the branch bash takes when the words
  are known (tests: = == != -eq..-le -n -z !). No pathname expansion: a word with * ? [
  passes as written, as bash does when no file matches. Hydra overrides key=value,
  +key=value, ++key=value, ~key, model_engine=..., group@package=choice and
  --config-name/-cn are applied on verl's defaults for that config. Unknowable values -- $1,
  $(...), `...`, a variable the script never sets, one set inside a loop or an if / case /
  && on unknown words, one it `read`s -- are each named in an `unknown` line with the key
  they feed; the rest is still reported. A line that ends in a backslash and a blank (then
  maybe a comment) ends the command there, as in bash: the report says so (`broken`), lists
  the words that reach the trainer and the lines that then run as separate, failing
  commands, and reports what runs. A trailing $@ and a second trainer command are noted.

exit status:
  0  a report (it may contain `unknown` lines, and byte figures that need --params)
  2  one line on stderr: no such file, a directory, not a regular file, a binary file, bad
     YAML, a script bash stops on (a quote / $( / ${ / array that never closes, an if / loop /
     case / { never closed, a stray fi, CRLF line endings, an arithmetic error bash reports),
     a script that runs no trainer (or exits first), a module that is not a verl trainer main,
     neither framework's config, --params outside 1..1e15, a size that is not a positive int,
     a reader bug (WEIGHT_SYNC_DEBUG=1 prints its traceback), or a value the framework
     refuses (an engine it lacks, a TP that does not divide the GPUs, a
     checkpoint engine or refit transport the placement does not allow)

facts: verl-project/verl 1dda039 (2026-08-22) and NVIDIA-NeMo/RL 7ea279a (2026-08-22);
  which versions go together: README, "RL: how a verl or NeMo RL run syncs its weights".
old name: python -m snippets.rl.verl_sync RUN (the same command)
"""


def main(argv: list[str] | None = None, prog: str = "weight-sync") -> int:
    parser = argparse.ArgumentParser(
        prog=prog,
        description=textwrap.fill(
            "Read an RL run's launch script or config (verl or NeMo RL) and say how it moves its "
            "weights from trainer to rollout every round: the trainer's layout, the rollout engine, "
            "whether they share GPUs, each step with the code that does it, and the bytes per GPU "
            "with a wire-time lower bound (NVLink 450 GB/s, InfiniBand 50 GB/s per GPU).",
            90,
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "run", nargs="?", help="a verl launch script (.sh), a verl YAML config or a NeMo RL YAML config"
    )
    parser.add_argument(
        "--versions",
        action="store_true",
        help="print which verl / NeMo RL / Megatron Core / Megatron-Bridge versions go together, and exit",
    )
    parser.add_argument("--params", help="model size, e.g. 7e9 or 7B (default: from the model's name)")
    parser.add_argument(
        "--dtype",
        choices=sorted(refit_cost.DTYPE_BYTES),
        help="bytes per weight (default: bf16; NeMo RL: policy.precision)",
    )
    args = parser.parse_args(argv)
    if args.versions:
        print("\n".join(versions()))
        return 0
    if args.run is None:
        parser.error("the following arguments are required: run")
    try:
        params, size_from = None, ""
        if args.params is not None:
            params, size_from = report.params_from_flag(args.params), " (--params)"
        lines = build(args.run, params, args.dtype, size_from)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except Exception as err:  # noqa: BLE001 -- a reader's gap, not the input's fault
        # still one line and exit 2, never a traceback; WEIGHT_SYNC_DEBUG=1 shows where it broke
        if os.environ.get("WEIGHT_SYNC_DEBUG"):
            traceback.print_exc()
        print(
            f"error: {args.run}: this command could not read it ({type(err).__name__}: {err}); "
            "WEIGHT_SYNC_DEBUG=1 prints the traceback",
            file=sys.stderr,
        )
        return 2
    try:
        print("\n".join(report.wrap(line) for line in lines))
        sys.stdout.flush()
    except BrokenPipeError:  # `weight-sync run.sh | head`: the reader stopped reading, not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
