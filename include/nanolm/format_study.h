/*
 * nanolm format_study: two small studies of a number format (nanolm/formats.h) that
 * `nanolm formats cast` and `nanolm formats sum` print: one value through a format (its code,
 * the value it decodes to, the error and the format's neighbours), and a long sum of one value
 * rounded to the format after every addition (the sum stalls once the step is below half an ulp),
 * optionally promoted into an fp32 total every few additions.
 */
#ifndef NANOLM_FORMAT_STUDY_H
#define NANOLM_FORMAT_STUDY_H

#include "nanolm/formats.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One value through a format. */
typedef struct nl_fmt_cast_result {
    float x;                  /* the input as fp32 */
    uint32_t code;            /* its code in the format */
    double decoded;           /* the code's value */
    double abs_err, rel_err;  /* |decoded - x|, that over |x| (NaN / inf where meaningless) */
    double below, above, ulp; /* the format's neighbours of x and their spacing */
    char hex[16];             /* the code in hex, "0x4380" */
    char binary[128];         /* its bits: "0 | 10000111 | 0000000" (sign | exponent | mantissa), plain for int */
} nl_fmt_cast_result;

/* Encodes x (stochastic rounding draws from a generator seeded with seed). nl_fmt_encode's errors. */
nl_status nl_fmt_cast(nl_format f, float x, nl_rounding rnd, nl_overflow ovf, uint64_t seed, nl_fmt_cast_result *c);

/* A sum of count copies of v in format f. */
typedef struct nl_fmt_sum_result {
    float *traj;         /* (count) the sum after each step; malloc'd, free() it */
    float result;        /* the final sum */
    int64_t last_change; /* last step at which the (unpromoted) partial sum changed */
} nl_fmt_sum_result;

/* every > 0: the partial sum is added into an fp32 total and restarted every `every` steps.
 * NL_ERR_NOMEM naming count. */
nl_status nl_fmt_repeated_sum(nl_format f, float v, int64_t count, int64_t every, nl_fmt_sum_result *s);

#ifdef __cplusplus
}
#endif

#endif
