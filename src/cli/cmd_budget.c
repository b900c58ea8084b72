/* nanolm budget: memory of training state (by recipe and ZeRO stage) and of activations. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "nanolm/plan.h"
#include "plan_opts.h"

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: nanolm budget (--model M|FILE.json | --params N) [--recipe bf16] [--gpus N] [--tp T] [--pp P]\n"
        "                     [--ep E] [--zero 0|1|2|3|hsdp] [--batch B] [--seq S] [--recompute none|selective|full]\n"
        "                     [--sp] [--no-flash] [--micro M] [--gpu G] [--hw FILE.json] [--model-file FILE.json]\n"
        "                     [--svg FILE] [--json]\n\n"
        "Training state per GPU for every ZeRO stage (or the one given), the parameters one GPU\n"
        "holds under tp/pp/ep, and with --model the activations kept for backward, term by term\n"
        "(Korthikanti et al. 2022 adapted to RMSNorm, GQA, SwiGLU), for --batch sequences of --seq\n"
        "tokens, beside Korthikanti's published formula and recomputation. Recipes: fp32, bf16, fp8,\n"
        "fp8-ds3. GB = 1e9 bytes, GiB = 2^30.\n");
}

int nl_cmd_budget(int argc, char **argv) {
    static const struct option opts[] = {{"model", required_argument, 0, 'M'},
                                         {"params", required_argument, 0, 'n'},
                                         {"recipe", required_argument, 0, 'r'},
                                         {"gpus", required_argument, 0, 'g'},
                                         {"tp", required_argument, 0, 't'},
                                         {"pp", required_argument, 0, 'p'},
                                         {"ep", required_argument, 0, 'e'},
                                         {"zero", required_argument, 0, 'z'},
                                         {"batch", required_argument, 0, 'b'},
                                         {"seq", required_argument, 0, 's'},
                                         {"recompute", required_argument, 0, 'R'},
                                         {"sp", no_argument, 0, 'S'},
                                         {"no-flash", no_argument, 0, 'F'},
                                         {"micro", required_argument, 0, 'm'},
                                         {"gpu", required_argument, 0, 'G'},
                                         {"hw", required_argument, 0, 'H'},
                                         {"model-file", required_argument, 0, 'X'},
                                         {"svg", required_argument, 0, 'v'},
                                         {"json", no_argument, 0, 'j'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *model = NULL, *recipe_name = "bf16", *gpu = "h100", *svg = NULL;
    double params = 0;
    int64_t gpus = 1, tp = 1, pp = 1, ep = 1, batch = 1, seq = 0, micro = 0;
    int zero = -1, recompute = NL_RECOMPUTE_NONE, sp = 0, flash = 1, json = 0, c;
    nl_catalog cat;
    nl_catalog_init(&cat);
    while ((c = getopt_long(argc, argv, "M:n:r:g:t:p:e:z:b:s:R:SFm:G:H:X:v:jh", opts, NULL)) != -1) {
        switch (c) {
        case 'M': model = optarg; break;
        case 'n':
            if (nl_cli_double_si("--params", optarg, &params)) return NL_EXIT_USAGE;
            if (!(params > 0))
                return nl_cli_usage_error("budget: --params must be a positive count (like 7B), got '%s'", optarg);
            break;
        case 'r': recipe_name = optarg; break;
        case 'g':
            if (nl_cli_int("--gpus", optarg, 1, 1 << 24, &gpus)) return NL_EXIT_USAGE;
            break;
        case 't':
            if (nl_cli_int("--tp", optarg, 1, 1024, &tp)) return NL_EXIT_USAGE;
            break;
        case 'p':
            if (nl_cli_int("--pp", optarg, 1, 1024, &pp)) return NL_EXIT_USAGE;
            break;
        case 'e':
            if (nl_cli_int("--ep", optarg, 1, 4096, &ep)) return NL_EXIT_USAGE;
            break;
        case 'z':
            if ((zero = nl_parse_zero(optarg)) < 0)
                return nl_cli_usage_error("budget: unknown --zero '%s' (0, 1, 2, 3, hsdp)", optarg);
            break;
        case 'b':
            if (nl_cli_int("--batch", optarg, 1, 1 << 24, &batch)) return NL_EXIT_USAGE;
            break;
        case 's':
            if (nl_cli_int("--seq", optarg, 1, 1 << 24, &seq)) return NL_EXIT_USAGE;
            break;
        case 'R':
            if ((recompute = nl_parse_recompute(optarg)) < 0)
                return nl_cli_usage_error("budget: unknown --recompute '%s' (none, selective, full)", optarg);
            break;
        case 'S': sp = 1; break;
        case 'F': flash = 0; break;
        case 'm':
            if (nl_cli_int("--micro", optarg, 1, 1 << 20, &micro)) return NL_EXIT_USAGE;
            break;
        case 'G': gpu = optarg; break;
        case 'H':
            if (nl_catalog_load_hw(&cat, optarg)) return nl_cli_fail("--hw");
            break;
        case 'X':
            if (nl_catalog_load_model(&cat, optarg)) return nl_cli_fail("--model-file");
            break;
        case 'v': svg = optarg; break;
        case 'j': json = 1; break;
        case 'h': usage(stdout); return NL_EXIT_OK;
        default: return nl_cli_bad_option("budget", argv);
        }
    }
    if (optind < argc) return nl_cli_usage_error("budget: unexpected argument '%s'", argv[optind]);
    if (!model && !(params > 0)) return nl_cli_usage_error("budget: give --model NAME or --params N");
    nl_recipe rec;
    if (nl_plan_recipe(recipe_name, &rec)) return nl_cli_usage_error("budget: --recipe: %s", nl_last_error());
    nl_hw hw;
    if (nl_catalog_find_hw(&cat, gpu, &hw)) return nl_cli_usage_error("budget: --gpu: %s", nl_last_error());
    nl_arch a;
    memset(&a, 0, sizeof a);
    double total = params, nonemb = params, active = params, expert = 0;
    if (model) {
        if (nl_cli_model_arch(&cat, model, &a)) return nl_cli_usage_error("budget: --model: %s", nl_last_error());
        nl_arch_params p;
        nl_arch_count_params(&a, &p);
        total = (double)p.total;
        nonemb = (double)p.non_embedding;
        active = (double)p.active;
        expert = (double)p.mlp_experts;
        if (params > 0) { /* a nominal size for the same shape */
            double s = params / total;
            total *= s;
            nonemb *= s;
            active *= s;
            expert *= s;
        }
        if (ep > 1 && (a.n_experts == 0 || a.n_experts % ep))
            return nl_cli_usage_error("budget: --ep %lld must divide the %lld experts of %s", (long long)ep,
                                      (long long)a.n_experts, a.name);
        if (tp > 1 && a.n_heads % tp)
            return nl_cli_usage_error("budget: --tp %lld does not divide %lld heads", (long long)tp,
                                      (long long)a.n_heads);
    } else if (ep > 1) {
        return nl_cli_usage_error("budget: --ep needs a --model with experts");
    }
    if (gpus % (tp * pp))
        return nl_cli_usage_error("budget: --gpus %lld is not a multiple of tp*pp = %lld", (long long)gpus,
                                  (long long)(tp * pp));
    int64_t dp = gpus / (tp * pp);
    if (ep > dp)
        return nl_cli_usage_error("budget: --ep %lld exceeds the data-parallel degree %lld", (long long)ep,
                                  (long long)dp);
    /* Parameters one GPU holds: dense part split by tp*pp, routed experts by ep*tp*pp. */
    double dense = total - expert, dense_ne = nonemb - expert;
    double per_gpu = dense / (double)(tp * pp) + expert / (double)(ep * tp * pp);
    double per_gpu_ne = dense_ne / (double)(tp * pp) + expert / (double)(ep * tp * pp);
    double edp = (double)dp / (double)ep;
    int64_t shard = hw.gpus_per_node / (tp) > 0 ? hw.gpus_per_node / tp : 1;
    if (shard > dp) shard = dp;

    cJSON *j = json ? cJSON_CreateObject() : NULL;
    if (j) {
        cJSON_AddStringToObject(j, "recipe", rec.name);
        cJSON_AddNumberToObject(j, "params", total);
        cJSON_AddNumberToObject(j, "params_non_embedding", nonemb);
        cJSON_AddNumberToObject(j, "params_active", active);
        cJSON_AddNumberToObject(j, "params_active_non_embedding", active - (total - nonemb));
        cJSON_AddNumberToObject(j, "params_per_gpu", per_gpu);
        cJSON_AddNumberToObject(j, "params_per_gpu_non_embedding", per_gpu_ne);
        cJSON_AddNumberToObject(j, "state_bytes_total", total * (rec.weight_bytes + rec.grad_bytes + rec.optim_bytes));
    } else {
        char a1[32], a2[32], a3[32], a4[32], a5[32];
        char a6[32];
        printf("Parameters%s%s: %s total (%s without embeddings), %s active per token (%s without embeddings).\n",
               model ? " of " : "", model ? a.name : "", nl_fmt_count(total, a1, sizeof a1),
               nl_fmt_count(nonemb, a2, sizeof a2), nl_fmt_count(active, a3, sizeof a3),
               nl_fmt_count(active - (total - nonemb), a6, sizeof a6));
        printf("One GPU at tp %lld, pp %lld, ep %lld holds %s parameters (%s without embeddings) = %.2f GB of %s "
               "weights (%.2f GB).\n",
               (long long)tp, (long long)pp, (long long)ep, nl_fmt_count(per_gpu, a4, sizeof a4),
               nl_fmt_count(per_gpu_ne, a5, sizeof a5), per_gpu * rec.weight_bytes / 1e9, rec.name,
               per_gpu_ne * rec.weight_bytes / 1e9);
        printf("Training state (%s: %g + %g + %g = %g bytes/param; %s): %.3g TB in all.\n\n", rec.name,
               rec.weight_bytes, rec.grad_bytes, rec.optim_bytes, rec.weight_bytes + rec.grad_bytes + rec.optim_bytes,
               rec.source, total * (rec.weight_bytes + rec.grad_bytes + rec.optim_bytes) / 1e12);
    }
    static const char *hdr[] = {"stage",     "dp",          "weights",    "grads",
                                "optimizer", "bytes/param", "GB per GPU", "fits " /* gpu */};
    nl_table t;
    nl_table_init(&t, 8, hdr);
    cJSON *stages = j ? cJSON_AddArrayToObject(j, "stages") : NULL;
    for (int z = 0; z <= 4; z++) {
        if (zero >= 0 && z != zero) continue;
        if (zero < 0 && z == NL_ZERO_HSDP && dp <= shard) continue;
        if (zero < 0 && z > 0 && dp == 1) continue; /* nothing to shard over */
        nl_state_bytes sd, se;
        nl_plan_state_bytes(&rec, (nl_zero)z, dp, shard, &sd);
        nl_plan_state_bytes(&rec, (nl_zero)z, (int64_t)edp, shard < edp ? shard : (int64_t)edp, &se);
        double dl = dense / (double)(tp * pp), el = expert / (double)(ep * tp * pp);
        double bytes = dl * sd.total + el * se.total;
        double bpp = bytes / per_gpu;
        if (j) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "stage", nl_zero_name((nl_zero)z));
            cJSON_AddNumberToObject(o, "dp", (double)dp);
            cJSON_AddNumberToObject(o, "bytes_per_param", bpp);
            cJSON_AddNumberToObject(o, "bytes_per_gpu", bytes);
            cJSON_AddBoolToObject(o, "fits", bytes <= hw.mem_bytes);
            cJSON_AddItemToArray(stages, o);
        } else {
            nl_table_rowf(&t, "%s|%lld|%.3g|%.3g|%.3g|%.3g|%.2f|%s", nl_zero_name((nl_zero)z), (long long)dp,
                          sd.weights, sd.grads, sd.optim, bpp, bytes / 1e9, bytes <= hw.mem_bytes ? "yes" : "no");
        }
    }
    if (!j) {
        printf("State per GPU by ZeRO stage (Rajbhandari et al. 2020; hsdp shards over %lld GPUs of a node),\n"
               "before activations, against %s's %.0f GB:\n",
               (long long)shard, hw.name, hw.mem_bytes / 1e9);
        nl_table_print(&t, stdout);
    }
    nl_table_free(&t);

    if (model) {
        if (seq == 0) seq = a.seq_len;
        double tokens = (double)batch * (double)seq;
        nl_act_opts ao = {.tp = tp,
                          .sp = sp,
                          .flash = flash,
                          .recompute = (nl_recompute)recompute,
                          .seq = (double)seq,
                          .bytes_per_elem = 2};
        nl_act_layer al;
        nl_plan_act_layer(&a, &ao, &al);
        double L = (double)a.n_layers / (double)pp;
        double tot = al.bytes_per_token * tokens * L;
        double gib = 1024.0 * 1024 * 1024;
        nl_act_opts o2 = ao;
        o2.recompute = NL_RECOMPUTE_SELECTIVE;
        nl_act_layer sel;
        nl_plan_act_layer(&a, &o2, &sel);
        o2.recompute = NL_RECOMPUTE_FULL;
        nl_act_layer full;
        nl_plan_act_layer(&a, &o2, &full);
        double k_none = nl_plan_act_korthikanti(&a, (double)seq, NL_RECOMPUTE_NONE, 0, tp, sp);
        double k_flash = nl_plan_act_korthikanti(&a, (double)seq, NL_RECOMPUTE_NONE, 1, tp, sp);
        double k_full = nl_plan_act_korthikanti(&a, (double)seq, NL_RECOMPUTE_FULL, 1, tp, sp);
        double logits = nl_plan_logits_bytes(&a, tokens) / (double)tp;
        int64_t m = micro > 0 ? micro : (pp > 1 ? 2 * pp : 1);
        double inflight_1f1b = pp > 1 ? fmin((double)pp, (double)m) : 1, inflight_gpipe = (double)m;
        if (j) {
            cJSON *ac = cJSON_AddObjectToObject(j, "activations");
            cJSON_AddNumberToObject(ac, "tokens", tokens);
            cJSON_AddNumberToObject(ac, "layers", L);
            cJSON *terms = cJSON_AddArrayToObject(ac, "terms");
            for (int i = 0; i < al.n; i++) {
                cJSON *o = cJSON_CreateObject();
                cJSON_AddStringToObject(o, "tensor", al.terms[i].name);
                cJSON_AddNumberToObject(o, "bytes_per_token_layer", al.terms[i].bytes);
                cJSON_AddNumberToObject(o, "bytes", al.terms[i].bytes * tokens * L);
                cJSON_AddItemToArray(terms, o);
            }
            cJSON_AddNumberToObject(ac, "bytes_per_token_layer", al.bytes_per_token);
            cJSON_AddNumberToObject(ac, "bytes_per_hidden_unit", al.bytes_per_token / (double)a.dim);
            cJSON_AddNumberToObject(ac, "bytes", tot);
            cJSON_AddNumberToObject(ac, "selective_bytes", sel.bytes_per_token * tokens * L);
            cJSON_AddNumberToObject(ac, "full_bytes", full.bytes_per_token * tokens * L);
            cJSON_AddNumberToObject(ac, "korthikanti_bytes", k_none * tokens * L);
            cJSON_AddNumberToObject(ac, "korthikanti_flash_bytes", k_flash * tokens * L);
            cJSON_AddNumberToObject(ac, "korthikanti_full_bytes", k_full * tokens * L);
            cJSON_AddNumberToObject(ac, "logits_bytes", logits);
            cJSON_AddNumberToObject(ac, "microbatches_in_flight_1f1b", inflight_1f1b);
            cJSON_AddNumberToObject(ac, "microbatches_in_flight_gpipe", inflight_gpipe);
        } else {
            printf(
                "\nActivations kept for backward: %lld x %lld tokens, %g layers%s, bf16, %s attention, recompute %s,\n"
                "tp %lld%s. Per token per layer (Korthikanti et al. 2022 sec. 4 walk, Llama layer):\n",
                (long long)batch, (long long)seq, L, pp > 1 ? " (one stage)" : "", flash ? "flash" : "plain",
                nl_recompute_name((nl_recompute)recompute), (long long)tp, sp ? " + sequence parallel" : "");
            static const char *h2[] = {"tensor", "bytes/token/layer", "x D", "GiB"};
            nl_table t2;
            nl_table_init(&t2, 4, h2);
            for (int i = 0; i < al.n; i++)
                nl_table_rowf(&t2, "%s|%.0f|%.3g|%.2f", al.terms[i].name, al.terms[i].bytes,
                              al.terms[i].bytes / (double)a.dim, al.terms[i].bytes * tokens * L / gib);
            nl_table_rowf(&t2, "total|%.0f|%.3g|%.2f", al.bytes_per_token, al.bytes_per_token / (double)a.dim,
                          tot / gib);
            nl_table_print(&t2, stdout);
            nl_table_free(&t2);
            printf("\nThe same batch other ways:\n");
            static const char *h3[] = {"accounting", "bytes/token/layer", "GiB"};
            nl_table t3;
            nl_table_init(&t3, 3, h3);
            nl_table_rowf(&t3, "this walk, no recompute|%.0f|%.1f", al.bytes_per_token, tot / gib);
            nl_table_rowf(&t3, "this walk, selective (recompute%s)|%.0f|%.1f",
                          flash ? ": nothing kept to drop with flash" : " the scores", sel.bytes_per_token,
                          sel.bytes_per_token * tokens * L / gib);
            nl_table_rowf(&t3, "this walk, full (layer input only)|%.0f|%.1f", full.bytes_per_token,
                          full.bytes_per_token * tokens * L / gib);
            nl_table_rowf(&t3, "Korthikanti eq.1 sbh(34+5as/h), no flash|%.0f|%.1f", k_none, k_none * tokens * L / gib);
            nl_table_rowf(&t3, "Korthikanti 34sbh (flash or selective)|%.0f|%.1f", k_flash, k_flash * tokens * L / gib);
            nl_table_rowf(&t3, "Korthikanti 2sbh (full recompute)|%.0f|%.1f", k_full, k_full * tokens * L / gib);
            nl_table_print(&t3, stdout);
            nl_table_free(&t3);
            printf("\nLogits (bf16) + fp32 loss copy: %.1f GiB. One layer's working set while recomputing: %.2f GiB.\n",
                   logits / gib, al.working_bytes_per_token * tokens / gib);
            if (pp > 1)
                printf("Pipeline of %lld stages, %lld microbatches of this size: the first stage holds %g in flight "
                       "with 1F1B\n"
                       "(%.1f GiB) and %g with GPipe (%.1f GiB).\n",
                       (long long)pp, (long long)m, inflight_1f1b, tot * inflight_1f1b / gib, inflight_gpipe,
                       tot * inflight_gpipe / gib);
        }
    }
    if (svg) {
        /* Memory bars: one per ZeRO stage at this layout. */
        nl_train_eval ev[5];
        int ne = 0;
        for (int z = 0; z <= 3; z++) {
            nl_state_bytes sd;
            nl_plan_state_bytes(&rec, (nl_zero)z, dp, shard, &sd);
            memset(&ev[ne], 0, sizeof ev[ne]);
            ev[ne].L = (nl_layout){dp, tp, pp, 1, ep, (nl_zero)z, batch, 1, 1, (nl_recompute)recompute, sp};
            ev[ne].mem_weights = per_gpu * sd.weights;
            ev[ne].mem_grads = per_gpu * sd.grads;
            ev[ne].mem_optim = per_gpu * sd.optim;
            if (model) {
                nl_act_opts ao = {.tp = tp,
                                  .sp = sp,
                                  .flash = flash,
                                  .recompute = (nl_recompute)recompute,
                                  .seq = (double)(seq ? seq : a.seq_len),
                                  .bytes_per_elem = 2};
                nl_act_layer al;
                nl_plan_act_layer(&a, &ao, &al);
                ev[ne].mem_act = al.bytes_per_token * (double)batch * ao.seq * (double)a.n_layers / (double)pp;
            }
            ev[ne].mem_total = ev[ne].mem_weights + ev[ne].mem_grads + ev[ne].mem_optim + ev[ne].mem_act;
            ne++;
        }
        if (nl_plan_svg_memory(svg, ev, (size_t)ne, hw.mem_bytes)) {
            if (j) cJSON_Delete(j);
            return nl_cli_fail("--svg");
        }
    }
    if (j) return nl_cli_print_json(j);
    return NL_EXIT_OK;
}
