"""Shared helpers of the Python tests: the repository root, the CLI, the shared data.

ctest runs these with NANOLM_LIB (the libnanolm.so just built), NANOLM_BIN (the CLI), NANOLM_DATA
and NANOLM_IMPL set; run by hand from the repository root they find build/ themselves.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))


def cli_path():
    env = os.environ.get("NANOLM_BIN")
    if env:
        return env
    p = ROOT / "build" / "nanolm"
    return str(p) if p.exists() else None


def cli_json(*args, same_blas=False):
    """Runs the nanolm CLI with --json and returns its JSON (skips when there is no CLI).
    same_blas: on the OpenBLAS kernels of this process, for results compared to the digit (the CLI
    would otherwise name faster ones where OpenBLAS falls back to Prescott)."""
    exe = cli_path()
    if not exe:
        pytest.skip("the nanolm CLI was not found (set NANOLM_BIN or build build/nanolm)")
    env = None
    if same_blas:
        import nanolm
        env = dict(os.environ, OPENBLAS_CORETYPE=nanolm.blas_kernels())
    p = subprocess.run([exe, *map(str, args), "--json"], capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def data_path(rel):
    """A file of the shared data folder (NANOLM_DATA, default ../shared/data); skips when absent."""
    root = Path(os.environ.get("NANOLM_DATA") or ROOT.parent / "shared" / "data")
    p = root / rel
    if not p.exists():
        pytest.skip(f"{p} is not there (the shared data folder; set NANOLM_DATA)")
    return p


def torch_or_skip():
    try:
        import torch
    except ImportError:
        pytest.skip("PyTorch is not installed (Debian: scripts/setup-deps.sh torch; run with /usr/bin/python3)")
    return torch
