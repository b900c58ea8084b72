"""nanolm.plan: the course's planning numbers (week 14) as dicts, the option mapping against the
CLI's --json, and errors."""
import pytest

from conftest import cli_json

import nanolm
from nanolm import plan

GIB = 2.0 ** 30


def test_budget_zero_stages_of_the_course():
    """7B, mixed precision, 4 GPUs: DDP 16 bytes/param (112 GB), ZeRO-1 7 (49 GB), ZeRO-2 5.5
    (38.5 GB), ZeRO-3 4 (28 GB)."""
    b = plan.budget(params=7e9, gpus=4)
    got = {s["stage"]: (s["bytes_per_param"], s["bytes_per_gpu"] / 1e9) for s in b["stages"]}
    assert got["ddp"] == (16, 112) and got["zero1"] == (7, 49)
    assert got["zero2"] == (5.5, 38.5) and got["zero3"] == (4, 28)
    assert [s["fits"] for s in b["stages"]] == [False, True, True, True]  # 80 GB H100


def test_budget_activations_of_the_course():
    """Llama-3-8B at batch 8 x 8192 with flash attention: the planner counts 34 bytes per hidden unit
    per token per layer as Korthikanti et al. do, 272 GiB (the course's 384 GiB also keeps
    sigmoid(gate), SiLU(gate) and a second copy of the norm inputs; see tests/test_plan_budget.c)."""
    a = plan.budget(model="llama-3-8b", batch=8, seq=8192)["activations"]
    assert a["tokens"] == 65536
    assert round(a["bytes"] / GIB) == 272
    assert round(a["korthikanti_flash_bytes"] / GIB) == 272


def test_plan_serve_course_numbers():
    """Llama-3-8B, B = 32, context 8k: decode step 15.1 ms on one GPU, 7.5 ms on two (before
    communication); a 2,000-token prompt 3.1e13 FLOPs, about 63 ms at 50% MFU (the planner adds
    kernel launches to the course's napkin)."""
    one = plan.plan_serve("llama-3-8b", batch=32, context=8192)
    two = plan.plan_serve("llama-3-8b", batch=32, context=8192, tp=2)
    assert round(one["decode_step_s"] * 1e3, 1) == 15.1
    assert round(two["decode_step_s"] * 1e3, 1) == 7.5
    assert two["decode_step_total_s"] > two["decode_step_s"]  # 64 all-reduces a step
    assert round(one["prefill_flops"] / 1e13, 1) == 3.1
    half = plan.plan_serve("llama-3-8b", batch=32, context=8192, prefill_mfu=0.5)
    assert 63 <= half["prefill_s"] * 1e3 < 70
    assert one["fits"] is True


def test_plan_train_7b_on_8_h100():
    """The interview question: 7B-class on 8 x H100 needs sharded state (DDP does not fit)."""
    r = plan.plan_train("llama-3-8b", 8, top=3)
    assert r["gpus"] == 8 and r["layouts_fit"] > 0 and len(r["ranked"]) == 3
    assert r["ranked"][0]["zero"] != "ddp" or r["ranked"][0]["tp"] * r["ranked"][0]["pp"] > 1
    assert all(e["fits"] for e in r["ranked"])
    assert "explanation" in r


def test_options_map_to_the_cli():
    """Keyword arguments become the command's options: the same dict as the CLI run by hand (the
    search's own wall time aside)."""
    got = plan.plan_train("llama-3-8b", 64, global_batch=512, tokens=1e12, top=2, napkin=True, zero=3)
    want = cli_json("plan", "train", "--model", "llama-3-8b", "--gpus", 64, "--global-batch", 512,
                    "--tokens", "1e12", "--top", 2, "--napkin", "--zero", 3)
    got.pop("search_s"), want.pop("search_s")
    assert got == want
    assert all(e["zero"] == "zero3" for e in got["ranked"])
    assert plan.plan_layer("llama-3-8b", tp=8, sp=True) == cli_json("plan", "layer", "--model", "llama-3-8b",
                                                                     "--tp", 8, "--sp")
    names = [m["name"] for m in plan.catalog()["models"]]
    assert "llama-3-8b" in names


def test_errors_are_value_errors_with_the_cli_message():
    with pytest.raises(ValueError, match="llama-3-8b") as e:  # the message lists the known models
        plan.plan_serve("llama-9")
    assert isinstance(e.value, nanolm.Error)
    with pytest.raises(ValueError, match="--tp"):
        plan.budget(model="llama-3-8b", tp=3)
    with pytest.raises(ValueError, match="no-such-option"):
        plan.budget(model="llama-3-8b", no_such_option=1)
