/* nanolm moe train: NanoLM-MoE with expert or context parallelism under mpirun (nanolm/moe_ep.h),
 * trained by the one training loop (nl_trainer_run) through the layout's hooks (nl_ep_layout):
 * schedule, warmup, validation, checkpoints, log and SIGTERM handling come from there. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


#include "cli/cli.h"
#include "cli/cli_opt.h"
#include "cli/report.h"
#include "cli/train_opts.h"
#include "nanolm/moe_stats.h"
#include "nanolm/tokenizer.h"


/* What the command line asks for. */
typedef struct moe_args {
    const char *preset;
    nl_arch_override shape; /* --layers, --dim, --experts, --top-k, --shared, --expert-hidden */
    double aux, cap;
    int json, mem;
    nl_train_args ta;  /* the training group (train_opts.h), bound to tr */
    nl_layout_args la; /* the layout group: --ep, --cp, --impl */
    nl_train_opts tr;
} moe_args;

/* The option table (also the --help of `moe` and `moe train`). */
static int parse_args(moe_args *a, int argc, char **argv) {
    memset(a, 0, sizeof *a);
    nl_train_opts_default(&a->tr);
    a->preset = "moe-course-tiny", a->shape.shared_experts = -1;
    a->aux = 0.01;
    /* moe train's defaults: 20 steps at a constant learning rate, no validation unless asked */
    a->tr.steps = 20, a->tr.batch = 4, a->tr.seq = 32, a->tr.warmup = 0, a->tr.eval_every = 0;
    a->ta.o = &a->tr;
    a->ta.omit = NL_TRAIN_OMIT_SVG | NL_TRAIN_OMIT_PRECISION | NL_TRAIN_OMIT_GRAD_ACCUM;
    a->ta.lr_min_is_lr = 1, a->ta.eval_when_asked = 1;
    nl_opt train[NL_TRAIN_NOPTS], layout[NL_LAYOUT_NOPTS];
    int ntrain = nl_cli_train_opts(train, &a->ta);
    a->la.offer = NL_LAYOUT_EP_CP;
    int nlayout = nl_cli_layout_opts(layout, &a->la);
    nl_opt model[] = {
        NL_OPT_STR("preset", &a->preset, "NAME",
                   "MoE shape (moe-course-tiny: 64 routed + 2 shared, top-6, D 64, 2 layers)"),
        NL_OPT_INT("layers", &a->shape.layers, 1, 64, "N", "override the preset's layers"),
        NL_OPT_INT("dim", &a->shape.dim, 2, 4096, "D", "override the model width"),
        NL_OPT_INT("experts", &a->shape.experts, 1, 1024, "E", "routed experts per MoE layer"),
        NL_OPT_INT("top-k", &a->shape.top_k, 1, 1024, "K", "experts per token"),
        NL_OPT_INT("shared", &a->shape.shared_experts, 0, 64, "S", "shared experts per MoE layer"),
        NL_OPT_INT("expert-hidden", &a->shape.expert_hidden, 1, 65536, "F", "hidden width of each expert"),
        NL_OPT_DBL("aux", &a->aux, 0, 1e6, "A", "load-balancing loss coefficient (0.01; 0 = off)"),
        NL_OPT_DBL("capacity", &a->cap, 0, 1e6, "C", "capacity factor (0 = no token dropping)"),
    };
    nl_opt out[] = {
        NL_OPT_FLAG("report-memory", &a->mem,
                    "bytes of parameters, gradients, optimizer state and activations per rank"),
        NL_OPT_FLAG("json", &a->json, "one JSON document with every step and rank"),
    };
    nl_optgroup groups[] = {
        {"model shape", model, NL_NOPTS(model)},
        {"parallel layout", layout, nlayout},
        {"training (the one trainer's options; SIGTERM/SIGINT finish the step, save, exit 0)", train, ntrain},
        {"output", out, NL_NOPTS(out)}};
    nl_cmdspec spec = {"moe train",
                       "[mpirun -np N] nanolm moe train --data FILE [options]",
                       "NanoLM-MoE (routed + shared SwiGLU experts, top-k router, aux loss) with expert parallelism: "
                       "N/ep data-parallel replicas of ep-rank expert groups, or context parallelism.",
                       groups,
                       NL_NOPTS(groups),
                       0};
    if (argc < 0) { /* `moe --help` */
        nl_cli_help(&spec, stdout);
        return NL_CLI_HELP;
    }
    return nl_cli_parse(&spec, argc, argv, NULL, NULL);
}

int nl_cmd_moe_train(int argc, char **argv);
int nl_cmd_moe(int argc, char **argv);
int nl_cmd_moe(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        moe_args a;
        if (argc < 2) {
            fprintf(stderr,
                    "usage: [mpirun -np N] nanolm moe train --data FILE [options] (see nanolm moe train --help)\n");
            return NL_EXIT_USAGE;
        }
        parse_args(&a, -1, NULL);
        return NL_EXIT_OK;
    }
    if (strcmp(argv[1], "train")) return nl_cli_usage_error("moe: unknown subcommand '%s' (train)", argv[1]);
    return nl_cmd_moe_train(argc - 1, argv + 1);
}

/* What the per-step callback needs. */
typedef struct moe_run {
    nl_ep_trainer *t;
    nl_comm *w;
    int N, R, json;
    nl_moe_steps steps; /* --json: one record per step, written at the end */
    nl_status err;      /* a failed gather in the callback */
} moe_run;

/* One line (rank 0) or one JSON record per step, from the layout's statistics (t->st). */
static void on_step(void *user, const nl_train_log *r, const nl_train_opts *o) {
    moe_run *x = user;
    const nl_ep_step_stats *st = &x->t->st;
    const nl_moe *e = x->t->model.moe;
    (void)o;
    if (x->json) {
        nl_status rc = nl_moe_steps_record(&x->steps, x->w, x->t, r);
        if (rc && !x->err) x->err = rc;
        return;
    }
    if (x->R != 0) return;
    printf("%5lld %9.5f %9.5f %9.3f %9lld %8.4f %14llu", (long long)r->step - 1, r->loss, st->aux_loss,
           nl_moe_load_ratio(st->tokens, e->n_moe_layers, e->E), (long long)st->dropped, r->grad_norm,
           (unsigned long long)st->a2a_sent_bytes);
    if (!isnan(r->val_loss)) printf("  val %.4f", r->val_loss);
    printf("\n");
    fflush(stdout);
}

/* The JSON result's header: the run's shape and layout (the text form printed its line before
 * the run). */
static void report_header(nl_report *r, const nl_arch *a, const nl_moe *e, const moe_args *g, int N) {
    nl_report_str(r, "model", "", a->name);
    nl_report_int(r, "ranks", "", N, NULL);
    nl_report_int(r, "ep", "", (long long)g->la.ep, NULL);
    nl_report_int(r, "cp", "", (long long)g->la.cp, NULL);
    nl_report_int(r, "dim", "", (long long)a->dim, NULL);
    nl_report_int(r, "moe_layers", "", (long long)e->n_moe_layers, NULL);
    nl_report_int(r, "top_k", "", (long long)a->top_k, NULL);
    nl_report_int(r, "experts", "", (long long)a->n_experts, NULL);
    nl_report_int(r, "tokens_per_rank", "", (long long)(g->tr.batch * g->tr.seq / g->la.cp), NULL);
    struct {
        const char *n;
        long long v;
    } f[] = {{"vocab_size", a->vocab_size},
             {"dim", a->dim},
             {"n_layers", a->n_layers},
             {"n_heads", a->n_heads},
             {"n_kv_heads", a->n_kv_heads},
             {"hidden_dim", a->hidden_dim},
             {"seq_len", a->seq_len},
             {"tied_embeddings", a->tied_embeddings},
             {"n_experts", a->n_experts},
             {"n_shared_experts", a->n_shared_experts},
             {"top_k", a->top_k},
             {"expert_hidden_dim", a->expert_hidden_dim},
             {"first_moe_layer", a->first_moe_layer}};
    nl_report_begin_object(r, "arch", NULL);
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) nl_report_int(r, f[i].n, "", f[i].v, NULL);
    nl_report_end_object(r);
}

/* The JSON result's steps: one row per step, each rank's byte counts as lists. */
static void report_steps(nl_report *r, const moe_run *x) {
    nl_report_col cols[9 + NL_MOE_STEP_BYTES] = {
        {"step", "", NULL},      {"loss", "", NULL},    {"aux_loss", "", NULL},
        {"grad_norm", "", NULL}, {"lr", "", NULL},      {"val_loss", "", NULL},
        {"slots", "", NULL},     {"dropped", "", NULL}, {"max_mean_load", "", NULL}};
    for (int k = 0; k < NL_MOE_STEP_BYTES; k++) cols[9 + k] = (nl_report_col){nl_moe_step_byte_names[k], "", NULL};
    nl_report_table(r, "steps", NULL, 9 + NL_MOE_STEP_BYTES, cols);
    for (int64_t i = 0; i < x->steps.n; i++) {
        const nl_moe_step_rec *s = &x->steps.rec[i];
        nl_report_cell_int(r, (long long)s->step);
        nl_report_cell_num(r, s->loss);
        nl_report_cell_num(r, s->aux_loss);
        nl_report_cell_num(r, s->grad_norm);
        nl_report_cell_num(r, s->lr);
        nl_report_cell_num(r, s->val_loss); /* null when the step had no validation */
        nl_report_cell_int(r, (long long)s->slots);
        nl_report_cell_int(r, (long long)s->dropped);
        nl_report_cell_num(r, s->max_mean_load);
        for (int k = 0; k < NL_MOE_STEP_BYTES; k++) nl_report_cell_nums(r, s->bytes + k * x->N, x->N);
        nl_report_row_end(r);
    }
}

/* The shape from the preset and the overrides; the layout and option checks that name flags. */
static int build_arch(moe_args *g, nl_arch *a, int N) {
    int rc = nl_cli_train_finish(&g->ta, "moe train");
    if (rc) return rc;
    int64_t ep = g->la.ep, cp = g->la.cp;
    if (nl_moe_preset(g->preset, a)) return nl_cli_usage_error("moe train: --preset: %s", nl_last_error());
    nl_arch_override_apply(&g->shape, a);
    if (g->tr.seq > a->seq_len) a->seq_len = g->tr.seq;
    if (nl_arch_validate(a)) return nl_cli_usage_error("moe train: %s", nl_last_error());
    if (N % ep || N % cp)
        return nl_cli_usage_error("moe train: --%s %lld must divide the %d ranks", N % ep ? "ep" : "cp",
                                  (long long)(N % ep ? ep : cp), N);
    if (cp > 1 && (ep > 1 || g->aux != 0 || g->cap != 0))
        return nl_cli_usage_error("moe train: --cp %lld needs --aux 0 and --capacity 0 and no --ep", (long long)cp);
    if (cp > 1 && g->tr.seq % (2 * cp))
        return nl_cli_usage_error("moe train: --seq %lld must be a multiple of 2 x --cp %lld", (long long)g->tr.seq,
                                  (long long)cp);
    if (cp > 1 && (g->ta.eval_given || g->ta.windows_given))
        return nl_cli_usage_error("moe train: --cp has no validation (--eval-every, --eval-windows)");
    if (ep > 1 && (g->tr.out || g->tr.resume))
        return nl_cli_usage_error("moe train: --out/--resume need --ep 1 (checkpoints hold whole models)");
    return 0;
}

/* --report-memory: bytes per rank (every rank takes part in the gathers). */
static nl_status report_memory(moe_run *x, nl_report *rep) {
    int N = x->N;
    const char *names[4] = {"params", "grads", "optimizer", "activations"};
    double *v = calloc((size_t)N * 4, sizeof(double));
    if (!v) return nl_fail(NL_ERR_NOMEM, "out of memory (memory report)");
    nl_status rc = nl_moe_memory(x->w, x->t, v);
    for (int r = 0; !rc && r < N; r++)
        nl_report_note(rep, "rank %d: params %.0f B, grads %.0f B, optimizer %.0f B, activations %.0f B", r, v[r],
                       v[N + r], v[2 * N + r], v[3 * N + r]);
    if (!rc) {
        nl_report_begin_object(rep, "memory", NULL);
        for (int k = 0; k < 4; k++) nl_report_nums(rep, names[k], "", v + k * N, N, NULL, NULL);
        nl_report_end_object(rep);
    }
    free(v);
    return rc;
}

/* Trains through nl_trainer_run and prints the per-step table or JSON, memory and throughput. */
static int train_and_report(moe_args *g, const nl_arch *a, nl_ep_trainer *t, const nl_data *d, moe_run *x) {
    nl_train_layout L;
    nl_ep_layout(t, &L);
    if (!g->ta.eval_given && !g->ta.windows_given) L.eval = NULL; /* validation only when asked for */
    nl_trainer tn;
    if (nl_trainer_init_layout(&tn, &g->tr, &L)) return nl_cli_fail(g->tr.resume ? "moe train: --resume" : "moe train");
    const nl_moe *e = t->model.moe;
    int rc = NL_EXIT_OK;
    nl_report *rep = NULL;
    if (!g->json && x->R == 0) {
        printf("NanoLM-MoE %s: %lld layers, D %lld, %lld routed + %lld shared experts (F %lld), top-%lld; %d ranks, "
               "ep %lld; %lld tokens per rank and step\n",
               a->name, (long long)a->n_layers, (long long)a->dim, (long long)a->n_experts,
               (long long)a->n_shared_experts, (long long)a->expert_hidden_dim, (long long)a->top_k, x->N,
               (long long)g->la.ep, (long long)(g->tr.batch * g->tr.seq / g->la.cp));
        if (g->tr.resume) printf("resumed from %s after step %lld\n", g->tr.resume, (long long)tn.step);
        printf("%5s %9s %9s %9s %9s %8s %14s\n", "step", "loss", "aux", "max/mean", "dropped", "|grad|", "a2a B/rank0");
    }
    int64_t first = tn.step;
    double t0 = nl_time_s();
    nl_train_catch_stop_signals(1);
    g->tr.stop = &nl_train_stop_signal;
    nl_status trc = nl_trainer_run(&tn, &g->tr, d, on_step, x);
    nl_train_catch_stop_signals(0);
    double el = nl_time_s() - t0;
    if (trc || x->err) {
        if (x->err && !trc) nl_fail(x->err, "%s", nl_last_error());
        rc = nl_cli_fail("moe train");
        goto out;
    }
    if (x->R == 0 && g->ta.log_csv && nl_train_log_write_csv(&tn, g->ta.log_csv)) {
        rc = nl_cli_fail("moe train: --log");
        goto out;
    }
    /* the result, once: the text form's last lines, or the JSON document */
    rep = nl_report_new("moe train");
    if (g->json) {
        report_header(rep, a, e, g, x->N);
        report_steps(rep, x);
        int64_t ntk = e->n_moe_layers * e->E;
        double *tk = malloc(sizeof(double) * (size_t)(ntk > 0 ? ntk : 1));
        for (int64_t i = 0; tk && i < ntk; i++) tk[i] = (double)t->st.tokens[i];
        if (tk) nl_report_nums(rep, "tokens_per_expert", "", tk, (int)ntk, NULL, NULL); /* of the last step */
        free(tk);
    }
    if (x->R == 0 && !g->json) nl_cli_train_stopped(&tn, &g->tr);
    if (x->R == 0 && !g->json && g->tr.out) printf("saved %s after step %lld\n", g->tr.out, (long long)tn.step);
    nl_comm_max_double(x->w, &el);
    if (g->mem && report_memory(x, rep)) {
        rc = nl_cli_fail("moe train: memory");
        goto out;
    }
    double tps = (double)((tn.step - first) * g->tr.batch * g->tr.seq * (x->N / g->la.cp)) / el;
    nl_report_note(rep, "%.2f s, %.0f tokens/s", el, tps);
    nl_report_num(rep, "seconds", "", el, NULL, NULL);
    nl_report_num(rep, "tokens_per_s", "", tps, NULL, NULL);
    if (x->R == 0) {
        rc = nl_report_print(rep, g->json);
        rep = NULL;
    }
out:
    nl_report_free(rep);
    nl_trainer_free(&tn);
    return rc;
}

int nl_cmd_moe_train(int argc, char **argv) {
    moe_args g;
    int prc = parse_args(&g, argc, argv);
    if (prc) return prc == NL_CLI_HELP ? NL_EXIT_OK : prc;
    if (nl_comm_init(NULL, NULL)) return nl_cli_fail("moe train: MPI");
    nl_comm *w = nl_comm_world();
    int N = nl_comm_size(w), R = nl_comm_rank(w), rc;
    nl_arch a;
    nl_tokenizer tok;
    nl_data d;
    nl_ep_trainer t;
    memset(&tok, 0, sizeof tok);
    memset(&d, 0, sizeof d);
    memset(&t, 0, sizeof t);
    moe_run x = {.t = &t, .w = w, .N = N, .R = R, .json = g.json};
    if ((rc = build_arch(&g, &a, N))) goto out;
    if (nl_tokenizer_init_byte(&tok) || nl_data_open(&d, g.ta.data, &tok) || nl_data_check_window(&d, (int)g.tr.seq)) {
        rc = nl_cli_fail("moe train: --data");
        goto out;
    }
    nl_ep_opts o;
    nl_ep_opts_default(&o);
    o.train = g.tr;
    o.ep = (int)g.la.ep, o.cp = (int)g.la.cp, o.impl = g.la.impl ? NL_COMM_NATIVE : NL_COMM_OURS;
    o.aux_coef = (float)g.aux, o.capacity_factor = (float)g.cap;
    if (nl_ep_init(&t, &a, &o, w)) {
        rc = nl_cli_fail("moe train: init");
        goto out;
    }
    rc = train_and_report(&g, &a, &t, &d, &x);
out:
    nl_moe_steps_free(&x.steps);
    nl_ep_free(&t);
    nl_data_free(&d);
    nl_tokenizer_free(&tok);
    nl_comm_finalize();
    return rc;
}
