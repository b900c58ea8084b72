/* The error of the emulated FP8 GEMM against fp64 on random operands, per scaling and
 * accumulator (nanolm/fp8_study.h): operands from a seed, the delayed-scaling history, the
 * fp64 references and the sweep over K. */
#include <math.h>
#include <stdio.h>

#include "nanolm/fp8_study.h"
#include "nanolm/svg.h"

static void fill(float *x, int64_t n, nl_fp8_dist dist, nl_rng *r) {
    for (int64_t i = 0; i < n; i++)
        x[i] = dist == NL_FP8_DIST_SYMMETRIC ? 2.0f * nl_rng_float(r) - 1.0f
               : dist == NL_FP8_DIST_UNIFORM ? nl_rng_float(r)
                                             : (float)nl_rng_normal(r);
}

/* A (M, K) and B (K, N) for a seed, with the outlier (nanolm/fp8_study.h) when asked. */
static void make_operands(const nl_fp8_study_cfg *c, int64_t K, uint64_t seed, int with_outlier, float *A, float *B) {
    nl_rng r;
    nl_rng_seed(&r, seed);
    fill(A, c->M * K, c->dist, &r);
    fill(B, K * c->N, c->dist, &r);
    if (with_outlier && c->outlier_col >= 0 && c->outlier_col < K) {
        for (int64_t i = 0; i < c->M; i++) A[i * K + c->outlier_col] *= (float)c->outlier_factor;
        for (int64_t j = 0; j < c->N; j++) B[c->outlier_col * c->N + j] /= (float)c->outlier_factor;
    }
}

/* Scratch of one setting: the dequantized operands, C and the fp64 product of the FP8 operands. */
typedef struct scratch {
    float *Ad, *Bd, *C;
    double *refq;
} scratch;

static void scratch_free(scratch *s) {
    nl_free(s->Ad);
    nl_free(s->Bd);
    nl_free(s->C);
    nl_free(s->refq);
}

static nl_status scratch_alloc(int64_t M, int64_t N, int64_t K, scratch *s) {
    s->Ad = nl_malloc((size_t)(M * K) * sizeof(float), "dequantized A");
    s->Bd = nl_malloc((size_t)(K * N) * sizeof(float), "dequantized B");
    s->C = nl_malloc((size_t)(M * N) * sizeof(float), "C");
    s->refq = nl_malloc((size_t)(M * N) * sizeof(double), "reference of the FP8 operands");
    if (s->Ad && s->Bd && s->C && s->refq) return NL_OK;
    scratch_free(s);
    return NL_ERR_NOMEM;
}

/* Delayed scaling's history: previous steps of the same distribution, without the outlier. */
static nl_status record_history(const nl_fp8_study_cfg *c, int64_t K, nl_fp8_delayed *da, nl_fp8_delayed *db,
                                scratch *s) {
    NL_TRY(nl_fp8_delayed_init(da, c->history, 0));
    NL_TRY(nl_fp8_delayed_init(db, c->history, 0));
    for (int h = 0; h < c->history; h++) {
        make_operands(c, K, c->seed + 1000 + (uint64_t)h, 0, s->Ad, s->Bd);
        NL_TRY(nl_fp8_quantize(c->fmt, NL_FP8_SCALE_DELAYED, da, c->M, K, 1, s->Ad, s->Ad, NULL));
        NL_TRY(nl_fp8_quantize(c->fmt, NL_FP8_SCALE_DELAYED, db, K, c->N, 0, s->Bd, s->Bd, NULL));
    }
    return NL_OK;
}

/* One setting on A, B (K inner) against the fp64 reference `ref` (M, N), in scratch s. */
static nl_status run_setting(const nl_fp8_study_cfg *c, int64_t K, const float *A, const float *B, const double *ref,
                             scratch *s, nl_fp8_study_row *row) {
    const int64_t M = c->M, N = c->N;
    row->skipped = 0;
    if (row->scaling == NL_FP8_SCALE_BLOCK && row->acc.bits &&
        (row->acc.promote == 0 || NL_FP8_BLOCK % row->acc.promote)) {
        row->skipped = 1;
        return NL_OK;
    }
    nl_fp8_gemm_opts o;
    nl_fp8_gemm_opts_default(&o);
    o.fmt_a = o.fmt_b = c->fmt;
    o.scaling = row->scaling;
    o.acc = row->acc;
    nl_fp8_delayed da, db, da2, db2;
    if (row->scaling == NL_FP8_SCALE_DELAYED) {
        NL_TRY(record_history(c, K, &da, &db, s));
        da2 = da;
        db2 = db;
        o.delayed_a = &da;
        o.delayed_b = &db;
    }
    NL_TRY(nl_fp8_quantize(c->fmt, row->scaling, &da2, M, K, 1, A, s->Ad, NULL));
    NL_TRY(nl_fp8_quantize(c->fmt, row->scaling, &db2, K, N, 0, B, s->Bd, NULL));
    NL_TRY(nl_fp8_gemm(&o, M, N, K, A, B, s->C, &row->st));
    nl_fp8_gemm_ref_f64(M, N, K, s->Ad, s->Bd, s->refq);
    nl_fp8_rel_error(M * N, s->C, s->refq, &row->acc_max, &row->acc_fro);
    nl_fp8_rel_error(M * N, s->C, ref, &row->tot_max, &row->tot_fro);
    return NL_OK;
}

nl_status nl_fp8_study_run(const nl_fp8_study_cfg *c, int64_t K, nl_fp8_study_row *rows, int n) {
    float *A = nl_malloc((size_t)(c->M * K) * sizeof(float), "A");
    float *B = nl_malloc((size_t)(K * c->N) * sizeof(float), "B");
    double *ref = nl_malloc((size_t)(c->M * c->N) * sizeof(double), "reference");
    scratch s = {0};
    nl_status st = A && B && ref ? scratch_alloc(c->M, c->N, K, &s) : NL_ERR_NOMEM;
    if (!st) {
        make_operands(c, K, c->seed, 1, A, B);
        nl_fp8_gemm_ref_f64(c->M, c->N, K, A, B, ref);
    }
    for (int i = 0; !st && i < n; i++) st = run_setting(c, K, A, B, ref, &s, &rows[i]);
    scratch_free(&s);
    nl_free(A);
    nl_free(B);
    nl_free(ref);
    return st;
}

nl_status nl_fp8_study_sweep_k(const nl_fp8_study_cfg *c, nl_fp8_scaling sc, const nl_fp8_acc *accs, int naccs,
                               nl_fp8_k_sweep *out) {
    if (naccs < 1 || naccs > 3) return nl_fail(NL_ERR_INVALID, "fp8 study: %d accumulators (1..3)", naccs);
    out->nk = 0;
    for (int64_t k = 128; k <= c->K && out->nk < 32; k *= 2) out->k[out->nk++] = (double)k;
    if (out->nk == 0) return nl_fail(NL_ERR_INVALID, "fp8 study: a sweep over K needs K >= 128");
    for (int ki = 0; ki < out->nk; ki++) {
        nl_fp8_study_row rows[3];
        for (int a = 0; a < naccs; a++) rows[a] = (nl_fp8_study_row){.scaling = sc, .acc = accs[a]};
        NL_TRY(nl_fp8_study_run(c, (int64_t)out->k[ki], rows, naccs));
        for (int a = 0; a < naccs; a++) {
            out->skipped[a] = rows[a].skipped;
            out->err[a][ki] = rows[a].skipped ? NAN : rows[a].acc_max;
        }
    }
    return NL_OK;
}

int nl_fp8_study_accs(int bits, int group, int promote, nl_fp8_acc accs[3]) {
    accs[0] = (nl_fp8_acc){0, group, 0, NL_FP8_ACC_TRUNCATE};
    accs[1] = (nl_fp8_acc){bits, group, 0, NL_FP8_ACC_TRUNCATE};
    accs[2] = (nl_fp8_acc){bits, group, promote, NL_FP8_ACC_TRUNCATE};
    return promote > 0 ? 3 : 2;
}

nl_status nl_fp8_study_sweep_svg(const char *path, const nl_fp8_study_cfg *c, nl_fp8_scaling sc, const nl_fp8_acc *accs,
                                 int naccs, const nl_fp8_k_sweep *sw) {
    nl_svg_series ser[3];
    char names[3][64], title[160];
    int ns = 0;
    for (int a = 0; a < naccs && a < 3; a++)
        if (!sw->skipped[a])
            ser[ns++] = (nl_svg_series){.name = nl_fp8_acc_name(&accs[a], names[a], sizeof names[a]),
                                        .x = sw->k,
                                        .y = sw->err[a],
                                        .n = (size_t)sw->nk,
                                        .markers = 1};
    snprintf(title, sizeof title, "FP8 GEMM accumulation error vs K (%s, %s scaling, %lldx%lld)", nl_fmt_name(c->fmt),
             nl_fp8_scaling_name(sc), (long long)c->M, (long long)c->N);
    nl_svg_plot_opts po = {
        .title = title, .xlabel = "K (products per output)", .ylabel = "max |C - R| / max |R|", .logx = 1, .logy = 1};
    return nl_svg_plot(path, &po, ser, (size_t)ns);
}
