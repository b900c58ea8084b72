/* nanolm serve: the OpenAI-compatible HTTP server (src/serve/server.c) over the engine. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "cli_opt.h"
#include "nanolm/arch.h"
#include "nanolm/chat_template.h"
#include "nanolm/dummy_engine.h"
#include "nanolm/engine.h"
#include "nanolm/kv_transfer.h"
#include "nanolm/model_load.h"
#include "nanolm/prefill_child.h"
#include "nanolm/server.h"

static int write_port_file(const char *path, int port) {
    char buf[32];
    int n = snprintf(buf, sizeof buf, "%d\n", port);
    return nl_write_file_atomic(path, buf, (size_t)n) ? nl_cli_fail("serve: --port-file") : 0;
}

/* --role prefill: the KV-transfer server on host:port until SIGINT/SIGTERM (blocked in sigs). */
static int serve_prefill(nl_engine *e, const char *host, int port, const char *port_file, sigset_t *sigs) {
    nl_kvx_server *ps = NULL;
    if (nl_kvx_server_start(&ps, e, host, port)) return nl_cli_fail("serve --role prefill");
    const nl_arch *a = nl_engine_arch(e);
    fprintf(stderr,
            "serve: prefill server listening on %s:%d (KV transfer; model: %lld layers, %lld kv heads, head dim %lld; "
            "KV %s)\n",
            host, nl_kvx_server_port(ps), (long long)a->n_layers, (long long)a->n_kv_heads,
            (long long)nl_arch_head_dim(a), nl_engine_kv_dtype(e) == NL_KV_INT8 ? "int8" : "fp32");
    fflush(stderr);
    if (port_file && write_port_file(port_file, nl_kvx_server_port(ps))) {
        nl_kvx_server_stop(ps);
        return NL_EXIT_FAIL;
    }
    int sig = 0;
    sigwait(sigs, &sig);
    nl_kvx_stats st;
    nl_kvx_server_stats(ps, &st);
    nl_kvx_server_stop(ps);
    fprintf(stderr, "serve: prefill server stopped (%lld prompts sent, %lld failed, %lld KV bytes)\n",
            (long long)st.requests_ok, (long long)st.requests_failed, (long long)st.kv_bytes_sent);
    return NL_EXIT_OK;
}

enum { ROLE_COLOCATED, ROLE_PREFILL, ROLE_DECODE, ROLE_DISAGG };

/* The options of `serve`, parsed: the engine's and the HTTP server's bound to their options
 * structs, and the rest. */
typedef struct serve_args {
    nl_engine_opts eo;
    nl_server_opts so;
    const char *ckpt, *dummy, *tok, *port_file, *chat_tmpl;
    int role, weights, kv, no_prefix_cache;
    double kv_mem, max_body;
} serve_args;

/* The engine with what it was opened from (random weights keep their model and tokenizer here). */
typedef struct served {
    nl_engine *e;
    nl_dummy_engine d;
    int have_dummy;
} served;

static int parse_args(int argc, char **argv, serve_args *sa) {
    *sa = (serve_args){.max_body = 1 << 20};
    nl_engine_opts *eo = &sa->eo;
    nl_server_opts *so = &sa->so;
    nl_engine_opts_default(eo);
    nl_server_opts_default(so);
    so->model_name = NULL; /* default: the checkpoint's name (nl_server_model_name) */
    nl_opt model_opts[] = {
        NL_OPT_STR("ckpt", &sa->ckpt, "FILE",
                   "checkpoint: NanoLM safetensors, a `quant model --out` file, or llama2.c .bin (required)"),
        NL_OPT_STR("dummy-arch", &sa->dummy, "JSON",
                   "instead of --ckpt: random weights of this shape (vLLM's --load-format dummy), "
                   "e.g. '{\"vocab_size\":512,\"dim\":768,\"n_layers\":12,\"n_heads\":12,\"n_kv_heads\":12,"
                   "\"hidden_dim\":2048,\"seq_len\":1024}'; with --tokenizer for vocabularies other than 256 bytes"),
        NL_OPT_STR("tokenizer", &sa->tok, "FILE", "llama2.c tokenizer (needed for .bin checkpoints)"),
        NL_OPT_CHOICE("weights", &sa->weights, "auto|fp32|bf16|int8|int4",
                      "weight format of the kernels (default auto: fp32, int8 for int8 checkpoints)"),
        NL_OPT_STR("chat-template", &sa->chat_tmpl, "FILE",
                   "Jinja chat template for /v1/chat/completions (default: a model folder's chat_template.jinja "
                   "or tokenizer_config.json \"chat_template\", a GGUF file's tokenizer.chat_template)"),
        NL_OPT_STR("model-name", &so->model_name, "NAME",
                   "name in /v1/models and responses (default: the checkpoint's file name)"),
    };
    nl_opt engine_opts[] = {
        NL_OPT_CHOICE("kv-cache", &sa->kv, "fp32|int8", "KV cache format (default fp32)"),
        NL_OPT_SI("kv-mem", &sa->kv_mem, 0, 1e13, "BYTES",
                  "KV pool size in bytes, e.g. 512M (default: max-batch full contexts)"),
        NL_OPT_INT("kv-blocks", &eo->kv_blocks, 0, 1 << 30, "N", "KV pool size in blocks (overrides --kv-mem)"),
        NL_OPT_INT("block-size", &eo->block_size, 1, 4096, "N", "tokens per KV block (default 16)"),
        NL_OPT_INT32("max-batch", &eo->max_batch, 1, 4096, "N", "running sequences at most (default 32)"),
        NL_OPT_INT("max-step-tokens", &eo->max_step_tokens, 1, 1 << 20, "N",
                   "tokens per engine step at most (default 512)"),
        NL_OPT_INT("chunk", &eo->chunk, 0, 1 << 20, "N",
                   "prompt tokens per step over all prompts, 0 = no chunking (default 256)"),
        NL_OPT_INT32("max-waiting", &eo->max_waiting, 1, 1 << 20, "N",
                     "waiting queue bound; beyond it requests get 429 (default 256)"),
        NL_OPT_INT32("threads", &eo->threads, 0, 1024, "N", "OpenMP threads of a step (default: OMP_NUM_THREADS)"),
        NL_OPT_FLAG("no-prefix-cache", &sa->no_prefix_cache,
                    "compute every prompt's KV (default: full blocks of a prompt prefix seen before are reused)"),
        NL_OPT_INT32(
            "speculate", &eo->spec_k, 0, 15, "K",
            "speculative decoding: draft K tokens per decode step by prompt lookup (n-gram) and verify "
            "them in the same step; greedy text unchanged, sampled text keeps its distribution (default 0: off)"),
        NL_OPT_INT32("spec-ngram", &eo->spec_ngram, 1, 64, "N", "longest n-gram prompt lookup matches (default 3)"),
        NL_OPT_STR("draft", &eo->draft_ckpt, "CKPT",
                   "speculative decoding with this draft model instead of prompt lookup (same tokenizer; "
                   "--speculate defaults to 4 with it)"),
    };
    nl_opt http_opts[] = {
        NL_OPT_STR("host", &so->host, "ADDR", "IPv4 address to listen on (default 127.0.0.1)"),
        NL_OPT_INT32("port", &so->port, 0, 65535, "N",
                     "port, 0 = ephemeral (default 8080); the bound port is printed on stderr"),
        NL_OPT_STR("port-file", &sa->port_file, "FILE",
                   "also write the bound port to FILE (atomically) once listening"),
        NL_OPT_SI("max-body", &sa->max_body, 1, 1e9, "BYTES", "largest request body; larger gets 413 (default 1M)"),
        NL_OPT_INT32("max-connections", &so->max_connections, 1, 65536, "N",
                     "connections that may send completions (default 512); 16 more are kept for GET /health, "
                     "/metrics, /v1/models"),
        NL_OPT_INT32("idle-timeout", &so->idle_timeout_s, 1, 86400, "S",
                     "close a connection idle this long; a request body must arrive within it (default 30)"),
        NL_OPT_INT32("header-timeout", &so->header_timeout_s, 1, 86400, "S",
                     "close a connection whose request headers are not complete this long after it opened or "
                     "after its previous response, however steadily they trickle (default 10)"),
        NL_OPT_DBL("drain-timeout", &so->drain_timeout_s, 0, 86400, "S",
                   "on SIGINT/SIGTERM, seconds running requests may finish before they are cancelled (default 30)"),
    };
    nl_opt disagg_opts[] = {
        NL_OPT_CHOICE("role", &sa->role, "colocated|prefill|decode|disagg",
                      "colocated (default): prefill and decode here; prefill: no HTTP, answer KV-transfer requests on "
                      "--port (prompt in, its KV cache and first token out); decode: the HTTP front end, each prompt "
                      "prefilled by --prefill and its KV imported here; disagg: both, this process the decode role "
                      "and a child process the prefill role on an ephemeral loopback port (each with --threads)"),
        NL_OPT_STR("prefill", &so->prefill_addr, "HOST:PORT",
                   "the prefill server of --role decode, e.g. 127.0.0.1:8081"),
    };
    nl_optgroup groups[] = {{"model", model_opts, NL_NOPTS(model_opts)},
                            {"engine", engine_opts, NL_NOPTS(engine_opts)},
                            {"http", http_opts, NL_NOPTS(http_opts)},
                            {"prefill/decode disaggregation", disagg_opts, NL_NOPTS(disagg_opts)}};
    nl_cmdspec spec = {
        "serve",
        "nanolm serve --ckpt FILE [--tokenizer FILE] [--host ADDR] [--port N] [options]",
        "OpenAI-compatible HTTP server: POST /v1/completions and /v1/chat/completions (stream: server-sent "
        "events), GET /v1/models, "
        "/health, /metrics (Prometheus). One engine thread runs continuous batching over a paged KV "
        "cache; SIGINT or SIGTERM stops accepting, lets running requests finish, and exits 0.",
        groups,
        4,
        0};
    int rc = nl_cli_parse(&spec, argc, argv, NULL, NULL);
    if (rc) return rc;
    eo->weights = (nl_wfmt)(sa->weights - 1); /* auto = -1 */
    eo->kv = sa->kv ? NL_KV_INT8 : NL_KV_FP32;
    eo->kv_mem_bytes = (int64_t)sa->kv_mem;
    eo->prefix_cache = !sa->no_prefix_cache;
    if (eo->draft_ckpt && !eo->spec_k) eo->spec_k = 4;
    so->max_body_bytes = (size_t)sa->max_body;
    if (!sa->ckpt == !sa->dummy)
        return nl_cli_usage_error("serve: give --ckpt FILE or --dummy-arch JSON (one of them)");
    if ((sa->role == ROLE_DECODE) != (so->prefill_addr != NULL))
        return nl_cli_usage_error(sa->role == ROLE_DECODE
                                      ? "serve: --role decode needs --prefill HOST:PORT (the prefill server)"
                                      : "serve: --prefill is for --role decode (--role disagg starts its own)");
    return 0;
}

/* OpenMP workers that spin after each step take the cores from the HTTP threads and the
 * clients: on 2 busy cores stories260K served 16 sequential requests at 11.8 tokens/s with
 * spinning and 713 tokens/s with passive waiting (docs/serving-http.md). Workers that sleep at once
 * pay a wake-up at each of the hundreds of parallel regions of a step, though: one stream of the
 * 85M model through the server read 32-44 tokens/s on 2 threads, against 61-83 in the engine
 * alone. A short spin (GOMP_SPINCOUNT 30000, ~0.3 ms by libgomp's reckoning) keeps them awake
 * inside a step and asleep between steps: sequential requests of 64 tokens (16 for stories260K,
 * 4 for the 85M model), alternated runs on 2026-12-02, stories260K 2607-4733 -> 4236-5039
 * tokens/s, the 85M model 32-44 -> 54-67.
 * libgomp reads both when it loads, so they are set here by running the command again with them
 * in the environment; settings the user made are kept. */
static void passive_omp_wait(int argc, char **argv) {
    if (getenv("OMP_WAIT_POLICY")) return;
    setenv("OMP_WAIT_POLICY", "passive", 1);
    if (!getenv("GOMP_SPINCOUNT")) setenv("GOMP_SPINCOUNT", "30000", 1);
    char **args = calloc((size_t)argc + 2, sizeof *args);
    if (!args) return;
    args[0] = "nanolm";
    for (int i = 0; i < argc; i++) args[i + 1] = argv[i];
    nl_reexec_self(args);
    free(args); /* exec failed: go on with the default policy */
}

static void close_served(served *sv) {
    if (sv->have_dummy)
        nl_dummy_engine_close(&sv->d);
    else
        nl_engine_close(sv->e);
    sv->e = NULL;
    sv->have_dummy = 0;
}

/* Opens the engine of --ckpt, or of random weights of --dummy-arch. */
static int open_served(serve_args *sa, served *sv) {
    memset(sv, 0, sizeof *sv);
    if (!sa->dummy) return nl_engine_open(&sv->e, sa->ckpt, sa->tok, &sa->eo) ? nl_cli_fail("serve") : 0;
    /* random weights: for load tests of a model shape without its checkpoint */
    nl_arch a;
    if (nl_arch_from_json("--dummy-arch", sa->dummy, &a)) return nl_cli_usage_error("serve: %s", nl_last_error());
    if (nl_dummy_engine_open(&sv->d, &a, sa->tok, &sa->eo)) return nl_cli_fail("serve");
    sv->e = sv->d.e;
    sv->have_dummy = 1;
    sa->ckpt = sv->d.name;
    return 0;
}

/* The HTTP server (colocated or decode role) until SIGINT/SIGTERM, or until the prefill child
 * (*child > 0) exits (then reaped: *child = -1). A SIGCHLD of a child that stopped or
 * continued (SIGSTOP, a debugger) is not a death: the server goes on. */
static int serve_http(const serve_args *sa, served *sv, pid_t *child, sigset_t *sigs) {
    char name[128];
    nl_server_opts so = sa->so;
    if (!so.model_name) so.model_name = nl_server_model_name(sa->ckpt, name, sizeof name);
    nl_chat_template *ct = NULL; /* /v1/chat/completions: --chat-template, else the model folder's */
    if (nl_model_load_chat_template(&ct, sa->ckpt, sa->chat_tmpl, nl_engine_tokenizer(sv->e)))
        return nl_cli_fail(sa->chat_tmpl ? "serve: --chat-template" : "serve: chat template");
    so.chat_template = ct;
    nl_server *s = NULL;
    if (nl_server_start(&s, sv->e, &so)) {
        nl_chat_template_free(ct);
        return nl_cli_fail("serve");
    }
    const nl_arch *a = nl_engine_arch(sv->e);
    nl_engine_stats st;
    nl_engine_stats_get(sv->e, &st);
    fprintf(
        stderr,
        "serve: listening on http://%s:%d (model %s: %lld layers, dim %lld, context %lld; weights %s; KV %lld blocks "
        "of %lld tokens%s%s)\n",
        so.host, nl_server_port(s), so.model_name, (long long)a->n_layers, (long long)a->dim, (long long)a->seq_len,
        nl_wfmt_name(nl_engine_weights(sv->e)), (long long)st.kv_blocks_total, (long long)st.block_size,
        so.prefill_addr ? "; decode role, prefill at " : "", so.prefill_addr ? so.prefill_addr : "");
    fflush(stderr);
    if (sa->port_file && write_port_file(sa->port_file, nl_server_port(s))) {
        nl_server_stop(s);
        nl_chat_template_free(ct);
        return NL_EXIT_FAIL;
    }
    int sig = 0, rc = NL_EXIT_OK;
    for (;;) {
        sigwait(sigs, &sig);
        if (sig != SIGCHLD) break;
        int cst = 0; /* the prefill process went away: new prompts cannot be served */
        if (*child > 0 && waitpid(*child, &cst, WNOHANG) == *child) {
            fprintf(stderr, "nanolm: serve: the prefill process exited (status %d); stopping\n",
                    WIFEXITED(cst) ? WEXITSTATUS(cst) : 128 + WTERMSIG(cst));
            *child = -1; /* reaped: nothing to signal later */
            rc = NL_EXIT_FAIL;
            break;
        }
    }
    fprintf(stderr, "serve: %s: not accepting; finishing running requests (up to %g s)\n",
            sig == SIGINT    ? "SIGINT"
            : sig == SIGTERM ? "SIGTERM"
                             : "the prefill process stopped",
            so.drain_timeout_s);
    nl_server_stop(s);
    nl_chat_template_free(ct);
    nl_engine_stats_get(sv->e, &st);
    fprintf(stderr, "serve: stopped (%lld requests, %lld tokens generated)\n", (long long)st.requests_finished,
            (long long)st.tokens_generated);
    return rc;
}

int nl_cmd_serve(int argc, char **argv) {
    serve_args sa;
    int rc = parse_args(argc, argv, &sa);
    if (rc) return rc == NL_CLI_HELP ? NL_EXIT_OK : rc;
    passive_omp_wait(argc, argv);
    /* SIGINT and SIGTERM (and SIGCHLD, for --role disagg's child) are blocked in every thread (the
     * HTTP and engine threads inherit the mask) and taken by sigwait, so a signal never
     * interrupts a step. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    if (sa.role == ROLE_DISAGG) sigaddset(&sigs, SIGCHLD);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    pid_t child = -1;
    char addr[64];
    if (sa.role == ROLE_DISAGG) {
        if (nl_prefill_child_start(argc, argv, &child, addr, sizeof addr)) return nl_cli_fail("serve --role disagg");
        sa.so.prefill_addr = addr;
    }
    served sv;
    if ((rc = open_served(&sa, &sv))) {
        if (child > 0) nl_prefill_child_stop(child);
        return rc;
    }
    if (sa.role == ROLE_PREFILL)
        rc = serve_prefill(sv.e, sa.so.host, sa.so.port, sa.port_file, &sigs);
    else
        rc = serve_http(&sa, &sv, &child, &sigs);
    close_served(&sv);
    if (child > 0 && nl_prefill_child_stop(child) != 0 && rc == NL_EXIT_OK) {
        fprintf(stderr, "nanolm: serve: the prefill process did not exit cleanly\n");
        rc = NL_EXIT_FAIL;
    }
    return rc;
}
