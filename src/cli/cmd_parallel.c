/* nanolm parallel train: data-parallel training of NanoLM over MPI (DDP, ZeRO-1/2/3).
 *   mpirun -np N nanolm parallel train --data FILE --dp N --zero Z [...]
 * Rank 0 prints the losses, the bytes every rank sent per step, and (--report-memory) the bytes
 * of parameters, gradients and optimizer state every rank holds. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "nanolm/dtrain.h"
#include "nanolm/pipeline.h"
#include "nanolm/svg.h"
#include "nanolm/tokenizer.h"

enum {
    O_DATA = 1000,
    O_PRESET,
    O_DIM,
    O_LAYERS,
    O_HEADS,
    O_KVH,
    O_HIDDEN,
    O_STEPS,
    O_BATCH,
    O_SEQ,
    O_LR,
    O_CLIP,
    O_WD,
    O_SEED,
    O_DP,
    O_TP,
    O_PP,
    O_ZERO,
    O_MICRO,
    O_SCHED,
    O_IMPL,
    O_NO_OVERLAP,
    O_MEM,
    O_JSON,
    O_SVG,
    O_OUT,
    O_SAVE_EVERY,
    O_RESUME,
    O_FAULT,
    O_SP,
    O_HELP,
    O_LR_MIN,
    O_WARMUP,
    O_EVAL_WINDOWS,
    O_LOG,
    O_STOP_AFTER,
    O_ACCUM,
    O_PRECISION,
    O_TIMEOUT
};

static const struct option popts[] = {{"data", required_argument, 0, O_DATA},
                                      {"preset", required_argument, 0, O_PRESET},
                                      {"dim", required_argument, 0, O_DIM},
                                      {"layers", required_argument, 0, O_LAYERS},
                                      {"heads", required_argument, 0, O_HEADS},
                                      {"kv-heads", required_argument, 0, O_KVH},
                                      {"hidden", required_argument, 0, O_HIDDEN},
                                      {"steps", required_argument, 0, O_STEPS},
                                      {"batch", required_argument, 0, O_BATCH},
                                      {"seq", required_argument, 0, O_SEQ},
                                      {"lr", required_argument, 0, O_LR},
                                      {"clip", required_argument, 0, O_CLIP},
                                      {"weight-decay", required_argument, 0, O_WD},
                                      {"seed", required_argument, 0, O_SEED},
                                      {"dp", required_argument, 0, O_DP},
                                      {"tp", required_argument, 0, O_TP},
                                      {"pp", required_argument, 0, O_PP},
                                      {"zero", required_argument, 0, O_ZERO},
                                      {"microbatches", required_argument, 0, O_MICRO},
                                      {"schedule", required_argument, 0, O_SCHED},
                                      {"impl", required_argument, 0, O_IMPL},
                                      {"no-overlap", no_argument, 0, O_NO_OVERLAP},
                                      {"sp", no_argument, 0, O_SP},
                                      {"report-memory", no_argument, 0, O_MEM},
                                      {"json", no_argument, 0, O_JSON},
                                      {"svg", required_argument, 0, O_SVG},
                                      {"out", required_argument, 0, O_OUT},
                                      {"save-every", required_argument, 0, O_SAVE_EVERY},
                                      {"resume", required_argument, 0, O_RESUME},
                                      {"inject-fault", required_argument, 0, O_FAULT},
                                      {"lr-min", required_argument, 0, O_LR_MIN},
                                      {"warmup", required_argument, 0, O_WARMUP},
                                      {"eval-every", required_argument, 0, O_SAVE_EVERY},
                                      {"eval-windows", required_argument, 0, O_EVAL_WINDOWS},
                                      {"log", required_argument, 0, O_LOG},
                                      {"stop-after", required_argument, 0, O_STOP_AFTER},
                                      {"grad-accum", required_argument, 0, O_ACCUM},
                                      {"precision", required_argument, 0, O_PRECISION},
                                      {"timeout", required_argument, 0, O_TIMEOUT},
                                      {"micro", required_argument, 0, O_MICRO},
                                      {"micro-batch", required_argument, 0, O_MICRO},
                                      {"help", no_argument, 0, O_HELP},
                                      {0, 0, 0, 0}};

static void usage(FILE *f) {
    fprintf(f, "usage: mpirun -np N nanolm parallel train --data FILE [options]\n"
               "   or: mpirun -np N nanolm train --data FILE --dp/--tp/--pp/--zero ... (the same run)\n"
               "  --dp D --tp T --pp P  layout (D x T x P must equal N; default D = N): data, tensor\n"
               "                        (Megatron) and pipeline parallelism; --sp adds sequence parallelism\n"
               "                        to --tp; ZeRO and checkpoints need --tp 1 --pp 1\n"
               "  --zero Z              0 = DDP (default), 1, 2, 3 (FSDP full shard)\n"
               "  --impl ours|native    collectives: our ring algorithms (default) or the MPI library's\n"
               "  --no-overlap          DDP: all-reduce the buckets after backward instead of during it\n"
               "  --sp                  with --tp: sequence parallelism (norms/residuals on sequence shards;\n"
               "                        reduce-scatter + all-gather instead of all-reduce; one stage)\n"
               "  --preset P            model shape (default shakespeare-char), then overrides:\n"
               "  --dim C --layers L --heads H --kv-heads K --hidden F\n"
               "  --microbatches M      with --pp: micro-batches per step (1; --micro, --micro-batch: aliases)\n"
               "  --schedule gpipe|1f1b with --pp: the stage schedule (gpipe)\n"
               "The training options and defaults of `nanolm train` (one trainer, src/train/trainer.c):\n"
               "  --steps N (2000) --batch B per dp rank (12) --seq T (the preset's seq_len)\n"
               "  --lr X (1e-3) --lr-min X (lr/10) --warmup N (100; steps/10 when >= steps): cosine schedule\n"
               "  --clip X (1.0) --weight-decay X (0.1) --seed S (1337)\n"
               "  --eval-every K (250) --eval-windows N (200): validation (not with --tp/--pp > 1)\n"
               "  --log CSV             per-step log (rank 0)\n"
               "  --stop-after K        stop (and save) after step K of the schedule\n"
               "  fp32 only; --grad-accum, --mup, --qat, --precision other than fp32 are refused\n"
               "  --report-memory       bytes of parameters, gradients, optimizer state on each rank\n"
               "  --json                the same as JSON\n"
               "  --svg FILE            picture of who holds what (measured bytes) and what moves per step\n"
               "  --out CKPT            checkpoint (safetensors, written by rank 0) at each validation and the end\n"
               "  --save-every K        alias of --eval-every K\n"
               "  --resume CKPT         continue from a checkpoint up to --steps\n"
               "  --timeout SECONDS     collective watchdog: a rank waiting longer ends the job naming the rank\n"
               "                        that did not arrive (default 600; 0 = off)\n"
               "  SIGTERM/SIGINT        every rank finishes the same step, saves (--out) and exits 0\n"
               "  --inject-fault R[:exit|_exit|segv|kill|stop]@S   (tests) rank R leaves (or stops) at step S\n"
               "The batch of dp rank r is its slice of the global batch of D*B windows: the same data as one\n"
               "process with --batch D*B.\n");
}

static int parse_i(const char *opt, const char *arg, int64_t lo, int64_t hi, int64_t *v) {
    return nl_cli_int(opt, arg, lo, hi, v);
}

/* Who holds what: per rank, bars of parameters, gradients and optimizer state (the full size
 * outlined, the part held filled; a shard sits at the rank's slice), and what it sent per step. */
static nl_status draw_layout(const char *path, int zero, int P, size_t n_params, const double *rows, int nk) {
    nl_svg s;
    double W = 900, rowh = 64, top = 60, H = top + rowh * P + 70, x0 = 80, barw = 420;
    nl_svg_begin(&s, W, H);
    char t[256];
    snprintf(t, sizeof t, "%s on %d ranks, %zu parameters (fp32 + AdamW): what each rank holds", zero ? "ZeRO" : "DDP",
             P, n_params);
    if (zero)
        snprintf(t, sizeof t, "ZeRO-%d on %d ranks, %zu parameters (fp32 + AdamW): what each rank holds", zero, P,
                 n_params);
    nl_svg_text(&s, W / 2, 24, 15, "middle", t);
    const char *names[3] = {"params", "grads", "Adam m,v"};
    const char *colors[3] = {"#4e79a7", "#f28e2b", "#59a14f"};
    double full[3] = {4.0 * n_params, 4.0 * n_params, 8.0 * n_params};
    double scale = barw / full[2];
    for (int r = 0; r < P; r++) {
        const double *x = rows + (size_t)r * nk;
        double y = top + r * rowh;
        snprintf(t, sizeof t, "rank %d", r);
        nl_svg_text(&s, 10, y + 28, 13, "start", t);
        for (int k = 0; k < 3; k++) {
            double held = x[2 + NL_COMM_OP_COUNT + k], by = y + k * 18, fw = full[k] * scale;
            nl_svg_rect(&s, x0, by, fw, 14, "#eeeeee", "full size");
            int sharded = held < 0.9 * full[k];
            double hx = sharded ? x0 + fw * r / P : x0, hw = held * scale;
            snprintf(t, sizeof t, "%s: %.0f bytes held", names[k], held);
            nl_svg_rect(&s, hx, by, hw, 14, colors[k], t);
            snprintf(t, sizeof t, "%s %s", names[k], sharded ? "1/p shard" : "full");
            nl_svg_text(&s, x0 + barw + 8, by + 11, 10, "start", t);
        }
        double sent = x[0];
        char m[256] = "";
        for (int k = 0; k < NL_COMM_OP_COUNT; k++)
            if (x[2 + k] > 0) {
                char part[64];
                snprintf(part, sizeof part, "%s%s %.0f", m[0] ? ", " : "", nl_comm_op_name((nl_comm_op)k), x[2 + k]);
                strncat(m, part, sizeof m - strlen(m) - 1);
            }
        snprintf(t, sizeof t, "sends %.0f B/step (%.3f x params)", sent, sent / full[0]);
        nl_svg_text(&s, x0 + barw + 110, y + 18, 11, "start", t);
        nl_svg_text(&s, x0 + barw + 110, y + 34, 10, "start", m);
    }
    static const char *moves[4] = {
        "moves: gradients all-reduced per layer bucket during backward (2(p-1)/p of the gradient bytes)",
        "moves: gradients reduce-scattered per unit, updated shard all-gathered (same 2(p-1)/p as DDP)",
        "moves: as ZeRO-1; only the reduced gradient shard is kept between steps",
        "moves: each layer all-gathered before forward and before backward, gradients reduce-scattered (~3(p-1)/p)"};
    nl_svg_text(&s, 10, H - 30, 12, "start", moves[zero]);
    return nl_svg_save(&s, path);
}

/* The last step's pipeline timeline: one row per rank, forward (blue) and backward (green)
 * boxes of each micro-batch where the stage computed; white is the bubble. */
static nl_status draw_timeline(const char *path, int P, int M, const char *sched, const double *ev, const double *rows,
                               int nk, double formula) {
    nl_svg s;
    double W = 900, x0 = 120, rowh = 34, top = 50, H = top + rowh * P + 50, tmax = 0;
    for (int r = 0; r < P; r++)
        for (int i = 0; i < 2 * M; i++) tmax = fmax(tmax, ev[((size_t)r * 2 * M + i) * 4 + 3]);
    if (tmax <= 0) tmax = 1;
    nl_svg_begin(&s, W, H);
    double sb = 0, si = 0;
    for (int r = 0; r < P; r++) {
        sb += rows[(size_t)r * nk + 6 + NL_COMM_OP_COUNT];
        si += rows[(size_t)r * nk + 7 + NL_COMM_OP_COUNT];
    }
    char t[200];
    snprintf(t, sizeof t,
             "%s, %d ranks, %d micro-batches (last step): measured bubble %.3f, formula (P-1)/(M+P-1) = %.3f", sched, P,
             M, si / (sb + si), formula);
    nl_svg_text(&s, W / 2, 24, 14, "middle", t);
    double scale = (W - x0 - 20) / tmax;
    for (int r = 0; r < P; r++) {
        double y = top + r * rowh;
        snprintf(t, sizeof t, "rank %d (stage %.0f)", r, rows[(size_t)r * nk + 8 + NL_COMM_OP_COUNT]);
        nl_svg_text(&s, 8, y + 18, 11, "start", t);
        nl_svg_rect(&s, x0, y, tmax * scale, rowh - 8, "#ffffff", "idle");
        for (int i = 0; i < 2 * M; i++) {
            const double *e = ev + ((size_t)r * 2 * M + i) * 4;
            if (e[3] <= e[2]) continue;
            snprintf(t, sizeof t, "%s micro-batch %.0f: %.2f ms", e[0] ? "backward" : "forward", e[1],
                     (e[3] - e[2]) * 1e3);
            nl_svg_rect(&s, x0 + e[2] * scale, y, (e[3] - e[2]) * scale, rowh - 8, e[0] ? "#59a14f" : "#4e79a7", t);
            if ((e[3] - e[2]) * scale > 14) {
                snprintf(t, sizeof t, "%s%.0f", e[0] ? "B" : "F", e[1]);
                nl_svg_text(&s, x0 + (e[2] + e[3]) / 2 * scale, y + 17, 10, "middle", t);
            }
        }
    }
    snprintf(t, sizeof t, "time (0 .. %.2f ms); blue forward, green backward, white waiting", tmax * 1e3);
    nl_svg_text(&s, x0, H - 20, 11, "start", t);
    return nl_svg_save(&s, path);
}

/* Each rank fills its row of (p, k) doubles; afterwards every rank holds the whole table. */
static nl_status share_rows(nl_comm *w, double *rows, int k) {
    int p = nl_comm_size(w);
    for (int i = 0; i < p * k; i++) NL_TRY(nl_comm_sum_double(w, &rows[i]));
    return NL_OK;
}

int nl_cmd_parallel(int argc, char **argv);
int nl_cmd_parallel_train(int argc, char **argv);
int nl_cmd_parallel(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? NL_EXIT_USAGE : NL_EXIT_OK;
    }
    if (strcmp(argv[1], "train")) return nl_cli_usage_error("parallel: unknown subcommand '%s' (train)", argv[1]);
    return nl_cmd_parallel_train(argc - 1, argv + 1);
}

/* The layout's hooks wrapped for what this command reports per step (bytes sent, backward and
 * waiting time, pipeline busy / idle) and for --inject-fault. */
typedef struct step_probe {
    nl_train_layout inner;
    nl_dist_trainer *dt;
    nl_pipe *pl;
    nl_comm_stats st; /* the last step's bytes */
    double bw_s, wait_s, busy_s, idle_s;
    int rank, fault_rank, fault_step;
    const char *fault_how;
    int json;
    float *losses; /* (steps) per step, for --json */
    double *norms;
} step_probe;

static nl_status probe_grads(void *u, const nl_data *d, int64_t step, float *loss) {
    step_probe *p = u;
    if (p->rank == p->fault_rank && step + 1 == p->fault_step) { /* a rank that dies at the start of a step */
        if (!strcmp(p->fault_how, "kill")) raise(SIGKILL);
        if (!strcmp(p->fault_how, "stop")) raise(SIGSTOP);
        if (!strcmp(p->fault_how, "segv")) raise(SIGSEGV);
        if (!strcmp(p->fault_how, "_exit")) _exit(3);
        exit(3);
    }
    nl_comm_reset_total_stats();
    return p->inner.grads(p->inner.user, d, step, loss);
}
static nl_status probe_sumsq(void *u, double *ss) {
    step_probe *p = u;
    return p->inner.sumsq(p->inner.user, ss);
}
static void probe_scale(void *u, float f) {
    step_probe *p = u;
    p->inner.scale(p->inner.user, f);
}
static nl_status probe_update(void *u, float lr) {
    step_probe *p = u;
    NL_TRY(p->inner.update(p->inner.user, lr));
    nl_comm_get_total_stats(&p->st); /* bytes of this step (the last step's are reported) */
    if (p->pl) p->busy_s += p->pl->busy_s, p->idle_s += p->pl->idle_s;
    if (p->dt) p->bw_s += p->dt->backward_s, p->wait_s += p->dt->comm_wait_s;
    return NL_OK;
}
static nl_status probe_eval(void *u, const nl_data *d, int64_t w, double *loss) {
    step_probe *p = u;
    return p->inner.eval(p->inner.user, d, w, loss);
}
static nl_status probe_save(void *u, const char *path, const struct nl_ckpt_state *st) {
    step_probe *p = u;
    return p->inner.save(p->inner.user, path, st);
}
static nl_status probe_load(void *u, const char *path, struct nl_ckpt_state *st) {
    step_probe *p = u;
    return p->inner.load(p->inner.user, path, st);
}
static nl_status probe_agree_stop(void *u, int *stop) {
    step_probe *p = u;
    return p->inner.agree_stop(p->inner.user, stop);
}

/* SIGTERM / SIGINT during training (src/cli/cmd_train.c): finish the step, save, exit 0. */
extern volatile int nl_train_stop_signal;
void nl_train_catch_stop_signals(int on);

static void on_step(void *user, const nl_train_log *r, const nl_train_opts *o) {
    step_probe *p = user;
    (void)o;
    if (p->json || !p->inner.rank0) return;
    if (isnan(r->val_loss))
        printf("step %3lld  loss %.6f  grad norm %.4f\n", (long long)r->step, r->loss, r->grad_norm);
    else
        printf("step %3lld  loss %.6f  grad norm %.4f  val %.4f\n", (long long)r->step, r->loss, r->grad_norm,
               r->val_loss);
    fflush(stdout);
}

/* What the command line of `parallel train` asks for. */
typedef struct par_cli {
    const char *data, *preset, *svg, *log_csv;
    int64_t dim, layers, heads, kvh, hidden, dp, tp, pp, micro;
    int json, mem, sched, seq_given, lr_min_given;
    int fault_rank, fault_step;
    char fault_how[16];
    nl_dist_opts o; /* o.train: the one training options struct, the one set of defaults */
} par_cli;

/* Parses argv into a (defaults first). Returns 0, NL_EXIT_USAGE after a message, or -1 after --help. */
/* --inject-fault R[:exit|_exit|segv|kill|stop]@S: rank R fails that way at step S. */
static int parse_fault(par_cli *a, const char *arg) {
    char how[16] = "exit";
    if (sscanf(arg, "%d@%d", &a->fault_rank, &a->fault_step) != 2 &&
        sscanf(arg, "%d:%15[_a-z]@%d", &a->fault_rank, how, &a->fault_step) != 3)
        return nl_cli_usage_error("parallel train: invalid --inject-fault '%s' (R[:exit|_exit|segv|kill]@S)", arg);
    if (strcmp(how, "exit") && strcmp(how, "_exit") && strcmp(how, "segv") && strcmp(how, "kill") &&
        strcmp(how, "stop"))
        return nl_cli_usage_error("parallel train: invalid --inject-fault '%s' (R[:exit|_exit|segv|kill]@S)", arg);
    snprintf(a->fault_how, sizeof a->fault_how, "%s", how);
    return 0;
}

/* --precision: fp32 runs; bf16 and fp16 are named so that the layout check can refuse them. */
static int parse_precision(const char *arg, nl_precision *out) {
    if (!strcmp(arg, "fp32"))
        *out = NL_PREC_FP32;
    else if (!strcmp(arg, "bf16"))
        *out = NL_PREC_BF16;
    else if (!strcmp(arg, "fp16"))
        *out = NL_PREC_FP16;
    else
        return nl_cli_usage_error("parallel train: unknown --precision '%s' (fp32; bf16, fp16 are refused)", arg);
    return 0;
}

static int parse_args(par_cli *a, int argc, char **argv) {
    memset(a, 0, sizeof *a);
    a->preset = "shakespeare-char";
    a->tp = 1, a->pp = 1, a->micro = 1, a->sched = NL_PIPE_GPIPE, a->fault_rank = -1;
    snprintf(a->fault_how, sizeof a->fault_how, "exit");
    nl_dist_opts_default(&a->o);
    nl_train_opts *tr = &a->o.train;
    int64_t v;
    double dv;
    int c;
    while ((c = getopt_long(argc, argv, "", popts, NULL)) != -1) {
        switch (c) {
        case O_DATA: a->data = optarg; break;
        case O_PRESET: a->preset = optarg; break;
        case O_DIM:
            if (parse_i("--dim", optarg, 1, 65536, &a->dim)) return NL_EXIT_USAGE;
            break;
        case O_LAYERS:
            if (parse_i("--layers", optarg, 1, 1024, &a->layers)) return NL_EXIT_USAGE;
            break;
        case O_HEADS:
            if (parse_i("--heads", optarg, 1, 1024, &a->heads)) return NL_EXIT_USAGE;
            break;
        case O_KVH:
            if (parse_i("--kv-heads", optarg, 1, 1024, &a->kvh)) return NL_EXIT_USAGE;
            break;
        case O_HIDDEN:
            if (parse_i("--hidden", optarg, 1, 1 << 20, &a->hidden)) return NL_EXIT_USAGE;
            break;
        case O_STEPS:
            if (parse_i("--steps", optarg, 1, 100000000, &v)) return NL_EXIT_USAGE;
            tr->steps = v;
            break;
        case O_BATCH:
            if (parse_i("--batch", optarg, 1, 65536, &v)) return NL_EXIT_USAGE;
            tr->batch = v;
            break;
        case O_SEQ:
            if (parse_i("--seq", optarg, 1, 1 << 20, &v)) return NL_EXIT_USAGE;
            tr->seq = v;
            a->seq_given = 1;
            break;
        case O_SEED:
            if (parse_i("--seed", optarg, 0, INT64_MAX, &v)) return NL_EXIT_USAGE;
            tr->seed = (uint64_t)v;
            break;
        case O_LR:
            if (nl_cli_double("--lr", optarg, &dv)) return NL_EXIT_USAGE;
            if (dv <= 0) return nl_cli_usage_error("--lr must be positive, got %s", optarg);
            tr->lr = (float)dv;
            break;
        case O_LR_MIN:
            if (nl_cli_double("--lr-min", optarg, &dv)) return NL_EXIT_USAGE;
            if (dv < 0) return nl_cli_usage_error("--lr-min must be >= 0, got %s", optarg);
            tr->lr_min = (float)dv, a->lr_min_given = 1;
            break;
        case O_WARMUP:
            if (parse_i("--warmup", optarg, 0, 100000000, &v)) return NL_EXIT_USAGE;
            tr->warmup = v;
            break;
        case O_EVAL_WINDOWS:
            if (parse_i("--eval-windows", optarg, 1, 1000000, &v)) return NL_EXIT_USAGE;
            tr->eval_windows = v;
            break;
        case O_STOP_AFTER:
            if (parse_i("--stop-after", optarg, 1, 100000000, &v)) return NL_EXIT_USAGE;
            tr->stop_after = v;
            break;
        case O_ACCUM:
            if (parse_i("--grad-accum", optarg, 1, 65536, &v)) return NL_EXIT_USAGE;
            tr->grad_accum = v;
            break;
        case O_PRECISION:
            if (parse_precision(optarg, &tr->precision)) return NL_EXIT_USAGE;
            break;
        case O_LOG: a->log_csv = optarg; break;
        case O_CLIP:
            if (nl_cli_double("--clip", optarg, &dv)) return NL_EXIT_USAGE;
            if (dv < 0) return nl_cli_usage_error("--clip must be >= 0, got %s", optarg);
            tr->grad_clip = (float)dv;
            break;
        case O_WD:
            if (nl_cli_double("--weight-decay", optarg, &dv)) return NL_EXIT_USAGE;
            if (dv < 0) return nl_cli_usage_error("--weight-decay must be >= 0, got %s", optarg);
            tr->weight_decay = (float)dv;
            break;
        case O_DP:
            if (parse_i("--dp", optarg, 1, 65536, &a->dp)) return NL_EXIT_USAGE;
            break;
        case O_TP:
            if (parse_i("--tp", optarg, 1, 65536, &a->tp)) return NL_EXIT_USAGE;
            break;
        case O_PP:
            if (parse_i("--pp", optarg, 1, 65536, &a->pp)) return NL_EXIT_USAGE;
            break;
        case O_ZERO:
            if (parse_i("--zero", optarg, 0, 3, &v)) return NL_EXIT_USAGE;
            a->o.zero = (int)v;
            break;
        case O_MICRO:
            if (parse_i("--microbatches", optarg, 1, 65536, &a->micro)) return NL_EXIT_USAGE;
            break;
        case O_SCHED:
            if (strcmp(optarg, "gpipe") && strcmp(optarg, "1f1b"))
                return nl_cli_usage_error("parallel train: unknown --schedule '%s' (gpipe, 1f1b)", optarg);
            a->sched = strcmp(optarg, "gpipe") ? NL_PIPE_1F1B : NL_PIPE_GPIPE;
            break;
        case O_IMPL:
            if (!strcmp(optarg, "ours"))
                a->o.impl = NL_COMM_OURS;
            else if (!strcmp(optarg, "native"))
                a->o.impl = NL_COMM_NATIVE;
            else
                return nl_cli_usage_error("parallel train: unknown --impl '%s' (ours, native)", optarg);
            break;
        case O_NO_OVERLAP: a->o.overlap = 0; break;
        case O_SP: a->o.sp = 1; break;
        case O_MEM: a->mem = 1; break;
        case O_JSON: a->json = 1; break;
        case O_SVG: a->svg = optarg; break;
        case O_OUT: tr->out = optarg; break;
        case O_RESUME: tr->resume = optarg; break;
        case O_SAVE_EVERY:
            if (parse_i("--eval-every", optarg, 0, 100000000, &v)) return NL_EXIT_USAGE;
            tr->eval_every = v;
            break;
        case O_FAULT:
            if (parse_fault(a, optarg)) return NL_EXIT_USAGE;
            break;
        case O_TIMEOUT:
            if (nl_cli_double("--timeout", optarg, &dv)) return NL_EXIT_USAGE;
            if (!(dv >= 0) || dv > 1e6)
                return nl_cli_usage_error("--timeout must be in [0, 1e6] seconds, got %s", optarg);
            nl_comm_set_timeout(dv);
            break;
        case O_HELP: usage(stdout); return -1;
        default: return nl_cli_bad_option("parallel train", argv);
        }
    }
    if (optind < argc) return nl_cli_usage_error("parallel train: unexpected argument '%s'", argv[optind]);
    return 0;
}

/* The model shape from the preset and the overrides, train's defaults, and the checks that name
 * flags (outputs writable before any work). Returns 0 or the exit status after a message. */
static int check_args(par_cli *a, nl_arch *arch) {
    nl_train_opts *tr = &a->o.train;
    if (!a->data) return nl_cli_usage_error("parallel train: --data FILE is required");
    if (nl_arch_preset(a->preset, arch)) return nl_cli_usage_error("parallel train: --preset: %s", nl_last_error());
    if (a->dim) arch->dim = a->dim;
    if (a->layers) arch->n_layers = a->layers;
    if (a->heads) arch->n_heads = a->heads, arch->n_kv_heads = a->heads;
    if (a->kvh) arch->n_kv_heads = a->kvh;
    if (a->hidden) arch->hidden_dim = a->hidden;
    /* the defaults of `nanolm train`: the preset's window, lr_min = lr/10, warmup below steps */
    if (!a->seq_given) tr->seq = arch->seq_len;
    if (arch->seq_len < tr->seq) arch->seq_len = tr->seq;
    if (!a->lr_min_given) tr->lr_min = tr->lr / 10.0f;
    if (tr->warmup >= tr->steps) tr->warmup = tr->steps / 10;
    tr->tokenizer = "byte";
    if (nl_arch_validate(arch)) return nl_cli_usage_error("parallel train: model shape: %s", nl_last_error());
    if (arch->vocab_size != 256)
        return nl_cli_usage_error("parallel train: preset %s has vocab %lld; training reads byte tokens (vocab 256)",
                                  a->preset, (long long)arch->vocab_size);
    /* every output is checked before any work starts */
    if ((tr->out && nl_check_writable(tr->out, "--out")) || (a->svg && nl_check_writable(a->svg, "--svg")) ||
        (a->log_csv && nl_check_writable(a->log_csv, "--log")))
        return nl_cli_fail("parallel train");
    if ((a->tp > 1 || a->pp > 1) && (tr->out || tr->resume))
        return nl_cli_usage_error("parallel train: --out/--resume are not supported yet with --tp or --pp > 1");

    return 0;
}

/* Everything the report of rank 0 shows. */
typedef struct par_report {
    const par_cli *a;
    int P;
    const double *rows, *ev;
    const nl_trainer *tn;
    int64_t first, steps;
    size_t n_full;
    double bw_s, wait_s, wall;
} par_report;

/* Rank 0's table or JSON, and --svg. Returns the exit status. */
static int print_report(const par_report *r) {
    const par_cli *a = r->a;
    const nl_dist_opts o = a->o;
    int P = r->P, json = a->json, mem = a->mem, sched = a->sched, rc = NL_EXIT_OK, mp = a->tp > 1 || a->pp > 1;
    int64_t dp = a->dp, tp = a->tp, pp = a->pp, micro = a->micro, first = r->first, steps = r->steps;
    const char *svg = a->svg;
    const double *rows = r->rows, *ev = r->ev;
    const nl_trainer tn = *r->tn;
    size_t n_full = r->n_full;
    double bw_s = r->bw_s, wait_s = r->wait_s, wall = r->wall;
    enum { NK = 2 + NL_COMM_OP_COUNT + 4 + 3 };
    const char *what = o.zero ? "ZeRO" : (dp > 1 ? "DDP" : "One process");
    double tokens_per_s = (double)(steps - first) * (double)(o.train.batch * o.train.seq * dp) / wall;
    if (json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddNumberToObject(j, "ranks", P);
        cJSON_AddNumberToObject(j, "dp", (double)dp);
        cJSON_AddNumberToObject(j, "zero", o.zero);
        cJSON_AddNumberToObject(j, "pp", (double)pp);
        cJSON_AddNumberToObject(j, "tp", (double)tp);
        if (pp > 1) {
            cJSON_AddNumberToObject(j, "microbatches", (double)micro);
            cJSON_AddStringToObject(j, "schedule", sched == NL_PIPE_GPIPE ? "gpipe" : "1f1b");
            cJSON_AddNumberToObject(j, "bubble_formula", nl_pipe_bubble_formula((int)pp, (int)micro));
        }
        cJSON_AddStringToObject(j, "impl", nl_comm_impl_name(o.impl));
        cJSON_AddNumberToObject(j, "overlap", o.overlap);
        cJSON_AddNumberToObject(j, "n_params", (double)n_full);
        cJSON_AddNumberToObject(j, "global_batch", (double)(o.train.batch * dp));
        cJSON_AddNumberToObject(j, "tokens_per_s", tokens_per_s);
        cJSON_AddNumberToObject(j, "backward_s", bw_s);
        cJSON_AddNumberToObject(j, "comm_wait_after_backward_s", wait_s);
        cJSON *ls = cJSON_AddArrayToObject(j, "losses"), *ns = cJSON_AddArrayToObject(j, "grad_norms");
        cJSON_AddNumberToObject(j, "first_step", (double)first + 1);
        for (int64_t s = 0; s < tn.n_log; s++) {
            cJSON_AddItemToArray(ls, cJSON_CreateNumber(tn.log[s].loss));
            cJSON_AddItemToArray(ns, cJSON_CreateNumber(tn.log[s].grad_norm));
        }
        if (tn.n_log && !isnan(tn.log[tn.n_log - 1].val_loss))
            cJSON_AddNumberToObject(j, "val_loss", tn.log[tn.n_log - 1].val_loss);
        cJSON *rk = cJSON_AddArrayToObject(j, "per_rank");
        for (int q = 0; q < P; q++) {
            const double *x = rows + (size_t)q * NK;
            cJSON *e = cJSON_CreateObject();
            cJSON_AddNumberToObject(e, "rank", q);
            cJSON_AddNumberToObject(e, "sent_bytes_per_step", x[0]);
            cJSON_AddNumberToObject(e, "recv_bytes_per_step", x[1]);
            cJSON *by = cJSON_AddObjectToObject(e, "sent_bytes_per_step_by_collective");
            for (int k = 0; k < NL_COMM_OP_COUNT; k++)
                if (x[2 + k] > 0) cJSON_AddNumberToObject(by, nl_comm_op_name((nl_comm_op)k), x[2 + k]);
            cJSON *mm = cJSON_AddObjectToObject(e, "memory_bytes");
            cJSON_AddNumberToObject(mm, "params", x[2 + NL_COMM_OP_COUNT]);
            cJSON_AddNumberToObject(mm, "grads", x[3 + NL_COMM_OP_COUNT]);
            cJSON_AddNumberToObject(mm, "optimizer", x[4 + NL_COMM_OP_COUNT]);
            cJSON_AddNumberToObject(mm, "workspace", x[5 + NL_COMM_OP_COUNT]);
            if (pp > 1) {
                cJSON_AddNumberToObject(e, "stage", x[8 + NL_COMM_OP_COUNT]);
                cJSON_AddNumberToObject(e, "busy_s", x[6 + NL_COMM_OP_COUNT]);
                cJSON_AddNumberToObject(e, "idle_s", x[7 + NL_COMM_OP_COUNT]);
                cJSON_AddNumberToObject(e, "bubble",
                                        x[7 + NL_COMM_OP_COUNT] / (x[6 + NL_COMM_OP_COUNT] + x[7 + NL_COMM_OP_COUNT]));
            }
            cJSON_AddItemToArray(rk, e);
        }
        nl_cli_print_json(j);
    } else {
        if (pp > 1)
            what = "Pipeline";
        else if (tp > 1)
            what = "Tensor parallel";
        printf("%s%s on %d rank%s (dp %lld), %zu parameters, global batch %lld x %lld tokens, %s collectives\n", what,
               o.zero ? (o.zero == 1   ? "-1"
                         : o.zero == 2 ? "-2"
                                       : "-3")
                      : "",
               P, P > 1 ? "s" : "", (long long)dp, n_full, (long long)(o.train.batch * dp), (long long)o.train.seq,
               nl_comm_impl_name(o.impl));
        if (mp)
            printf("%.0f tokens/s\n", tokens_per_s);
        else
            printf("%.0f tokens/s; backward %.3f s, waiting for gradient buckets after backward %.3f s\n", tokens_per_s,
                   bw_s, wait_s);
        const char *hdr[] = {"rank",     "sent/step", "of params",   "recv/step",
                             "params B", "grads B",   "optimizer B", "workspace B"};
        nl_table tb;
        nl_table_init(&tb, mem ? 8 : 4, hdr);
        double pbytes = (double)n_full * 4;
        for (int q = 0; q < P; q++) {
            const double *x = rows + (size_t)q * NK;
            if (mem)
                nl_table_rowf(&tb, "%d|%.0f|%.4f|%.0f|%.0f|%.0f|%.0f|%.0f", q, x[0], x[0] / pbytes, x[1],
                              x[2 + NL_COMM_OP_COUNT], x[3 + NL_COMM_OP_COUNT], x[4 + NL_COMM_OP_COUNT],
                              x[5 + NL_COMM_OP_COUNT]);
            else
                nl_table_rowf(&tb, "%d|%.0f|%.4f|%.0f", q, x[0], x[0] / pbytes, x[1]);
        }
        nl_table_print(&tb, stdout);
        nl_table_free(&tb);
    }
    if (pp > 1 && !json) {
        printf("pipeline: %lld stages, %lld micro-batches, %s; bubble formula (P-1)/(M+P-1) = %.4f\n", (long long)pp,
               (long long)micro, sched == NL_PIPE_GPIPE ? "GPipe" : "1F1B",
               nl_pipe_bubble_formula((int)pp, (int)micro));
        const char *bh[] = {"rank", "stage", "busy s", "idle s", "measured bubble"};
        nl_table bt;
        nl_table_init(&bt, 5, bh);
        double sb = 0, si = 0;
        for (int q = 0; q < P; q++) {
            const double *x = rows + (size_t)q * NK, bu = x[6 + NL_COMM_OP_COUNT], id = x[7 + NL_COMM_OP_COUNT];
            sb += bu, si += id;
            nl_table_rowf(&bt, "%d|%.0f|%.4f|%.4f|%.4f", q, x[8 + NL_COMM_OP_COUNT], bu, id, id / (bu + id));
        }
        nl_table_print(&bt, stdout);
        nl_table_free(&bt);
        printf("mean measured bubble %.4f vs formula %.4f\n", si / (sb + si),
               nl_pipe_bubble_formula((int)pp, (int)micro));
    }
    if (svg && pp > 1) {
        if (draw_timeline(svg, P, (int)micro, sched == NL_PIPE_GPIPE ? "GPipe" : "1F1B", ev, rows, NK,
                          nl_pipe_bubble_formula((int)pp, (int)micro)))
            rc = nl_cli_fail("parallel train: --svg");
    } else if (svg && draw_layout(svg, o.zero, P, n_full, rows, NK)) {
        rc = nl_cli_fail("parallel train: --svg");
    }
    return rc;
}

/* `parallel train` (and `train` with a layout option): argv[0] is "train". */
/* This rank's row of the report: bytes sent and received, sent per collective, memory
 * (parameters, gradients, optimizer, workspace), pipeline busy and idle seconds, stage. */
static void fill_rank_row(double *me, const nl_comm_stats *st, const nl_dist_memory *dm, double busy_s, double idle_s,
                          int pp_rank) {
    me[0] = (double)nl_comm_stats_sent_bytes(st);
    me[1] = (double)nl_comm_stats_recv_bytes(st);
    for (int k = 0; k < NL_COMM_OP_COUNT; k++) me[2 + k] = (double)st->coll[k].sent_bytes;
    me[2 + NL_COMM_OP_COUNT] = (double)dm->params;
    me[3 + NL_COMM_OP_COUNT] = (double)dm->grads;
    me[4 + NL_COMM_OP_COUNT] = (double)dm->optimizer;
    me[5 + NL_COMM_OP_COUNT] = (double)dm->workspace;
    me[6 + NL_COMM_OP_COUNT] = busy_s;
    me[7 + NL_COMM_OP_COUNT] = idle_s;
    me[8 + NL_COMM_OP_COUNT] = pp_rank;
}

int nl_cmd_parallel_train(int argc, char **argv) {
    par_cli A;
    int prc = parse_args(&A, argc, argv);
    if (prc) return prc < 0 ? NL_EXIT_OK : prc;
    nl_arch arch;
    if ((prc = check_args(&A, &arch))) return prc;
    int64_t dp = A.dp, tp = A.tp, pp = A.pp, micro = A.micro;
    int json = A.json, sched = A.sched, mp = tp > 1 || pp > 1; /* mp: the pipeline/tensor engine */
    const char *data = A.data, *svg = A.svg, *log_csv = A.log_csv;
    nl_dist_opts o = A.o;
    nl_train_opts *tr = &o.train;
    if (nl_comm_init(NULL, NULL)) return nl_cli_fail("parallel train: MPI");
    nl_comm *w = nl_comm_world();
    int P = nl_comm_size(w), R = nl_comm_rank(w), rc = NL_EXIT_OK;
    if (!dp) dp = P / (tp * pp) > 0 ? P / (tp * pp) : 1;
    A.dp = dp;
    nl_layout L;
    memset(&L, 0, sizeof L);
    nl_tokenizer tok;
    nl_data d;
    memset(&tok, 0, sizeof tok);
    memset(&d, 0, sizeof d);
    nl_dist_trainer t;
    memset(&t, 0, sizeof t);
    nl_pipe pl;
    memset(&pl, 0, sizeof pl);
    nl_trainer tn;
    memset(&tn, 0, sizeof tn);
    double *rows = NULL, *ev = NULL;
    step_probe probe;
    memset(&probe, 0, sizeof probe);
    nl_train_layout hooks;
    int64_t steps = tr->steps;
    enum { NK = 2 + NL_COMM_OP_COUNT + 4 + 3 }; /* per rank: sent, recv, per collective, memory x4, pipeline x3 */
    if (nl_layout_init(w, (int)dp, (int)tp, (int)pp, &L)) {
        rc = nl_cli_fail("parallel train: layout");
        goto out;
    }
    if (nl_tokenizer_init_byte(&tok) || nl_data_open(&d, data, &tok) || nl_data_check_window(&d, (int)tr->seq)) {
        rc = nl_cli_fail("parallel train: data");
        goto out;
    }
    if (mp) {
        if (nl_pipe_init(&pl, &arch, &o, (int)micro, (nl_pipe_schedule)sched, L.pp_comm, L.dp_comm, L.tp_comm)) {
            rc = nl_cli_fail("parallel train: --tp/--pp/--microbatches/--batch/--sp/--zero");
            goto out;
        }
        nl_pipe_layout(&pl, &probe.inner);
        probe.pl = &pl;
    } else {
        if (nl_dist_init(&t, &arch, &o, L.dp_comm)) {
            rc = nl_cli_fail("parallel train: --dp/--zero");
            goto out;
        }
        nl_dist_layout(&t, &probe.inner);
        probe.dt = &t;
    }
    probe.rank = R, probe.fault_rank = A.fault_rank, probe.fault_step = A.fault_step, probe.fault_how = A.fault_how;
    probe.json = json;
    hooks = probe.inner;
    hooks.user = &probe;
    hooks.grads = probe_grads, hooks.sumsq = probe_sumsq, hooks.scale = probe_scale, hooks.update = probe_update;
    hooks.eval = probe.inner.eval ? probe_eval : NULL;
    hooks.save = probe.inner.save ? probe_save : NULL;
    hooks.load = probe.inner.load ? probe_load : NULL;
    hooks.agree_stop = probe.inner.agree_stop ? probe_agree_stop : NULL;
    if (nl_trainer_init_layout(&tn, tr, &hooks)) {
        rc = nl_cli_fail(tr->resume ? "parallel train: --resume" : "parallel train");
        goto out;
    }
    rows = calloc((size_t)P * NK, sizeof(double));
    if (!rows) {
        rc = nl_cli_fail("parallel train: out of memory");
        goto out;
    }
    int64_t first = tn.step;
    if (tr->resume && R == 0 && !json) printf("resumed from %s after step %lld\n", tr->resume, (long long)first);
    double t0 = nl_time_s();
    nl_train_catch_stop_signals(1);
    tr->stop = &nl_train_stop_signal;
    nl_status trc = nl_trainer_run(&tn, tr, &d, on_step, &probe);
    nl_train_catch_stop_signals(0);
    if (trc) {
        rc = nl_cli_fail("parallel train");
        goto out;
    }
    if (tn.stopped && R == 0 && !json)
        printf("stopped by %s after step %lld of %lld%s%s\n", tn.stopped == SIGINT ? "SIGINT" : "SIGTERM",
               (long long)tn.step, (long long)tr->steps,
               tr->out ? "; resume with --resume " : " (no --out: nothing saved)", tr->out ? tr->out : "");
    if (R == 0 && log_csv && nl_train_log_write_csv(&tn, log_csv)) {
        rc = nl_cli_fail("parallel train: --log");
        goto out;
    }
    if (R == 0 && !json && tr->out) printf("saved %s after step %lld\n", tr->out, (long long)tn.step);
    steps = tn.step;
    nl_comm_stats st = probe.st;
    double bw_s = probe.bw_s, wait_s = probe.wait_s, busy_s = probe.busy_s, idle_s = probe.idle_s;
    double wall = nl_time_s() - t0;
    size_t n_full = mp ? pl.n_params_full : t.model.n_params; /* parameters of the whole model */
    nl_dist_memory dm;
    if (mp) { /* this rank's part only (see nanolm/pipeline.h) */
        nl_pipe_memory_report(&pl, &dm);
    } else {
        nl_dist_memory_report(&t, &dm);
    }
    fill_rank_row(rows + (size_t)R * NK, &st, &dm, busy_s, idle_s, L.pp_rank);
    if (share_rows(w, rows, NK)) {
        rc = nl_cli_fail("parallel train: report");
        goto out;
    }
    if (pp > 1 && svg) {
        ev = calloc((size_t)P * 2 * (size_t)micro * 4, sizeof(double));
        if (!ev) {
            rc = nl_cli_fail("parallel train: --svg");
            goto out;
        }
        for (int i = 0; i < pl.n_ev; i++) {
            double *e = ev + ((size_t)R * 2 * (size_t)micro + (size_t)i) * 4;
            e[0] = pl.ev_kind[i], e[1] = pl.ev_mb[i], e[2] = pl.ev_t0[i], e[3] = pl.ev_t1[i];
        }
        if (share_rows(w, ev, (int)(2 * micro * 4))) {
            rc = nl_cli_fail("parallel train: report");
            goto out;
        }
    }
    if (R == 0) {
        par_report rep = {&A, P, rows, ev, &tn, first, steps, n_full, bw_s, wait_s, wall};
        rc = print_report(&rep);
    }
out:
    nl_trainer_free(&tn);
    free(rows);
    free(ev);
    nl_dist_free(&t);
    nl_pipe_free(&pl);
    nl_data_free(&d);
    nl_tokenizer_free(&tok);
    nl_layout_free(&L);
    nl_comm_finalize();
    return rc;
}
