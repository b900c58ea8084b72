"""nanolm.plan: the planner's answers as dicts, the same data as the CLI's --json.

    budget(model="llama3-8b", gpus=8, batch=8, seq=8192)            nanolm budget ... --json
    plan_train(model="llama3-8b", gpus=8, tokens=15e12)             nanolm plan train ... --json
    plan_serve(model="llama3-8b", tp=2, batch=32, prompt=2000)      nanolm plan serve ... --json
    plan_layer(...), catalog()                                      nanolm plan layer / catalog

Keyword arguments are the command's options: `global_batch=512` is --global-batch 512, `sp=True`
is --sp, False or None leaves an option out. The --json writers of these commands live in the CLI
(src/cli/cmd_budget.c, cmd_plan.c), not in the library, so this module runs the `nanolm` program
that belongs to the library it loaded (its build folder or PREFIX/bin, or $NANOLM_BIN) and parses
its JSON: one source for the numbers, nothing computed here. A bad option or value raises
ValueError with the CLI's message.
"""
import json
import os
import shutil
import subprocess
from pathlib import Path

from . import _lib


def _binary():
    env = os.environ.get("NANOLM_BIN")
    if env:
        return env
    libdir = Path(_lib.path).resolve().parent if os.path.sep in _lib.path else None
    if libdir is not None:
        for p in (libdir / "nanolm", libdir.parent / "bin" / "nanolm", libdir.parent.parent / "bin" / "nanolm"):
            if p.is_file() and os.access(p, os.X_OK):
                return str(p)
    found = shutil.which("nanolm")
    if found:
        return found
    raise OSError("nanolm.plan: the nanolm program was not found next to " + _lib.path +
                  " nor on PATH; set NANOLM_BIN=/path/to/nanolm")


def _args(options):
    out = []
    for k, v in options.items():
        if v is None or v is False:
            continue
        flag = "--" + k.replace("_", "-")
        if v is True:
            out.append(flag)
        else:
            out += [flag, repr(v) if isinstance(v, float) else str(v)]
    return out


def run_json(*command, **options):
    """Runs `nanolm COMMAND... --OPTIONS --json` and returns its JSON as Python objects."""
    argv = [_binary(), *command, *_args(options), "--json"]
    p = subprocess.run(argv, capture_output=True, text=True)
    if p.returncode != 0:
        msg = p.stderr.strip().splitlines()
        msg = msg[0] if msg else f"exit status {p.returncode}"
        if msg.startswith("nanolm: "):
            msg = msg[len("nanolm: "):]
        if p.returncode == 2:
            raise _lib.InvalidError(msg, 1, "invalid argument")
        raise _lib.Error(msg, p.returncode, "failed")
    return json.loads(p.stdout)


def budget(model=None, **options):
    """Training state per GPU by ZeRO stage and the activations kept for backward (nanolm budget).
    Give model= (a catalog name or a JSON file) or params= (a count such as 7e9 or "7B")."""
    return run_json("budget", model=model, **options)


def plan_train(model, gpus, **options):
    """Every parallel layout of `gpus` GPUs ranked by step time, with memory, time and cost
    (nanolm plan train). Options: gpu, tokens, global_batch, seq, recipe, params, top, napkin, mfu,
    dp/tp/pp/cp/ep/micro_batch/zero/recompute to fix a part of the layout, ..."""
    return run_json("plan", "train", model=model, gpus=gpus, **options)


def plan_serve(model, **options):
    """Prefill, decode, TTFT/TPOT, chunked prefill and disaggregation numbers (nanolm plan serve).
    Options: gpu, tp, prompt, output, batch, context, chunk, prefill_mfu."""
    return run_json("plan", "serve", model=model, **options)


def plan_layer(model, **options):
    """The collectives of one transformer layer under a layout (nanolm plan layer)."""
    return run_json("plan", "layer", model=model, **options)


def catalog(**options):
    """The built-in GPUs and models (nanolm plan catalog)."""
    return run_json("plan", "catalog", **options)
