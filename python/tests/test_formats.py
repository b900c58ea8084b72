"""nanolm.formats: the course's numbers, the CLI's `formats cast`, PyTorch's bf16/fp16 codes."""
import numpy as np
import pytest

from conftest import ROOT, cli_json, torch_or_skip

import nanolm
from nanolm import formats


def test_course_numbers():
    assert formats.cast([257.0], "bf16")[0] == 256.0      # 8 significant bits: neighbours 256, 258
    assert formats.cast([257.0], "fp16")[0] == 257.0
    assert formats.cast([70000.0], "fp16")[0] == np.inf   # beyond fp16's 65504
    assert formats.cast([1e-8], "fp16")[0] == 0.0         # below fp16's smallest subnormal / 2
    assert formats.cast([70000.0], "bf16")[0] == 70144.0  # bf16 has fp32's range
    assert formats.cast([1e-8], "bf16")[0] != 0.0
    assert formats.cast([64.0 + 3.0], "e4m3")[0] == 64.0  # spacing 8 between 64 and 128
    assert formats.info("e4m3")["max_finite"] == 448.0
    assert formats.info("e5m2")["max_finite"] == 57344.0


def test_course_accumulation_in_e4m3():
    """100 threes summed with the sum rounded to E4M3 after each step stop at 64."""
    s = np.float32(0)
    for _ in range(100):
        s = formats.cast([s + 3], "e4m3")[0]
    assert s == 64.0


@pytest.mark.parametrize("value,fmt,rounding,overflow", [
    (257, "bf16", "rne", "default"), (0.1, "e4m3", "rne", "default"), (0.1, "e4m3", "rtz", "default"),
    (-2.5, "int4", "away", "default"), (1000, "e4m3", "rne", "saturate"), (1e6, "fp16", "rne", "saturate"),
    (1e6, "fp16", "rtz", "ieee"), (3.3, "e2m1", "stochastic", "default"), (0.3, "e5m2", "stochastic", "default"),
])
def test_matches_cli_formats_cast(value, fmt, rounding, overflow):
    d = cli_json("formats", "cast", value, "--to", fmt, "--rounding", rounding, "--overflow", overflow, "--seed", 7)
    got = formats.cast([value], fmt, rounding=rounding, overflow=overflow, seed=7)[0]
    want = {"inf": np.inf, "-inf": -np.inf}.get(d["decoded"], d["decoded"])
    assert got == np.float32(want), (got, d)
    assert formats.encode([value], fmt)[0] == d["code"] or rounding != "rne" or overflow != "default"


def test_encode_decode_round_trip_every_format():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(2000) * np.exp(rng.uniform(-8, 8, 2000))).astype(np.float32)
    for fmt in formats.names():
        if fmt == "e8m0":
            xs = np.abs(x) + np.float32(1e-30)
        else:
            xs = x
        c = formats.encode(xs, fmt)
        assert c.shape == xs.shape
        np.testing.assert_array_equal(formats.decode(c, fmt), formats.cast(xs, fmt), err_msg=fmt)


def test_shapes_dtypes_and_copy_rule():
    x = np.arange(12, dtype=np.float64).reshape(3, 4) / 7
    y = formats.cast(x, "bf16")
    assert y.shape == (3, 4) and y.dtype == np.float32
    x32 = x.astype(np.float32)
    formats.cast(x32, "bf16")
    assert np.array_equal(x32, (np.arange(12, dtype=np.float32).reshape(3, 4) / 7))  # input untouched
    assert formats.encode(x, "bf16").dtype == np.uint16
    assert formats.encode(x, "e4m3").dtype == np.uint8
    assert formats.encode(x, "tf32").dtype == np.uint32


def test_errors():
    with pytest.raises(ValueError, match="bf16"):  # the message lists the known names
        formats.cast([1.0], "bf17")
    with pytest.raises(ValueError, match="rounding"):
        formats.cast([1.0], "bf16", rounding="up")
    with pytest.raises(nanolm.InvalidError, match=r"x\[1\]"):
        formats.cast([1.0, np.nan], "int8", rounding="rtz")
    assert np.isnan(formats.cast([np.nan], "int8")[0])  # rne/default keeps NaN for every format
    with pytest.raises(TypeError):
        formats.decode([1.5], "bf16")


def test_bf16_fp16_codes_match_pytorch_fixture():
    """Codes of 100,000 special and random values against PyTorch's tensor.to(bfloat16/float16)
    (tests/ref/formats_torch.bin by tests/ref/make_formats_fixture.py). NaN: PyTorch 1.13 writes
    0xFFFF for every bf16 NaN; nanolm keeps the sign, so there both must only be NaN codes."""
    raw = (ROOT / "tests/ref/formats_torch.bin").read_bytes()
    assert raw[:8] == b"NLFMTFX1"
    n = int(np.frombuffer(raw, "<u4", 1, 8)[0])
    x = np.frombuffer(raw, "<u4", n, 12).view(np.float32)
    tbf = np.frombuffer(raw, "<u2", n, 12 + 4 * n)
    tfp = np.frombuffer(raw, "<u2", n, 12 + 6 * n)
    bf, fp = formats.encode(x, "bf16"), formats.encode(x, "fp16")
    nan = np.isnan(x)
    np.testing.assert_array_equal(bf[~nan], tbf[~nan])
    assert ((bf[nan] & 0x7F80) == 0x7F80).all() and ((bf[nan] & 0x7F) != 0).all()
    np.testing.assert_array_equal(fp, tfp)


def test_matches_torch_to_bfloat16_and_half():
    torch = torch_or_skip()
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(50000) * np.exp(rng.uniform(-20, 12, 50000))).astype(np.float32)
    t = torch.from_numpy(x)
    np.testing.assert_array_equal(formats.cast(x, "bf16"), t.to(torch.bfloat16).float().numpy())
    np.testing.assert_array_equal(formats.cast(x, "fp16"), t.to(torch.float16).float().numpy())
    np.testing.assert_array_equal(formats.cast(t, "fp16"), t.to(torch.float16).float().numpy())  # torch in
