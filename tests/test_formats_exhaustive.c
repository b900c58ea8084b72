/*
 * Exhaustive check of the bulk conversion (nl_fmt_encode_array_kernel with every kernel this
 * CPU can run, the one nl_fmt_encode_array dispatches to among them) for every one of the
 * 2^32 fp32 bit patterns, into bf16, fp16, E4M3, E5M2, E3M2, E2M3 and E2M1, against an
 * independent reference. The scalar reference nl_fmt_encode is checked against the same table
 * on a strided sample (every 4099th pattern, about a million per format).
 *
 * The reference shares no code with the library's rounding: from the format's definition
 * (E, M, bias, which codes are inf/NaN) it enumerates every representable non-negative value
 * into a sorted table (value, code). Round-to-nearest, ties to the even code, is then: x goes
 * to table entry i when it lies between the midpoints (v[i-1]+v[i])/2 and (v[i]+v[i+1])/2, a
 * midpoint itself going to whichever of the two codes is even. Because non-negative fp32
 * values are monotone in their bit patterns, each table entry owns one contiguous range of
 * patterns; the reference finds each range's first pattern by binary search over patterns
 * against the exact midpoint (in double), and the check then compares the bulk output of each
 * range with that entry's code. Negative patterns expect the same code with the sign bit set.
 *
 * Overflow policy tested (the bulk API's default): FP8 and MX formats saturate, so every
 * pattern above the largest finite value, +-inf included, expects +-max finite. fp16 and bf16
 * are IEEE: the table gets one more entry, the value 2^(emax+1) the exponent range would hold
 * next, with the inf code; so x >= max + ulp/2 (the midpoint, a tie that goes to the even inf
 * code) and inf expect inf, as IEEE 754 specifies.
 * NaN patterns: formats with NaN must give a NaN code (by the format's definition: exponent
 * all ones and mantissa non-zero; E4M3 only S.1111.111) with the input's sign; formats
 * without NaN must make nl_fmt_encode_array fail.
 */
#include "testutil.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/base.h"
#include "nanolm/formats.h"

typedef struct spec {
    nl_format f;
    const char *name;
    int E, M, B, bits;
    int ieee_specials; /* exponent all ones = inf (mantissa 0) / NaN */
    int e4m3_nan;      /* only magnitude all ones is NaN, no inf */
    int has_nan;
    int saturate; /* default overflow of the bulk API */
} spec;

static const spec SPECS[] = {
    {NL_FMT_BF16, "bf16", 8, 7, 127, 16, 1, 0, 1, 0}, {NL_FMT_FP16, "fp16", 5, 10, 15, 16, 1, 0, 1, 0},
    {NL_FMT_E4M3, "e4m3", 4, 3, 7, 8, 0, 1, 1, 1},    {NL_FMT_E5M2, "e5m2", 5, 2, 15, 8, 1, 0, 1, 1},
    {NL_FMT_E3M2, "e3m2", 3, 2, 3, 6, 0, 0, 0, 1},    {NL_FMT_E2M3, "e2m3", 2, 3, 1, 6, 0, 0, 0, 1},
    {NL_FMT_E2M1, "e2m1", 2, 1, 1, 4, 0, 0, 0, 1},
};

typedef struct table {
    int n;           /* entries */
    double *v;       /* sorted values */
    uint32_t *code;  /* their codes */
    uint32_t *start; /* start[i]: first non-negative fp32 pattern that maps to entry i; start[n] = 0x7F800001 */
} table;

static double pat2d(uint32_t p) {
    float x;
    memcpy(&x, &p, 4);
    return (double)x;
}

static int ref_is_nan_code(const spec *s, uint32_t mag) {
    if (s->e4m3_nan) return mag == (1u << (s->bits - 1)) - 1;
    if (s->ieee_specials) return (mag >> s->M) == (1u << s->E) - 1 && (mag & ((1u << s->M) - 1)) != 0;
    return 0;
}

static void build_table(const spec *s, table *t) {
    uint32_t ncodes = 1u << (s->bits - 1);
    t->v = malloc((ncodes + 1) * sizeof(double));
    t->code = malloc((ncodes + 1) * sizeof(uint32_t));
    t->start = malloc((ncodes + 2) * sizeof(uint32_t));
    t->n = 0;
    for (uint32_t c = 0; c < ncodes; c++) {
        uint32_t e = c >> s->M, m = c & ((1u << s->M) - 1);
        if (s->ieee_specials && e == (1u << s->E) - 1) continue;
        if (s->e4m3_nan && c == ncodes - 1) continue;
        double v = e == 0 ? ldexp((double)m, 1 - s->B - s->M) : ldexp((double)((1u << s->M) + m), (int)e - s->B - s->M);
        t->v[t->n] = v;
        t->code[t->n] = c;
        t->n++;
    }
    if (!s->saturate) { /* IEEE: the next binade's first value stands for inf */
        int emax = (1 << s->E) - 2 - s->B;
        t->v[t->n] = ldexp(1.0, emax + 1);
        t->code[t->n] = ((1u << s->E) - 1) << s->M;
        t->n++;
    }
    for (int i = 1; i < t->n; i++) assert_true(t->v[i] > t->v[i - 1]);
    t->start[0] = 0;
    for (int i = 0; i + 1 < t->n; i++) {
        double mid = (t->v[i] + t->v[i + 1]) / 2; /* exact: few significant bits */
        int tie_up = (t->code[i + 1] & 1) == 0;
        /* first pattern p in [0, 0x7F800000] with x(p) > mid, or x(p) == mid when the tie goes up */
        uint32_t lo = 0, hi = 0x7F800000u;
        while (lo < hi) {
            uint32_t md = lo + (hi - lo) / 2;
            double x = pat2d(md);
            if (x > mid || (x == mid && tie_up))
                hi = md;
            else
                lo = md + 1;
        }
        t->start[i + 1] = lo;
    }
    t->start[t->n] = 0x7F800001u;
}

#define CHUNK_LOG 20
#define CHUNK     (1u << CHUNK_LOG)

typedef struct result {
    uint64_t mismatches;
    uint32_t first_pattern, first_got, first_want;
    int other_failures;
} result;

static void note_bad(result *r, uint32_t p, uint32_t got, uint32_t want) {
#pragma omp critical(exh_bad)
    {
        if (r->mismatches == 0 || p < r->first_pattern) {
            r->first_pattern = p;
            r->first_got = got;
            r->first_want = want;
        }
        r->mismatches++;
    }
}

static inline uint32_t get_code(const void *codes, int w, size_t i) {
    return w == 2 ? ((const uint16_t *)codes)[i] : ((const uint8_t *)codes)[i];
}

/* Compares codes[a..b) (patterns base+a..) against `want`; returns mismatches. */
static uint64_t cmp_run(const void *codes, int w, size_t a, size_t b, uint32_t want) {
    uint32_t bad = 0;
    if (w == 2) {
        const uint16_t *c = codes;
        for (size_t i = a; i < b; i++) bad |= c[i] ^ want;
    } else {
        const uint8_t *c = codes;
        for (size_t i = a; i < b; i++) bad |= c[i] ^ want;
    }
    if (!bad) return 0;
    uint64_t n = 0;
    for (size_t i = a; i < b; i++) n += get_code(codes, w, i) != want;
    return n;
}

static void check_chunk(const spec *s, nl_fmt_kernel kern, const table *t, uint32_t p0, float *x, void *codes,
                        result *r) {
    int w = s->bits > 8 ? 2 : 1;
    uint32_t sign = p0 >> 31, sbit = sign << (s->bits - 1);
    uint32_t q0 = p0 & 0x7FFFFFFFu; /* chunks never straddle the sign */
    for (uint32_t i = 0; i < CHUNK; i++) {
        uint32_t p = p0 + i;
        memcpy(&x[i], &p, 4);
    }
    int has_nan_in = q0 + CHUNK - 1 > 0x7F800000u;
    nl_status rc = nl_fmt_encode_array_kernel(s->f, kern, x, CHUNK, codes);
    if (has_nan_in && !s->has_nan) {
        /* must fail; then check the non-NaN head of the chunk (only +-inf at 0x7F800000) */
        if (rc != NL_ERR_INVALID) {
#pragma omp critical(exh_bad)
            r->other_failures++;
            return;
        }
        size_t head = q0 >= 0x7F800000u ? (q0 == 0x7F800000u ? 1 : 0) : 0x7F800001u - q0;
        if (head == 0) return;
        rc = nl_fmt_encode_array_kernel(s->f, kern, x, head, codes);
        if (rc != NL_OK) {
#pragma omp critical(exh_bad)
            r->other_failures++;
            return;
        }
        for (size_t i = 0; i < head; i++) {
            uint32_t q = q0 + (uint32_t)i;
            int j = t->n - 1;
            while (t->start[j] > q) j--;
            uint32_t want = t->code[j] | sbit, got = get_code(codes, w, i);
            if (got != want) note_bad(r, p0 + (uint32_t)i, got, want);
        }
        return;
    }
    if (rc != NL_OK) {
#pragma omp critical(exh_bad)
        r->other_failures++;
        return;
    }
    /* find the table entry of the chunk's first pattern */
    size_t i = 0;
    if (q0 <= 0x7F800000u) {
        int lo = 0, hi = t->n - 1; /* last j with start[j] <= q0 */
        while (lo < hi) {
            int md = (lo + hi + 1) / 2;
            if (t->start[md] <= q0)
                lo = md;
            else
                hi = md - 1;
        }
        for (int j = lo; j < t->n && i < CHUNK; j++) {
            uint64_t end = t->start[j + 1] - (uint64_t)q0; /* exclusive, relative to chunk */
            size_t b = end < CHUNK ? (size_t)end : CHUNK;
            if (b <= i) continue;
            uint32_t want = t->code[j] | sbit;
            uint64_t bad = cmp_run(codes, w, i, b, want);
            if (bad) {
                for (size_t k = i; k < b; k++)
                    if (get_code(codes, w, k) != want) {
                        note_bad(r, p0 + (uint32_t)k, get_code(codes, w, k), want);
                        break;
                    }
#pragma omp critical(exh_bad)
                r->mismatches += bad - 1;
            }
            i = b;
        }
    }
    /* the rest are NaN patterns */
    for (; i < CHUNK; i++) {
        uint32_t got = get_code(codes, w, i);
        uint32_t mag = got & ((1u << (s->bits - 1)) - 1);
        if (!ref_is_nan_code(s, mag) || (got & sbit) != sbit || (got >> s->bits) != 0)
            note_bad(r, p0 + (uint32_t)i, got, 0xFFFFFFFFu);
    }
}

static void test_exhaustive(void **state) {
    (void)state;
    double t_all = nl_time_s();
    int threads = omp_get_max_threads();
    uint64_t total_bad = 0;
    int kernels_run = 0;
    for (size_t k = 0; k < sizeof SPECS / sizeof SPECS[0]; k++) {
        const spec *s = &SPECS[k];
        const nl_format_info *fi = nl_fmt_info(s->f);
        /* the spec here and the library agree on the basics, else the test means nothing */
        assert_int_equal(fi->bits, s->bits);
        assert_int_equal(fi->exp_bits, s->E);
        assert_int_equal(fi->man_bits, s->M);
        assert_int_equal(fi->bias, s->B);
        table t;
        build_table(s, &t);
        assert_true(t.v[s->saturate ? t.n - 1 : t.n - 2] == fi->max_finite);
        /* every kernel this CPU can run (the one nl_fmt_encode_array picks is among them) */
        for (int kk = NL_FMT_KERNEL_PORTABLE; kk < NL_FMT_KERNEL_COUNT; kk++) {
            nl_fmt_kernel kern = (nl_fmt_kernel)kk;
            if (!nl_fmt_kernel_available(s->f, kern)) continue;
            result r = {0};
            double t0 = nl_time_s();
            const uint32_t nchunks = (uint32_t)(((uint64_t)1 << 32) >> CHUNK_LOG);
#pragma omp parallel
            {
                float *x = nl_malloc(CHUNK * sizeof(float), "exhaustive inputs");
                void *codes = nl_malloc(CHUNK * 2, "exhaustive codes");
#pragma omp for schedule(dynamic, 4)
                for (uint32_t c = 0; c < nchunks; c++) check_chunk(s, kern, &t, c << CHUNK_LOG, x, codes, &r);
                nl_free(x);
                nl_free(codes);
            }
            double dt = nl_time_s() - t0;
            print_message("[  INFO    ] %-5s kernel %-10s%s: 2^32 patterns, %d table values, %llu mismatches, %.1f s "
                          "(%d threads)\n",
                          s->name, nl_fmt_kernel_name(kern), kern == nl_fmt_kernel_auto(s->f) ? " (auto)" : "       ",
                          t.n, (unsigned long long)r.mismatches, dt, threads);
            if (r.mismatches)
                print_error("%s/%s: first mismatch at fp32 0x%08X: got 0x%X want 0x%X (0xFFFFFFFF = a NaN code)\n",
                            s->name, nl_fmt_kernel_name(kern), r.first_pattern, r.first_got, r.first_want);
            total_bad += r.mismatches + (uint64_t)r.other_failures;
            kernels_run++;
        }
        /* the scalar reference nl_fmt_encode against the table too, on every 4099th pattern */
        uint64_t scalar_bad = 0, scalar_n = 0;
        for (uint64_t p = 0; p < ((uint64_t)1 << 32); p += 4099) {
            uint32_t q = (uint32_t)p & 0x7FFFFFFFu, sbit = (uint32_t)(p >> 31) << (s->bits - 1);
            float x;
            uint32_t pp = (uint32_t)p, got = 0;
            memcpy(&x, &pp, 4);
            nl_status rc = nl_fmt_encode(s->f, x, NL_ROUND_NEAREST_EVEN, NL_OVERFLOW_DEFAULT, 0, &got);
            scalar_n++;
            if (q > 0x7F800000u) {
                if (s->has_nan ? rc != NL_OK || !ref_is_nan_code(s, got & ~sbit) || (got & sbit) != sbit
                               : rc != NL_ERR_INVALID)
                    scalar_bad++;
                continue;
            }
            int j = 0, hi = t.n - 1;
            while (j < hi) {
                int md = (j + hi + 1) / 2;
                if (t.start[md] <= q)
                    j = md;
                else
                    hi = md - 1;
            }
            if (rc != NL_OK || got != (t.code[j] | sbit)) {
                if (scalar_bad++ == 0)
                    print_error("%s scalar: fp32 0x%08X got 0x%X want 0x%X\n", s->name, pp, got, t.code[j] | sbit);
            }
        }
        print_message("[  INFO    ] %-5s scalar nl_fmt_encode  : %llu strided patterns, %llu mismatches\n", s->name,
                      (unsigned long long)scalar_n, (unsigned long long)scalar_bad);
        total_bad += scalar_bad;
        free(t.v);
        free(t.code);
        free(t.start);
    }
    print_message("[  INFO    ] exhaustive total %.1f s, %d format x kernel pairs\n", nl_time_s() - t_all, kernels_run);
    assert_true(kernels_run >= 7);
    assert_int_equal(total_bad, 0);
}

/* The reference itself, on a few values the course states (so a broken reference can't pass). */
static void test_reference_table(void **state) {
    (void)state;
    table t;
    build_table(&SPECS[2], &t); /* e4m3 */
    assert_int_equal(t.n, 127);
    assert_true(t.v[t.n - 1] == 448.0);
    assert_true(t.v[1] == 0x1p-9);
    /* 400 lies between 384 (0x7C) and 416 (0x7D): a tie, goes to 0x7C */
    float f400 = 400.0f;
    uint32_t p400;
    memcpy(&p400, &f400, 4);
    int j = t.n - 1;
    while (t.start[j] > p400) j--;
    assert_int_equal(t.code[j], 0x7C);
    free(t.v);
    free(t.code);
    free(t.start);
    build_table(&SPECS[1], &t); /* fp16: 70000 -> inf entry, 65519 -> 0x7BFF, 65520 -> inf */
    float f = 65519.0f;
    uint32_t p;
    memcpy(&p, &f, 4);
    j = t.n - 1;
    while (t.start[j] > p) j--;
    assert_int_equal(t.code[j], 0x7BFF);
    f = 65520.0f;
    memcpy(&p, &f, 4);
    j = t.n - 1;
    while (t.start[j] > p) j--;
    assert_int_equal(t.code[j], 0x7C00);
    free(t.v);
    free(t.code);
    free(t.start);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference_table),
        cmocka_unit_test(test_exhaustive),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
