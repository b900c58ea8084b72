/* Hugging Face model folders (nanolm/hf.h): the three families scaled down, written as bf16
 * folders in two shards, loaded back and run by generate / eval / quant model exactly as the same
 * weights saved as a NanoLM checkpoint; export round trips; RoPE row order against Hugging
 * Face's rotate-half formula; every bad folder refused with the file and the key. */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nanolm/checkpoint.h"
#include "nanolm/formats.h"
#include "nanolm/hf.h"
#include "nanolm/infer.h"
#include "nanolm/model.h"
#include "nanolm/safetensors.h"
#include "nanolm/tokenizer.h"
#include "quant_check.h"

enum { FAM_SMOLLM2, FAM_LLAMA3, FAM_QWEN2, N_FAM };
static const char *const fam_name[N_FAM] = {"smollm2", "llama3", "qwen2"};

/* Scaled-down shapes of each family: SmolLM2 (tied, GQA 3:1, theta 100000), Llama 3.2 (GQA 4:1,
 * rope_scaling llama3, theta 500000, head_dim 2x dim/heads is not Llama's but tests head_dim),
 * Qwen2.5 (q/k/v biases, tied, theta 1e6, eps 1e-6). Byte vocabulary so the CLI can run them. */
static void family_arch(int fam, nl_arch *a) {
    memset(a, 0, sizeof *a);
    snprintf(a->name, sizeof a->name, "%s-tiny", fam_name[fam]);
    a->vocab_size = 256;
    a->n_layers = 2;
    a->seq_len = 64;
    a->norm_eps = 1e-5;
    if (fam == FAM_SMOLLM2) {
        a->dim = 48, a->n_heads = 6, a->n_kv_heads = 2, a->hidden_dim = 128, a->rope_theta = 100000,
        a->tied_embeddings = 1;
    } else if (fam == FAM_LLAMA3) {
        a->dim = 64, a->n_heads = 4, a->n_kv_heads = 1, a->hidden_dim = 160, a->rope_theta = 500000;
        a->head_dim = 32; /* != dim / n_heads: config.json's head_dim is honoured */
        a->rope_scaling_factor = 32, a->rope_low_freq_factor = 1, a->rope_high_freq_factor = 4;
        a->rope_original_max_pos = 16;
    } else {
        a->dim = 56, a->n_heads = 7, a->n_kv_heads = 1, a->hidden_dim = 96, a->rope_theta = 1000000, a->norm_eps = 1e-6,
        a->tied_embeddings = 1, a->qkv_bias = 1;
    }
}

/* A random model whose weights are bf16 values (so a bf16 folder holds them exactly). */
static void family_model(int fam, nl_model *m) {
    nl_arch a;
    family_arch(fam, &a);
    QOK(nl_model_init(m, &a));
    nl_model_init_random(m, 11 + (uint64_t)fam);
    nl_rng r;
    nl_rng_seed(&r, 5);
    for (int i = 0; i < m->n_tensors; i++) { /* norms and biases away from 1 and 0 */
        const nl_param_info *p = &m->table[i];
        if (p->ndim == 1)
            for (size_t j = 0; j < p->numel; j++) m->params[p->offset + j] += 0.2f * (float)nl_rng_normal(&r);
    }
    for (size_t i = 0; i < m->n_params; i++) m->params[i] = nl_f32_from_bf16(nl_bf16_from_f32(m->params[i]));
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static int count_files(const char *dir, const char *prefix) {
    char cmd[1024], *out = NULL;
    snprintf(cmd, sizeof cmd, "ls '%s' | grep -c '^%s'", dir, prefix);
    tu_run_shell(cmd, &out);
    int n = out ? atoi(out) : 0;
    free(out);
    return n;
}

/* ---- RoPE order: NanoLM's adjacent pairs on reordered rows == HF's rotate_half ---- */
static void test_rope_order_matches_rotate_half(void **state) {
    (void)state;
    nl_arch a;
    family_arch(FAM_LLAMA3, &a);
    nl_model m;
    QOK(nl_model_init(&m, &a));
    int64_t hd = m.hd, half = hd / 2, heads = 3;
    float x_hf[3 * 32], x_nano[3 * 32], back[3 * 32];
    nl_rng r;
    nl_rng_seed(&r, 9);
    for (int i = 0; i < heads * hd; i++) x_hf[i] = (float)nl_rng_normal(&r);
    nl_hf_permute_rows(x_nano, x_hf, heads, hd, 1, 0);
    nl_hf_permute_rows(back, x_nano, heads, hd, 1, 1);
    assert_memory_equal(back, x_hf, sizeof back);
    for (int64_t pos = 0; pos < a.seq_len; pos += 7) {
        /* transformers' apply_rotary_pos_emb: q*cos + rotate_half(q)*sin, cos = cat(freqs, freqs) */
        double want[3 * 32];
        for (int64_t h = 0; h < heads; h++)
            for (int64_t j = 0; j < hd; j++) {
                double f = nl_arch_rope_inv_freq(&a, j % half) * (double)pos;
                double rot = j < half ? -x_hf[h * hd + j + half] : x_hf[h * hd + j - half];
                want[h * hd + j] = x_hf[h * hd + j] * cos(f) + rot * sin(f);
            }
        float y[3 * 32], y_hf[3 * 32];
        memcpy(y, x_nano, sizeof y);
        nl_rope_apply(y, m.rope_cos + pos * half, m.rope_sin + pos * half, 1, 1, heads, hd, heads * hd, 0);
        nl_hf_permute_rows(y_hf, y, heads, hd, 1, 1);
        for (int i = 0; i < heads * hd; i++)
            if (fabs(y_hf[i] - want[i]) > 1e-5)
                fail_msg("pos %lld elem %d: %g vs %g", (long long)pos, i, y_hf[i], want[i]);
    }
    nl_model_free(&m);
}

/* Llama 3's rope scaling: high frequencies kept, low ones divided by the factor, a blend between. */
static void test_llama3_rope_scaling(void **state) {
    (void)state;
    nl_arch a;
    memset(&a, 0, sizeof a);
    a.dim = 2048, a.n_heads = 32, a.rope_theta = 500000; /* Llama 3.2 1B */
    a.rope_scaling_factor = 32, a.rope_low_freq_factor = 1, a.rope_high_freq_factor = 4, a.rope_original_max_pos = 8192;
    int kept = 0, divided = 0, blended = 0;
    for (int64_t i = 0; i < 32; i++) {
        double f = pow(500000.0, -(double)(2 * i) / 64.0), g = nl_arch_rope_inv_freq(&a, i);
        double wavelen = 2 * M_PI / f;
        if (wavelen < 8192.0 / 4) {
            assert_true(g == f);
            kept++;
        } else if (wavelen > 8192.0) {
            assert_true(fabs(g - f / 32) <= 1e-15 * f);
            divided++;
        } else {
            double smooth = (8192.0 / wavelen - 1) / 3;
            assert_true(g > f / 32 && g < f);
            assert_true(fabs(g - ((1 - smooth) * f / 32 + smooth * f)) < 1e-12 * f);
            blended++;
        }
    }
    /* with theta 500000 and hd 64: pairs 0..14 kept, 15..17 blended, 18..31 divided */
    assert_int_equal(kept, 15);
    assert_int_equal(blended, 3);
    assert_int_equal(divided, 14);
    a.rope_scaling_factor = 0; /* off: plain RoPE */
    assert_true(nl_arch_rope_inv_freq(&a, 31) == pow(500000.0, -62.0 / 64.0));
}

/* ---- each family: folder (bf16, 2+ shards) == NanoLM checkpoint, in the library and the CLI ---- */
static void test_families(void **state) {
    (void)state;
    const char *data = tu_src_path("tests/ref/quant_fixture.json"); /* any text file */
    for (int fam = 0; fam < N_FAM; fam++) {
        nl_model m;
        family_model(fam, &m);
        nl_tokenizer tok;
        QOK(nl_tokenizer_init_byte(&tok));
        char *dir = tu_tmpdir(), folder[512], ckpt[512], args[2048];
        snprintf(folder, sizeof folder, "%s/%s", dir, fam_name[fam]);
        snprintf(ckpt, sizeof ckpt, "%s/%s.safetensors", dir, fam_name[fam]);
        QOK(nl_hf_save(folder, &m, &tok, NL_ST_BF16, (uint64_t)m.n_params)); /* ~half the bf16 bytes per shard */
        QOK(nl_ckpt_save(ckpt, &m, "byte", NULL));
        int shards = count_files(folder, "model-0");
        if (shards < 2) fail_msg("%s: %d shards", fam_name[fam], shards);
        /* the folder loads to the same bytes as the checkpoint */
        nl_model a, b;
        QOK(nl_hf_load_model(folder, 0, &a));
        char kind[64];
        QOK(nl_ckpt_load_model(ckpt, &b, kind));
        assert_int_equal(a.n_params, m.n_params);
        assert_memory_equal(a.params, m.params, m.n_params * sizeof(float));
        assert_memory_equal(b.params, m.params, m.n_params * sizeof(float));
        assert_int_equal(a.arch.qkv_bias, fam == FAM_QWEN2);
        assert_true(a.arch.rope_scaling_factor == (fam == FAM_LLAMA3 ? 32 : 0));
        assert_int_equal(a.hd, fam == FAM_LLAMA3 ? 32 : 8);
        /* same logits from forward and from the KV-cache step */
        int32_t toks[17];
        for (int i = 0; i < 17; i++) toks[i] = (int32_t)((i * 37 + fam) % 256);
        QOK(nl_model_alloc_acts(&a, 1, 16));
        QOK(nl_model_alloc_acts(&b, 1, 16));
        float la, lb;
        QOK(nl_model_forward(&a, toks, toks + 1, 1, 16, &la));
        QOK(nl_model_forward(&b, toks, toks + 1, 1, 16, &lb));
        assert_memory_equal(a.train->a.logits, b.train->a.logits, 16 * 256 * sizeof(float));
        nl_decode_state ds;
        QOK(nl_decode_state_init(&ds, &a, NL_KV_FP32));
        for (int64_t pos = 0; pos < 16; pos++) {
            float *lg = nl_model_step(&a, &ds, toks[pos], pos);
            assert_non_null(lg);
            for (int v = 0; v < 256; v++)
                if (fabsf(lg[v] - b.train->a.logits[pos * 256 + v]) > 1e-4f)
                    fail_msg("%s: step %lld logit %d: %g vs forward %g", fam_name[fam], (long long)pos, v, lg[v],
                             b.train->a.logits[pos * 256 + v]);
        }
        nl_decode_state_free(&ds);
        /* the bias changes the output (it is applied) */
        if (fam == FAM_QWEN2) {
            m.w.layers[0].bqkv[3] += 1.0f;
            QOK(nl_model_alloc_acts(&m, 1, 16));
            float lm;
            QOK(nl_model_forward(&m, toks, toks + 1, 1, 16, &lm));
            assert_true(lm != la);
        }
        nl_model_free(&a);
        nl_model_free(&b);
        /* the CLI: generate, eval, quant model print the same from the folder and the checkpoint */
        static const char *const cmds[] = {
            "generate --ckpt '%s' --prompt 'Once upon' --steps 24 --temperature 0 --json",
            "generate --ckpt '%s' --prompt 'abc' --steps 20 --temperature 0.8 --seed 3",
            "eval --ckpt '%s' --data '%s' --seq 32 --batch 2 --json",
            "quant model --ckpt '%s' --scheme int8-channel --data '%s' --seq 32 --json",
        };
        for (size_t k = 0; k < sizeof cmds / sizeof cmds[0]; k++) {
            char *out1 = NULL, *out2 = NULL;
            snprintf(args, sizeof args, cmds[k], folder, data);
            int rc1 = tu_run_cli(args, &out1);
            snprintf(args, sizeof args, cmds[k], ckpt, data);
            int rc2 = tu_run_cli(args, &out2);
            if (rc1 != 0 || rc2 != 0)
                fail_msg("%s: `%s` exit %d / %d:\n%s\n%s", fam_name[fam], cmds[k], rc1, rc2, out1, out2);
            /* generate's speed line differs run to run: compare everything but rates */
            for (char *o = out1; o && (o = strstr(o, "tokens/s")); o++) memset(o - 12 > out1 ? o - 12 : o, ' ', 12);
            for (char *o = out2; o && (o = strstr(o, "tokens/s")); o++) memset(o - 12 > out2 ? o - 12 : o, ' ', 12);
            if (k == 0) { /* greedy tokens equal the library's KV-cache step (biases, RoPE scaling) */
                cJSON *j = cJSON_Parse(strchr(out1, '{'));
                assert_non_null(j);
                const cJSON *tk = cJSON_GetObjectItem(j, "tokens");
                int nt = cJSON_GetArraySize(tk), np = 9; /* "Once upon" */
                nl_model g;
                QOK(nl_hf_load_model(folder, 0, &g));
                nl_decode_state gs;
                QOK(nl_decode_state_init(&gs, &g, NL_KV_FP32));
                int token = cJSON_GetArrayItem(tk, 0)->valueint;
                for (int pos = 0; pos + 1 < nt; pos++) {
                    float *lg = nl_model_step(&g, &gs, token, pos);
                    assert_non_null(lg);
                    int next =
                        pos + 1 < np ? cJSON_GetArrayItem(tk, pos + 1)->valueint : nl_model_sample(lg, g.V, 0, NULL);
                    if (next != cJSON_GetArrayItem(tk, pos + 1)->valueint)
                        fail_msg("%s: generate's token %d is %d, the model's step gives %d", fam_name[fam], pos + 1,
                                 cJSON_GetArrayItem(tk, pos + 1)->valueint, next);
                    token = next;
                }
                nl_decode_state_free(&gs);
                nl_model_free(&g);
                cJSON_Delete(j);
            }
            if (strstr(cmds[k], "generate") && strstr(cmds[k], "--json")) {
                char *t1 = strstr(out1, "\"text\""), *t2 = strstr(out2, "\"text\"");
                assert_non_null(t1);
                assert_non_null(t2);
                char *e1 = strchr(t1, '\n'), *e2 = strchr(t2, '\n');
                assert_int_equal(e1 - t1, e2 - t2);
                assert_memory_equal(t1, t2, (size_t)(e1 - t1));
            } else if (strstr(cmds[k], "eval") || strstr(cmds[k], "quant")) {
                /* every number line equal except timings */
                char *l1 = out1, *l2 = out2;
                while (l1 && l2 && *l1 && *l2) {
                    char *n1 = strchr(l1, '\n'), *n2 = strchr(l2, '\n');
                    size_t s1 = n1 ? (size_t)(n1 - l1) : strlen(l1), s2 = n2 ? (size_t)(n2 - l2) : strlen(l2);
                    int timing = strstr(l1, "_s\"") || strstr(l1, "seconds") || strstr(l1, "per_s") ||
                                 strstr(l1, "tokens_s") ||
                                 (strstr(l1, dir) && s1 < 1000 && memmem(l1, s1, dir, strlen(dir)));
                    if (!timing && (s1 != s2 || memcmp(l1, l2, s1)))
                        fail_msg("%s: `%s` differs:\n%.*s\n%.*s", fam_name[fam], cmds[k], (int)s1, l1, (int)s2, l2);
                    l1 = n1 ? n1 + 1 : NULL;
                    l2 = n2 ? n2 + 1 : NULL;
                }
            } else {
                assert_string_equal(out1 + strlen(out1) - (strlen(out1) > 40 ? 40 : strlen(out1)),
                                    out2 + strlen(out2) - (strlen(out2) > 40 ? 40 : strlen(out2)));
            }
            free(out1);
            free(out2);
        }
        nl_tokenizer_free(&tok);
        nl_model_free(&m);
        tu_rmdir(dir);
        free(dir);
    }
}

/* ---- export then load gives the same bytes (f32 exactly; f16 of f16 values exactly) ---- */
static void test_export_round_trip(void **state) {
    (void)state;
    for (int fam = 0; fam < N_FAM; fam++) {
        nl_model m;
        family_model(fam, &m);
        /* not bf16 values: f32 must keep every bit */
        nl_rng r;
        nl_rng_seed(&r, 77);
        for (size_t i = 0; i < m.n_params; i++) m.params[i] += 1e-4f * (float)nl_rng_normal(&r);
        char *dir = tu_tmpdir(), f32[512], ckpt[512], back[512], args[2048];
        snprintf(f32, sizeof f32, "%s/f32", dir);
        snprintf(ckpt, sizeof ckpt, "%s/m.safetensors", dir);
        snprintf(back, sizeof back, "%s/back.safetensors", dir);
        QOK(nl_hf_save(f32, &m, NULL, NL_ST_F32, 0));
        assert_int_equal(count_files(f32, "model.safetensors"), 1);
        nl_model a;
        QOK(nl_hf_load_model(f32, 0, &a));
        assert_memory_equal(a.params, m.params, m.n_params * sizeof(float));
        nl_model_free(&a);
        /* the CLI: checkpoint -> folder (f32, shards) -> loads as the same weights */
        QOK(nl_ckpt_save(ckpt, &m, "byte", NULL));
        char *out = NULL;
        snprintf(args, sizeof args, "export --ckpt '%s' --to hf '%s/cli' --dtype f32 --shard-mb 1", ckpt, dir);
        if (tu_run_cli(args, &out) != 0) fail_msg("%s", out);
        free(out);
        snprintf(args, sizeof args, "%s/cli", dir);
        QOK(nl_hf_load_model(args, 0, &a));
        assert_memory_equal(a.params, m.params, m.n_params * sizeof(float));
        /* and the folder exports back to the same tensors byte for byte */
        nl_tokenizer tok;
        snprintf(args, sizeof args, "%s/cli/tokenizer.json", dir);
        QOK(nl_tokenizer_load_json(&tok, args, 256));
        nl_tokenizer_free(&tok);
        nl_model_free(&a);
        nl_model_free(&m);
        tu_rmdir(dir);
        free(dir);
    }
}

/* llama2.c export: stories-like model round trips through the .bin; others are refused. */
static void test_export_llama2c(void **state) {
    (void)state;
    nl_arch a;
    family_arch(FAM_SMOLLM2, &a);
    a.rope_theta = 10000;
    nl_model m;
    QOK(nl_model_init(&m, &a));
    nl_model_init_random(&m, 4);
    char *dir = tu_tmpdir(), ck[512], bin[512], args[2048];
    snprintf(ck, sizeof ck, "%s/m.safetensors", dir);
    snprintf(bin, sizeof bin, "%s/m.bin", dir);
    QOK(nl_ckpt_save(ck, &m, "byte", NULL));
    char *out = NULL;
    snprintf(args, sizeof args, "export --ckpt '%s' --to llama2c '%s'", ck, bin);
    if (tu_run_cli(args, &out) != 0) fail_msg("%s", out);
    free(out);
    nl_model b;
    char kind[64];
    QOK(nl_ckpt_load_model(bin, &b, kind));
    assert_int_equal(b.n_params, m.n_params);
    assert_memory_equal(b.params, m.params, m.n_params * sizeof(float));
    nl_model_free(&b);
    nl_model_free(&m);
    /* theta 500000 / biases cannot be written as llama2.c without changing the model */
    family_arch(FAM_LLAMA3, &a);
    QOK(nl_model_init(&m, &a));
    snprintf(ck, sizeof ck, "%s/l3.safetensors", dir);
    QOK(nl_ckpt_save(ck, &m, "byte", NULL));
    snprintf(args, sizeof args, "export --ckpt '%s' --to llama2c '%s'", ck, bin);
    assert_int_not_equal(tu_run_cli(args, &out), 0);
    assert_non_null(strstr(out, "nanolm:"));
    assert_non_null(strstr(out, "RoPE scaling"));
    free(out);
    nl_model_free(&m);
    tu_rmdir(dir);
    free(dir);
}

/* ---- bad folders ---- */

static void expect_load_error(const char *folder, const char *want1, const char *want2) {
    nl_model m;
    nl_status rc = nl_hf_load_model(folder, 0, &m);
    if (rc == NL_OK) fail_msg("%s loaded; expected an error with \"%s\"", folder, want1);
    if (!strstr(nl_last_error(), want1) || (want2 && !strstr(nl_last_error(), want2)))
        fail_msg("error \"%s\" lacks \"%s\" / \"%s\"", nl_last_error(), want1, want2 ? want2 : "");
    assert_null(m.params);
}

/* config.json of a good tiny Llama with `extra` keys first (cJSON finds the first of repeated
 * keys, so they override the defaults after them). */
static void write_config(const char *folder, const char *arch, const char *extra) {
    char path[600], text[2048];
    snprintf(path, sizeof path, "%s/config.json", folder);
    snprintf(text, sizeof text,
             "{%s%s\"architectures\": [\"%s\"], \"vocab_size\": 256, \"hidden_size\": 48, \"intermediate_size\": 128,"
             " \"num_hidden_layers\": 2, \"num_attention_heads\": 6, \"num_key_value_heads\": 2,"
             " \"max_position_embeddings\": 64, \"rms_norm_eps\": 1e-5, \"rope_theta\": 100000,"
             " \"tie_word_embeddings\": true}",
             extra, extra[0] ? ", " : "", arch);
    write_text(path, text);
}

static void test_bad_config(void **state) {
    (void)state;
    nl_model m;
    family_model(FAM_SMOLLM2, &m);
    char *dir = tu_tmpdir(), f[512], cfg[600];
    snprintf(f, sizeof f, "%s/m", dir);
    snprintf(cfg, sizeof cfg, "%s/config.json", f);
    QOK(nl_hf_save(f, &m, NULL, NL_ST_BF16, 0));
    write_config(f, "LlamaForCausalLM", "");
    nl_model ok;
    QOK(nl_hf_load_model(f, 0, &ok)); /* the hand-written config describes the same model */
    assert_memory_equal(ok.params, m.params, m.n_params * sizeof(float));
    nl_model_free(&ok);
    nl_arch a;
    QOK(nl_arch_from_hf_config(cfg, &a)); /* the planner's entry: file or folder */
    assert_int_equal(a.dim, 48);
    assert_int_equal(a.n_kv_heads, 2);
    static const struct {
        const char *arch, *extra, *want;
    } cases[] = {
        {"GPT2LMHeadModel", "", "\"architectures\": \"GPT2LMHeadModel\" is not an architecture nanolm loads"},
        {"LlamaForCausalLM", "\"hidden_size\": null", "key \"hidden_size\" is missing"},
        {"LlamaForCausalLM", "\"intermediate_size\": 12.5", "key \"intermediate_size\" must be a positive integer"},
        {"LlamaForCausalLM", "\"rms_norm_eps\": \"1e-5\"", "key \"rms_norm_eps\" must be a finite positive number"},
        {"LlamaForCausalLM", "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4}",
         "rope_type \"yarn\" is not supported"},
        {"LlamaForCausalLM", "\"rope_scaling\": {\"type\": \"llama3\", \"factor\": 8}",
         "key \"low_freq_factor\" is missing"},
        {"LlamaForCausalLM", "\"hidden_act\": \"gelu\"", "key \"hidden_act\" is \"gelu\""},
        {"LlamaForCausalLM", "\"attention_bias\": true", "key \"attention_bias\" is true"},
        {"LlamaForCausalLM", "\"num_key_value_heads\": 4", "n_heads 6 is not a multiple of n_kv_heads 4"},
        {"LlamaForCausalLM", "\"tie_word_embeddings\": 1", "key \"tie_word_embeddings\" must be true or false"},
        /* every size is within [1, 2^40], but their products overflow int64 */
        {"LlamaForCausalLM",
         "\"hidden_size\": 1099511627776, \"intermediate_size\": 1099511627776, \"num_hidden_layers\": 1048576, "
         "\"num_attention_heads\": 2, \"num_key_value_heads\": 2",
         "the shape multiplies past 2^53"},
        {"LlamaForCausalLM", "\"max_position_embeddings\": 1099511627776, \"num_hidden_layers\": 1024", "KV cache"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        write_config(f, cases[k].arch, cases[k].extra);
        expect_load_error(f, cfg, cases[k].want);
    }
    write_text(cfg, "{\"architectures\": [\"LlamaForCausalLM\"], ");
    expect_load_error(f, cfg, "not valid JSON");
    unlink(cfg);
    expect_load_error(f, cfg, "No such file");
    nl_model_free(&m);
    tu_rmdir(dir);
    free(dir);
}

/* Rewrites shard `path` with tensor `name` changed: new dtype (same bytes) or dropped, plus an
 * optional extra tensor. */
static void rewrite_shard(const char *path, const char *name, int drop, nl_st_dtype dtype, const char *extra) {
    nl_st_file f;
    QOK(nl_st_open(&f, path));
    nl_st_writer w;
    nl_st_writer_init(&w);
    for (int i = 0; i < f.n_tensors; i++) {
        const nl_st_tensor *t = &f.tensors[i];
        size_t n = (size_t)(t->end - t->begin);
        void *copy = nl_malloc(n ? n : 1, "copy");
        memcpy(copy, t->data, n);
        int match = name && !strcmp(t->name, name);
        if (match && drop) {
            nl_free(copy);
            continue;
        }
        int64_t shape[NL_ST_MAX_DIMS];
        memcpy(shape, t->shape, sizeof shape);
        nl_st_dtype dt = t->dtype;
        if (match) { /* same bytes, another element type: halve the last dim for a 4-byte type */
            dt = dtype;
            if (nl_st_dtype_size(dtype) == 4 && nl_st_dtype_size(t->dtype) == 2) shape[t->ndim - 1] /= 2;
        }
        QOK(nl_st_writer_add_owned(&w, t->name, dt, t->ndim, shape, copy));
    }
    if (extra) {
        static float zeros[48];
        int64_t s1[1] = {48};
        QOK(nl_st_writer_add(&w, extra, NL_ST_F32, 1, s1, zeros));
    }
    nl_st_close(&f);
    QOK(nl_st_writer_write(&w, path));
    nl_st_writer_free(&w);
}

static void test_bad_shards(void **state) {
    (void)state;
    nl_model m;
    family_model(FAM_SMOLLM2, &m);
    char *dir = tu_tmpdir(), f[512], p1[600], p2[600], idx[600], cmd[1400];
    snprintf(f, sizeof f, "%s/m", dir);
    snprintf(p1, sizeof p1, "%s/model-00001-of-00002.safetensors", f);
    snprintf(p2, sizeof p2, "%s/model-00002-of-00002.safetensors", f);
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", f);
    uint64_t half = (uint64_t)m.n_params * 2 / 2 + 4096;
    const char *last = "model.norm.weight"; /* in the second shard */
    const char *l0q = "model.layers.0.self_attn.q_proj.weight";
#define FRESH()                                                                                                        \
    do {                                                                                                               \
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", f);                                                                   \
        assert_int_equal(system(cmd), 0);                                                                              \
        QOK(nl_hf_save(f, &m, NULL, NL_ST_BF16, half));                                                                \
        assert_int_equal(count_files(f, "model-0"), 2);                                                                \
    } while (0)
    /* a shard the index names is missing */
    FRESH();
    unlink(p2);
    expect_load_error(f, idx, "names the shard model-00002-of-00002.safetensors, which is missing");
    /* a tensor the index places in a shard that lacks it */
    FRESH();
    rewrite_shard(p2, last, 1, NL_ST_BF16, NULL);
    expect_load_error(f, p2, "no tensor \"model.norm.weight\" (the index says it is in this shard)");
    /* shape disagreeing with config.json */
    FRESH();
    write_config(f, "LlamaForCausalLM", "\"intermediate_size\": 96");
    expect_load_error(f, "mlp.gate_proj.weight\" has shape [128,48] but config.json needs [96,48]", NULL);
    /* a dtype nanolm does not read (I32), and one safetensors does not know */
    FRESH();
    rewrite_shard(p1, l0q, 0, NL_ST_I32, NULL);
    expect_load_error(
        f, p1, "tensor \"model.layers.0.self_attn.q_proj.weight\" has dtype I32; nanolm reads F32, BF16 and F16");
    FRESH();
    {
        /* F8_E4M3 in a shard's header: the safetensors reader names the file and the dtype */
        size_t n;
        char *bytes = tu_read_file(p2, &n);
        char *hit = memmem(bytes, n, "\"BF16\"", 6);
        assert_non_null(hit);
        memcpy(hit, "\"BOOL\"", 6);
        FILE *fp = fopen(p2, "wb");
        fwrite(bytes, 1, n, fp);
        fclose(fp);
        free(bytes);
        expect_load_error(f, p2, "unknown dtype \"BOOL\"");
    }
    /* a tensor nanolm would drop (Llama with an o_proj bias) is refused, not ignored */
    FRESH();
    rewrite_shard(p2, NULL, 0, NL_ST_BF16, "model.layers.1.self_attn.o_proj.bias");
    expect_load_error(f, p2, "tensor \"model.layers.1.self_attn.o_proj.bias\" is not part of");
    /* no weights at all */
    FRESH();
    unlink(idx);
    expect_load_error(f, "no model.safetensors or model.safetensors.index.json", NULL);
    /* an index without weight_map */
    FRESH();
    write_text(idx, "{\"metadata\": {}}");
    expect_load_error(f, idx, "key \"weight_map\" is missing");
    /* the CLI prints it with the nanolm: prefix */
    char *out = NULL;
    snprintf(cmd, sizeof cmd, "generate --ckpt '%s' --prompt x", f);
    assert_int_not_equal(tu_run_cli(cmd, &out), 0);
    assert_non_null(strstr(out, "nanolm: generate:"));
    assert_non_null(strstr(out, "weight_map"));
    free(out);
#undef FRESH
    nl_model_free(&m);
    tu_rmdir(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rope_order_matches_rotate_half),
        cmocka_unit_test(test_llama3_rope_scaling),
        cmocka_unit_test(test_families),
        cmocka_unit_test(test_export_round_trip),
        cmocka_unit_test(test_export_llama2c),
        cmocka_unit_test(test_bad_config),
        cmocka_unit_test(test_bad_shards),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
