/* nanolm generate: continue a prompt (llama2.c's `run`), as one request of the serving engine.
 * The text streams to stdout as it is generated; --json collects it and writes it once through
 * the report writer (report.h). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "cli_opt.h"
#include "nanolm/driver.h"
#include "nanolm/engine.h"
#include "report.h"

/* What one run produced: the tokens shown (the prompt's after the first, then the generated
 * ones), their printable text (with --json), and the counts. */
typedef struct gen_out {
    double *tokens; /* [n_tokens] token ids shown, as numbers for the report */
    int64_t n_tokens, cap_tokens;
    char *text; /* --json: the printable pieces, NUL-terminated */
    size_t text_len, text_cap;
    int64_t generated, positions;
    double seconds;
} gen_out;

/* Appends a piece to the JSON text buffer. */
static int text_add(char **text, size_t *len, size_t *cap, const char *piece, size_t n) {
    if (*len + n + 1 > *cap) {
        size_t nc = 2 * (*len + n + 1) + 256;
        char *t = nl_malloc(nc, "generated text");
        if (!t) return 1;
        if (*text) memcpy(t, *text, *len);
        nl_free(*text);
        *text = t;
        *cap = nc;
    }
    memcpy(*text + *len, piece, n);
    *len += n;
    (*text)[*len] = 0;
    return 0;
}

/* Shows one token: printed at once (text), or kept with its printable piece (--json). */
static nl_status show_token(gen_out *g, int json, int32_t id, const char *piece, size_t len) {
    if (!json) {
        nl_tokenizer_print_piece(stdout, piece, len);
        return NL_OK;
    }
    if (g->n_tokens < g->cap_tokens) g->tokens[g->n_tokens++] = id;
    if (nl_tokenizer_piece_printable(piece, len) && text_add(&g->text, &g->text_len, &g->text_cap, piece, len))
        return NL_ERR_NOMEM;
    return NL_OK;
}

/* The options of generate, as given. */
typedef struct gen_args {
    nl_model_args model;
    const char *prompt;
    int64_t steps, seed, top_k;
    int threads, kv, json;
    double temperature, top_p;
    nl_opt_list stops;
} gen_args;

static int gen_parse(int argc, char **argv, gen_args *a) {
    *a = (gen_args){.prompt = "", .steps = 256, .seed = 1337, .temperature = 1.0, .top_p = 1.0};
    nl_opt model[3];
    int nmodel = nl_cli_model_opts(model, &a->model, 1);
    nl_opt opts[] = {
        NL_OPT_STR("prompt", &a->prompt, "TEXT", "the text to continue (default: empty)"),
        NL_OPT_INT("steps", &a->steps, 1, 1 << 24, "N",
                   "positions including the prompt (as llama2.c's run), at most seq_len (default 256)"),
        NL_OPT_DBL("temperature", &a->temperature, 0, INFINITY, "T", "sampling temperature; 0 is greedy (default 1)"),
        NL_OPT_INT("seed", &a->seed, 0, 9.2e18, "S", "sampling seed (default 1337)"),
        NL_OPT_INT("top-k", &a->top_k, 0, 1 << 30, "K", "sample among the K likeliest tokens (default 0: all)"),
        NL_OPT_DBL("top-p", &a->top_p, 1e-300, 1, "P",
                   "nucleus sampling: smallest set with probability >= P (default 1)"),
        NL_OPT_LIST("stop", &a->stops, "TEXT", "end the text before the first occurrence of TEXT (repeat, up to 4)"),
        NL_OPT_CHOICE("kv-cache", &a->kv, "fp32|int8",
                      "KV cache: fp32, or int8 per head and token (absmax, fp16 scales) (default fp32)"),
        NL_OPT_INT32("threads", &a->threads, 0, 4096, "N", "decode threads (default 0: OpenMP's choice)"),
        NL_OPT_FLAG("json", &a->json, "print the tokens, the text and the speed as JSON"),
    };
    nl_optgroup groups[] = {{"model", model, nmodel}, {"generation", opts, NL_NOPTS(opts)}};
    nl_cmdspec spec = {"generate",
                       "nanolm generate --ckpt F --prompt TEXT [options]",
                       "Continues the prompt. Runs as one request of the serving engine (see docs/serving.md).\n"
                       "--ckpt may be a quantized checkpoint that `nanolm quant model` wrote (int8 per channel\n"
                       "runs on the int8 kernels).",
                       groups,
                       2,
                       0};
    int rc = nl_cli_parse(&spec, argc, argv, NULL, NULL);
    if (rc) return rc;
    if (!a->model.ckpt) return nl_cli_usage_error("generate: --ckpt F is required");
    return 0;
}

/* Engine options and sampling from the arguments; prints the error and returns NL_EXIT_USAGE on a
 * bad --weights or --stop. */
static int gen_setup(const gen_args *a, nl_engine_opts *eo, nl_sampling *smp) {
    nl_engine_opts_default(eo);
    nl_sampling_default(smp);
    eo->kv = a->kv == 1 ? NL_KV_INT8 : NL_KV_FP32;
    if (a->model.weights && nl_wfmt_parse(a->model.weights, &eo->weights))
        return nl_cli_usage_error("generate: --weights: %s", nl_last_error());
    for (int i = 0; i < a->stops.n; i++)
        if (nl_sampling_add_stop(smp, a->stops.v[i]))
            return nl_cli_usage_error("generate: --stop: %s", nl_last_error());
    eo->max_batch = 1;
    eo->max_waiting = 1;
    eo->threads = a->threads;
    eo->kv_blocks = 0; /* the pool holds one whole context (the contiguous cache's size) */
    return 0;
}

/* One generate request as the driver runs it: what the hook after each step reads and shows. */
typedef struct gen_run_state {
    nl_engine *e;
    const gen_args *a;
    gen_out *g;
    uint64_t id;
    int32_t prev; /* the last token shown (for the next piece) */
    nl_finish fin;
    int failed; /* the hook failed: the message is set */
} gen_run_state;

/* Shows what the request produced; returns 1 when it finished (or on BOS, or a failure). */
static int gen_show(gen_run_state *st, const nl_engine_output *o) {
    const nl_tokenizer *tok = nl_engine_tokenizer(st->e);
    gen_out *g = st->g;
    g->generated += o->n_tokens;
    for (int64_t i = 0; i < o->n_tokens; i++) {
        int32_t next = o->tokens[i];
        if (tok->bos_id >= 0 && next == tok->bos_id) {
            g->generated -= o->n_tokens - i - 1; /* the tokens after BOS were never shown */
            st->fin = NL_FINISH_STOP;
            nl_engine_cancel(st->e, st->id);
            break;
        }
        size_t len;
        const char *piece = nl_tokenizer_piece(tok, (int)st->prev, next, &len);
        if (!piece) break;
        if (show_token(g, st->a->json, next, piece, len)) return st->failed = 1;
        st->prev = next;
    }
    if (!st->a->json) fflush(stdout);
    if (st->fin == NL_FINISH_ERROR) {
        if (!st->a->json) printf("\n");
        fflush(stdout);
        nl_fail(NL_ERR_NUMERIC, "%s: %s", st->a->model.ckpt, o->error);
        return st->failed = 1;
    }
    return st->fin != NL_FINISH_NONE;
}

/* The driver's hook after each step: reads the request's news and shows it. */
static int gen_after_step(void *user, int stepped) {
    (void)stepped;
    gen_run_state *st = user;
    nl_engine_output o;
    if (nl_engine_read(st->e, st->id, 0, &o)) return st->failed = 1;
    st->fin = o.finish;
    int done = gen_show(st, &o);
    nl_engine_output_free(&o);
    return done;
}

/* Runs the request on the engine (the driver loop of driver.h) and shows each generated token;
 * returns an exit code. */
static int gen_decode(nl_engine *e, const gen_args *a, nl_sampling *smp, const int32_t *ids, int64_t n, int64_t steps,
                      gen_out *g) {
    gen_run_state st = {.e = e, .a = a, .g = g, .prev = ids[n - 1]};
    smp->temperature = (float)a->temperature;
    smp->top_k = (int)a->top_k;
    smp->top_p = (float)a->top_p;
    smp->seed = (uint64_t)a->seed;
    smp->max_tokens = steps - n + 1;
    smp->ignore_eos = 1; /* only BOS ends generate's text (llama2.c's run): checked below */
    if (nl_engine_submit(e, ids, n, smp, &st.id)) return nl_cli_fail("generate");
    nl_drive_opts o = {.stop_on_error = 1, .after = gen_after_step, .user = &st};
    if (nl_driver_run(e, &o) || st.failed) return nl_cli_fail("generate");
    g->positions = n - 1 + g->generated;
    return NL_EXIT_OK;
}

/* The prompt's tokens after the first (all of them without BOS), up to --steps positions, then
 * what the engine generates: steps - n + 1 tokens, the last position's sample included (llama2.c's
 * run prints steps tokens after the first). */
static int gen_run(nl_engine *e, const gen_args *a, nl_sampling *smp, const int32_t *ids, int64_t n, gen_out *g) {
    const nl_tokenizer *tok = nl_engine_tokenizer(e);
    int64_t steps = a->steps > nl_engine_arch(e)->seq_len ? nl_engine_arch(e)->seq_len : a->steps;
    g->cap_tokens = steps + 1;
    g->tokens = nl_malloc((size_t)g->cap_tokens * sizeof *g->tokens, "generated tokens");
    if (!g->tokens) return nl_cli_fail("generate");
    for (int64_t i = tok->bos_id < 0 ? 0 : 1; i < n && i <= steps; i++) {
        size_t len;
        const char *piece = nl_tokenizer_piece(tok, i > 0 ? ids[i - 1] : -1, ids[i], &len);
        if (!piece || show_token(g, a->json, ids[i], piece, len)) return nl_cli_fail("generate");
    }
    if (!a->json) fflush(stdout);
    double t0 = nl_time_s();
    g->positions = steps < n ? steps : 0;
    int rc = steps >= n ? gen_decode(e, a, smp, ids, n, steps, g) : NL_EXIT_OK;
    g->seconds = nl_time_s() - t0;
    return rc;
}

/* The speed line on stderr (text), or the whole result as JSON. */
static int gen_print(nl_engine *e, const gen_args *a, const int32_t *ids, int64_t n, const gen_out *g) {
    nl_engine_stats st;
    nl_engine_stats_get(e, &st);
    size_t kv_bytes = (size_t)st.kv_blocks_total * st.kv_block_bytes;
    const char *kvname = a->kv == 1 ? "int8" : "fp32";
    double tps = g->seconds > 0 ? (double)g->positions / g->seconds : 0;
    if (!a->json) {
        printf("\n");
        fflush(stdout);
        fprintf(stderr, "generate: %lld positions, %.1f tokens/s, %s weights, %s KV cache %zu bytes\n",
                (long long)g->positions, tps, nl_wfmt_name(nl_engine_weights(e)), kvname, kv_bytes);
        return NL_EXIT_OK;
    }
    double *prompt = nl_malloc((size_t)n * sizeof *prompt, "prompt tokens");
    if (!prompt) return nl_cli_fail("generate");
    for (int64_t i = 0; i < n; i++) prompt[i] = ids[i];
    nl_report *r = nl_report_new("generate");
    nl_report_nums(r, "prompt_tokens", NULL, prompt, (int)n, NULL, NULL);
    nl_report_nums(r, "tokens", NULL, g->tokens, (int)g->n_tokens, NULL, NULL);
    nl_report_str(r, "text", NULL, g->text ? g->text : "");
    nl_report_int(r, "generated", NULL, g->generated, NULL);
    nl_report_num(r, "tokens_per_s", NULL, tps, NULL, NULL);
    nl_report_str(r, "weights", NULL, nl_wfmt_name(nl_engine_weights(e)));
    nl_report_int(r, "weight_bytes", NULL, (long long)st.weight_bytes, NULL);
    nl_report_str(r, "kv_cache", NULL, kvname);
    nl_report_int(r, "kv_cache_bytes", NULL, (long long)kv_bytes, NULL);
    nl_free(prompt);
    return nl_report_print(r, 1);
}

int nl_cmd_generate(int argc, char **argv) {
    gen_args a;
    int rcode = gen_parse(argc, argv, &a);
    if (rcode) return rcode == NL_CLI_HELP ? NL_EXIT_OK : rcode;
    nl_engine_opts eo;
    nl_sampling smp;
    if ((rcode = gen_setup(&a, &eo, &smp))) return rcode;
    nl_engine *e = NULL;
    if (nl_engine_open(&e, a.model.ckpt, a.model.tokenizer, &eo)) return nl_cli_fail("generate");
    const nl_arch *arch = nl_engine_arch(e);
    int32_t *ids = NULL;
    int64_t n = 0;
    gen_out g;
    memset(&g, 0, sizeof g);
    if (nl_engine_encode(e, a.prompt, strlen(a.prompt), &ids, &n)) {
        rcode = nl_cli_fail("generate");
    } else if (n < 1) {
        rcode = nl_cli_usage_error("generate: --prompt is empty (the byte tokenizer needs at least one byte)");
    } else if (n > arch->seq_len) {
        rcode = nl_cli_usage_error("generate: the prompt is %lld tokens, longer than the model's seq_len %lld",
                                   (long long)n, (long long)arch->seq_len);
    } else if (!(rcode = gen_run(e, &a, &smp, ids, n, &g))) {
        rcode = gen_print(e, &a, ids, n, &g);
    }
    nl_free(g.tokens);
    nl_free(g.text);
    nl_free(ids);
    nl_engine_close(e);
    return rcode;
}
