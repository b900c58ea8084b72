/* nanolm bench serve: the load generator (src/tools/http_loadgen.c) against an OpenAI-compatible
 * server, with a latency-vs-throughput sweep over arrival rates. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "cli_opt.h"
#include "nanolm/client.h"
#include "nanolm/http_loadgen.h"
#include "nanolm/loadgen_sweep.h"
#include "nanolm/machine.h"
#include "nanolm/peak.h"
#include "nanolm/plan_engine.h"
#include "nanolm/plan.h"
#include "plan_opts.h"
#include "report.h"

/* Parses --sweep's rates; -1 after printing an error. */
static int parse_rates(const char *s, double *rates) {
    int n = nl_loadgen_parse_rates(s, rates);
    if (n < 0) nl_cli_usage_error("bench serve: --sweep %s", nl_last_error());
    return n;
}

static void add_latency(nl_report *r, const char *key, const char *label, const nl_latency_summary *s) {
    char k[64], l[96];
    const char *q[] = {"p50", "p90", "p99"};
    double v[] = {s->p50, s->p90, s->p99};
    for (int i = 0; i < 3; i++) {
        snprintf(k, sizeof k, "%s_%s_ms", key, q[i]);
        snprintf(l, sizeof l, "%s %s", label, q[i]);
        nl_report_num(r, k, l, v[i] * 1e3, "%.2f", "ms");
    }
    snprintf(k, sizeof k, "%s_max_ms", key);
    snprintf(l, sizeof l, "%s max", label);
    nl_report_num(r, k, l, s->max * 1e3, "%.2f", "ms");
    snprintf(k, sizeof k, "%s_n", key);
    nl_report_int(r, k, "", (long long)s->n, NULL); /* samples: JSON only */
}

static void sweep_progress(void *ctx, int i, double rate, const nl_loadgen_result *r) {
    (void)i;
    if (*(const int *)ctx > 1)
        fprintf(stderr,
                "bench serve: rate %g/s: %.1f output tokens/s, TTFT p50 %.1f ms, TPOT p50 %.2f ms, %lld failed\n", rate,
                r->output_tokens_per_s, r->ttft.p50 * 1e3, r->tpot.p50 * 1e3, (long long)r->failed);
}

static int bench_serve(int argc, char **argv) {
    const char *url = "http://127.0.0.1:8080", *svg = NULL, *sweep = NULL;
    nl_loadgen_opts o = {.requests = 64, .concurrency = 8, .prompt_len = 128, .output_len = 128, .timeout_s = 600};
    int64_t seed = 1;
    int json = 0, conc_given = 0, rate_given = 0;
    double rate = 0, slo_ttft_ms = 0, slo_tpot_ms = 0;
    nl_opt opts[] = {
        NL_OPT_STR("url", &url, "URL", "server to load (default http://127.0.0.1:8080)"),
        NL_OPT_INT("requests", &o.requests, 1, 100000000, "N", "requests in all (default 64)"),
        NL_OPT_INT32("concurrency", &o.concurrency, 1, 4096, "C",
                     "requests in flight at most (default 8; closed loop without --rate)"),
        NL_OPT_DBL("rate", &rate, 0, 1e6, "R",
                   "Poisson arrivals at R requests/s (open loop; at most --concurrency in flight, default 256 then)"),
        NL_OPT_INT("prompt-len", &o.prompt_len, 1, 1 << 20, "P", "prompt tokens (random ids; default 128)"),
        NL_OPT_INT("prompt-len-max", &o.prompt_len_max, 0, 1 << 20, "P",
                   "> --prompt-len: uniform lengths in [prompt-len, this]"),
        NL_OPT_INT("shared-prefix", &o.shared_prefix, 0, 1 << 20, "S",
                   "every prompt starts with the same S tokens (a system prompt, the same whatever --seed), then its "
                   "--prompt-len own"),
        NL_OPT_INT("output-len", &o.output_len, 1, 1 << 20, "O",
                   "output tokens (max_tokens with ignore_eos; default 128)"),
        NL_OPT_INT("output-len-max", &o.output_len_max, 0, 1 << 20, "O",
                   "> --output-len: uniform lengths in [output-len, this]"),
        NL_OPT_DBL("slo-ttft", &slo_ttft_ms, 0, 1e9, "MS", "goodput objective: time to first token at most MS"),
        NL_OPT_DBL("slo-tpot", &slo_tpot_ms, 0, 1e9, "MS", "goodput objective: time per output token at most MS"),
        NL_OPT_DBL("temperature", &o.temperature, 0, 2, "T", "sampling temperature sent (default 0: greedy)"),
        NL_OPT_INT("vocab", &o.vocab_size, 0, 1 << 30, "V",
                   "token ids drawn below V (default: vocab_size from /v1/models)"),
        NL_OPT_INT("seed", &seed, 0, INT64_MAX, "S", "seed of prompts, lengths and arrivals (default 1)"),
        NL_OPT_DBL("duration", &o.duration_s, 0, 1e7, "S",
                   "start no request after S seconds (--requests is then a cap; default 0: no limit)"),
        NL_OPT_DBL("timeout", &o.timeout_s, 1, 86400, "S", "per-read socket timeout (default 600)"),
        NL_OPT_DBL("disconnect", &o.disconnect_frac, 0, 1, "F",
                   "share F of the clients close the connection mid-stream, after a random number of tokens "
                   "(counted as disconnected, not failed; default 0)"),
        NL_OPT_STR("sweep", &sweep, "R1,R2,..",
                   "run once per arrival rate (requests/s) and tabulate latency vs throughput"),
        NL_OPT_STR("svg", &svg, "FILE", "with --sweep: latency (TTFT, TPOT p50/p99) against output tokens/s"),
        NL_OPT_FLAG("json", &json, "print the result as JSON"),
    };
    opts[2].given = &conc_given;
    opts[3].given = &rate_given;
    nl_optgroup groups[] = {{"options", opts, NL_NOPTS(opts)}};
    nl_cmdspec spec = {
        "bench serve",
        "nanolm bench serve --url URL --requests N (--concurrency C | --rate R) --prompt-len P --output-len O "
        "[--json] [--sweep R1,R2,.. --svg FILE]",
        "Load generator for OpenAI-compatible servers (streamed /v1/completions): requests/s, output "
        "tokens/s, time to first token (TTFT), time per output token (TPOT), inter-token latency (ITL) at "
        "p50/p90/p99, and goodput (requests/s meeting --slo-ttft and --slo-tpot). Latencies are measured "
        "at the client from the moment a request is sent.",
        groups,
        1,
        0};
    int rc = nl_cli_parse(&spec, argc, argv, NULL, NULL);
    if (rc) return rc == NL_CLI_HELP ? NL_EXIT_OK : rc;
    nl_http_url u;
    if (nl_http_parse_url(url, &u)) return nl_cli_usage_error("bench serve: --url: %s", nl_last_error());
    if (svg && !sweep)
        return nl_cli_usage_error("bench serve: --svg needs --sweep R1,R2,.. (a curve needs several rates)");
    double rates[NL_LOADGEN_MAX_SWEEP];
    int nrates = 1;
    rates[0] = rate;
    if (sweep && (nrates = parse_rates(sweep, rates)) < 0) return NL_EXIT_USAGE;
    if ((rate_given || sweep) && !conc_given) o.concurrency = 256;
    o.host = u.host;
    o.port = u.port;
    o.seed = (uint64_t)seed;
    o.slo_ttft_s = slo_ttft_ms / 1e3;
    o.slo_tpot_s = slo_tpot_ms / 1e3;
    nl_loadgen_result res[NL_LOADGEN_MAX_SWEEP];
    if (nl_loadgen_sweep(&o, rates, nrates, res, sweep_progress, &nrates)) return nl_cli_fail("bench serve");
    nl_loadgen_result *r = &res[nrates - 1];
    nl_report *rep = nl_report_new("bench serve");
    nl_report_str(rep, "url", "url", url);
    nl_report_int(rep, "requests", "requests", (long long)(sweep ? o.requests : r->requests),
                  o.duration_s > 0 ? "(started within --duration)" : NULL);
    nl_report_int(rep, "concurrency", "concurrency (most in flight)", o.concurrency, NULL);
    if (!sweep) nl_report_num(rep, "rate_rps", "arrival rate (0: closed loop)", rate, "%g", "req/s");
    nl_report_int(rep, "prompt_len", "prompt tokens", (long long)o.prompt_len,
                  o.prompt_len_max > o.prompt_len ? "(low end)" : NULL);
    nl_report_int(rep, "output_len", "output tokens", (long long)o.output_len,
                  o.output_len_max > o.output_len ? "(low end)" : NULL);
    if (!sweep) {
        nl_report_int(rep, "ok", "succeeded", (long long)r->ok, NULL);
        nl_report_int(rep, "failed", "failed", (long long)r->failed, NULL);
        if (o.disconnect_frac > 0)
            nl_report_int(rep, "disconnected", "left mid-stream (--disconnect)", (long long)r->disconnected, NULL);
        nl_report_int(rep, "short_outputs", "stopped early (BOS)", (long long)r->short_outputs, NULL);
        nl_report_num(rep, "duration_s", "duration", r->duration_s, "%.2f", "s");
        nl_report_num(rep, "requests_per_s", "throughput", r->requests_per_s, "%.3f", "req/s");
        nl_report_num(rep, "output_tokens_per_s", "output tokens/s", r->output_tokens_per_s, "%.1f", "tok/s");
        nl_report_num(rep, "total_tokens_per_s", "prompt+output tokens/s", r->total_tokens_per_s, "%.1f", "tok/s");
        add_latency(rep, "ttft", "TTFT", &r->ttft);
        add_latency(rep, "tpot", "TPOT", &r->tpot);
        add_latency(rep, "itl", "ITL", &r->itl);
        add_latency(rep, "e2e", "end-to-end", &r->e2e);
        if (slo_ttft_ms > 0 || slo_tpot_ms > 0) {
            nl_report_num(rep, "goodput_rps", "goodput (met the SLOs)", r->goodput_rps, "%.3f", "req/s");
            nl_report_int(rep, "good", "requests meeting the SLOs", (long long)r->good, NULL);
        }
        if (r->first_error[0]) nl_report_str(rep, "first_error", "first error", r->first_error);
    } else {
        nl_report_table(rep, "sweep", "latency vs throughput", 11,
                        (const nl_report_col[]){{"rate_rps", "rate req/s", "%g"},
                                                {"requests_per_s", "req/s", "%.3f"},
                                                {"output_tokens_per_s", "out tok/s", "%.1f"},
                                                {"ttft_p50_ms", "TTFT p50 ms", "%.1f"},
                                                {"ttft_p99_ms", "TTFT p99 ms", "%.1f"},
                                                {"tpot_p50_ms", "TPOT p50 ms", "%.2f"},
                                                {"tpot_p99_ms", "TPOT p99 ms", "%.2f"},
                                                {"itl_p99_ms", "ITL p99 ms", "%.2f"},
                                                {"e2e_p50_ms", "e2e p50 ms", "%.1f"},
                                                {"goodput_rps", "goodput req/s", "%.3f"},
                                                {"failed", "failed", "%.0f"}});
        for (int i = 0; i < nrates; i++) {
            nl_loadgen_result *x = &res[i];
            double row[] = {rates[i],          x->requests_per_s, x->output_tokens_per_s, x->ttft.p50 * 1e3,
                            x->ttft.p99 * 1e3, x->tpot.p50 * 1e3, x->tpot.p99 * 1e3,      x->itl.p99 * 1e3,
                            x->e2e.p50 * 1e3,  x->goodput_rps,    (double)x->failed};
            for (int k = 0; k < 11; k++) nl_report_cell_num(rep, row[k]);
            nl_report_row_end(rep);
        }
    }
    if (svg && nl_loadgen_sweep_svg(svg, res, nrates)) {
        nl_report_free(rep);
        return nl_cli_fail("bench serve --svg");
    }
    int failed = nl_loadgen_sweep_failed(res, nrates);
    rc = nl_report_print(rep, json);
    if (failed)
        fprintf(stderr, "nanolm: bench serve: some requests failed (first: %s)\n",
                r->first_error[0] ? r->first_error : "?");
    return rc ? rc : failed ? NL_EXIT_FAIL : NL_EXIT_OK;
}

/* The 85M-parameter llama2.c shape of issue 15 (random weights are fine for rates). */
#define MACHINE_DEFAULT_MODEL                                                                                          \
    "{\"name\":\"nanolm-85m\",\"vocab_size\":512,\"dim\":768,\"n_layers\":12,\"n_heads\":12,\"n_kv_heads\":12,"        \
    "\"hidden_dim\":2048,\"seq_len\":1024}"

static int bench_machine(int argc, char **argv) {
    const char *model = NULL, *name = NULL;
    int json = 0;
    double bw_bytes = 256.0 * 1024 * 1024;
    nl_machine_opts mo;
    nl_machine_opts_default(&mo);
    nl_opt opts[] = {
        NL_OPT_STR(
            "model", &model, "M",
            "the model whose linear shapes are measured: a NanoLM checkpoint, llama2.c .bin, "
            "Hugging Face folder, model JSON or catalog name (default: the 85M llama2.c shape, dim 768 x 12 layers)"),
        NL_OPT_INT32("threads", &mo.threads, 0, 1024, "N",
                     "OpenMP threads of the kernels and the engine (default: OMP_NUM_THREADS)"),
        NL_OPT_STR("name", &name, "NAME", "name of the hardware entry (default cpu-<threads>t)"),
        NL_OPT_SI("bw-bytes", &bw_bytes, 1 << 20, 1e11, "BYTES", "buffer of the read-bandwidth probe (default 256M)"),
        NL_OPT_DBL("min-time", &mo.min_time_s, 1e-4, 60, "S", "each timing runs at least this long (default 0.05)"),
        NL_OPT_INT32("repeats", &mo.repeats, 1, 31, "N", "timings per quantity, the median is kept (default 5)"),
        NL_OPT_FLAG("cpu-clock", &mo.thread_cpu_time,
                    "time with the thread's CPU clock (needs --threads 1): other processes on "
                    "the cores do not count"),
        NL_OPT_FLAG("json", &json,
                    "print only the hardware JSON entry (the file `nanolm plan serve` takes as its hardware)"),
    };
    nl_optgroup groups[] = {{"options", opts, NL_NOPTS(opts)}};
    nl_cmdspec spec = {
        "bench machine",
        "nanolm bench machine [--json] [--threads N] [--model M]",
        "Measures this machine for the serving engine's cost model: streaming read bandwidth (1 and N "
        "threads), the engine's linear kernel in fp32, bf16 and int8 at M = 1, 8, 32, 128, 256, 512 rows "
        "over the model's linear shapes, paged attention, the per-token work of a layer, and the engine's "
        "per-step and per-layer overheads; written as a hardware JSON entry in the catalog's format, which "
        "`nanolm plan serve` reads to predict this engine.",
        groups,
        1,
        0};
    int rc = nl_cli_parse(&spec, argc, argv, NULL, NULL);
    if (rc) return rc == NL_CLI_HELP ? NL_EXIT_OK : rc;
    nl_arch arch;
    static nl_catalog cat;
    nl_catalog_init(&cat);
    if (model ? nl_cli_model_arch(&cat, model, &arch)
              : nl_arch_from_json("default model", MACHINE_DEFAULT_MODEL, &arch))
        return nl_cli_usage_error("bench machine: --model: %s", nl_last_error());
    mo.bw_bytes = (size_t)bw_bytes;
    mo.predict_step_s = nl_plan_engine_probe_step_s; /* the overheads: measured minus the cost model */
    nl_cpu_rates r;
    if (nl_machine_measure(&arch, &mo, &r)) return nl_cli_fail("bench machine");
    if (name) snprintf(r.name, sizeof r.name, "%s", name);
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGE_SIZE);
    char src[160];
    snprintf(src, sizeof src, "nanolm bench machine: %d threads, linear shapes of %s (dim %lld, %lld layers)",
             r.threads, arch.name[0] ? arch.name : "model", (long long)arch.dim, (long long)arch.n_layers);
    char *js = NULL;
    if (nl_cpu_rates_json(&r, pages > 0 && psz > 0 ? (double)pages * (double)psz : 0, src, &js))
        return nl_cli_fail("bench machine");
    if (json) {
        fputs(js, stdout);
        nl_free(js);
        return NL_EXIT_OK;
    }
    nl_free(js);
    printf("%s\n\n", src);
    printf("read bandwidth       %8.2f GB/s (1 thread)   %8.2f GB/s (%d threads)\n", r.read_bw_1t / 1e9,
           r.read_bw_nt / 1e9, r.threads);
    printf("linear kernel GFLOP/s by rows M:\n  %-6s", "M");
    for (int i = 0; i < NL_CPU_NM; i++) printf(" %9lld", (long long)nl_cpu_m[i]);
    static const char *fmt[3] = {"fp32", "bf16", "int8"};
    for (int f = 0; f < 3; f++) {
        printf("\n  %-6s", fmt[f]);
        for (int i = 0; i < NL_CPU_NM; i++) printf(" %9.2f", r.gemm[f][i] / 1e9);
    }
    printf("\ndecode rows per step D:\n  %-26s", "D");
    for (int i = 0; i < NL_CPU_NB; i++) printf(" %9lld", (long long)nl_cpu_m[i]);
    static const char *kvf[2] = {"fp32", "int8"};
    for (int kv = 0; kv < 2; kv++) {
        printf("\n  %s KV: attention us/(token, head)", kvf[kv]);
        printf("\n  %-26s", "");
        for (int i = 0; i < NL_CPU_NB; i++) printf(" %9.3f", r.attn_row_s[kv][i] * 1e6);
        printf("\n  %-26s", "  + ns per position");
        for (int i = 0; i < NL_CPU_NB; i++) printf(" %9.3f", r.attn_pos_s[kv][i] * 1e9);
        printf("\n  %-26s", "RoPE + KV store us/token");
        for (int i = 0; i < NL_CPU_NB; i++) printf(" %9.3f", r.rope_kv_s[kv][i] * 1e6);
    }
    printf("\nprompt chunk attention %6.2f GFLOP/s, RoPE + KV store %.3f us per token and layer\n",
           r.attn_flops_chunk / 1e9, r.rope_kv_chunk_s * 1e6);
    printf("per token and layer  %8.2f us (norms, residuals, SwiGLU)\n", r.row_layer_s * 1e6);
    printf("engine overheads     %8.2f us per step, %.2f us per layer\n", r.step_overhead_s * 1e6,
           r.layer_overhead_s * 1e6);
    /* the ceilings of training's model FLOPs utilisation (nanolm train reports it against both) */
    nl_peak_ceilings pk;
    if (nl_peak_ceilings_measure(r.threads, mo.min_time_s, mo.repeats, &pk)) return nl_cli_fail("bench machine");
    printf("fp32 FMA peak        %8.2f GFLOP/s (1 thread) %8.2f GFLOP/s (%d threads), %s register kernel\n",
           pk.fma_1t / 1e9, pk.fma_nt / 1e9, r.threads, nl_peak_path_name(pk.path));
    printf(
        "sgemm %lld^3          %8.2f GFLOP/s (1 thread) %8.2f GFLOP/s (%d threads), OpenBLAS: %.0f%% / %.0f%% of the "
        "FMA peak\n",
        (long long)NL_PEAK_SGEMM_N, pk.sgemm_1t / 1e9, pk.sgemm_nt / 1e9, r.threads, 100.0 * pk.sgemm_1t / pk.fma_1t,
        100.0 * pk.sgemm_nt / pk.fma_nt);
    return NL_EXIT_OK;
}

int nl_cmd_bench(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        printf("usage: nanolm bench serve --url URL [options]   load an OpenAI-compatible server (--help for options)\n"
               "       nanolm bench machine [--json] [--threads N]   measure this CPU for `plan serve`\n");
        return argc < 2 ? NL_EXIT_USAGE : NL_EXIT_OK;
    }
    if (!strcmp(argv[1], "serve")) return bench_serve(argc - 1, argv + 1);
    if (!strcmp(argv[1], "machine")) return bench_machine(argc - 1, argv + 1);
    return nl_cli_usage_error("bench: unknown subcommand '%s' (known: serve, machine)", argv[1]);
}
