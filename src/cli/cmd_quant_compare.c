/* nanolm quant-compare (also reachable as `nanolm quant compare`): RTN, GPTQ, AWQ, SmoothQuant,
 * W8A8 and LLM.int8() on one checkpoint, side by side: bytes, mean loss, delta vs fp32, time. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "cli_model.h"
#include "nanolm/quant_methods.h"
#include "nanolm/svg.h"
#include "nanolm/train.h"

#define DEFAULT_SCHEMES "rtn-int4-g32,gptq-int4-g32,awq-int4-g32,rtn-int3-g32,gptq-int3-g32,awq-int3-g32," \
                        "rtn-int4-g128,gptq-int4-g128,awq-int4-g128,w8a8,smoothquant-w8a8,int8-outlier6"

typedef struct qc_row {
    nl_qm_scheme s;
    int64_t bytes;
    double loss, time_s, awq_alpha;
    int *calib_outliers, *eval_outliers; /* [L * NL_QM_SITES] or NULL */
} qc_row;

static nl_status encode_text(const nl_tokenizer *tok, const char *text, size_t bytes, int **ids, int64_t *n) {
    return nl_tokenizer_encode(tok, text, bytes, 1, 0, ids, n);
}

static nl_status write_svg(const char *path, const qc_row *rows, int n, double base) {
    nl_svg s;
    double W = 760, H = 40 + 26.0 * n + 40, left = 190, right = 40, top = 40;
    nl_svg_begin(&s, W, H);
    nl_svg_text(&s, W / 2, 22, 14, "middle", "loss increase over fp32 (nats/token), lower is better");
    double lo = 0, hi = 0;
    for (int i = 0; i < n; i++) {
        double d = rows[i].loss - base;
        if (d < lo) lo = d;
        if (d > hi) hi = d;
    }
    if (hi - lo <= 0) hi = lo + 1e-6;
    double span = W - left - right, x0 = left + (0 - lo) / (hi - lo) * span;
    for (int i = 0; i < n; i++) {
        double d = rows[i].loss - base, y = top + 26.0 * i;
        double x1 = left + (d - lo) / (hi - lo) * span;
        char val[48];
        snprintf(val, sizeof val, "%+.4f", d);
        nl_svg_rect(&s, x1 < x0 ? x1 : x0, y + 4, fabs(x1 - x0) < 1 ? 1 : fabs(x1 - x0), 18,
                    nl_svg_color((size_t)rows[i].s.method), val);
        nl_svg_text(&s, left - 8, y + 18, 12, "end", rows[i].s.name);
        nl_svg_text(&s, (x1 > x0 ? x1 : x0) + 4, y + 18, 11, "start", val);
    }
    nl_svg_line(&s, x0, top, x0, top + 26.0 * n, "#000", 1);
    return nl_svg_save(&s, path);
}

static const char *method_name(nl_qm_method m) {
    static const char *names[] = {"fp32", "rtn", "gptq", "awq", "smoothquant", "w8a8", "llm.int8"};
    return names[m];
}

int nl_cmd_quant_compare(int argc, char **argv) {
    static const struct option opts[] = {
        {"ckpt", required_argument, 0, 'c'}, {"data", required_argument, 0, 'd'},
        {"calib", required_argument, 0, 'C'}, {"calib-tokens", required_argument, 0, 'n'}, {"eval-tokens", required_argument, 0, 'e'},
        {"schemes", required_argument, 0, 'S'}, {"tokenizer", required_argument, 0, 'k'},
        {"batch", required_argument, 0, 'b'}, {"seq", required_argument, 0, 's'},
        {"svg", required_argument, 0, 'g'}, {"json", no_argument, 0, 'j'}, {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    const char *ckpt = NULL, *data = NULL, *calib = NULL, *tok_path = NULL, *svg = NULL;
    const char *schemes = DEFAULT_SCHEMES;
    int64_t calib_n = 8192, eval_n = 0, B = 4, T = 256;
    int json = 0, c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'c': ckpt = optarg; break;
        case 'd': data = optarg; break;
        case 'C': calib = optarg; break;
        case 'k': tok_path = optarg; break;
        case 'S': schemes = optarg; break;
        case 'g': svg = optarg; break;
        case 'n': if (nl_cli_int("--calib-tokens", optarg, 1, 1 << 26, &calib_n)) return NL_EXIT_USAGE; break;
        case 'e': if (nl_cli_int("--eval-tokens", optarg, 2, INT64_MAX, &eval_n)) return NL_EXIT_USAGE; break;
        case 'b': if (nl_cli_int("--batch", optarg, 1, 4096, &B)) return NL_EXIT_USAGE; break;
        case 's': if (nl_cli_int("--seq", optarg, 1, 1 << 20, &T)) return NL_EXIT_USAGE; break;
        case 'j': json = 1; break;
        case 'h':
            printf("usage: nanolm quant compare --ckpt F --data TEXT --calib TEXT [--schemes S1,S2,...]\n"
                   "       [--calib-tokens N] [--eval-tokens N] [--tokenizer tok.bin] [--batch B] [--seq T] [--svg FILE] [--json]\n"
                   "  Quantizes the checkpoint with each scheme (linear layers only) and prints bytes, mean loss on\n"
                   "  --data and its increase over fp32, and the quantization time. When --calib and --data are the\n"
                   "  same file, the first half (up to the first newline after the middle) calibrates and the\n"
                   "  second half is evaluated. Calibration uses the first --calib-tokens tokens (8192) in windows\n"
                   "  of --seq (256) tokens; --eval-tokens N evaluates only the first N tokens (default: all).\n"
                   "  Schemes: fp32, rtn-intB-gG, gptq-intB-gG, awq-intB-gG (B 2..8, G 0 = per row), w8a8,\n"
                   "  smoothquant-w8a8[-aALPHA], int8-outlierT. Default: %s\n", DEFAULT_SCHEMES);
            return NL_EXIT_OK;
        default: return nl_cli_bad_option("quant compare", argv);
        }
    }
    if (optind < argc) return nl_cli_usage_error("quant compare: unexpected argument '%s'", argv[optind]);
    if (!ckpt || !data || !calib) return nl_cli_usage_error("quant compare: --ckpt F, --data TEXT and --calib TEXT are required");
    /* Parse every scheme first, so that a typo fails before any work. */
    qc_row rows[64];
    int n_rows = 0;
    char list[1024];
    if (strlen(schemes) >= sizeof list) return nl_cli_usage_error("quant compare: --schemes list too long");
    snprintf(list, sizeof list, "%s", schemes);
    for (char *save = NULL, *tokn = strtok_r(list, ",", &save); tokn; tokn = strtok_r(NULL, ",", &save)) {
        if (n_rows == 64) return nl_cli_usage_error("quant compare: at most 64 schemes");
        memset(&rows[n_rows], 0, sizeof rows[n_rows]);
        if (nl_qm_parse(tokn, &rows[n_rows].s)) return nl_cli_usage_error("quant compare: --schemes: %s", nl_last_error());
        /* fp32 is the baseline row, always measured and printed first: listing it adds nothing */
        if (rows[n_rows].s.method == NL_QM_FP32) continue;
        for (int j = 0; j < n_rows; j++)
            if (!strcmp(rows[j].s.name, rows[n_rows].s.name))
                return nl_cli_usage_error("quant compare: --schemes lists %s twice", rows[j].s.name);
        n_rows++;
    }
    if (n_rows == 0) return nl_cli_usage_error("quant compare: --schemes names no scheme besides the fp32 baseline");

    nl_model m;
    nl_tokenizer tok;
    if (nl_cli_load_model(ckpt, tok_path, &m, &tok)) return nl_cli_fail("quant compare");
    int rcode = NL_EXIT_OK;
    char *dtext = NULL, *ctext = NULL;
    size_t dbytes = 0, cbytes = 0;
    int *eval_ids = NULL, *calib_ids = NULL;
    int64_t n_eval = 0, n_calib = 0, scored = 0;
    float *orig = NULL;
    double base = 0;
    if (T > m.arch.seq_len) T = m.arch.seq_len;
    if (nl_read_file(data, &dtext, &dbytes)) { rcode = nl_cli_fail("quant compare"); goto done; }
    const char *etext = dtext, *cal = NULL;
    size_t ebytes = dbytes, calb = 0;
    if (!strcmp(data, calib)) {
        size_t mid = dbytes / 2;
        while (mid < dbytes && dtext[mid] != '\n') mid++;
        cal = dtext;
        calb = mid;
        etext = dtext + mid;
        ebytes = dbytes - mid;
    } else {
        if (nl_read_file(calib, &ctext, &cbytes)) { rcode = nl_cli_fail("quant compare"); goto done; }
        cal = ctext;
        calb = cbytes;
    }
    if (encode_text(&tok, etext, ebytes, &eval_ids, &n_eval) || encode_text(&tok, cal, calb, &calib_ids, &n_calib)) {
        rcode = nl_cli_fail("quant compare");
        goto done;
    }
    if (n_eval < 2 || n_calib < T) {
        nl_fail(NL_ERR_INVALID, "quant compare: %lld evaluation tokens and %lld calibration tokens; need >= 2 and >= --seq %lld",
                (long long)n_eval, (long long)n_calib, (long long)T);
        rcode = nl_cli_fail("quant compare");
        goto done;
    }
    if (n_calib > calib_n) n_calib = calib_n < T ? T : calib_n;
    if (eval_n > 0 && n_eval > eval_n) n_eval = eval_n;
    orig = nl_malloc(m.n_params * sizeof(float), "fp32 parameter copy");
    if (!orig || nl_model_alloc_acts(&m, B, T)) { rcode = nl_cli_fail("quant compare"); goto done; }
    memcpy(orig, m.params, m.n_params * sizeof(float));
    if (nl_eval_loss_tokens(&m, eval_ids, n_eval, B, T, &base, &scored)) { rcode = nl_cli_fail("quant compare"); goto done; }
    nl_qm_calib cb = {.tokens = calib_ids, .n = n_calib, .B = B, .T = T};
    for (int i = 0; i < n_rows; i++) {
        memcpy(m.params, orig, m.n_params * sizeof(float));
        nl_qm_runtime rt;
        double t0 = nl_time_s();
        nl_status rc = nl_qm_apply(&m, &rows[i].s, &cb, &rt);
        rows[i].time_s = nl_time_s() - t0;
        if (!rc) rc = nl_eval_loss_tokens(&m, eval_ids, n_eval, B, T, &rows[i].loss, NULL);
        if (rc) { nl_qm_runtime_free(&rt); rcode = nl_cli_fail("quant compare"); goto done; }
        rows[i].bytes = nl_qm_model_bytes(&m, &rows[i].s);
        rows[i].awq_alpha = rt.awq_alpha_mean;
        if (rt.calib_outliers) {
            size_t k = (size_t)m.L * NL_QM_SITES * sizeof(int);
            rows[i].calib_outliers = nl_malloc(k, "outlier report");
            rows[i].eval_outliers = nl_malloc(k, "outlier report");
            if (rows[i].calib_outliers && rows[i].eval_outliers) {
                memcpy(rows[i].calib_outliers, rt.calib_outliers, k);
                memcpy(rows[i].eval_outliers, rt.eval_outliers_max, k);
            }
        }
        nl_qm_runtime_free(&rt);
    }
    memcpy(m.params, orig, m.n_params * sizeof(float));

    nl_qm_scheme fp;
    nl_qm_parse("fp32", &fp);
    int64_t fp_bytes = nl_qm_model_bytes(&m, &fp);
    if (json) {
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "checkpoint", ckpt);
        cJSON_AddStringToObject(d, "data", data);
        cJSON_AddStringToObject(d, "calib", calib);
        cJSON_AddBoolToObject(d, "split_halves", !strcmp(data, calib));
        cJSON_AddNumberToObject(d, "eval_tokens", (double)scored);
        cJSON_AddNumberToObject(d, "calib_tokens", (double)((n_calib / T) * T));
        cJSON_AddNumberToObject(d, "fp32_loss", base);
        cJSON_AddNumberToObject(d, "fp32_bytes", (double)fp_bytes);
        cJSON *arr = cJSON_AddArrayToObject(d, "schemes");
        for (int i = 0; i < n_rows; i++) {
            cJSON *r = cJSON_CreateObject();
            cJSON_AddStringToObject(r, "scheme", rows[i].s.name);
            cJSON_AddStringToObject(r, "method", method_name(rows[i].s.method));
            cJSON_AddNumberToObject(r, "weight_bits", rows[i].s.bits);
            cJSON_AddNumberToObject(r, "act_bits", rows[i].s.act_bits);
            cJSON_AddNumberToObject(r, "group", rows[i].s.group);
            cJSON_AddNumberToObject(r, "bytes", (double)rows[i].bytes);
            cJSON_AddNumberToObject(r, "mean_loss", rows[i].loss);
            cJSON_AddNumberToObject(r, "delta_loss", rows[i].loss - base);
            cJSON_AddNumberToObject(r, "quant_time_s", rows[i].time_s);
            if (rows[i].s.method == NL_QM_AWQ) cJSON_AddNumberToObject(r, "awq_alpha_mean", rows[i].awq_alpha);
            if (rows[i].calib_outliers && rows[i].eval_outliers) {
                cJSON *ol = cJSON_AddArrayToObject(r, "outlier_dims");
                for (int l = 0; l < m.L; l++)
                    for (int s = 0; s < NL_QM_SITES; s++) {
                        cJSON *o = cJSON_CreateObject();
                        cJSON_AddNumberToObject(o, "layer", l);
                        cJSON_AddStringToObject(o, "site", nl_qm_site_name(s));
                        cJSON_AddNumberToObject(o, "in_dim", s == 1 ? (double)(m.NH * m.hd) : s == 3 ? (double)m.H : (double)m.C);
                        cJSON_AddNumberToObject(o, "calib_outlier_dims", rows[i].calib_outliers[l * NL_QM_SITES + s]);
                        cJSON_AddNumberToObject(o, "eval_max_outlier_dims", rows[i].eval_outliers[l * NL_QM_SITES + s]);
                        cJSON_AddItemToArray(ol, o);
                    }
            }
            cJSON_AddItemToArray(arr, r);
        }
        nl_cli_print_json(d);
    } else {
        printf("%s: fp32 mean loss %.4f nats/token on %lld tokens of %s%s; calibration %lld tokens of %s%s\n",
               ckpt, base, (long long)scored, data, !strcmp(data, calib) ? " (second half)" : "",
               (long long)((n_calib / T) * T), calib, !strcmp(data, calib) ? " (first half)" : "");
        const char *hdr[] = {"scheme", "method", "W bits", "A bits", "group", "bytes", "vs fp32", "mean loss", "Δloss", "Δ%", "quant s"};
        nl_table tb;
        nl_table_init(&tb, 11, hdr);
        nl_table_rowf(&tb, "fp32|fp32|32|32|-|%lld|1.00x|%.4f|0|0|0", (long long)fp_bytes, base);
        for (int i = 0; i < n_rows; i++) {
            char grp[16];
            if (rows[i].s.act_bits == 8 || rows[i].s.method == NL_QM_FP32) snprintf(grp, sizeof grp, "row");
            else if (rows[i].s.group == 0) snprintf(grp, sizeof grp, "row");
            else snprintf(grp, sizeof grp, "%d", rows[i].s.group);
            nl_table_rowf(&tb, "%s|%s|%d|%d|%s|%lld|%.2fx|%.4f|%+.4f|%+.2f|%.2f", rows[i].s.name,
                          method_name(rows[i].s.method), rows[i].s.bits, rows[i].s.act_bits, grp,
                          (long long)rows[i].bytes, (double)fp_bytes / rows[i].bytes, rows[i].loss,
                          rows[i].loss - base, 100.0 * (rows[i].loss - base) / base, rows[i].time_s);
        }
        nl_table_print(&tb, stdout);
        nl_table_free(&tb);
        for (int i = 0; i < n_rows; i++)
            if (rows[i].s.method == NL_QM_AWQ)
                printf("%s: mean chosen alpha %.3f over the AWQ sites%s\n", rows[i].s.name, rows[i].awq_alpha,
                       m.NH != m.KVH ? " (o_proj uses RTN: GQA leaves no exact fold into v_proj)" : "");
        for (int i = 0; i < n_rows; i++) {
            if (!rows[i].calib_outliers || !rows[i].eval_outliers) continue;
            printf("\n%s: outlier feature dims (|x| > %g) per layer, calibration set / most in one eval batch:\n",
                   rows[i].s.name, rows[i].s.param);
            const char *oh[] = {"layer", "qkv", "o", "gate_up", "down"};
            nl_table ot;
            nl_table_init(&ot, 5, oh);
            int total = 0;
            for (int l = 0; l < m.L; l++) {
                int *co = rows[i].calib_outliers + l * NL_QM_SITES, *eo = rows[i].eval_outliers + l * NL_QM_SITES;
                for (int s = 0; s < NL_QM_SITES; s++) total += co[s];
                nl_table_rowf(&ot, "%d|%d/%d of %lld|%d/%d of %lld|%d/%d of %lld|%d/%d of %lld", l, co[0], eo[0], (long long)m.C,
                              co[1], eo[1], (long long)(m.NH * m.hd), co[2], eo[2], (long long)m.C, co[3], eo[3], (long long)m.H);
            }
            nl_table_print(&ot, stdout);
            if (total == 0) printf("(no outlier dimensions in this model at threshold %g: int8-outlier equals plain W8A8 here)\n", rows[i].s.param);
        }
    }
    if (svg && write_svg(svg, rows, n_rows, base)) rcode = nl_cli_fail("quant compare");
done:
    for (int i = 0; i < n_rows; i++) { nl_free(rows[i].calib_outliers); nl_free(rows[i].eval_outliers); }
    nl_free(orig);
    nl_free(eval_ids);
    nl_free(calib_ids);
    nl_free(dtext);
    nl_free(ctext);
    nl_tokenizer_free(&tok);
    nl_model_free(&m);
    return rcode;
}
