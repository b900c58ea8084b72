/* nanolm moe train: NanoLM-MoE with expert parallelism under mpirun (nanolm/moe_ep.h). */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli/cli.h"
#include "nanolm/moe_ep.h"
#include "nanolm/tokenizer.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: [mpirun -np N] nanolm moe train --data FILE [options]\n"
            "  NanoLM-MoE (routed + shared SwiGLU experts, top-k router, aux loss) with expert\n"
            "  parallelism: N/ep data-parallel replicas of ep-rank expert groups.\n"
            "  --preset NAME      MoE shape (moe-course-tiny: 64 routed + 2 shared, top-6, D 64, 2 layers)\n"
            "  --layers N --dim D --experts E --top-k K --shared S --expert-hidden F   override the shape\n"
            "  --ep E             ranks per expert-parallel group (divides N and the experts; 1)\n"
            "  --cp C             context parallel: C ranks share each sequence, ring attention over\n"
            "                     a load-balanced split (2C chunks); needs --aux 0, no --ep\n"
            "  --steps N (20) --batch B (sequences per rank, 4) --seq T (32) --lr X (1e-3) --seed S (1337)\n"
            "  --aux A            load-balancing loss coefficient (0.01; 0 = off)\n"
            "  --capacity C       capacity factor (0 = no token dropping)\n"
            "  --impl ours|native all-to-all implementation (ours)\n"
            "  --report-memory    bytes of parameters, gradients, optimizer state and activations per rank\n"
            "  --json             one JSON document with every step and rank\n");
}

int nl_cmd_moe_train(int argc, char **argv);
int nl_cmd_moe(int argc, char **argv);
int nl_cmd_moe(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? NL_EXIT_USAGE : NL_EXIT_OK;
    }
    if (strcmp(argv[1], "train")) return nl_cli_usage_error("moe: unknown subcommand '%s' (train)", argv[1]);
    return nl_cmd_moe_train(argc - 1, argv + 1);
}

enum { O_DATA = 1, O_PRESET, O_LAYERS, O_DIM, O_EXPERTS, O_TOPK, O_SHARED, O_FE, O_EP, O_CP, O_STEPS, O_BATCH, O_SEQ,
       O_LR, O_SEED, O_AUX, O_CAP, O_IMPL, O_MEM, O_JSON, O_HELP };
static const struct option mopts[] = {
    {"data", required_argument, 0, O_DATA}, {"preset", required_argument, 0, O_PRESET},
    {"layers", required_argument, 0, O_LAYERS}, {"dim", required_argument, 0, O_DIM},
    {"experts", required_argument, 0, O_EXPERTS}, {"top-k", required_argument, 0, O_TOPK},
    {"shared", required_argument, 0, O_SHARED}, {"expert-hidden", required_argument, 0, O_FE},
    {"ep", required_argument, 0, O_EP}, {"cp", required_argument, 0, O_CP}, {"steps", required_argument, 0, O_STEPS},
    {"batch", required_argument, 0, O_BATCH}, {"seq", required_argument, 0, O_SEQ},
    {"lr", required_argument, 0, O_LR}, {"seed", required_argument, 0, O_SEED},
    {"aux", required_argument, 0, O_AUX}, {"capacity", required_argument, 0, O_CAP},
    {"impl", required_argument, 0, O_IMPL}, {"report-memory", no_argument, 0, O_MEM},
    {"json", no_argument, 0, O_JSON}, {"help", no_argument, 0, O_HELP}, {0, 0, 0, 0}};

/* mean over MoE layers of (max expert load / mean expert load) */
static double load_ratio(const int64_t *tok, int64_t layers, int64_t E) {
    double r = 0;
    for (int64_t l = 0; l < layers; l++) {
        double mx = 0, sum = 0;
        for (int64_t e = 0; e < E; e++) {
            sum += (double)tok[l * E + e];
            if (tok[l * E + e] > mx) mx = (double)tok[l * E + e];
        }
        r += sum > 0 ? mx / (sum / (double)E) : 0;
    }
    return r / (double)layers;
}

/* per-rank values gathered to everyone by a sum of one-hot vectors */
static nl_status gather(nl_comm *w, double *v, int n, int rank, double mine) {
    for (int i = 0; i < n; i++) {
        v[i] = i == rank ? mine : 0;
        if (n > 1) NL_TRY(nl_comm_sum_double(w, &v[i]));
    }
    return NL_OK;
}

int nl_cmd_moe_train(int argc, char **argv) {
    const char *data = NULL, *preset = "moe-course-tiny";
    int64_t layers = 0, dim = 0, experts = 0, topk = 0, shared = -1, fe = 0, ep = 1, cp = 1, steps = 20, batch = 4,
            seq = 32, seed = 1337;
    double lr = 1e-3, aux = 0.01, cap = 0;
    int json = 0, mem = 0;
    nl_comm_impl impl = NL_COMM_OURS;
    int c;
    nl_cli_getopt_reset();
    while ((c = getopt_long(argc, argv, "", mopts, NULL)) != -1) {
        switch (c) {
        case O_DATA: data = optarg; break;
        case O_PRESET: preset = optarg; break;
        case O_LAYERS: if (nl_cli_int("--layers", optarg, 1, 64, &layers)) return NL_EXIT_USAGE; break;
        case O_DIM: if (nl_cli_int("--dim", optarg, 2, 4096, &dim)) return NL_EXIT_USAGE; break;
        case O_EXPERTS: if (nl_cli_int("--experts", optarg, 1, 1024, &experts)) return NL_EXIT_USAGE; break;
        case O_TOPK: if (nl_cli_int("--top-k", optarg, 1, 1024, &topk)) return NL_EXIT_USAGE; break;
        case O_SHARED: if (nl_cli_int("--shared", optarg, 0, 64, &shared)) return NL_EXIT_USAGE; break;
        case O_FE: if (nl_cli_int("--expert-hidden", optarg, 1, 65536, &fe)) return NL_EXIT_USAGE; break;
        case O_EP: if (nl_cli_int("--ep", optarg, 1, 64, &ep)) return NL_EXIT_USAGE; break;
        case O_CP: if (nl_cli_int("--cp", optarg, 1, 64, &cp)) return NL_EXIT_USAGE; break;
        case O_STEPS: if (nl_cli_int("--steps", optarg, 1, 10000000, &steps)) return NL_EXIT_USAGE; break;
        case O_BATCH: if (nl_cli_int("--batch", optarg, 1, 65536, &batch)) return NL_EXIT_USAGE; break;
        case O_SEQ: if (nl_cli_int("--seq", optarg, 1, 65536, &seq)) return NL_EXIT_USAGE; break;
        case O_SEED: if (nl_cli_int("--seed", optarg, 0, INT64_MAX, &seed)) return NL_EXIT_USAGE; break;
        case O_LR: if (nl_cli_double("--lr", optarg, &lr)) return NL_EXIT_USAGE; break;
        case O_AUX: if (nl_cli_double("--aux", optarg, &aux)) return NL_EXIT_USAGE; break;
        case O_CAP: if (nl_cli_double("--capacity", optarg, &cap)) return NL_EXIT_USAGE; break;
        case O_IMPL:
            if (!strcmp(optarg, "ours")) impl = NL_COMM_OURS;
            else if (!strcmp(optarg, "native")) impl = NL_COMM_NATIVE;
            else return nl_cli_usage_error("moe train: --impl must be ours or native, got '%s'", optarg);
            break;
        case O_MEM: mem = 1; break;
        case O_JSON: json = 1; break;
        case O_HELP: usage(stdout); return NL_EXIT_OK;
        default: return nl_cli_bad_option("moe train", argv);
        }
    }
    if (optind < argc) return nl_cli_usage_error("moe train: unexpected argument '%s'", argv[optind]);
    if (!data) return nl_cli_usage_error("moe train: --data FILE is required");
    if (aux < 0 || cap < 0) return nl_cli_usage_error("moe train: --aux and --capacity must be >= 0");
    nl_arch a;
    if (nl_moe_preset(preset, &a)) return nl_cli_usage_error("moe train: %s", nl_last_error());
    if (layers) a.n_layers = layers;
    if (dim) a.dim = dim;
    if (experts) a.n_experts = experts;
    if (topk) a.top_k = topk;
    if (shared >= 0) a.n_shared_experts = shared;
    if (fe) a.expert_hidden_dim = fe;
    if (seq > a.seq_len) a.seq_len = seq;
    if (nl_arch_validate(&a)) return nl_cli_usage_error("moe train: %s", nl_last_error());

    if (nl_comm_init(NULL, NULL)) return nl_cli_fail("moe train: MPI");
    nl_comm *w = nl_comm_world();
    int N = nl_comm_size(w), R = nl_comm_rank(w), rc = NL_EXIT_OK;
    nl_ep_opts o;
    nl_ep_opts_default(&o);
    o.ep = (int)ep, o.cp = (int)cp, o.impl = impl, o.train.batch = batch, o.train.seq = seq, o.train.lr = (float)lr, o.train.seed = (uint64_t)seed;
    o.aux_coef = (float)aux, o.capacity_factor = (float)cap;
    nl_tokenizer tok;
    nl_data d;
    nl_ep_trainer t;
    memset(&tok, 0, sizeof tok);
    memset(&d, 0, sizeof d);
    memset(&t, 0, sizeof t);
    cJSON *doc = NULL, *jsteps = NULL;
    double *v = calloc((size_t)N * 8, sizeof(double));
    if (nl_tokenizer_init_byte(&tok) || nl_data_open(&d, data, &tok) || nl_data_check_window(&d, (int)seq)) {
        rc = nl_cli_fail("moe train: data");
        goto out;
    }
    if (N % ep || N % cp) {
        rc = nl_cli_usage_error("moe train: --%s %lld must divide the %d ranks", N % ep ? "ep" : "cp",
                                (long long)(N % ep ? ep : cp), N);
        goto out;
    }
    if (nl_ep_init(&t, &a, &o, w)) {
        rc = nl_cli_fail("moe train: init");
        goto out;
    }
    nl_moe *e = t.model.moe;
    if (json) {
        doc = cJSON_CreateObject();
        cJSON_AddStringToObject(doc, "model", a.name);
        cJSON_AddNumberToObject(doc, "ranks", N);
        cJSON_AddNumberToObject(doc, "ep", (double)ep);
        cJSON_AddNumberToObject(doc, "cp", (double)cp);
        cJSON_AddNumberToObject(doc, "dim", (double)a.dim);
        cJSON_AddNumberToObject(doc, "moe_layers", (double)e->n_moe_layers);
        cJSON_AddNumberToObject(doc, "top_k", (double)a.top_k);
        cJSON_AddNumberToObject(doc, "experts", (double)a.n_experts);
        cJSON_AddNumberToObject(doc, "tokens_per_rank", (double)(batch * seq / cp));
        cJSON *ja = cJSON_AddObjectToObject(doc, "arch");
        cJSON_AddNumberToObject(ja, "vocab_size", (double)a.vocab_size);
        cJSON_AddNumberToObject(ja, "dim", (double)a.dim);
        cJSON_AddNumberToObject(ja, "n_layers", (double)a.n_layers);
        cJSON_AddNumberToObject(ja, "n_heads", (double)a.n_heads);
        cJSON_AddNumberToObject(ja, "n_kv_heads", (double)a.n_kv_heads);
        cJSON_AddNumberToObject(ja, "hidden_dim", (double)a.hidden_dim);
        cJSON_AddNumberToObject(ja, "seq_len", (double)a.seq_len);
        cJSON_AddNumberToObject(ja, "tied_embeddings", a.tied_embeddings);
        cJSON_AddNumberToObject(ja, "n_experts", (double)a.n_experts);
        cJSON_AddNumberToObject(ja, "n_shared_experts", (double)a.n_shared_experts);
        cJSON_AddNumberToObject(ja, "top_k", (double)a.top_k);
        cJSON_AddNumberToObject(ja, "expert_hidden_dim", (double)a.expert_hidden_dim);
        cJSON_AddNumberToObject(ja, "first_moe_layer", (double)a.first_moe_layer);
        jsteps = cJSON_AddArrayToObject(doc, "steps");
    } else if (R == 0) {
        printf("NanoLM-MoE %s: %lld layers, D %lld, %lld routed + %lld shared experts (F %lld), top-%lld; %d ranks, "
               "ep %lld; %lld tokens per rank and step\n",
               a.name, (long long)a.n_layers, (long long)a.dim, (long long)a.n_experts, (long long)a.n_shared_experts,
               (long long)a.expert_hidden_dim, (long long)a.top_k, N, (long long)ep, (long long)(batch * seq / cp));
        printf("%5s %9s %9s %9s %9s %8s %14s\n", "step", "loss", "aux", "max/mean", "dropped", "|grad|",
               "a2a B/rank0");
    }
    double t0 = nl_time_s();
    for (int64_t s = 0; s < steps; s++) {
        if (nl_ep_step(&t, &d, s)) {
            rc = nl_cli_fail("moe train: step");
            goto out;
        }
        double ratio = load_ratio(t.st.tokens, e->n_moe_layers, e->E);
        if (json) {
            double *g = v;
            double mine[6] = {(double)t.st.a2a_sent_bytes, (double)t.st.a2a_count_bytes,
                              (double)t.st.payload_sent_bytes, (double)t.st.payload_self_bytes,
                              (double)t.st.dispatched_bytes, (double)t.st.returned_bytes};
            cJSON *st = cJSON_CreateObject();
            cJSON_AddNumberToObject(st, "step", (double)s);
            cJSON_AddNumberToObject(st, "loss", t.st.loss);
            cJSON_AddNumberToObject(st, "aux_loss", t.st.aux_loss);
            cJSON_AddNumberToObject(st, "grad_norm", t.st.grad_norm);
            cJSON_AddNumberToObject(st, "slots", (double)t.st.slots);
            cJSON_AddNumberToObject(st, "dropped", (double)t.st.dropped);
            cJSON_AddNumberToObject(st, "max_mean_load", ratio);
            const char *names[6] = {"a2a_sent_bytes", "a2a_count_bytes", "payload_sent_bytes", "payload_self_bytes",
                                    "dispatched_bytes", "returned_bytes"};
            for (int k = 0; k < 6; k++) {
                if (gather(w, g, N, R, mine[k])) { rc = nl_cli_fail("moe train: stats"); goto out; }
                cJSON_AddItemToObject(st, names[k], cJSON_CreateDoubleArray(g, N));
            }
            if (s == steps - 1) {
                cJSON *tk = cJSON_AddArrayToObject(st, "tokens_per_expert");
                for (int64_t i = 0; i < e->n_moe_layers * e->E; i++) cJSON_AddItemToArray(tk, cJSON_CreateNumber((double)t.st.tokens[i]));
            }
            cJSON_AddItemToArray(jsteps, st);
        } else if (R == 0) {
            printf("%5lld %9.5f %9.5f %9.3f %9lld %8.4f %14llu\n", (long long)s, t.st.loss, t.st.aux_loss, ratio,
                   (long long)t.st.dropped, t.st.grad_norm, (unsigned long long)t.st.a2a_sent_bytes);
        }
    }
    double el = nl_time_s() - t0;
    nl_comm_max_double(w, &el);
    if (mem) {
        double mine[4] = {(double)nl_model_param_bytes(&t.model), (double)nl_model_param_bytes(&t.model),
                          (double)nl_adamw_bytes(&t.opt), (double)nl_ep_act_bytes(&t)};
        const char *names[4] = {"params", "grads", "optimizer", "activations"};
        cJSON *jm = json ? cJSON_AddObjectToObject(doc, "memory") : NULL;
        for (int k = 0; k < 4; k++) {
            if (gather(w, v + k * N, N, R, mine[k])) { rc = nl_cli_fail("moe train: memory"); goto out; }
            if (jm) cJSON_AddItemToObject(jm, names[k], cJSON_CreateDoubleArray(v + k * N, N));
        }
        if (!json && R == 0)
            for (int r = 0; r < N; r++)
                printf("rank %d: params %.0f B, grads %.0f B, optimizer %.0f B, activations %.0f B\n", r, v[r],
                       v[N + r], v[2 * N + r], v[3 * N + r]);
    }
    double tps = (double)(steps * batch * seq * (N / cp)) / el;
    if (json) {
        cJSON_AddNumberToObject(doc, "seconds", el);
        cJSON_AddNumberToObject(doc, "tokens_per_s", tps);
    } else if (R == 0) {
        printf("%.2f s, %.0f tokens/s\n", el, tps);
    }
out:
    if (doc) {
        if (R == 0 && rc == NL_EXIT_OK) nl_cli_print_json(doc);
        else cJSON_Delete(doc);
    }
    free(v);
    nl_ep_free(&t);
    nl_data_free(&d);
    nl_tokenizer_free(&tok);
    nl_comm_finalize();
    return rc;
}
