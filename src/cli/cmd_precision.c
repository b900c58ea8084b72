/* nanolm precision underflow: what fp16 (with and without loss scaling) and bf16 would lose of a
 * real model's gradients. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "nanolm/data.h"
#include "cli_model.h"
#include "nanolm/precision.h"

#define GRADSCALER_INIT 65536.0 /* torch.cuda.amp.GradScaler(init_scale=2**16) */

static void usage(FILE *f) {
    fprintf(f,
            "usage: nanolm precision underflow --ckpt F --data TEXT [--tokenizer tok512.bin] [--batch B] [--batches N]\n"
            "                                   [--seq T] [--json]\n"
            "  Runs N forward/backward passes of the model on the first N*B windows of the text's\n"
            "  validation split (last 10%%) in fp32 and reports, for the linear layers' output gradients\n"
            "  and for the parameter gradients, the fraction of nonzero values that would be flushed to\n"
            "  zero, left subnormal or overflow: fp16 without loss scaling, with GradScaler's initial\n"
            "  scale 2^16, with the largest power-of-two scale that does not overflow, and bf16.\n"
            "  --tokenizer is needed for llama2.c .bin checkpoints.\n");
}

typedef struct scheme { nl_format f; double scale; const char *label; } scheme;

static int underflow_cmd(int argc, char **argv) {
    static const struct option opts[] = {
        {"ckpt", required_argument, 0, 'c'}, {"data", required_argument, 0, 'd'}, {"batch", required_argument, 0, 'b'},
        {"batches", required_argument, 0, 'n'}, {"seq", required_argument, 0, 's'}, {"json", no_argument, 0, 'j'}, {"tokenizer", required_argument, 0, 'k'},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    const char *ckpt = NULL, *data = NULL, *tok_path = NULL;
    int64_t B = 8, nb = 4, T = 0;
    int json = 0, c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'c': ckpt = optarg; break;
        case 'd': data = optarg; break;
        case 'k': tok_path = optarg; break;
        case 'b': if (nl_cli_int("--batch", optarg, 1, 4096, &B)) return NL_EXIT_USAGE; break;
        case 'n': if (nl_cli_int("--batches", optarg, 1, 1000, &nb)) return NL_EXIT_USAGE; break;
        case 's': if (nl_cli_int("--seq", optarg, 1, 1 << 20, &T)) return NL_EXIT_USAGE; break;
        case 'j': json = 1; break;
        case 'h': usage(stdout); return NL_EXIT_OK;
        default: return nl_cli_bad_option("precision underflow", argv);
        }
    }
    if (optind < argc) return nl_cli_usage_error("precision underflow: unexpected argument '%s'", argv[optind]);
    if (!ckpt || !data) return nl_cli_usage_error("precision underflow: --ckpt F and --data TEXT are required");
    nl_model m;
    nl_tokenizer tok;
    if (nl_cli_load_model(ckpt, tok_path, &m, &tok)) return nl_cli_fail("precision underflow");
    int rc = NL_EXIT_OK;
    nl_data dt;
    memset(&dt, 0, sizeof dt);
    float *act = NULL, *wgt = NULL;
    size_t n_act = 0, n_wgt = 0;
    if (T == 0) T = m.arch.seq_len;
    if (T > m.arch.seq_len) {
        rc = nl_cli_usage_error("precision underflow: --seq %lld exceeds the model's seq_len %lld", (long long)T,
                                (long long)m.arch.seq_len);
        goto done;
    }
    /* The validation split (last 10%) of the text, tokenized with the checkpoint's tokenizer. */
    if (nl_data_open(&dt, data, &tok) || nl_model_alloc_acts(&m, B, T) || nl_model_alloc_grads(&m) ||
        nl_grad_sample(&m, (const int32_t *)dt.tokens + nl_data_split_begin(&dt, NL_DATA_VAL),
                       nl_data_split_tokens(&dt, NL_DATA_VAL), B, T, (int)nb, &act, &n_act, &wgt, &n_wgt)) {
        rc = nl_cli_fail("precision underflow");
        goto done;
    }
    const double fp16_max = nl_fmt_info(NL_FMT_FP16)->max_finite;
    double s_act = nl_underflow_max_scale(act, n_act, fp16_max, 0x1p24);
    double s_wgt = nl_underflow_max_scale(wgt, n_wgt, fp16_max, 0x1p24);
    double s_best = s_act == 0.0 ? s_wgt : (s_wgt == 0.0 ? s_act : fmin(s_act, s_wgt));
    if (s_best == 0.0) s_best = 1.0;
    char best_label[48];
    snprintf(best_label, sizeof best_label, "2^%d (largest w/o overflow)", (int)lround(log2(s_best)));
    const scheme schemes[4] = {{NL_FMT_FP16, 1.0, "1 (none)"}, {NL_FMT_FP16, GRADSCALER_INIT, "2^16 (GradScaler init)"},
                               {NL_FMT_FP16, s_best, best_label}, {NL_FMT_BF16, 1.0, "1 (none)"}};
    const char *cats[2] = {"linear output grads dL/dy", "parameter grads"};
    const float *vals[2] = {act, wgt};
    const size_t nv[2] = {n_act, n_wgt};
    nl_underflow_counts cnt[2][4];
    memset(cnt, 0, sizeof cnt);
    for (int k = 0; k < 2; k++)
        for (int s = 0; s < 4; s++)
            if (nl_underflow_count(schemes[s].f, (float)schemes[s].scale, vals[k], nv[k], &cnt[k][s])) {
                rc = nl_cli_fail("precision underflow");
                goto done;
            }
    if (json) {
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "checkpoint", ckpt);
        cJSON_AddStringToObject(d, "data", data);
        cJSON_AddNumberToObject(d, "batches", (double)nb);
        cJSON_AddNumberToObject(d, "batch", (double)B);
        cJSON_AddNumberToObject(d, "seq", (double)T);
        cJSON *arr = cJSON_AddArrayToObject(d, "rows");
        for (int k = 0; k < 2; k++)
            for (int s = 0; s < 4; s++) {
                const nl_underflow_counts *u = &cnt[k][s];
                cJSON *o = cJSON_CreateObject();
                cJSON_AddStringToObject(o, "tensor", k == 0 ? "linear_output_grads" : "parameter_grads");
                cJSON_AddStringToObject(o, "format", nl_fmt_name(schemes[s].f));
                cJSON_AddNumberToObject(o, "loss_scale", schemes[s].scale);
                cJSON_AddNumberToObject(o, "values", (double)u->values);
                cJSON_AddNumberToObject(o, "nonzero", (double)u->nonzero);
                cJSON_AddNumberToObject(o, "flushed_frac", u->nonzero ? (double)u->flushed / (double)u->nonzero : 0.0);
                cJSON_AddNumberToObject(o, "subnormal_frac", u->nonzero ? (double)u->subnormal / (double)u->nonzero : 0.0);
                cJSON_AddNumberToObject(o, "overflow_frac", u->nonzero ? (double)u->overflow / (double)u->nonzero : 0.0);
                cJSON_AddItemToArray(arr, o);
            }
        rc = nl_cli_print_json(d);
        goto done;
    }
    printf("gradients of %s on %lld x %lld windows of %lld tokens from %s (validation split), fp32 backward\n", ckpt,
           (long long)nb, (long long)B, (long long)T, data);
    static const char *const hdr[] = {"gradients", "format", "loss scale", "nonzero values", "flushed to 0",
                                      "subnormal", "overflow (inf)"};
    nl_table t;
    nl_table_init(&t, 7, hdr);
    for (int k = 0; k < 2; k++)
        for (int s = 0; s < 4; s++) {
            const nl_underflow_counts *u = &cnt[k][s];
            const double z = u->nonzero ? 100.0 / (double)u->nonzero : 0.0;
            nl_table_rowf(&t, "%s|%s|%s|%lld|%.4f %%|%.4f %%|%.4f %%", cats[k], nl_fmt_name(schemes[s].f),
                          schemes[s].label, (long long)u->nonzero, u->flushed * z, u->subnormal * z, u->overflow * z);
        }
    nl_table_print(&t, stdout);
    nl_table_free(&t);
done:
    nl_free(act);
    nl_free(wgt);
    nl_data_free(&dt);
    nl_tokenizer_free(&tok);
    nl_model_free(&m);
    return rc;
}

int nl_cmd_precision(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? NL_EXIT_USAGE : NL_EXIT_OK;
    }
    if (!strcmp(argv[1], "underflow")) return underflow_cmd(argc - 1, argv + 1);
    return nl_cli_usage_error("precision: unknown subcommand '%s' (valid: underflow)", argv[1]);
}
