/* Numeric edge cases through the collectives (2, 3 and 4 ranks; ours and native; fp32 and
 * bf16): NaN, +-inf, inf - inf, -0, subnormals, sums that overflow, a sum that cancels to zero,
 * and lengths 0 and 1 (fewer elements than ranks). Each element's sum has one defined value
 * whatever the order of the additions, so every implementation must produce it. Verdicts are
 * agreed on by all ranks before they are asserted (no rank is left waiting in a collective). */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "nanolm/comm.h"
#include "testutil.h"

static nl_comm *W;
static int P, R;

static int agree(int ok) {
    double v = ok ? 0.0 : 1.0;
    if (nl_comm_max_double(W, &v)) return 0;
    return v == 0.0;
}

enum { E_NAN, E_INF, E_INF_MINUS_INF, E_NEG_ZERO, E_SUBNORMAL, E_OVERFLOW, E_CANCEL, E_ONE, N_E };
static const char *names[N_E] = {"NaN", "+inf", "inf-inf", "-0", "subnormal", "overflow", "cancel", "ones"};

/* Rank r's value of element e. */
static float value(int e, int r) {
    switch (e) {
    case E_NAN: return r == 0 ? NAN : 1.0f;
    case E_INF: return r == 0 ? INFINITY : 2.0f;
    case E_INF_MINUS_INF: return r == 0 ? INFINITY : r == 1 ? -INFINITY : 0.0f;
    case E_NEG_ZERO: return -0.0f;
    case E_SUBNORMAL: return ldexpf(1.0f, -130); /* subnormal in fp32 and in bf16 */
    case E_OVERFLOW: return FLT_MAX;
    case E_CANCEL: return r == 0 ? FLT_MAX : r == 1 ? -FLT_MAX : 0.0f;
    default: return 1.0f;
    }
}

/* Whether `got` is the order-independent sum of element e over P ranks (bf16: rounded). */
static int correct(int e, float got) {
    switch (e) {
    case E_NAN:
    case E_INF_MINUS_INF: return isnan(got);
    case E_INF: return isinf(got) && got > 0;
    case E_NEG_ZERO: return got == 0.0f;                    /* the sign of a zero sum is reported, not required */
    case E_SUBNORMAL: return got == ldexpf((float)P, -130); /* exact: P <= 4 */
    case E_OVERFLOW: return isinf(got) && got > 0;
    case E_CANCEL: return got == 0.0f;
    default: return got == (float)P;
    }
}

static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void test_special_values(void **state) {
    (void)state;
    int neg_zero_kept = 1, checked = 0;
    for (int impl = 0; impl < 2; impl++)
        for (int dt = 0; dt < 2; dt++) {
            float f[N_E];
            uint16_t h[N_E];
            for (int e = 0; e < N_E; e++) {
                f[e] = value(e, R);
                h[e] = to_bf16(f[e]);
            }
            /* bf16 cannot hold FLT_MAX (it rounds to inf): use its own largest finite value. */
            if (dt)
                for (int e = 0; e < N_E; e++)
                    if (fabsf(value(e, R)) == FLT_MAX) h[e] = value(e, R) > 0 ? 0x7f7f : 0xff7f;
            void *buf = dt ? (void *)h : (void *)f;
            nl_status rc = nl_comm_all_reduce(W, buf, N_E, dt ? NL_COMM_BF16 : NL_COMM_F32, (nl_comm_impl)impl);
            assert_true(agree(rc == NL_OK));
            for (int e = 0; e < N_E; e++) {
                float got = dt ? from_bf16(h[e]) : f[e];
                int ok = correct(e, got);
                if (!ok)
                    print_message("rank %d: all-reduce %s %s of %s gave %g\n", R, nl_comm_impl_name((nl_comm_impl)impl),
                                  dt ? "bf16" : "f32", names[e], (double)got);
                assert_true(agree(ok));
                if (e == E_NEG_ZERO && !signbit(got)) neg_zero_kept = 0;
                checked++;
            }
        }
    /* Reduce-scatter then all-gather of the same elements (each chunk summed by a different rank). */
    float f[N_E], out[N_E];
    for (int e = 0; e < N_E; e++) f[e] = value(e, R);
    float part[N_E];
    assert_true(agree(nl_comm_reduce_scatter(W, f, part, N_E, NL_COMM_F32, NL_COMM_OURS) == NL_OK));
    assert_true(agree(nl_comm_all_gather(W, part, out, N_E, NL_COMM_F32, NL_COMM_OURS) == NL_OK));
    for (int e = 0; e < N_E; e++) assert_true(agree(correct(e, out[e])));
    if (R == 0)
        print_message("%d ranks: %d (implementation, dtype, element) sums correct; -0 + ... + -0 gives %s\n", P,
                      checked, neg_zero_kept ? "-0 everywhere" : "+0 in some implementation");
}

static void test_lengths_0_and_1(void **state) {
    (void)state;
    for (int impl = 0; impl < 2; impl++) {
        float x = (float)(R + 1), dummy = 7.0f;
        /* n = 0: nothing to do, or a clear error; the same on every rank, and no hang. */
        nl_status rc = nl_comm_all_reduce(W, &dummy, 0, NL_COMM_F32, (nl_comm_impl)impl);
        assert_true(agree(rc == NL_OK || (rc == NL_ERR_INVALID && nl_last_error()[0])));
        assert_true(agree(dummy == 7.0f));
        /* n = 1 < ranks for the reduce-scatter: one rank owns the element, the others none. */
        float part = -1.0f, all = -1.0f;
        assert_true(agree(nl_comm_reduce_scatter(W, &x, &part, 1, NL_COMM_F32, (nl_comm_impl)impl) == NL_OK));
        if (nl_comm_chunk_count(1, P, R) == 1)
            assert_true(agree(part == (float)(P * (P + 1) / 2)));
        else
            assert_true(agree(1));
        assert_true(agree(nl_comm_all_gather(W, &part, &all, 1, NL_COMM_F32, (nl_comm_impl)impl) == NL_OK));
        assert_true(agree(all == (float)(P * (P + 1) / 2)));
        if (R == 0 && impl == 0) print_message("n = 0 all-reduce: %s\n", rc == NL_OK ? "no-op" : nl_last_error());
    }
}

int main(int argc, char **argv) {
    if (nl_comm_init(&argc, &argv) != NL_OK) {
        fprintf(stderr, "MPI init failed: %s\n", nl_last_error());
        return 1;
    }
    W = nl_comm_world();
    P = nl_comm_size(W);
    R = nl_comm_rank(W);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_special_values),
        cmocka_unit_test(test_lengths_0_and_1),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    nl_comm_finalize();
    return rc;
}
