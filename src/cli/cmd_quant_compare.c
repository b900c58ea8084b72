/* nanolm quant-compare (also reachable as `nanolm quant compare`): RTN, GPTQ, AWQ, SmoothQuant,
 * W8A8 and LLM.int8() on one checkpoint, side by side: bytes, mean loss, delta vs fp32, time. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "cli_model.h"
#include "cli_opt.h"
#include "nanolm/quant_compare.h"
#include "report.h"

#define DEFAULT_SCHEMES                                                                                                \
    "rtn-int4-g32,gptq-int4-g32,awq-int4-g32,rtn-int3-g32,gptq-int3-g32,awq-int3-g32,"                                 \
    "rtn-int4-g128,gptq-int4-g128,awq-int4-g128,w8a8,smoothquant-w8a8,int8-outlier6"

typedef nl_qc_row qc_row;

/* The options of quant compare, as given. */
typedef struct qc_args {
    nl_model_args model;
    const char *data, *calib, *schemes, *svg;
    int64_t calib_n, eval_n, B, T;
    int json;
} qc_args;

static const char qc_summary[] =
    "Quantizes the checkpoint with each scheme (linear layers only) and prints bytes, mean loss on\n"
    "--data and its increase over fp32, and the quantization time. When --calib and --data are the\n"
    "same file, the first half (up to the first newline after the middle) calibrates and the\n"
    "second half is evaluated. Calibration uses the first --calib-tokens tokens in windows of --seq\n"
    "tokens. Schemes: fp32, rtn-intB-gG, gptq-intB-gG, awq-intB-gG (B 2..8, G 0 = per row), w8a8,\n"
    "smoothquant-w8a8[-aALPHA], int8-outlierT. Default: " DEFAULT_SCHEMES;

static int qc_parse(int argc, char **argv, qc_args *a) {
    memset(a, 0, sizeof *a);
    a->schemes = DEFAULT_SCHEMES;
    a->calib_n = 8192;
    a->B = 4;
    a->T = 256;
    nl_opt model[3];
    int nmodel = nl_cli_model_opts(model, &a->model, 0);
    nl_opt opts[] = {
        NL_OPT_STR("data", &a->data, "TEXT", "text the loss is measured on (required)"),
        NL_OPT_STR("calib", &a->calib, "TEXT", "calibration text (required; the same file: split in halves)"),
        NL_OPT_STR("schemes", &a->schemes, "S1,S2,...", "the schemes to compare (default: see above)"),
        NL_OPT_INT("calib-tokens", &a->calib_n, 1, 1 << 26, "N", "calibration tokens (default 8192)"),
        NL_OPT_INT("eval-tokens", &a->eval_n, 2, 9.2e18, "N", "evaluate only the first N tokens (default: all)"),
        NL_OPT_INT("batch", &a->B, 1, 4096, "B", "windows per forward pass (default 4)"),
        NL_OPT_INT("seq", &a->T, 1, 1 << 20, "T", "tokens per window (default 256, at most the model's)"),
        NL_OPT_STR("svg", &a->svg, "FILE", "bar chart of the loss increase per scheme"),
        NL_OPT_FLAG("json", &a->json, "print the result as JSON"),
    };
    nl_optgroup groups[] = {{"model", model, nmodel}, {"options", opts, NL_NOPTS(opts)}};
    nl_cmdspec spec = {"quant compare",
                       "nanolm quant compare --ckpt F --data TEXT --calib TEXT [--schemes S1,S2,...] [options]",
                       qc_summary,
                       groups,
                       2,
                       0};
    int rc = nl_cli_parse(&spec, argc, argv, NULL, NULL);
    if (rc) return rc;
    if (!a->model.ckpt || !a->data || !a->calib)
        return nl_cli_usage_error("quant compare: --ckpt F, --data TEXT and --calib TEXT are required");
    return 0;
}

/* The main table: the fp32 baseline, then one row per scheme. */
static void qc_report_table(nl_report *r, const char *title, const qc_row *rows, int n_rows, double base,
                            int64_t fp_bytes) {
    nl_report_table(r, "schemes", title, 15,
                    (const nl_report_col[]){{"scheme", "scheme", NULL},
                                            {"method", "method", NULL},
                                            {"weight_bits", "W bits", "%-.0f"},
                                            {"act_bits", "A bits", "%-.0f"},
                                            {"group", "", NULL},
                                            {NULL, "group", NULL},
                                            {"bytes", "bytes", "%-.0f"},
                                            {NULL, "vs fp32", NULL},
                                            {"mean_loss", "mean loss", "%-.4f"},
                                            {"delta_loss", "", NULL},
                                            {NULL, "Δloss", NULL},
                                            {NULL, "Δ%", NULL},
                                            {"quant_time_s", "", NULL},
                                            {NULL, "quant s", NULL},
                                            {"awq_alpha_mean", "", NULL}});
    nl_qm_scheme fp;
    nl_qm_parse("fp32", &fp);
    for (int i = -1; i < n_rows; i++) {
        const qc_row *q = i < 0 ? NULL : &rows[i];
        const nl_qm_scheme *sc = q ? &q->s : &fp;
        double loss = q ? q->loss : base, t = q ? q->time_s : 0;
        int64_t bytes = q ? q->bytes : fp_bytes;
        char grp[16], vs[32], dl[32], dp[32], ts[32];
        if (!q)
            snprintf(grp, sizeof grp, "-");
        else if (sc->act_bits == 8 || sc->group == 0)
            snprintf(grp, sizeof grp, "row");
        else
            snprintf(grp, sizeof grp, "%d", sc->group);
        snprintf(vs, sizeof vs, "%.2fx", (double)fp_bytes / bytes);
        snprintf(dl, sizeof dl, q ? "%+.4f" : "0", loss - base);
        snprintf(dp, sizeof dp, q ? "%+.2f" : "0", 100.0 * (loss - base) / base);
        snprintf(ts, sizeof ts, q ? "%.2f" : "0", t);
        nl_report_cell_str(r, sc->name);
        nl_report_cell_str(r, nl_qm_method_name(sc->method));
        nl_report_cell_int(r, q ? sc->bits : 32);
        nl_report_cell_int(r, q ? sc->act_bits : 32);
        nl_report_cell_int(r, sc->group);
        nl_report_cell_str(r, grp);
        nl_report_cell_int(r, (long long)bytes);
        nl_report_cell_str(r, vs);
        nl_report_cell_num(r, loss);
        nl_report_cell_num(r, loss - base);
        nl_report_cell_str(r, dl);
        nl_report_cell_str(r, dp);
        nl_report_cell_num(r, t);
        nl_report_cell_str(r, ts);
        if (q && sc->method == NL_QM_AWQ)
            nl_report_cell_num(r, q->awq_alpha);
        else
            nl_report_cell_str(r, NULL);
        nl_report_row_end(r);
    }
}

/* LLM.int8()'s outlier dimensions per layer and site: a table per scheme in the text form. */
static void qc_text_outliers(nl_report *r, const nl_model *m, const qc_row *q) {
    char title[300];
    snprintf(title, sizeof title,
             "%.128s: outlier feature dims (|x| > %g) per layer, calibration set / most in one eval batch:", q->s.name,
             q->s.param);
    nl_report_table(r, NULL, title, 5,
                    (const nl_report_col[]){{NULL, "layer", "%-.0f"},
                                            {NULL, "qkv", NULL},
                                            {NULL, "o", NULL},
                                            {NULL, "gate_up", NULL},
                                            {NULL, "down", NULL}});
    const int64_t in_dim[4] = {m->C, m->NH * m->hd, m->C, m->H};
    int total = 0;
    for (int l = 0; l < m->L; l++) {
        const int *co = q->calib_outliers + l * NL_QM_SITES, *eo = q->eval_outliers + l * NL_QM_SITES;
        nl_report_cell_int(r, l);
        for (int s = 0; s < NL_QM_SITES; s++) {
            char c[64];
            snprintf(c, sizeof c, "%d/%d of %lld", co[s], eo[s], (long long)in_dim[s]);
            nl_report_cell_str(r, c);
            total += co[s];
        }
        nl_report_row_end(r);
    }
    if (total == 0)
        nl_report_note(r, "(no outlier dimensions in this model at threshold %g: int8-outlier equals plain W8A8 here)",
                       q->s.param);
}

/* The same in the JSON: one row per layer and site under outlier_dims.<scheme>. */
static void qc_json_outliers(nl_report *r, const nl_model *m, const qc_row *q) {
    const int64_t in_dim[4] = {m->C, m->NH * m->hd, m->C, m->H};
    nl_report_table(r, q->s.name, NULL, 5,
                    (const nl_report_col[]){{"layer", "", NULL},
                                            {"site", "", NULL},
                                            {"in_dim", "", NULL},
                                            {"calib_outlier_dims", "", NULL},
                                            {"eval_max_outlier_dims", "", NULL}});
    for (int l = 0; l < m->L; l++)
        for (int s = 0; s < NL_QM_SITES; s++) {
            nl_report_cell_int(r, l);
            nl_report_cell_str(r, nl_qm_site_name(s));
            nl_report_cell_int(r, (long long)in_dim[s]);
            nl_report_cell_int(r, q->calib_outliers[l * NL_QM_SITES + s]);
            nl_report_cell_int(r, q->eval_outliers[l * NL_QM_SITES + s]);
            nl_report_row_end(r);
        }
}

static int qc_print(const qc_args *a, const nl_model *m, const qc_row *rows, int n_rows, double base, int64_t scored,
                    int64_t calib_tokens) {
    nl_qm_scheme fp;
    nl_qm_parse("fp32", &fp);
    int64_t fp_bytes = nl_qm_model_bytes(m, &fp);
    const int halves = !strcmp(a->data, a->calib);
    nl_report *r = nl_report_new("quant compare");
    nl_report_str(r, "checkpoint", "", a->model.ckpt);
    nl_report_str(r, "data", "", a->data);
    nl_report_str(r, "calib", "", a->calib);
    nl_report_bool(r, "split_halves", "", halves);
    nl_report_int(r, "eval_tokens", "", scored, NULL);
    nl_report_int(r, "calib_tokens", "", calib_tokens, NULL);
    nl_report_num(r, "fp32_loss", "", base, NULL, NULL);
    nl_report_int(r, "fp32_bytes", "", fp_bytes, NULL);
    char title[2048];
    snprintf(title, sizeof title,
             "%s: fp32 mean loss %.4f nats/token on %lld tokens of %s%s; calibration %lld tokens of %s%s",
             a->model.ckpt, base, (long long)scored, a->data, halves ? " (second half)" : "", (long long)calib_tokens,
             a->calib, halves ? " (first half)" : "");
    qc_report_table(r, title, rows, n_rows, base, fp_bytes);
    for (int i = 0; i < n_rows; i++)
        if (rows[i].s.method == NL_QM_AWQ)
            nl_report_note(r, "%s: mean chosen alpha %.3f over the AWQ sites%s", rows[i].s.name, rows[i].awq_alpha,
                           m->NH != m->KVH ? " (o_proj uses RTN: GQA leaves no exact fold into v_proj)" : "");
    int any = 0;
    for (int i = 0; i < n_rows; i++)
        if (rows[i].calib_outliers && rows[i].eval_outliers) qc_text_outliers(r, m, &rows[i]), any = 1;
    if (any) nl_report_begin_object(r, "outlier_dims", NULL);
    for (int i = 0; i < n_rows; i++)
        if (rows[i].calib_outliers && rows[i].eval_outliers) qc_json_outliers(r, m, &rows[i]);
    if (any) nl_report_end_object(r);
    return nl_report_print(r, a->json);
}

int nl_cmd_quant_compare(int argc, char **argv) {
    qc_args a;
    int rcode = qc_parse(argc, argv, &a);
    if (rcode) return rcode == NL_CLI_HELP ? NL_EXIT_OK : rcode;
    qc_row rows[64];
    int n_rows = 0;
    /* every scheme parsed first, so that a typo fails before any work */
    if (nl_qc_parse_schemes(a.schemes, rows, 64, &n_rows))
        return nl_cli_usage_error("quant compare: %s", nl_last_error());
    nl_model m;
    nl_tokenizer tok;
    if (nl_cli_load_model(a.model.ckpt, a.model.tokenizer, &m, &tok)) return nl_cli_fail("quant compare");
    nl_qc_tokens t;
    double base = 0;
    int64_t scored = 0, T = a.T > m.arch.seq_len ? m.arch.seq_len : a.T;
    if (nl_qc_encode(a.data, a.calib, &tok, T, a.calib_n, a.eval_n, &t) || nl_model_alloc_acts(&m, a.B, T) ||
        nl_qc_run(&m, &t, a.B, T, rows, n_rows, &base, &scored)) {
        rcode = nl_cli_fail("quant compare");
        goto done;
    }
    rcode = qc_print(&a, &m, rows, n_rows, base, scored, (t.n_calib / T) * T);
    if (a.svg && nl_qc_svg(a.svg, rows, n_rows, base)) rcode = nl_cli_fail("quant compare");
done:
    nl_qc_rows_free(rows, n_rows);
    nl_qc_tokens_free(&t);
    nl_tokenizer_free(&tok);
    nl_model_free(&m);
    return rcode;
}
