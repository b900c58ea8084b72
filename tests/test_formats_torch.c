/*
 * bf16 and fp16 codes of 100,000 random and special fp32 values agree bit for bit with
 * PyTorch (`tensor.to(torch.bfloat16)` / `tensor.to(torch.float16)`, Debian python3-torch
 * 1.13, CPU). The fixture tests/ref/formats_torch.bin is written by
 * tests/ref/make_formats_fixture.py; this test needs no Python.
 *
 * NaN: PyTorch 1.13's CPU bf16 conversion replaces every NaN by 0xFFFF (a negative quiet NaN,
 * whatever the input's sign and payload), while nanolm keeps the sign and writes the canonical
 * 0x7FC0 / 0xFFC0. So for NaN inputs the bf16 check is "both are NaN codes"; every other bf16
 * code, and every fp16 code including NaNs (PyTorch writes sign | 0x7E00 as nanolm does),
 * must match exactly.
 */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/formats.h"

static uint32_t rd32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint16_t rd16(const unsigned char *p) { return (uint16_t)(p[0] | p[1] << 8); }

static int bf16_is_nan(uint16_t c) { return (c & 0x7F80) == 0x7F80 && (c & 0x7F) != 0; }

static void test_torch_fixture(void **state) {
    (void)state;
    size_t bytes = 0;
    unsigned char *buf = (unsigned char *)tu_read_file(tu_src_path("tests/ref/formats_torch.bin"), &bytes);
    assert_non_null(buf);
    assert_true(bytes >= 12);
    assert_memory_equal(buf, "NLFMTFX1", 8);
    uint32_t n = rd32(buf + 8);
    assert_int_equal(n, 100000);
    assert_int_equal(bytes, 12 + (size_t)n * 8);
    const unsigned char *pin = buf + 12, *pbf = pin + (size_t)n * 4, *pfp = pbf + (size_t)n * 2;
    float *x = malloc(n * sizeof *x);
    uint16_t *bf = malloc(n * 2), *fp = malloc(n * 2);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t u = rd32(pin + 4 * i);
        memcpy(&x[i], &u, 4);
    }
    assert_int_equal(nl_fmt_encode_array(NL_FMT_BF16, x, n, bf), NL_OK);
    assert_int_equal(nl_fmt_encode_array(NL_FMT_FP16, x, n, fp), NL_OK);
    int bad = 0, nans = 0, subn = 0, ties = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint16_t tb = rd16(pbf + 2 * i), tf = rd16(pfp + 2 * i);
        uint32_t u = rd32(pin + 4 * i);
        if ((u & 0x7F800000u) == 0 && (u & 0x7FFFFF)) subn++;
        if ((u & 0xFFFF) == 0x8000) ties++;
        if (isnan(x[i])) {
            nans++;
            if (!bf16_is_nan(tb) || !bf16_is_nan(bf[i])) bad++;
        } else if (bf[i] != tb) {
            if (bad++ < 10) print_error("bf16: x=0x%08X torch 0x%04X nanolm 0x%04X\n", u, tb, bf[i]);
        }
        /* the scalar reference agrees too */
        uint32_t c;
        assert_int_equal(nl_fmt_encode(NL_FMT_FP16, x[i], NL_ROUND_NEAREST_EVEN, NL_OVERFLOW_DEFAULT, 0, &c), NL_OK);
        if (fp[i] != tf || c != tf) {
            if (bad++ < 10) print_error("fp16: x=0x%08X torch 0x%04X nanolm 0x%04X/0x%04X\n", u, tf, fp[i], c);
        }
    }
    print_message("[  INFO    ] %u values (%d NaN, %d fp32 subnormal, %d bf16 ties): %d differences\n", n, nans, subn,
                  ties, bad);
    assert_true(nans > 5 && subn > 10 && ties > 1000);
    assert_int_equal(bad, 0);
    free(x);
    free(bf);
    free(fp);
    free(buf);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_torch_fixture)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
