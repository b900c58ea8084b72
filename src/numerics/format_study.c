/* Two small studies of a number format (nanolm/format_study.h): one value through it, and a long
 * sum rounded to it after every addition. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/format_study.h"

/* "0 | 10000111 | 0000000" for float formats, plain bits for int formats. */
static void code_binary(const nl_format_info *fi, uint32_t code, char *out, size_t n) {
    size_t k = 0;
    for (int b = fi->bits - 1; b >= 0 && k + 4 < n; b--) {
        out[k++] = (char)('0' + ((code >> b) & 1));
        if (fi->kind != NL_FMT_KIND_INT && b > 0) {
            int sign_end = fi->has_sign && b == fi->bits - 1;
            int exp_end = b == fi->man_bits && fi->man_bits > 0;
            if (sign_end || exp_end) {
                out[k++] = ' ';
                out[k++] = '|';
                out[k++] = ' ';
            }
        }
    }
    out[k] = '\0';
}

nl_status nl_fmt_cast(nl_format f, float x, nl_rounding rnd, nl_overflow ovf, uint64_t seed, nl_fmt_cast_result *c) {
    nl_rng rng;
    nl_rng_seed(&rng, seed);
    memset(c, 0, sizeof *c);
    c->x = x;
    nl_status st = nl_fmt_encode(f, x, rnd, ovf, nl_rng_u32(&rng), &c->code);
    if (st) return st;
    c->decoded = nl_fmt_decode(f, c->code);
    c->abs_err = fabs(c->decoded - (double)x);
    c->rel_err = x != 0 ? c->abs_err / fabs((double)x) : (c->decoded == 0 ? 0 : INFINITY);
    if (isnan(c->decoded) || isinf(c->decoded) || isinf(x)) {
        c->abs_err = (c->decoded == (double)x) ? 0 : (isnan(c->decoded) || x != x) ? NAN : INFINITY;
        c->rel_err = c->abs_err;
    }
    c->below = c->above = NAN;
    if (x == x) nl_fmt_neighbors(f, x, &c->below, &c->above);
    c->ulp = nl_fmt_ulp(f, x);
    const nl_format_info *fi = nl_fmt_info(f);
    snprintf(c->hex, sizeof c->hex, "0x%0*X", (fi->bits + 3) / 4, c->code);
    code_binary(fi, c->code, c->binary, sizeof c->binary);
    return NL_OK;
}

nl_status nl_fmt_repeated_sum(nl_format f, float v, int64_t count, int64_t every, nl_fmt_sum_result *s) {
    s->traj = malloc((size_t)count * sizeof *s->traj);
    if (!s->traj)
        return nl_fail(NL_ERR_NOMEM, "a sum of %lld values: out of memory for its trajectory", (long long)count);
    float partial = 0, acc = 0;
    s->last_change = 0;
    for (int64_t i = 1; i <= count; i++) {
        float before = partial;
        partial = nl_fmt_round(f, partial + v);
        if (partial != before) s->last_change = i;
        if (every && (i % every == 0 || i == count)) {
            acc += partial;
            partial = 0;
        }
        s->traj[i - 1] = every ? acc + partial : partial;
    }
    s->result = every ? acc : partial;
    return NL_OK;
}
