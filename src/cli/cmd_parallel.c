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
    O_DATA = 1000, O_PRESET, O_DIM, O_LAYERS, O_HEADS, O_KVH, O_HIDDEN, O_STEPS, O_BATCH, O_SEQ, O_LR, O_CLIP,
    O_WD, O_SEED, O_DP, O_TP, O_PP, O_ZERO, O_MICRO, O_SCHED, O_IMPL, O_NO_OVERLAP, O_MEM, O_JSON, O_SVG, O_OUT, O_SAVE_EVERY, O_RESUME, O_FAULT, O_SP, O_HELP
};

static const struct option popts[] = {
    {"data", required_argument, 0, O_DATA},      {"preset", required_argument, 0, O_PRESET},
    {"dim", required_argument, 0, O_DIM},        {"layers", required_argument, 0, O_LAYERS},
    {"heads", required_argument, 0, O_HEADS},    {"kv-heads", required_argument, 0, O_KVH},
    {"hidden", required_argument, 0, O_HIDDEN},  {"steps", required_argument, 0, O_STEPS},
    {"batch", required_argument, 0, O_BATCH},    {"seq", required_argument, 0, O_SEQ},
    {"lr", required_argument, 0, O_LR},          {"clip", required_argument, 0, O_CLIP},
    {"weight-decay", required_argument, 0, O_WD}, {"seed", required_argument, 0, O_SEED},
    {"dp", required_argument, 0, O_DP},          {"tp", required_argument, 0, O_TP},
    {"pp", required_argument, 0, O_PP},          {"zero", required_argument, 0, O_ZERO},
    {"microbatches", required_argument, 0, O_MICRO}, {"schedule", required_argument, 0, O_SCHED},
    {"impl", required_argument, 0, O_IMPL},      {"no-overlap", no_argument, 0, O_NO_OVERLAP},
    {"sp", no_argument, 0, O_SP},
    {"report-memory", no_argument, 0, O_MEM},    {"json", no_argument, 0, O_JSON},
    {"svg", required_argument, 0, O_SVG},        {"out", required_argument, 0, O_OUT},
    {"save-every", required_argument, 0, O_SAVE_EVERY}, {"resume", required_argument, 0, O_RESUME},
    {"inject-fault", required_argument, 0, O_FAULT},
    {"help", no_argument, 0, O_HELP},            {0, 0, 0, 0}};

static void usage(FILE *f) {
    fprintf(f,
            "usage: mpirun -np N nanolm parallel train --data FILE [options]\n"
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
            "  --steps N (20) --batch B per dp rank (4) --seq T (32) --lr X (1e-3, constant)\n"
            "  --clip X (1.0) --weight-decay X (0.1) --seed S (1337)\n"
            "  --report-memory       bytes of parameters, gradients, optimizer state on each rank\n"
            "  --json                the same as JSON\n"
            "  --svg FILE            picture of who holds what (measured bytes) and what moves per step\n"
            "  --out CKPT --save-every K   checkpoint (safetensors, written by rank 0) every K steps and at the end\n"
            "  --resume CKPT         continue from a checkpoint up to --steps\n"
            "  --inject-fault R[:exit|_exit|segv|kill]@S   (tests) rank R leaves at the start of step S\n"
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
    if (zero) snprintf(t, sizeof t, "ZeRO-%d on %d ranks, %zu parameters (fp32 + AdamW): what each rank holds", zero, P,
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
    snprintf(t, sizeof t, "%s, %d ranks, %d micro-batches (last step): measured bubble %.3f, formula (P-1)/(M+P-1) = %.3f",
             sched, P, M, si / (sb + si), formula);
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
            snprintf(t, sizeof t, "%s micro-batch %.0f: %.2f ms", e[0] ? "backward" : "forward", e[1], (e[3] - e[2]) * 1e3);
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

/* `parallel train` (and `train` with a layout option): argv[0] is "train". */
int nl_cmd_parallel_train(int argc, char **argv) {
    const char *data = NULL, *preset = "shakespeare-char";
    int64_t dim = 0, layers = 0, heads = 0, kvh = 0, hidden = 0, steps = 20, dp = 0, tp = 1, pp = 1, v;
    int64_t micro = 1;
    int json = 0, mem = 0, sched = NL_PIPE_GPIPE;
    const char *svg = NULL, *out_path = NULL, *resume = NULL;
    int64_t save_every = 0;
    int fault_rank = -1, fault_step = 0;
    char fault_how[16] = "exit";
    nl_dist_opts o;
    nl_dist_opts_default(&o);
    double dv;
    int c;
    while ((c = getopt_long(argc, argv, "", popts, NULL)) != -1) {
        switch (c) {
        case O_DATA: data = optarg; break;
        case O_PRESET: preset = optarg; break;
        case O_DIM: if (parse_i("--dim", optarg, 1, 65536, &dim)) return NL_EXIT_USAGE; break;
        case O_LAYERS: if (parse_i("--layers", optarg, 1, 1024, &layers)) return NL_EXIT_USAGE; break;
        case O_HEADS: if (parse_i("--heads", optarg, 1, 1024, &heads)) return NL_EXIT_USAGE; break;
        case O_KVH: if (parse_i("--kv-heads", optarg, 1, 1024, &kvh)) return NL_EXIT_USAGE; break;
        case O_HIDDEN: if (parse_i("--hidden", optarg, 1, 1 << 20, &hidden)) return NL_EXIT_USAGE; break;
        case O_STEPS: if (parse_i("--steps", optarg, 1, 100000000, &steps)) return NL_EXIT_USAGE; break;
        case O_BATCH: if (parse_i("--batch", optarg, 1, 65536, &v)) return NL_EXIT_USAGE; o.batch = v; break;
        case O_SEQ: if (parse_i("--seq", optarg, 1, 1 << 20, &v)) return NL_EXIT_USAGE; o.seq = v; break;
        case O_SEED: if (parse_i("--seed", optarg, 0, INT64_MAX, &v)) return NL_EXIT_USAGE; o.seed = (uint64_t)v; break;
        case O_LR: if (nl_cli_double("--lr", optarg, &dv)) return NL_EXIT_USAGE; o.lr = (float)dv; break;
        case O_CLIP: if (nl_cli_double("--clip", optarg, &dv)) return NL_EXIT_USAGE; o.grad_clip = (float)dv; break;
        case O_WD: if (nl_cli_double("--weight-decay", optarg, &dv)) return NL_EXIT_USAGE; o.weight_decay = (float)dv; break;
        case O_DP: if (parse_i("--dp", optarg, 1, 65536, &dp)) return NL_EXIT_USAGE; break;
        case O_TP: if (parse_i("--tp", optarg, 1, 65536, &tp)) return NL_EXIT_USAGE; break;
        case O_PP: if (parse_i("--pp", optarg, 1, 65536, &pp)) return NL_EXIT_USAGE; break;
        case O_ZERO: if (parse_i("--zero", optarg, 0, 3, &v)) return NL_EXIT_USAGE; o.zero = (int)v; break;
        case O_MICRO: if (parse_i("--microbatches", optarg, 1, 65536, &micro)) return NL_EXIT_USAGE; break;
        case O_SCHED:
            if (strcmp(optarg, "gpipe") && strcmp(optarg, "1f1b"))
                return nl_cli_usage_error("parallel train: unknown --schedule '%s' (gpipe, 1f1b)", optarg);
            sched = strcmp(optarg, "gpipe") ? NL_PIPE_1F1B : NL_PIPE_GPIPE;
            break;
        case O_IMPL:
            if (!strcmp(optarg, "ours")) o.impl = NL_COMM_OURS;
            else if (!strcmp(optarg, "native")) o.impl = NL_COMM_NATIVE;
            else return nl_cli_usage_error("parallel train: unknown --impl '%s' (ours, native)", optarg);
            break;
        case O_NO_OVERLAP: o.overlap = 0; break;
        case O_SP: o.sp = 1; break;
        case O_MEM: mem = 1; break;
        case O_JSON: json = 1; break;
        case O_SVG: svg = optarg; break;
        case O_OUT: out_path = optarg; break;
        case O_RESUME: resume = optarg; break;
        case O_SAVE_EVERY: if (parse_i("--save-every", optarg, 1, 100000000, &save_every)) return NL_EXIT_USAGE; break;
        case O_FAULT: {
            char how[16] = "exit";
            if (sscanf(optarg, "%d@%d", &fault_rank, &fault_step) != 2 &&
                sscanf(optarg, "%d:%15[_a-z]@%d", &fault_rank, how, &fault_step) != 3)
                return nl_cli_usage_error("parallel train: invalid --inject-fault '%s' (R[:exit|_exit|segv|kill]@S)", optarg);
            if (strcmp(how, "exit") && strcmp(how, "_exit") && strcmp(how, "segv") && strcmp(how, "kill"))
                return nl_cli_usage_error("parallel train: invalid --inject-fault '%s' (R[:exit|_exit|segv|kill]@S)", optarg);
            snprintf(fault_how, sizeof fault_how, "%s", how);
            break;
        }
        case O_HELP: usage(stdout); return NL_EXIT_OK;
        default: return nl_cli_bad_option("parallel train", argv);
        }
    }
    if (optind < argc) return nl_cli_usage_error("parallel train: unexpected argument '%s'", argv[optind]);
    if (!data) return nl_cli_usage_error("parallel train: --data FILE is required");
    nl_arch arch;
    if (nl_arch_preset(preset, &arch)) return nl_cli_usage_error("parallel train: --preset: %s", nl_last_error());
    if (dim) arch.dim = dim;
    if (layers) arch.n_layers = layers;
    if (heads) arch.n_heads = heads, arch.n_kv_heads = heads;
    if (kvh) arch.n_kv_heads = kvh;
    if (hidden) arch.hidden_dim = hidden;
    if (arch.seq_len < o.seq) arch.seq_len = o.seq;
    if (nl_arch_validate(&arch)) return nl_cli_usage_error("parallel train: model shape: %s", nl_last_error());
    if (arch.vocab_size != 256)
        return nl_cli_usage_error("parallel train: preset %s has vocab %lld; training reads byte tokens (vocab 256)",
                                  preset, (long long)arch.vocab_size);
    /* every output is checked before any work starts */
    if ((out_path && nl_check_writable(out_path, "--out")) || (svg && nl_check_writable(svg, "--svg")))
        return nl_cli_fail("parallel train");
    int mp = tp > 1 || pp > 1; /* model parallel: the pipeline/tensor engine */
    if (mp && (out_path || resume))
        return nl_cli_usage_error("parallel train: --out/--resume are not supported yet with --tp or --pp > 1");

    if (nl_comm_init(NULL, NULL)) return nl_cli_fail("parallel train: MPI");
    nl_comm *w = nl_comm_world();
    int P = nl_comm_size(w), R = nl_comm_rank(w), rc = NL_EXIT_OK;
    if (!dp) dp = P / (tp * pp) > 0 ? P / (tp * pp) : 1;
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
    double *losses = NULL, *norms = NULL, *rows = NULL, *ev = NULL;
    enum { NK = 2 + NL_COMM_OP_COUNT + 4 + 3 }; /* per rank: sent, recv, per collective, memory x4, pipeline x3 */
    if (nl_layout_init(w, (int)dp, (int)tp, (int)pp, &L)) { rc = nl_cli_fail("parallel train: layout"); goto out; }
    if (nl_tokenizer_init_byte(&tok) || nl_data_open(&d, data, &tok) || nl_data_check_window(&d, (int)o.seq)) {
        rc = nl_cli_fail("parallel train: data");
        goto out;
    }
    if (mp) {
        if (nl_pipe_init(&pl, &arch, &o, (int)micro, (nl_pipe_schedule)sched, L.pp_comm, L.dp_comm, L.tp_comm)) {
            rc = nl_cli_fail("parallel train: init");
            goto out;
        }
    } else if (nl_dist_init(&t, &arch, &o, L.dp_comm)) {
        rc = nl_cli_fail("parallel train: init");
        goto out;
    }
    losses = calloc((size_t)steps, sizeof(double));
    norms = calloc((size_t)steps, sizeof(double));
    rows = calloc((size_t)P * NK, sizeof(double));
    nl_comm_stats st;
    memset(&st, 0, sizeof st);
    int64_t first = 0;
    if (resume) {
        if (nl_dist_load(&t, resume, &first)) { rc = nl_cli_fail("parallel train: --resume"); goto out; }
        if (R == 0 && !json) printf("resumed from %s after step %lld\n", resume, (long long)first);
    }
    double t0 = nl_time_s(), bw_s = 0, wait_s = 0, busy_s = 0, idle_s = 0;
    for (int64_t s = first; s < steps; s++) {
        if (R == fault_rank && s + 1 == fault_step) { /* a rank that dies at the start of a step */
            if (!strcmp(fault_how, "kill")) raise(SIGKILL);
            if (!strcmp(fault_how, "segv")) raise(SIGSEGV);
            if (!strcmp(fault_how, "_exit")) _exit(3);
            exit(3);
        }
        nl_comm_reset_total_stats();
        float loss;
        double norm;
        nl_status sst = mp ? nl_pipe_step(&pl, &d, s, o.lr, &loss, &norm) : nl_dist_step(&t, &d, s, o.lr, &loss, &norm);
        if (sst) { rc = nl_cli_fail("parallel train: step"); goto out; }
        busy_s += pl.busy_s;
        idle_s += pl.idle_s;
        nl_comm_get_total_stats(&st); /* bytes of this step (the last step's are reported) */
        losses[s] = loss;
        norms[s] = norm;
        bw_s += t.backward_s;
        wait_s += t.comm_wait_s;
        if (!json && R == 0)
            printf("step %3lld  loss %.6f  grad norm %.4f\n", (long long)s + 1, loss, norm);
        if (out_path && ((save_every && (s + 1) % save_every == 0) || s + 1 == steps)) {
            if (nl_dist_save(&t, out_path, s + 1)) { rc = nl_cli_fail("parallel train: --out"); goto out; }
            if (!json && R == 0) printf("saved %s after step %lld\n", out_path, (long long)s + 1);
        }
    }
    double wall = nl_time_s() - t0;
    size_t n_full = mp ? pl.n_params_full : t.model.n_params; /* parameters of the whole model */
    nl_dist_memory dm;
    if (mp) { /* this rank's part only (see nanolm/pipeline.h) */
        nl_pipe_memory_report(&pl, &dm);
    } else {
        nl_dist_memory_report(&t, &dm);
    }
    double *me = rows + (size_t)R * NK;
    me[0] = (double)nl_comm_stats_sent_bytes(&st);
    me[1] = (double)nl_comm_stats_recv_bytes(&st);
    for (int k = 0; k < NL_COMM_OP_COUNT; k++) me[2 + k] = (double)st.coll[k].sent_bytes;
    me[2 + NL_COMM_OP_COUNT] = (double)dm.params;
    me[3 + NL_COMM_OP_COUNT] = (double)dm.grads;
    me[4 + NL_COMM_OP_COUNT] = (double)dm.optimizer;
    me[5 + NL_COMM_OP_COUNT] = (double)dm.workspace;
    me[6 + NL_COMM_OP_COUNT] = busy_s;
    me[7 + NL_COMM_OP_COUNT] = idle_s;
    me[8 + NL_COMM_OP_COUNT] = L.pp_rank;
    if (share_rows(w, rows, NK)) { rc = nl_cli_fail("parallel train: report"); goto out; }
    if (pp > 1 && svg) {
        ev = calloc((size_t)P * 2 * (size_t)micro * 4, sizeof(double));
        if (!ev) { rc = nl_cli_fail("parallel train: --svg"); goto out; }
        for (int i = 0; i < pl.n_ev; i++) {
            double *e = ev + ((size_t)R * 2 * (size_t)micro + (size_t)i) * 4;
            e[0] = pl.ev_kind[i], e[1] = pl.ev_mb[i], e[2] = pl.ev_t0[i], e[3] = pl.ev_t1[i];
        }
        if (share_rows(w, ev, (int)(2 * micro * 4))) { rc = nl_cli_fail("parallel train: report"); goto out; }
    }
    if (R == 0) {
        const char *what = o.zero ? "ZeRO" : (dp > 1 ? "DDP" : "One process");
        double tokens_per_s = (double)(steps - first) * (double)(o.batch * o.seq * dp) / wall;
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
            cJSON_AddNumberToObject(j, "global_batch", (double)(o.batch * dp));
            cJSON_AddNumberToObject(j, "tokens_per_s", tokens_per_s);
            cJSON_AddNumberToObject(j, "backward_s", bw_s);
            cJSON_AddNumberToObject(j, "comm_wait_after_backward_s", wait_s);
            cJSON *ls = cJSON_AddArrayToObject(j, "losses"), *ns = cJSON_AddArrayToObject(j, "grad_norms");
            cJSON_AddNumberToObject(j, "first_step", (double)first + 1);
            for (int64_t s = first; s < steps; s++) {
                cJSON_AddItemToArray(ls, cJSON_CreateNumber(losses[s]));
                cJSON_AddItemToArray(ns, cJSON_CreateNumber(norms[s]));
            }
            cJSON *rk = cJSON_AddArrayToObject(j, "per_rank");
            for (int q = 0; q < P; q++) {
                double *x = rows + (size_t)q * NK;
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
                    cJSON_AddNumberToObject(e, "bubble", x[7 + NL_COMM_OP_COUNT] / (x[6 + NL_COMM_OP_COUNT] + x[7 + NL_COMM_OP_COUNT]));
                }
                cJSON_AddItemToArray(rk, e);
            }
            nl_cli_print_json(j);
        } else {
            if (pp > 1) what = "Pipeline";
            else if (tp > 1) what = "Tensor parallel";
            printf("%s%s on %d rank%s (dp %lld), %zu parameters, global batch %lld x %lld tokens, %s collectives\n",
                   what, o.zero ? (o.zero == 1 ? "-1" : o.zero == 2 ? "-2" : "-3") : "", P, P > 1 ? "s" : "", (long long)dp,
                   n_full, (long long)(o.batch * dp), (long long)o.seq, nl_comm_impl_name(o.impl));
            if (mp)
                printf("%.0f tokens/s\n", tokens_per_s);
            else
                printf("%.0f tokens/s; backward %.3f s, waiting for gradient buckets after backward %.3f s\n",
                       tokens_per_s, bw_s, wait_s);
            const char *hdr[] = {"rank", "sent/step", "of params", "recv/step", "params B", "grads B", "optimizer B",
                                 "workspace B"};
            nl_table tb;
            nl_table_init(&tb, mem ? 8 : 4, hdr);
            double pbytes = (double)n_full * 4;
            for (int q = 0; q < P; q++) {
                double *x = rows + (size_t)q * NK;
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
            printf("pipeline: %lld stages, %lld micro-batches, %s; bubble formula (P-1)/(M+P-1) = %.4f\n",
                   (long long)pp, (long long)micro, sched == NL_PIPE_GPIPE ? "GPipe" : "1F1B",
                   nl_pipe_bubble_formula((int)pp, (int)micro));
            const char *bh[] = {"rank", "stage", "busy s", "idle s", "measured bubble"};
            nl_table bt;
            nl_table_init(&bt, 5, bh);
            double sb = 0, si = 0;
            for (int q = 0; q < P; q++) {
                double *x = rows + (size_t)q * NK, bu = x[6 + NL_COMM_OP_COUNT], id = x[7 + NL_COMM_OP_COUNT];
                sb += bu, si += id;
                nl_table_rowf(&bt, "%d|%.0f|%.4f|%.4f|%.4f", q, x[8 + NL_COMM_OP_COUNT], bu, id, id / (bu + id));
            }
            nl_table_print(&bt, stdout);
            nl_table_free(&bt);
            printf("mean measured bubble %.4f vs formula %.4f\n", si / (sb + si), nl_pipe_bubble_formula((int)pp, (int)micro));
        }
        if (svg && pp > 1) {
            if (draw_timeline(svg, P, (int)micro, sched == NL_PIPE_GPIPE ? "GPipe" : "1F1B", ev, rows, NK,
                              nl_pipe_bubble_formula((int)pp, (int)micro)))
                rc = nl_cli_fail("parallel train: --svg");
        } else if (svg && draw_layout(svg, o.zero, P, n_full, rows, NK)) {
            rc = nl_cli_fail("parallel train: --svg");
        }
    }
out:
    free(losses);
    free(norms);
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
