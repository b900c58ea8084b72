/* nanolm precision underflow: what fp16 (with and without loss scaling) and bf16 would lose of a
 * real model's gradients. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "cli_model.h"
#include "cli_opt.h"
#include "nanolm/data.h"
#include "nanolm/precision.h"
#include "report.h"

static void usage(FILE *f) {
    fprintf(f, "usage: nanolm precision underflow --ckpt F --data TEXT [options]\n"
               "  underflow: what fp16 (with and without loss scaling) and bf16 would lose of a model's\n"
               "  gradients (see nanolm precision underflow --help)\n");
}

static int underflow_cmd(int argc, char **argv) {
    const char *ckpt = NULL, *data = NULL, *tok_path = NULL;
    int64_t B = 8, nb = 4, T = 0;
    int json = 0;
    nl_opt opts[] = {
        NL_OPT_STR("ckpt", &ckpt, "F", "checkpoint: safetensors from train, or a llama2.c .bin (required)"),
        NL_OPT_STR("data", &data, "TEXT", "text whose validation split (last 10%) is used (required)"),
        NL_OPT_STR("tokenizer", &tok_path, "FILE", "llama2.c tokenizer (tok512.bin), needed for .bin checkpoints"),
        NL_OPT_INT("batch", &B, 1, 4096, "B", "windows per pass (default 8)"),
        NL_OPT_INT("batches", &nb, 1, 1000, "N", "forward/backward passes (default 4)"),
        NL_OPT_INT("seq", &T, 1, 1 << 20, "T", "tokens per window (default: the model's seq_len)"),
        NL_OPT_FLAG("json", &json, "print the result as JSON"),
    };
    nl_optgroup groups[] = {{"options", opts, NL_NOPTS(opts)}};
    nl_cmdspec spec = {"precision underflow",
                       "nanolm precision underflow --ckpt F --data TEXT [options]",
                       "Runs N forward/backward passes of the model on the first N*B windows of the text's validation\n"
                       "split in fp32 and reports, for the linear layers' output gradients and for the parameter\n"
                       "gradients, the fraction of nonzero values that would be flushed to zero, left subnormal or\n"
                       "overflow: fp16 without loss scaling, with GradScaler's initial scale 2^16, with the largest\n"
                       "power-of-two scale that does not overflow, and bf16.",
                       groups,
                       1,
                       0};
    int prc = nl_cli_parse(&spec, argc, argv, NULL, NULL);
    if (prc) return prc == NL_CLI_HELP ? NL_EXIT_OK : prc;
    if (!ckpt || !data) return nl_cli_usage_error("precision underflow: --ckpt F and --data TEXT are required");
    nl_model m;
    nl_tokenizer tok;
    if (nl_cli_load_model(ckpt, tok_path, &m, &tok)) return nl_cli_fail("precision underflow");
    int rc = NL_EXIT_OK;
    nl_data dt;
    memset(&dt, 0, sizeof dt);
    if (T == 0) T = m.arch.seq_len;
    if (T > m.arch.seq_len) {
        rc = nl_cli_usage_error("precision underflow: --seq %lld exceeds the model's seq_len %lld", (long long)T,
                                (long long)m.arch.seq_len);
        goto done;
    }
    /* The validation split (last 10%) of the text, tokenized with the checkpoint's tokenizer. */
    nl_underflow_study u;
    if (nl_data_open(&dt, data, &tok) ||
        nl_underflow_study_run(&m, (const int32_t *)dt.tokens + nl_data_split_begin(&dt, NL_DATA_VAL),
                               nl_data_split_tokens(&dt, NL_DATA_VAL), B, T, (int)nb, &u)) {
        rc = nl_cli_fail("precision underflow");
        goto done;
    }
    nl_report *r = nl_report_new("precision underflow");
    nl_report_str(r, "checkpoint", "checkpoint", ckpt);
    nl_report_str(r, "data", "text (validation split)", data);
    nl_report_int(r, "batches", "passes", nb, NULL);
    nl_report_int(r, "batch", "windows per pass", B, NULL);
    nl_report_int(r, "seq", "tokens per window", T, NULL);
    nl_report_table(r, "rows", "fraction of the nonzero gradient values", 9,
                    (const nl_report_col[]){{"tensor", "gradients", NULL},
                                            {"format", "format", NULL},
                                            {"scale", "loss scale", NULL},
                                            {"loss_scale", "scale value", "%g"},
                                            {"values", "values", "%.0f"},
                                            {"nonzero", "nonzero", "%.0f"},
                                            {"flushed_frac", "flushed to 0", "%.6f"},
                                            {"subnormal_frac", "subnormal", "%.6f"},
                                            {"overflow_frac", "overflow (inf)", "%.6f"}});
    for (int k = 0; k < 2; k++)
        for (int s = 0; s < NL_UNDERFLOW_SCHEMES; s++) {
            const nl_underflow_counts *c = &u.cnt[k][s];
            const double z = c->nonzero ? 1.0 / (double)c->nonzero : 0.0;
            nl_report_cell_str(r, k == 0 ? "linear_output_grads" : "parameter_grads");
            nl_report_cell_str(r, nl_fmt_name(u.fmt[s]));
            nl_report_cell_str(r, u.label[s]);
            nl_report_cell_num(r, u.scale[s]);
            nl_report_cell_num(r, (double)c->values);
            nl_report_cell_num(r, (double)c->nonzero);
            nl_report_cell_num(r, (double)c->flushed * z);
            nl_report_cell_num(r, (double)c->subnormal * z);
            nl_report_cell_num(r, (double)c->overflow * z);
            nl_report_row_end(r);
        }
    rc = nl_report_print(r, json);
done:
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
