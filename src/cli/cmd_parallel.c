/* nanolm parallel train: data-parallel training of NanoLM over MPI (DDP, ZeRO-1/2/3).
 *   mpirun -np N nanolm parallel train --data FILE --dp N --zero Z [...]
 * Rank 0 prints the losses, the bytes every rank sent per step, and (--report-memory) the bytes
 * of parameters, gradients and optimizer state every rank holds. */
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "cli_opt.h"
#include "report.h"
#include "train_opts.h"
#include "nanolm/par_run.h"
#include "nanolm/par_svg.h"

/* What the command adds to the probe (nanolm/par_probe.h): --inject-fault and --json. */
typedef struct step_probe {
    const nl_par_probe *pr;
    int rank, fault_rank, fault_step;
    const char *fault_how;
    int json;
} step_probe;

/* --inject-fault: a rank that dies at the start of a step. */
static void fault_before_grads(void *u, int64_t step) {
    step_probe *p = u;
    if (p->rank != p->fault_rank || step + 1 != p->fault_step) return;
    if (!strcmp(p->fault_how, "kill")) raise(SIGKILL);
    if (!strcmp(p->fault_how, "stop")) raise(SIGSTOP);
    if (!strcmp(p->fault_how, "segv")) raise(SIGSEGV);
    if (!strcmp(p->fault_how, "_exit")) _exit(3);
    exit(3);
}


static void on_step(void *user, const nl_train_log *r, const nl_train_opts *o) {
    step_probe *p = user;
    (void)o;
    if (p->json || !p->pr->inner.rank0) return;
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
    nl_arch_override shape; /* --dim, --layers, --heads, --kv-heads, --hidden */
    int64_t dp, tp, pp, micro;
    int json, mem, sched;
    int fault_rank, fault_step;
    char fault_how[16];
    nl_train_args ta;  /* the training group (train_opts.h), bound to o.train */
    nl_layout_args la; /* the parallel layout group */
    nl_dist_opts o;    /* o.train: the one training options struct, the one set of defaults */
} par_cli;

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

/* Parses argv into a (defaults first): the training and layout groups (train_opts.h), the model
 * shape overrides and the outputs. argc < 0: prints the help only. Returns 0, NL_CLI_HELP after
 * --help, or NL_EXIT_USAGE after a message. */
static int parse_args(par_cli *a, int argc, char **argv) {
    memset(a, 0, sizeof *a);
    a->preset = "shakespeare-char";
    a->fault_rank = -1;
    a->shape.shared_experts = -1;
    snprintf(a->fault_how, sizeof a->fault_how, "exit");
    nl_dist_opts_default(&a->o);
    a->ta.o = &a->o.train;
    a->ta.seq_from_preset = 1;
    nl_opt train[NL_TRAIN_NOPTS], layout[NL_LAYOUT_NOPTS];
    int ntrain = nl_cli_train_opts(train, &a->ta);
    a->la.offer = NL_LAYOUT_DP_TP_PP | NL_LAYOUT_TIMEOUT | NL_LAYOUT_FAULT;
    int nlayout = nl_cli_layout_opts(layout, &a->la);
    nl_opt model[] = {
        NL_OPT_STR("preset", &a->preset, "P", "model shape (default shakespeare-char), then the overrides below"),
        NL_OPT_INT("dim", &a->shape.dim, 1, 65536, "C", "model width"),
        NL_OPT_INT("layers", &a->shape.layers, 1, 1024, "L", "layers"),
        NL_OPT_INT("heads", &a->shape.heads, 1, 1024, "H", "attention heads (and KV heads)"),
        NL_OPT_INT("kv-heads", &a->shape.kv_heads, 1, 1024, "K", "KV heads"),
        NL_OPT_INT("hidden", &a->shape.hidden, 1, 1 << 20, "F", "feed-forward width"),
    };
    nl_opt out[] = {
        NL_OPT_FLAG("report-memory", &a->mem, "bytes of parameters, gradients, optimizer state on each rank"),
        NL_OPT_FLAG("json", &a->json, "the report as JSON"),
    };
    nl_optgroup groups[] = {
        {"parallel layout (D x T x P must equal the ranks; ZeRO and checkpoints need --tp 1 --pp 1)", layout, nlayout},
        {"model shape", model, NL_NOPTS(model)},
        {"training: the options and defaults of `nanolm train` (fp32 only; --svg draws who holds what, or the "
         "pipeline timeline; SIGTERM/SIGINT: every rank finishes the same step, saves, exits 0)",
         train, ntrain},
        {"output", out, NL_NOPTS(out)},
    };
    nl_cmdspec spec = {"parallel train",
                       "mpirun -np N nanolm parallel train --data FILE [options]\n"
                       "   or: mpirun -np N nanolm train --data FILE --dp/--tp/--pp/--zero ... (the same run)",
                       "Data (DDP, ZeRO-1/2/3), tensor and pipeline parallel training of NanoLM over MPI. The batch of "
                       "dp rank r is its slice of the global batch of D*B windows: the same data as one process "
                       "with --batch D*B.",
                       groups,
                       NL_NOPTS(groups),
                       0};
    if (argc < 0) {
        nl_cli_help(&spec, stdout);
        return NL_CLI_HELP;
    }
    int rc = nl_cli_parse(&spec, argc, argv, NULL, NULL);
    if (rc) return rc;
    a->data = a->ta.data, a->svg = a->ta.svg, a->log_csv = a->ta.log_csv;
    a->dp = a->la.dp, a->tp = a->la.tp, a->pp = a->la.pp, a->micro = a->la.microbatches;
    a->sched = a->la.schedule ? NL_PIPE_1F1B : NL_PIPE_GPIPE;
    a->o.zero = (int)a->la.zero;
    a->o.impl = a->la.impl ? NL_COMM_NATIVE : NL_COMM_OURS;
    a->o.sp = a->la.sp;
    if (a->la.no_overlap) a->o.overlap = 0;
    if (a->la.timeout_given) nl_comm_set_timeout(a->la.timeout_s);
    if (a->la.inject_fault && parse_fault(a, a->la.inject_fault)) return NL_EXIT_USAGE;
    return 0;
}

/* The model shape from the preset and the overrides, train's defaults, and the checks that name
 * flags (outputs writable before any work). Returns 0 or the exit status after a message. */
static int check_args(par_cli *a, nl_arch *arch) {
    nl_train_opts *tr = &a->o.train;
    int rc = nl_cli_train_finish(&a->ta, "parallel train");
    if (rc) return rc;
    if (a->ta.precision == NL_TRAIN_FP8)
        return nl_cli_usage_error("parallel train: --precision fp8 is not supported by the parallel layouts (fp32)");
    if (nl_arch_preset(a->preset, arch)) return nl_cli_usage_error("parallel train: --preset: %s", nl_last_error());
    nl_arch_override_apply(&a->shape, arch);
    /* the defaults of `nanolm train`: the preset's window */
    if (!a->ta.seq_given) tr->seq = arch->seq_len;
    if (arch->seq_len < tr->seq) arch->seq_len = tr->seq;
    if (nl_arch_validate(arch)) return nl_cli_usage_error("parallel train: model shape: %s", nl_last_error());
    if (arch->vocab_size != 256)
        return nl_cli_usage_error("parallel train: preset %s has vocab %lld; training reads byte tokens (vocab 256)",
                                  a->preset, (long long)arch->vocab_size);
    if ((a->tp > 1 || a->pp > 1) && (tr->out || tr->resume))
        return nl_cli_usage_error("parallel train: --out/--resume are not supported yet with --tp or --pp > 1");
    return 0;
}

int nl_cmd_parallel(int argc, char **argv);
int nl_cmd_parallel_train(int argc, char **argv);
int nl_cmd_parallel(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        if (argc < 2) {
            fprintf(stderr, "usage: mpirun -np N nanolm parallel train --data FILE [options] (see nanolm parallel "
                            "train --help)\n");
            return NL_EXIT_USAGE;
        }
        par_cli a;
        parse_args(&a, -1, NULL);
        return NL_EXIT_OK;
    }
    if (strcmp(argv[1], "train")) return nl_cli_usage_error("parallel: unknown subcommand '%s' (train)", argv[1]);
    return nl_cmd_parallel_train(argc - 1, argv + 1);
}

/* The report rows: per rank, bytes sent and received, sent per collective, memory x4, pipeline x3. */
enum { NK = NL_PAR_ROW };

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

/* Rank 0's report, written once (report.h): the run's header lines and values, the per-rank table
 * (bytes sent and received, memory held) and, with --pp, the per-stage table. */
static void report_run(nl_report *r, const par_report *x) {
    const par_cli *a = x->a;
    const nl_dist_opts *o = &a->o;
    int P = x->P, zero = o->zero, mp = a->tp > 1 || a->pp > 1;
    int64_t dp = a->dp, steps_run = x->steps - x->first;
    double tokens_per_s = (double)steps_run * (double)(o->train.batch * o->train.seq * dp) / x->wall;
    const char *what = a->pp > 1   ? "Pipeline"
                       : a->tp > 1 ? "Tensor parallel"
                       : zero      ? "ZeRO"
                       : dp > 1    ? "DDP"
                                   : "One process";
    static const char *zname[4] = {"", "-1", "-2", "-3"};
    nl_report_note(r, "%s%s on %d rank%s (dp %lld), %zu parameters, global batch %lld x %lld tokens, %s collectives",
                   what, zname[zero], P, P > 1 ? "s" : "", (long long)dp, x->n_full, (long long)(o->train.batch * dp),
                   (long long)o->train.seq, nl_comm_impl_name(o->impl));
    if (mp)
        nl_report_note(r, "%.0f tokens/s", tokens_per_s);
    else
        nl_report_note(r, "%.0f tokens/s; backward %.3f s, waiting for gradient buckets after backward %.3f s",
                       tokens_per_s, x->bw_s, x->wait_s);
    nl_report_int(r, "ranks", "", P, NULL);
    nl_report_int(r, "dp", "", (long long)dp, NULL);
    nl_report_int(r, "zero", "", zero, NULL);
    nl_report_int(r, "pp", "", (long long)a->pp, NULL);
    nl_report_int(r, "tp", "", (long long)a->tp, NULL);
    if (a->pp > 1) {
        nl_report_int(r, "microbatches", "", (long long)a->micro, NULL);
        nl_report_str(r, "schedule", "", a->sched == NL_PIPE_GPIPE ? "gpipe" : "1f1b");
        nl_report_num(r, "bubble_formula", "", nl_pipe_bubble_formula((int)a->pp, (int)a->micro), NULL, NULL);
    }
    nl_report_str(r, "impl", "", nl_comm_impl_name(o->impl));
    nl_report_int(r, "overlap", "", o->overlap, NULL);
    nl_report_int(r, "n_params", "", (long long)x->n_full, NULL);
    nl_report_int(r, "global_batch", "", (long long)(o->train.batch * dp), NULL);
    nl_cli_train_summary(r, x->tn, a->preset, (long long)x->n_full, x->wall, tokens_per_s);
    nl_report_num(r, "backward_s", "", x->bw_s, NULL, NULL);
    nl_report_num(r, "comm_wait_after_backward_s", "", x->wait_s, NULL, NULL);
    const nl_trainer *tn = x->tn;
    double *ls = malloc(((size_t)tn->n_log + 1) * 2 * sizeof(double)), *ns = ls ? ls + tn->n_log + 1 : NULL;
    for (int64_t s = 0; ls && s < tn->n_log; s++) ls[s] = tn->log[s].loss, ns[s] = tn->log[s].grad_norm;
    nl_report_nums(r, "losses", "", ls, ls ? (int)tn->n_log : 0, NULL, NULL);
    nl_report_nums(r, "grad_norms", "", ns, ls ? (int)tn->n_log : 0, NULL, NULL);
    free(ls);
    nl_report_int(r, "first_step", "", (long long)x->first + 1, NULL);
}

/* The per-rank table: bytes sent and received per step (and per collective, JSON), memory held
 * (text with --report-memory). */
static void report_ranks(nl_report *r, const par_report *x) {
    const char *mh = x->a->mem ? NULL : ""; /* memory columns: in the table with --report-memory */
    nl_report_col cols[8 + NL_COMM_OP_COUNT] = {
        {"rank", "rank", "%-.0f"},
        {"sent_bytes_per_step", "sent/step", "%-.0f"},
        {NULL, "of params", "%-.4f"},
        {"recv_bytes_per_step", "recv/step", "%-.0f"},
        {"params_bytes", mh ? mh : "params B", "%-.0f"},
        {"grads_bytes", mh ? mh : "grads B", "%-.0f"},
        {"optimizer_bytes", mh ? mh : "optimizer B", "%-.0f"},
        {"workspace_bytes", mh ? mh : "workspace B", "%-.0f"},
    };
    char keys[NL_COMM_OP_COUNT][48];
    for (int k = 0; k < NL_COMM_OP_COUNT; k++) { /* sent per collective: JSON only */
        snprintf(keys[k], sizeof keys[k], "sent_bytes_per_step_%s", nl_comm_op_name((nl_comm_op)k));
        for (char *c = keys[k]; *c; c++)
            if (*c == '-') *c = '_';
        cols[8 + k] = (nl_report_col){keys[k], "", NULL};
    }
    nl_report_table(r, "per_rank", NULL, 8 + NL_COMM_OP_COUNT, cols);
    double pbytes = (double)x->n_full * 4;
    for (int q = 0; q < x->P; q++) {
        const double *m = x->rows + (size_t)q * NK;
        nl_report_cell_int(r, q);
        nl_report_cell_num(r, m[0]);
        nl_report_cell_num(r, m[0] / pbytes);
        nl_report_cell_num(r, m[1]);
        for (int k = 0; k < 4; k++) nl_report_cell_num(r, m[2 + NL_COMM_OP_COUNT + k]);
        for (int k = 0; k < NL_COMM_OP_COUNT; k++) nl_report_cell_num(r, m[2 + k]);
        nl_report_row_end(r);
    }
}

/* With --pp: the stages' busy and idle time against the bubble formula. */
static void report_stages(nl_report *r, const par_report *x) {
    const par_cli *a = x->a;
    double formula = nl_pipe_bubble_formula((int)a->pp, (int)a->micro);
    nl_report_note(r, "pipeline: %lld stages, %lld micro-batches, %s; bubble formula (P-1)/(M+P-1) = %.4f",
                   (long long)a->pp, (long long)a->micro, a->sched == NL_PIPE_GPIPE ? "GPipe" : "1F1B", formula);
    nl_report_table(r, "stages", NULL, 5,
                    (const nl_report_col[]){{"rank", "rank", "%-.0f"},
                                            {"stage", "stage", "%-.0f"},
                                            {"busy_s", "busy s", "%-.4f"},
                                            {"idle_s", "idle s", "%-.4f"},
                                            {"bubble", "measured bubble", "%-.4f"}});
    double sb = 0, si = 0;
    for (int q = 0; q < x->P; q++) {
        const double *m = x->rows + (size_t)q * NK, bu = m[6 + NL_COMM_OP_COUNT], id = m[7 + NL_COMM_OP_COUNT];
        sb += bu, si += id;
        nl_report_cell_int(r, q);
        nl_report_cell_num(r, m[8 + NL_COMM_OP_COUNT]);
        nl_report_cell_num(r, bu);
        nl_report_cell_num(r, id);
        nl_report_cell_num(r, id / (bu + id));
        nl_report_row_end(r);
    }
    nl_report_note(r, "mean measured bubble %.4f vs formula %.4f", si / (sb + si), formula);
}

/* Rank 0's table or JSON, and --svg. Returns the exit status. */
static int print_report(const par_report *x) {
    const par_cli *a = x->a;
    nl_report *r = nl_report_new("parallel train");
    report_run(r, x);
    report_ranks(r, x);
    if (a->pp > 1) report_stages(r, x);
    int rc = nl_report_print(r, a->json);
    if (a->svg && a->pp > 1) {
        if (nl_par_svg_timeline(a->svg, x->P, (int)a->micro, a->sched == NL_PIPE_GPIPE ? "GPipe" : "1F1B", x->ev,
                                x->rows, NK, nl_pipe_bubble_formula((int)a->pp, (int)a->micro)))
            rc = nl_cli_fail("parallel train: --svg");
    } else if (a->svg && nl_par_svg_layout(a->svg, a->o.zero, x->P, x->n_full, x->rows, NK)) {
        rc = nl_cli_fail("parallel train: --svg");
    }
    return rc;
}

/* What one run of `parallel train` holds on this rank: the run (nanolm/par_run.h), what the
 * command's hook reads, and the shared report rows. */
typedef struct par_run {
    nl_comm *w;
    int P, R;
    nl_par_run run;
    step_probe probe;
    double *rows, *ev; /* (P, NK) per-rank rows; with --pp --svg (P, 2M, 4) timeline events */
} par_run;

/* The run (resumed when asked) and the report rows. Returns 0 or the exit status after a message. */
static int run_setup(par_cli *A, const nl_arch *arch, par_run *x) {
    step_probe *p = &x->probe;
    p->pr = &x->run.pr;
    p->rank = x->R, p->fault_rank = A->fault_rank, p->fault_step = A->fault_step, p->fault_how = A->fault_how;
    p->json = A->json;
    nl_par_run_part part;
    if (nl_par_run_open(&x->run, x->w, arch, &A->o, (int)A->dp, (int)A->tp, (int)A->pp, (int)A->micro,
                        (nl_pipe_schedule)A->sched, A->data, fault_before_grads, p, &part)) {
        const char *what[] = {"parallel train: layout", "parallel train: data",
                              x->run.mp ? "parallel train: --tp/--pp/--microbatches/--batch/--sp/--zero"
                                        : "parallel train: --dp/--zero",
                              A->o.train.resume ? "parallel train: --resume" : "parallel train"};
        return nl_cli_fail(what[part]);
    }
    x->rows = calloc((size_t)x->P * NK, sizeof(double));
    if (!x->rows) return nl_cli_fail("parallel train: out of memory");
    return 0;
}

/* Every rank's row of the report (and with --pp --svg its timeline), shared with every rank. */
static int share_report(const par_cli *A, par_run *x) {
    if (nl_par_share_rows(x->w, &x->run.pr, x->run.L.pp_rank, x->rows)) return nl_cli_fail("parallel train: report");
    if (A->pp > 1 && A->svg) {
        x->ev = calloc((size_t)x->P * 2 * (size_t)A->micro * 4, sizeof(double));
        if (!x->ev) return nl_cli_fail("parallel train: --svg");
        if (nl_par_share_timeline(x->w, &x->run.pl, (int)A->micro, x->ev)) return nl_cli_fail("parallel train: report");
    }
    return 0;
}

static void run_free(par_run *x) {
    nl_par_run_free(&x->run);
    free(x->rows);
    free(x->ev);
}

/* Trains through nl_trainer_run with SIGTERM/SIGINT caught, then says how it stopped, writes the
 * log and shares the report rows. Returns the exit status. */
static int run_train(par_cli *A, par_run *x) {
    nl_train_opts *tr = &A->o.train;
    int R = x->R, json = A->json;
    int64_t first = x->run.tn.step;
    if (tr->resume && R == 0 && !json) printf("resumed from %s after step %lld\n", tr->resume, (long long)first);
    double t0 = nl_time_s();
    nl_train_catch_stop_signals(1);
    tr->stop = &nl_train_stop_signal;
    nl_status trc = nl_trainer_run(&x->run.tn, tr, &x->run.d, on_step, &x->probe);
    nl_train_catch_stop_signals(0);
    if (trc) return nl_cli_fail("parallel train");
    const nl_trainer *tn = &x->run.tn;
    if (R == 0 && !json) nl_cli_train_stopped(tn, tr);
    if (R == 0 && A->log_csv && nl_train_log_write_csv(tn, A->log_csv)) return nl_cli_fail("parallel train: --log");
    if (R == 0 && !json && tr->out) printf("saved %s after step %lld\n", tr->out, (long long)tn->step);
    double wall = nl_time_s() - t0;
    int rc = share_report(A, x);
    if (rc || R != 0) return rc;
    size_t n_full = x->run.mp ? x->run.pl.n_params_full : x->run.t.model.n_params; /* of the whole model */
    par_report rep = {A, x->P, x->rows, x->ev, tn, first, tn->step, n_full, x->run.pr.bw_s, x->run.pr.wait_s, wall};
    return print_report(&rep);
}

int nl_cmd_parallel_train(int argc, char **argv) {
    par_cli A;
    int rc = parse_args(&A, argc, argv);
    if (rc) return rc == NL_CLI_HELP ? NL_EXIT_OK : rc;
    nl_arch arch;
    if ((rc = check_args(&A, &arch))) return rc;
    if (nl_comm_init(NULL, NULL)) return nl_cli_fail("parallel train: MPI");
    par_run x;
    memset(&x, 0, sizeof x);
    x.w = nl_comm_world();
    x.P = nl_comm_size(x.w), x.R = nl_comm_rank(x.w);
    if (!A.dp) A.dp = x.P / (A.tp * A.pp) > 0 ? x.P / (A.tp * A.pp) : 1;
    rc = run_setup(&A, &arch, &x);
    if (!rc) rc = run_train(&A, &x);
    run_free(&x);
    nl_comm_finalize();
    return rc;
}
