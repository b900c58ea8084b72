/* nanolm train: train NanoLM on a text file (byte-level tokens). */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_model.h"
#include "cli_opt.h"
#include "report.h"
#include "train_opts.h"
#include "nanolm/fp8_linear.h"
#include "nanolm/mfu.h"
#include "nanolm/qat.h"
#include "nanolm/step_prof.h"
#include "nanolm/train.h"
#include "nanolm/train_log.h"

/* What the command line asks for: the training group (train_opts.h) and train's own options. */
typedef struct train_cli {
    nl_train_opts o;
    nl_train_args ta; /* the training group: --data, --steps, ..., --log, --svg, --precision */
    const char *preset;
    int report_memory, json, preset_given, no_mfu;
    int fp8, no_loss_scaling; /* --precision fp8: bf16 model + FP8 linears (nanolm/fp8_linear.h) */
    nl_fp8_recipe fp8r;
    int fp8_recipe;          /* --fp8-recipe: index in "e4m3|hybrid" */
    const char *fp8_scaling; /* --fp8-scaling name, or NULL: the recipe's default */
    const char *qat_name;    /* --qat: fake-quantized linears (nanolm/qat.h) */
    nl_quant_spec qat;
    int from_ckpt;                  /* --resume without --preset: the shape comes from the checkpoint */
    char fp8_desc[160], fp8_id[96]; /* --precision fp8: the recipe in words, and as recorded */
} train_cli;

/* Parses argv into c (defaults first): the training group, then train's model, precision and
 * output options. Returns 0, NL_CLI_HELP after --help, or NL_EXIT_USAGE after a message. */
static int parse_args(train_cli *c, int argc, char **argv) {
    memset(c, 0, sizeof *c);
    nl_train_opts_default(&c->o);
    nl_fp8_recipe_default(&c->fp8r);
    c->preset = "shakespeare-char";
    c->ta.o = &c->o;
    c->ta.seq_from_preset = 1;
    nl_opt train[NL_TRAIN_NOPTS];
    int ntrain = nl_cli_train_opts(train, &c->ta);
    nl_opt model[] = {
        NL_OPT_STR("preset", &c->preset, "P", "stories260k | shakespeare-char | small (default shakespeare-char)"),
        NL_OPT_STR("resume-weights", &c->o.init_weights, "CKPT",
                   "start from a checkpoint's weights (fresh optimizer, step 0)"),
        NL_OPT_INT("mup", &c->o.mup_base_dim, 1, 1 << 20, "BASE",
                   "muP with base width BASE (fp32; give it again with --resume)"),
        NL_OPT_STR("qat", &c->qat_name, "S",
                   "quantization-aware training: int<b>-g<G> (e.g. int4-g32) | int<b>-channel"),
    };
    model[0].given = &c->preset_given;
    nl_opt prec[] = {
        NL_OPT_FLT("loss-scale", &c->o.loss_scale_init, 1, 3e38, "X",
                   "fp16: initial dynamic loss scale (default 65536)"),
        NL_OPT_FLAG("no-loss-scaling", &c->no_loss_scaling, "fp16: fixed loss scale 1 (no GradScaler)"),
        NL_OPT_CHOICE("fp8-recipe", &c->fp8_recipe, "e4m3|hybrid",
                      "fp8: e4m3 (everywhere, default) | hybrid (e5m2 grads)"),
        NL_OPT_STR("fp8-scaling", &c->fp8_scaling, "S", "fp8: block (default) | tensor | delayed | mx"),
        NL_OPT_INT32("fp8-acc-bits", &c->fp8r.acc.bits, 0, 24, "K",
                     "fp8: 0 = fp32 accumulation (default), 2..24 limited"),
        NL_OPT_INT32("promote-every", &c->fp8r.acc.promote, 0, 1 << 20, "N",
                     "fp8: promote to fp32 every N products (128; 0 never)"),
    };
    prec[5].aliases = "fp8-promote";
    nl_opt out[] = {
        NL_OPT_FLAG("report-memory", &c->report_memory, "print the bytes allocated, exactly"),
        NL_OPT_FLAG("json", &c->json, "print the summary as JSON"),
        NL_OPT_FLAG("no-mfu", &c->no_mfu,
                    "skip measuring this machine's FMA peak and sgemm rate after the run (~0.1 s) and the MFU"),
    };
    nl_optgroup groups[] = {
        {"training (SIGTERM/SIGINT finish the step, save with --out, exit 0)", train, ntrain},
        {"model", model, NL_NOPTS(model)},
        {"precision", prec, NL_NOPTS(prec)},
        {"output", out, NL_NOPTS(out)},
    };
    nl_cmdspec spec = {"train",
                       "nanolm train --data FILE [options]",
                       "Trains NanoLM on a text file (byte tokens). A layout option (--dp, --tp, --pp, --zero, "
                       "--microbatches, --schedule) runs `nanolm parallel train` with the same options.",
                       groups,
                       NL_NOPTS(groups),
                       0};
    int rc = nl_cli_parse(&spec, argc, argv, NULL, NULL);
    if (rc) return rc;
    if (c->fp8r.acc.bits == 1) return nl_cli_usage_error("train: --fp8-acc-bits must be 0 (fp32) or 2..24, got 1");
    if (c->fp8_recipe) c->fp8r.fmt_grad = NL_FMT_E5M2;
    if (c->fp8_scaling && nl_fp8_scaling_from_name(c->fp8_scaling, &c->fp8r.scaling))
        return nl_cli_usage_error("train: --fp8-scaling: %s", nl_last_error());
    if (c->qat_name && nl_qat_parse(c->qat_name, &c->qat))
        return nl_cli_usage_error("train: --qat: %s", nl_last_error());
    c->fp8 = c->ta.precision == NL_TRAIN_FP8;
    return 0;
}

typedef struct progress_ctx {
    nl_progress bar;
    int quiet;
    int64_t first_step;
} progress_ctx;

static void on_step(void *user, const nl_train_log *r, const nl_train_opts *o) {
    progress_ctx *p = user;
    char extra[160];
    snprintf(extra, sizeof extra, "loss %.4f lr %.2e%s", r->loss, r->lr, r->skipped ? " (skipped)" : "");
    nl_progress_update(&p->bar, r->step - p->first_step,
                       (double)(r->step - p->first_step) *
                           (double)(o->batch * o->seq * (o->grad_accum > 0 ? o->grad_accum : 1)),
                       "tok", extra);
    if (!isnan(r->val_loss) && !p->quiet) {
        printf("step %6lld/%lld  train %.4f  val %.4f  lr %.2e  %.0f tok/s%s\n", (long long)r->step,
               (long long)o->steps, r->loss, r->val_loss, r->lr, r->tokens_per_s, r->skipped ? "  (skipped)" : "");
        fflush(stdout);
    }
}

/* SIGTERM / SIGINT: the first one asks the trainer to finish the current step, save and stop
 * (exit 0, what a preempted job needs); a second one ends the process at once, removing the
 * temporary file of a checkpoint being written. Shared with `parallel train` (cmd_parallel.c),
 * whose ranks agree on the stop once per step (nl_train_layout.agree_stop). */
volatile int nl_train_stop_signal;
static void on_stop_signal(int sig) {
    if (nl_train_stop_signal) {
        nl_atomic_remove_pending();
        _exit(128 + sig);
    }
    nl_train_stop_signal = sig;
}

/* on = 1: catch SIGTERM and SIGINT (the flag starts at 0); on = 0: restore what was there. */
void nl_train_catch_stop_signals(int on) {
    static struct sigaction old_term, old_int;
    if (!on) {
        sigaction(SIGTERM, &old_term, NULL);
        sigaction(SIGINT, &old_int, NULL);
        return;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    nl_train_stop_signal = 0;
    sigaction(SIGTERM, &sa, &old_term);
    sigaction(SIGINT, &sa, &old_int);
}

int nl_cmd_parallel_train(int argc, char **argv); /* src/cli/cmd_parallel.c */

/* The model shape from the preset, train's defaults, the option combinations refused by name and
 * the outputs checked writable, before any work. Returns 0 or the exit status after a message. */
/* The model shape from the preset, train's defaults, the option combinations refused by name and
 * the outputs checked writable, before any work. Returns 0 or the exit status after a message. */
static int check_args(train_cli *c, nl_arch *arch) {
    int rc = nl_cli_train_finish(&c->ta, "train");
    if (rc) return rc;
    if (nl_arch_preset(c->preset, arch)) return nl_cli_usage_error("train: --preset: %s", nl_last_error());
    /* a resumed run takes its shape (and its window) from the checkpoint; --preset beside
     * --resume is checked against it */
    c->from_ckpt = c->o.resume && !c->preset_given;
    if (!c->ta.seq_given) c->o.seq = c->from_ckpt ? 0 : arch->seq_len;
    if (!c->o.resume && arch->vocab_size != 256)
        return nl_cli_usage_error("train: preset %s has vocab %lld; training reads byte tokens (vocab 256)", c->preset,
                                  (long long)arch->vocab_size);
    if (c->no_loss_scaling && c->o.precision != NL_PREC_FP16)
        return nl_cli_usage_error("train: --no-loss-scaling applies to --precision fp16 only");
    c->o.no_loss_scaling = c->no_loss_scaling;
    if (c->fp8) {
        if (nl_fp8_acc_validate(&c->fp8r.acc)) return nl_cli_usage_error("train: %s", nl_last_error());
        if (c->fp8r.scaling == NL_FP8_SCALE_BLOCK && c->fp8r.acc.bits &&
            (c->fp8r.acc.promote == 0 || NL_FP8_BLOCK % c->fp8r.acc.promote))
            return nl_cli_usage_error("train: --fp8-scaling block needs --promote-every dividing %d", NL_FP8_BLOCK);
    }
    if (c->qat_name && (c->fp8 || c->o.precision != NL_PREC_FP32))
        return nl_cli_usage_error("train: --qat needs --precision fp32");
    if (c->o.resume && c->o.init_weights)
        return nl_cli_usage_error("train: --resume and --resume-weights exclude each other");
    if (c->fp8) {
        char desc[140];
        snprintf(c->fp8_desc, sizeof c->fp8_desc, " + FP8 linears (%s)",
                 nl_fp8_recipe_desc(&c->fp8r, desc, sizeof desc));
        c->o.fp8 = nl_fp8_recipe_id(&c->fp8r, c->fp8_id, sizeof c->fp8_id);
    }
    c->o.qat = c->qat_name;
    return 0;
}

/* The bytes training allocates, one row per buffer (--report-memory): JSON key, table label, bytes. */
typedef struct mem_row {
    const char *key, *label;
    size_t bytes;
} mem_row;
static void memory_rows(const nl_trainer *t, mem_row rows[7]) {
    const mem_row r[7] = {{"parameters", "parameters", t->mem.params},
                          {"gradients", "gradients", t->mem.grads},
                          {"optimizer", "optimizer (AdamW m, v)", t->mem.optimizer},
                          {"activations", "activations", t->mem.activations},
                          {"low_precision_weights", "low-precision weights", t->mem.lp_weights},
                          {"token_batch", "token batch", t->mem.batch},
                          {"total", "total", t->mem.total}};
    memcpy(rows, r, sizeof r);
}

/* The validation losses of QAT: fp32 and fake-quantized (RTN) at the start, after QAT fake-quantized
 * and with the fp32 master weights. */
typedef nl_qat_losses qat_losses;

/* The QAT figures: JSON object "qat", text line "qat S: validation loss ...". */
static void report_qat(nl_report *r, const char *scheme, const qat_losses *q) {
    nl_qat_recovery qr = nl_qat_recovered(q->fp32_start, q->rtn_start, q->end, q->fp32_end);
    char rec[200];
    if (qr.why)
        snprintf(rec, sizeof rec, "recovered fraction not reported: %s", qr.why);
    else
        snprintf(rec, sizeof rec, "%.1f%% of RTN's delta recovered", 100.0 * qr.fraction);
    nl_report_note(r,
                   "qat %s: validation loss fake-quantized %.4f (delta vs fp32 start %+.4f, RTN %+.4f: %s); fp32 "
                   "master weights %.4f",
                   scheme, q->end, q->end - q->fp32_start, qr.rtn_delta, rec, q->fp32_end);
    nl_report_begin_object(r, "qat", NULL);
    nl_report_str(r, "scheme", "", scheme);
    nl_report_num(r, "val_loss_fp32_start", "", q->fp32_start, NULL, NULL);
    nl_report_num(r, "val_loss_rtn_start", "", q->rtn_start, NULL, NULL);
    nl_report_num(r, "val_loss_qat_end", "", q->end, NULL, NULL);
    nl_report_num(r, "val_loss_fp32_master_end", "", q->fp32_end, NULL, NULL);
    nl_report_num(r, "rtn_delta", "", q->rtn_start - q->fp32_start, NULL, NULL);
    nl_report_num(r, "qat_delta", "", q->end - q->fp32_start, NULL, NULL);
    nl_report_num(r, "recovered_fraction", "", qr.why ? NAN : qr.fraction, NULL, NULL);
    if (qr.why) nl_report_str(r, "recovered_fraction_not_reported", "", qr.why);
    nl_report_end_object(r);
}

/* The FP8 figures: JSON object "fp8", text line "fp8: N GEMMs, ...". */
static void report_fp8(nl_report *r, const nl_fp8_recipe *rc, const nl_fp8_linear_stats *s) {
    double q = (double)(s->quantized + !s->quantized);
    nl_report_note(r, "fp8: %lld GEMMs, %.3g%% of quantized values saturated, %.3g%% flushed to zero",
                   (long long)s->gemms, 100.0 * (double)s->saturated / q, 100.0 * (double)s->flushed / q);
    nl_report_begin_object(r, "fp8", NULL);
    nl_report_str(r, "activations", "", nl_fmt_name(rc->fmt_act));
    nl_report_str(r, "gradients", "", nl_fmt_name(rc->fmt_grad));
    nl_report_str(r, "scaling", "", nl_fp8_scaling_name(rc->scaling));
    nl_report_int(r, "acc_bits", "", rc->acc.bits, NULL);
    nl_report_int(r, "promote", "", rc->acc.promote, NULL);
    nl_report_int(r, "gemms", "", s->gemms, NULL);
    nl_report_int(r, "saturated", "", s->saturated, NULL);
    nl_report_int(r, "flushed", "", s->flushed, NULL);
    nl_report_int(r, "quantized", "", s->quantized, NULL);
    nl_report_end_object(r);
}

/* Model FLOPs utilisation (nanolm/mfu.h), unless --no-mfu. */
typedef nl_mfu mfu_figs;

static void measure_mfu(const train_cli *c, const nl_trainer *t, mfu_figs *f) {
    memset(f, 0, sizeof *f);
    if (!c->no_mfu && nl_mfu_measure(t, f)) fprintf(stderr, "nanolm: train: MFU not measured: %s\n", nl_last_error());
}

static void report_mfu(nl_report *r, const mfu_figs *f) {
    if (!f->measured) return;
    nl_report_note(r,
                   "mfu: %.2f GFLOP/s of model FLOPs (6N + attention, %.3g per token) = %.1f%% of this machine's "
                   "fp32 FMA peak (%.1f GFLOP/s, %s, %d threads), %.1f%% of its sgemm rate (%.1f GFLOP/s, OpenBLAS "
                   "%d^3)",
                   f->model_flops / 1e9, f->flops_per_token, 100.0 * f->model_flops / f->fma_peak, f->fma_peak / 1e9,
                   nl_peak_path_name(f->path), f->threads, 100.0 * f->model_flops / f->sgemm, f->sgemm / 1e9,
                   NL_PEAK_SGEMM_N);
    nl_report_begin_object(r, "mfu", NULL);
    nl_report_num(r, "model_flops_per_token", "", f->flops_per_token, NULL, NULL);
    nl_report_num(r, "model_flops_per_s", "", f->model_flops, NULL, NULL);
    nl_report_num(r, "fma_peak_flops_per_s", "", f->fma_peak, NULL, NULL);
    nl_report_str(r, "fma_peak_path", "", nl_peak_path_name(f->path));
    nl_report_num(r, "sgemm_flops_per_s", "", f->sgemm, NULL, NULL);
    nl_report_int(r, "sgemm_n", "", NL_PEAK_SGEMM_N, NULL);
    nl_report_int(r, "threads", "", f->threads, NULL);
    nl_report_num(r, "mfu_fma_peak", "", f->model_flops / f->fma_peak, NULL, NULL);
    nl_report_num(r, "mfu_sgemm", "", f->model_flops / f->sgemm, NULL, NULL);
    nl_report_end_object(r);
}

/* The result of a finished run, once, as text ("done: ..." and the QAT and FP8 lines) or JSON.
 * Returns the exit status. */
static int print_result(const train_cli *c, const nl_trainer *t, const nl_fp8_linear *fp8, const qat_losses *q,
                        const mfu_figs *mfu) {
    const nl_train_log *last = t->n_log ? &t->log[t->n_log - 1] : NULL;
    double tps = t->wall_s > 0 ? (double)t->tokens_done / t->wall_s : 0;
    int64_t skipped = t->scaler.skipped;
    if (!last && !c->json) return NL_EXIT_OK;
    nl_report *r = nl_report_new("train");
    nl_cli_train_summary(r, t, t->model.arch.name, (long long)t->model.n_params, t->wall_s, tps);
    if (last) {
        char fp16[96] = "";
        if (c->o.precision == NL_PREC_FP16)
            snprintf(fp16, sizeof fp16, ", %lld skipped steps (loss scale %g)", (long long)skipped, t->scaler.scale);
        nl_report_note(r, "done: %lld steps, train loss %.4f, val loss %.4f, %.1f s, %.0f tokens/s%s%s%s",
                       (long long)t->step, last->loss, last->val_loss, t->wall_s, tps, c->o.out ? ", checkpoint " : "",
                       c->o.out ? c->o.out : "", fp16);
    }
    report_mfu(r, mfu);
    if (c->fp8) report_fp8(r, &c->fp8r, &fp8->stats);
    if (c->qat_name) report_qat(r, c->qat_name, q);
    if (c->report_memory) { /* the text form printed its table before the run */
        mem_row rows[7];
        memory_rows(t, rows);
        nl_report_begin_object(r, "memory_bytes", NULL);
        for (int i = 0; i < 7; i++) nl_report_int(r, rows[i].key, "", (long long)rows[i].bytes, NULL);
        nl_report_end_object(r);
    }
    return nl_report_print(r, c->json);
}

/* The lines before the run: the model and data, the QAT starting losses, --report-memory's table. */
static void print_header(const train_cli *c, const nl_trainer *t, const nl_data *data, const qat_losses *q) {
    if (c->json) return;
    printf("train %s: %lld parameters, %lld train / %lld validation tokens, batch %lld x %lld, %s%s%s%s\n",
           t->model.arch.name, (long long)t->model.n_params, (long long)nl_data_split_tokens(data, NL_DATA_TRAIN),
           (long long)nl_data_split_tokens(data, NL_DATA_VAL), (long long)c->o.batch, (long long)c->o.seq,
           c->o.precision == NL_PREC_BF16   ? "bf16"
           : c->o.precision == NL_PREC_FP16 ? "fp16"
                                            : "fp32",
           c->fp8_desc, c->no_loss_scaling ? " without loss scaling" : "", c->o.resume ? " (resumed)" : "");
    if (c->qat_name)
        printf("qat %s (absmax, fake-quantized q/k/v/o/gate/up/down, straight-through backward) from %s:\n"
               "  validation loss at start: fp32 %.4f, fake-quantized (RTN) %.4f, RTN delta %+.4f\n",
               c->qat_name,
               c->o.init_weights ? c->o.init_weights
               : c->o.resume     ? c->o.resume
                                 : "random init",
               q->fp32_start, q->rtn_start, q->rtn_start - q->fp32_start);
    if (c->report_memory) { /* the JSON form has them in its result */
        nl_report *r = nl_report_new("train --report-memory");
        nl_report_table(
            r, NULL, NULL, 3,
            (const nl_report_col[]){{NULL, "buffer", NULL}, {NULL, "bytes", "%-.0f"}, {NULL, "MiB", "%-.2f"}});
        mem_row rows[7];
        memory_rows(t, rows);
        for (int i = 0; i < 7; i++) {
            nl_report_cell_str(r, rows[i].label);
            nl_report_cell_num(r, (double)rows[i].bytes);
            nl_report_cell_num(r, (double)rows[i].bytes / 1048576.0);
            nl_report_row_end(r);
        }
        nl_report_print(r, 0);
    }
    fflush(stdout);
}

/* What a run holds besides the trainer: the data, the FP8 linears and the QAT wrappers. */
typedef struct train_run {
    nl_data data;
    nl_trainer t;
    nl_fp8_linear fp8;
    nl_qat qat;
    int have_trainer;
    qat_losses q;
} train_run;

static void run_free(train_run *r) {
    nl_qat_remove(&r->qat);
    nl_fp8_linear_remove(&r->fp8);
    if (r->have_trainer) nl_trainer_free(&r->t);
    nl_data_free(&r->data);
}

/* Opens the data, builds (or resumes) the trainer, installs FP8 or QAT and measures QAT's starting
 * losses. Returns 0, or the exit status after a message (NL_EXIT_OK: the resumed run is complete). */
static int run_setup(train_cli *c, const nl_arch *arch, train_run *r) {
    nl_tokenizer tok;
    if (nl_tokenizer_init_byte(&tok)) return nl_cli_fail("train");
    nl_status st = nl_data_open(&r->data, c->ta.data, &tok);
    nl_tokenizer_free(&tok);
    if (st) return nl_cli_fail("train");
    nl_status init_rc = nl_trainer_init(&r->t, c->from_ckpt ? NULL : arch, &c->o);
    if (init_rc) {
        if (init_rc == NL_DONE) { /* the resumed run is already complete */
            fprintf(stderr, "nanolm: train: %s\n", nl_last_error());
            return NL_EXIT_OK;
        }
        return nl_cli_fail(c->o.resume ? "train: --resume" : "train");
    }
    r->have_trainer = 1;
    c->o.seq = r->t.seq;
    if (nl_data_check_window(&r->data, (int)c->o.seq)) return nl_cli_fail("train");
    if (c->fp8 && nl_fp8_linear_install(&r->fp8, &r->t.model, &c->fp8r)) return nl_cli_fail("train");
    /* QAT: validation loss of the starting weights in fp32 and fake-quantized (= RTN) */
    const nl_train_opts *o = &c->o;
    if (c->qat_name && nl_qat_begin(&r->qat, &r->t.model, &c->qat, &r->data, o->batch, o->seq, o->eval_windows, &r->q))
        return nl_cli_fail("train: --qat");
    return 0;
}

int nl_cmd_train(int argc, char **argv) {
    /* hook for the distributed runtime: a layout option hands the run to `nanolm parallel train` */
    for (int i = 1; i < argc; i++)
        if (!strncmp(argv[i], "--dp", 4) || !strncmp(argv[i], "--tp", 4) || !strncmp(argv[i], "--pp", 4) ||
            !strncmp(argv[i], "--zero", 6) || !strncmp(argv[i], "--microbatches", 14) ||
            !strncmp(argv[i], "--schedule", 10))
            return nl_cmd_parallel_train(argc, argv);
    train_cli c;
    int prc = parse_args(&c, argc, argv);
    if (prc) return prc == NL_CLI_HELP ? NL_EXIT_OK : prc;
    nl_arch arch;
    if ((prc = check_args(&c, &arch))) return prc;
    train_run r;
    memset(&r, 0, sizeof r);
    r.q = (qat_losses){NAN, NAN, NAN, NAN};
    if ((prc = run_setup(&c, &arch, &r)) != 0 || !r.have_trainer) {
        run_free(&r);
        return prc;
    }
    nl_trainer *t = &r.t;
    print_header(&c, t, &r.data, &r.q);
    progress_ctx pc = {.quiet = c.json, .first_step = t->step};
    nl_progress_begin(&pc.bar, "train", c.o.steps - t->step);
    nl_train_catch_stop_signals(1);
    c.o.stop = &nl_train_stop_signal;
    nl_status rc = nl_trainer_run(t, &c.o, &r.data, on_step, &pc);
    nl_train_catch_stop_signals(0);
    nl_progress_end(&pc.bar);
    if (!rc && !c.json) nl_cli_train_stopped(t, &c.o);
    int exit_code = NL_EXIT_OK;
    if (rc) exit_code = nl_cli_fail("train");
    if (c.fp8 && nl_fp8_linear_status(&r.fp8)) fprintf(stderr, "nanolm: train: %s\n", r.fp8.error);
    if (c.qat_name && nl_qat_status(&r.qat)) fprintf(stderr, "nanolm: train: %s\n", r.qat.error);
    if (!rc && c.qat_name && (rc = nl_qat_end(&r.qat, &r.data, c.o.batch, c.o.seq, c.o.eval_windows, &r.q)) != 0)
        exit_code = nl_cli_fail("train: --qat");
    /* logs cover what ran, also after a failure */
    if (c.ta.log_csv && t->n_log && nl_train_log_write_csv(t, c.ta.log_csv)) exit_code = nl_cli_fail("train: --log");
    if (c.ta.svg && t->n_log && nl_train_log_svg(t, c.ta.svg)) exit_code = nl_cli_fail("train: --svg");
    if (t->prof) nl_step_prof_print(t->prof, stderr, "train step profile (NANOLM_STEP_PROFILE, wall and CPU time)");
    if (!rc) {
        mfu_figs mfu;
        measure_mfu(&c, t, &mfu);
        int prc2 = print_result(&c, t, &r.fp8, &r.q, &mfu);
        if (prc2) exit_code = prc2;
    }
    run_free(&r);
    return exit_code;
}
