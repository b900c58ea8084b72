/* nanolm serve: the OpenAI-compatible HTTP server (src/serve/server.c) over the engine. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "cli_opt.h"
#include "nanolm/arch.h"
#include "nanolm/engine.h"
#include "nanolm/kv_transfer.h"
#include "nanolm/model.h"
#include "nanolm/tokenizer.h"
#include "nanolm/server.h"

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
    if (port_file) {
        char buf[32];
        int n = snprintf(buf, sizeof buf, "%d\n", nl_kvx_server_port(ps));
        if (nl_write_file_atomic(port_file, buf, (size_t)n)) {
            nl_kvx_server_stop(ps);
            return nl_cli_fail("serve: --port-file");
        }
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

int nl_cmd_serve(int argc, char **argv) {
    const char *ckpt = NULL, *dummy = NULL, *tok = NULL, *host = "127.0.0.1", *port_file = NULL, *model_name = NULL;
    const char *prefill = NULL;
    int role = 0, port = 8080, weights = 0, kv = 0, max_batch = 32, max_waiting = 256, threads = 0, max_conn = 512;
    int64_t block_size = 16, kv_blocks = 0, max_step = 512, chunk = 256;
    double kv_mem = 0, max_body = 1 << 20, drain_s = 30;
    nl_opt model_opts[] = {
        NL_OPT_STR("ckpt", &ckpt, "FILE",
                   "checkpoint: NanoLM safetensors, a `quant model --out` file, or llama2.c .bin (required)"),
        NL_OPT_STR("dummy-arch", &dummy, "JSON",
                   "instead of --ckpt: random weights of this shape (vLLM's --load-format dummy), "
                   "e.g. '{\"vocab_size\":512,\"dim\":768,\"n_layers\":12,\"n_heads\":12,\"n_kv_heads\":12,"
                   "\"hidden_dim\":2048,\"seq_len\":1024}'; with --tokenizer for vocabularies other than 256 bytes"),
        NL_OPT_STR("tokenizer", &tok, "FILE", "llama2.c tokenizer (needed for .bin checkpoints)"),
        NL_OPT_CHOICE("weights", &weights, "auto|fp32|bf16|int8",
                      "weight format of the kernels (default auto: fp32, int8 for int8 checkpoints)"),
        NL_OPT_STR("model-name", &model_name, "NAME",
                   "name in /v1/models and responses (default: the checkpoint's file name)"),
    };
    nl_opt engine_opts[] = {
        NL_OPT_CHOICE("kv-cache", &kv, "fp32|int8", "KV cache format (default fp32)"),
        NL_OPT_SI("kv-mem", &kv_mem, 0, 1e13, "BYTES",
                  "KV pool size in bytes, e.g. 512M (default: max-batch full contexts)"),
        NL_OPT_INT("kv-blocks", &kv_blocks, 0, 1 << 30, "N", "KV pool size in blocks (overrides --kv-mem)"),
        NL_OPT_INT("block-size", &block_size, 1, 4096, "N", "tokens per KV block (default 16)"),
        NL_OPT_INT32("max-batch", &max_batch, 1, 4096, "N", "running sequences at most (default 32)"),
        NL_OPT_INT("max-step-tokens", &max_step, 1, 1 << 20, "N", "tokens per engine step at most (default 512)"),
        NL_OPT_INT("chunk", &chunk, 0, 1 << 20, "N",
                   "prompt tokens per step over all prompts, 0 = no chunking (default 256)"),
        NL_OPT_INT32("max-waiting", &max_waiting, 1, 1 << 20, "N",
                     "waiting queue bound; beyond it requests get 429 (default 256)"),
        NL_OPT_INT32("threads", &threads, 0, 1024, "N", "OpenMP threads of a step (default: OMP_NUM_THREADS)"),
    };
    nl_opt http_opts[] = {
        NL_OPT_STR("host", &host, "ADDR", "IPv4 address to listen on (default 127.0.0.1)"),
        NL_OPT_INT32("port", &port, 0, 65535, "N",
                     "port, 0 = ephemeral (default 8080); the bound port is printed on stderr"),
        NL_OPT_STR("port-file", &port_file, "FILE", "also write the bound port to FILE (atomically) once listening"),
        NL_OPT_SI("max-body", &max_body, 1, 1e9, "BYTES", "largest request body; larger gets 413 (default 1M)"),
        NL_OPT_INT32("max-connections", &max_conn, 1, 65536, "N", "open connections at most (default 512)"),
        NL_OPT_DBL("drain-timeout", &drain_s, 0, 86400, "S",
                   "on SIGINT/SIGTERM, seconds running requests may finish before they are cancelled (default 30)"),
    };
    nl_opt disagg_opts[] = {
        NL_OPT_CHOICE("role", &role, "colocated|prefill|decode",
                      "colocated (default): prefill and decode here; prefill: no HTTP, answer KV-transfer requests on "
                      "--port (prompt in, its KV cache and first token out); decode: the HTTP front end, each prompt "
                      "prefilled by --prefill and its KV imported here"),
        NL_OPT_STR("prefill", &prefill, "HOST:PORT", "the prefill server of --role decode, e.g. 127.0.0.1:8081"),
    };
    nl_optgroup groups[] = {{"model", model_opts, NL_NOPTS(model_opts)},
                            {"engine", engine_opts, NL_NOPTS(engine_opts)},
                            {"http", http_opts, NL_NOPTS(http_opts)},
                            {"prefill/decode disaggregation", disagg_opts, NL_NOPTS(disagg_opts)}};
    nl_cmdspec spec = {
        "serve",
        "nanolm serve --ckpt FILE [--tokenizer FILE] [--host ADDR] [--port N] [options]",
        "OpenAI-compatible HTTP server: POST /v1/completions (stream: server-sent events), GET /v1/models, "
        "/health, /metrics (Prometheus). One engine thread runs continuous batching over a paged KV "
        "cache; SIGINT or SIGTERM stops accepting, lets running requests finish, and exits 0.",
        groups,
        4,
        0};
    int rc = nl_cli_parse(&spec, argc, argv, NULL, NULL);
    if (rc) return rc == NL_CLI_HELP ? NL_EXIT_OK : rc;
    if (!ckpt == !dummy) return nl_cli_usage_error("serve: give --ckpt FILE or --dummy-arch JSON (one of them)");
    if ((role == 2) != (prefill != NULL))
        return nl_cli_usage_error(role == 2 ? "serve: --role decode needs --prefill HOST:PORT (the prefill server)"
                                            : "serve: --prefill is for --role decode");

    /* OpenMP workers that spin after each step take the cores from the HTTP threads and the
     * clients: on 2 busy cores stories260K served 16 sequential requests at 11.8 tokens/s with
     * spinning and 713 tokens/s with passive waiting (docs/serving.md). libgomp reads the policy
     * when it loads, so it is set here by running the command again with it in the environment;
     * a policy the user set is kept. */
    if (!getenv("OMP_WAIT_POLICY")) {
        setenv("OMP_WAIT_POLICY", "passive", 1);
        char **args = calloc((size_t)argc + 2, sizeof *args);
        if (args) {
            args[0] = "nanolm";
            for (int i = 0; i < argc; i++) args[i + 1] = argv[i];
            execv("/proc/self/exe", args);
            free(args); /* exec failed: go on with the default policy */
        }
    }

    nl_engine_opts eo;
    nl_engine_opts_default(&eo);
    eo.weights = (nl_wfmt)(weights - 1); /* auto = -1 */
    eo.kv = kv ? NL_KV_INT8 : NL_KV_FP32;
    eo.block_size = block_size;
    eo.kv_blocks = kv_blocks;
    eo.kv_mem_bytes = (int64_t)kv_mem;
    eo.max_batch = max_batch;
    eo.max_step_tokens = max_step;
    eo.chunk = chunk;
    eo.max_waiting = max_waiting;
    eo.threads = threads;
    nl_engine *e = NULL;
    nl_model dm;
    nl_tokenizer dt;
    int have_dummy = 0;
    if (dummy) { /* random weights: for load tests of a model shape without its checkpoint */
        nl_arch a;
        if (nl_arch_from_json("--dummy-arch", dummy, &a)) return nl_cli_usage_error("serve: %s", nl_last_error());
        if (!a.name[0]) snprintf(a.name, sizeof a.name, "dummy");
        memset(&dt, 0, sizeof dt);
        if (nl_model_init(&dm, &a)) return nl_cli_fail("serve: --dummy-arch");
        nl_model_init_random(&dm, 1);
        nl_status trc = tok ? nl_tokenizer_load_llama2c(&dt, tok, (int)a.vocab_size)
                        : a.vocab_size == 256
                            ? nl_tokenizer_init_byte(&dt)
                            : nl_fail(NL_ERR_INVALID, "--dummy-arch with vocab_size %lld needs --tokenizer",
                                      (long long)a.vocab_size);
        if (trc || nl_engine_open_model(&e, &dm, &dt, &eo)) {
            nl_tokenizer_free(&dt);
            nl_model_free(&dm);
            return nl_cli_fail("serve");
        }
        have_dummy = 1;
        static char dname[sizeof a.name];
        snprintf(dname, sizeof dname, "%s", a.name);
        ckpt = dname;
    } else if (nl_engine_open(&e, ckpt, tok, &eo)) {
        return nl_cli_fail("serve");
    }

    /* SIGINT and SIGTERM are blocked in every thread (the HTTP and engine threads inherit the
     * mask) and taken here by sigwait, so a signal never interrupts a step. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    if (role == 1) {
        int prc = serve_prefill(e, host, port, port_file, &sigs);
        nl_engine_close(e);
        if (have_dummy) nl_model_free(&dm), nl_tokenizer_free(&dt);
        return prc;
    }
    char name[128];
    if (!model_name) {
        const char *base = strrchr(ckpt, '/');
        base = base ? base + 1 : ckpt;
        snprintf(name, sizeof name, "%s", base);
        char *dot = strrchr(name, '.');
        if (dot && dot != name) *dot = 0;
        model_name = name;
    }
    nl_server_opts so;
    nl_server_opts_default(&so);
    so.host = host;
    so.port = port;
    so.model_name = model_name;
    so.max_body_bytes = (size_t)max_body;
    so.max_connections = max_conn;
    so.drain_timeout_s = drain_s;
    so.prefill_addr = prefill;
    nl_server *s = NULL;
    if (nl_server_start(&s, e, &so)) {
        nl_engine_close(e);
        if (have_dummy) nl_model_free(&dm), nl_tokenizer_free(&dt);
        return nl_cli_fail("serve");
    }
    const nl_arch *a = nl_engine_arch(e);
    nl_engine_stats st;
    nl_engine_stats_get(e, &st);
    fprintf(
        stderr,
        "serve: listening on http://%s:%d (model %s: %lld layers, dim %lld, context %lld; weights %s; KV %lld blocks "
        "of %lld tokens%s%s)\n",
        host, nl_server_port(s), model_name, (long long)a->n_layers, (long long)a->dim, (long long)a->seq_len,
        nl_wfmt_name(nl_engine_weights(e)), (long long)st.kv_blocks_total, (long long)st.block_size,
        prefill ? "; decode role, prefill at " : "", prefill ? prefill : "");
    fflush(stderr);
    if (port_file) {
        char buf[32];
        int n = snprintf(buf, sizeof buf, "%d\n", nl_server_port(s));
        if (nl_write_file_atomic(port_file, buf, (size_t)n)) {
            nl_server_stop(s);
            nl_engine_close(e);
            if (have_dummy) nl_model_free(&dm), nl_tokenizer_free(&dt);
            return nl_cli_fail("serve: --port-file");
        }
    }
    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr, "serve: %s: not accepting; finishing running requests (up to %g s)\n",
            sig == SIGINT ? "SIGINT" : "SIGTERM", drain_s);
    nl_server_stop(s);
    nl_engine_stats_get(e, &st);
    nl_engine_close(e);
    if (have_dummy) nl_model_free(&dm), nl_tokenizer_free(&dt);
    fprintf(stderr, "serve: stopped (%lld requests, %lld tokens generated)\n", (long long)st.requests_finished,
            (long long)st.tokens_generated);
    return NL_EXIT_OK;
}
