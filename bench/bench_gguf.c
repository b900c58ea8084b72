/* bench_gguf: nanolm's half of bench/bench_llamacpp.sh (nanolm and llama.cpp decoding the same
 * GGUF weights in the same run).
 *
 *   bench_gguf make85m DIR
 *       writes the 85M-parameter random model of bench_decode (dim 768, 12 layers, 12 heads,
 *       hidden 2048, vocab 512, seq_len 1024, nl_model_init_random seed 1) as DIR/m85-TYPE.gguf
 *       for TYPE f32, f16, bf16, q8_0, q4_0 (nanolm's GGUF writer).
 *   bench_gguf decode MODEL THREADS N_NEW WEIGHTS PROMPT
 *       loads MODEL (any checkpoint nanolm reads, GGUF included) into the serving engine with
 *       WEIGHTS (fp32|bf16|int8|int4) and THREADS threads, decodes N_NEW tokens greedily after
 *       PROMPT (comma-separated ids, or "text:..." encoded by the model's tokenizer) and prints
 *       one JSON line: {"prompt": [...], "tokens": [...], "decode_tok_s": R}. R counts the tokens
 *       after the first over the time from the first to the last (the prompt's prefill step and
 *       the load are not timed), as bench/llamacpp/llamacpp_decode.mjs times llama.cpp.
 * Run with OMP_WAIT_POLICY=active (the script does). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "nanolm/base.h"
#include "nanolm/engine.h"
#include "nanolm/gguf.h"
#include "nanolm/gguf_model.h"
#include "nanolm/model.h"

static int die(const char *what) {
    fprintf(stderr, "bench_gguf: %s: %s\n", what, nl_last_error());
    return 1;
}

static int make85m(const char *dir) {
    nl_arch a;
    memset(&a, 0, sizeof a);
    snprintf(a.name, sizeof a.name, "random-85m");
    a.vocab_size = 512;
    a.dim = 768;
    a.n_layers = 12;
    a.n_heads = 12;
    a.n_kv_heads = 12;
    a.hidden_dim = 2048;
    a.seq_len = 1024;
    a.rope_theta = 10000;
    a.norm_eps = 1e-5;
    a.tied_embeddings = 1;
    nl_model m;
    if (nl_model_init(&m, &a)) return die("model");
    nl_model_init_random(&m, 1);
    nl_tokenizer tok;
    if (nl_tokenizer_init_byte(&tok)) return die("tokenizer");
    mkdir(dir, 0755);
    static const uint32_t types[] = {NL_GGML_F32, NL_GGML_F16, NL_GGML_BF16, NL_GGML_Q8_0, NL_GGML_Q4_0};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/m85-%s.gguf", dir, nl_ggml_type_name(types[i]));
        if (nl_gguf_save(path, &m, &tok, types[i])) return die(path);
        printf("%s\n", path);
    }
    nl_tokenizer_free(&tok);
    nl_model_free(&m);
    return 0;
}

static int decode(const char *model, int threads, int n_new, const char *wname, const char *prompt_s) {
    nl_engine_opts o;
    nl_engine_opts_default(&o);
    o.threads = threads;
    o.max_batch = 1;
    if (nl_wfmt_parse(wname, &o.weights)) return die("weights");
    nl_engine *e;
    if (nl_engine_open(&e, model, NULL, &o)) return die(model);
    int32_t *prompt = NULL;
    int64_t np = 0;
    if (!strncmp(prompt_s, "text:", 5)) {
        if (nl_engine_encode(e, prompt_s + 5, strlen(prompt_s + 5), &prompt, &np)) return die("encode");
    } else {
        prompt = nl_malloc((strlen(prompt_s) / 2 + 2) * sizeof *prompt, "prompt");
        for (const char *p = prompt_s; *p;) {
            prompt[np++] = (int32_t)strtol(p, (char **)&p, 10);
            if (*p == ',') p++;
        }
    }
    nl_sampling s;
    nl_sampling_default(&s);
    s.temperature = 0;
    s.max_tokens = n_new;
    s.ignore_eos = 1;
    uint64_t id;
    if (nl_engine_submit(e, prompt, np, &s, &id)) return die("submit");
    if (nl_engine_step(e, NULL)) return die("step"); /* the prefill step and the first token */
    double t0 = nl_time_s();
    while (nl_engine_busy(e))
        if (nl_engine_step(e, NULL)) return die("step");
    double dt = nl_time_s() - t0;
    nl_engine_output out;
    if (nl_engine_read(e, id, 1, &out)) return die("read");
    printf("{\"prompt\": [");
    for (int64_t i = 0; i < np; i++) printf("%s%d", i ? "," : "", prompt[i]);
    printf("], \"tokens\": [");
    for (int64_t i = 0; i < out.n_tokens; i++) printf("%s%d", i ? "," : "", out.tokens[i]);
    printf("], \"decode_tok_s\": %.3f, \"threads\": %d, \"weights\": \"%s\"}\n",
           out.n_tokens > 1 ? (double)(out.n_tokens - 1) / dt : 0.0, threads, wname);
    nl_engine_output_free(&out);
    nl_engine_release(e, id);
    nl_free(prompt);
    nl_engine_close(e);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "make85m")) return make85m(argv[2]);
    if (argc == 7 && !strcmp(argv[1], "decode")) return decode(argv[2], atoi(argv[3]), atoi(argv[4]), argv[5], argv[6]);
    fprintf(stderr, "usage: bench_gguf make85m DIR | decode MODEL THREADS N_NEW fp32|bf16|int8|int4 IDS|text:TEXT\n");
    return 2;
}
