/* GGUF: the container (nanolm/gguf.h), ggml's block types (nanolm/ggml_quant.h) and models
 * (nanolm/gguf_model.h): a file built here byte by byte as the format's documentation lays it
 * out, the writer's files read back, every malformed header refused by name, and models
 * exported and loaded back bit for bit. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/engine.h"
#include "nanolm/formats.h"
#include "nanolm/ggml_quant.h"
#include "nanolm/gguf.h"
#include "nanolm/gguf_model.h"
#include "nanolm/matvec.h"
#include "nanolm/model_load.h"

/* ---- a byte builder ------------------------------------------------------------------------- */
typedef struct bb {
    uint8_t b[8192];
    size_t n;
} bb;
static void u8(bb *x, uint8_t v) { x->b[x->n++] = v; }
static void u32(bb *x, uint32_t v) {
    for (int i = 0; i < 4; i++) u8(x, (uint8_t)(v >> (8 * i)));
}
static void u64(bb *x, uint64_t v) {
    for (int i = 0; i < 8; i++) u8(x, (uint8_t)(v >> (8 * i)));
}
static void str(bb *x, const char *s) {
    u64(x, strlen(s));
    memcpy(x->b + x->n, s, strlen(s));
    x->n += strlen(s);
}
static void pad32(bb *x) {
    while (x->n % 32) u8(x, 0);
}

/* A small valid file: 3 KVs (u32, string, array of 2 f32) and 2 tensors: "a" Q8_0 [32] with
 * d = 0.5 and codes 0..31 minus 16, "b" F32 [2, 1] = {1.5, -2}. */
static void build_valid(bb *x) {
    memset(x, 0, sizeof *x);
    u32(x, 0x46554747); /* "GGUF" */
    u32(x, 3);
    u64(x, 2); /* tensors */
    u64(x, 3); /* KVs */
    str(x, "general.alignment");
    u32(x, 4); /* uint32 */
    u32(x, 32);
    str(x, "general.name");
    u32(x, 8);
    str(x, "tiny");
    str(x, "v");
    u32(x, 9); /* array */
    u32(x, 6); /* of float32 */
    u64(x, 2);
    float f[2] = {0.25f, -3.0f};
    uint32_t fb[2];
    memcpy(fb, f, 8);
    u32(x, fb[0]);
    u32(x, fb[1]);
    str(x, "a");
    u32(x, 1);
    u64(x, 32);
    u32(x, 8); /* Q8_0 */
    u64(x, 0);
    str(x, "b");
    u32(x, 2);
    u64(x, 2);
    u64(x, 1);
    u32(x, 0); /* F32 */
    u64(x, 64);
    pad32(x);
    u8(x, 0x00); /* fp16 0.5 = 0x3800 */
    u8(x, 0x38);
    for (int j = 0; j < 32; j++) u8(x, (uint8_t)(int8_t)(j - 16));
    pad32(x);
    float g[2] = {1.5f, -2.0f};
    memcpy(x->b + x->n, g, 8);
    x->n += 8;
}

static void test_hand_built(void **s) {
    (void)s;
    bb x;
    build_valid(&x);
    nl_gguf_file f;
    assert_int_equal(nl_gguf_parse(&f, x.b, x.n, "hand.gguf"), NL_OK);
    assert_int_equal(f.n_kv, 3);
    assert_int_equal(f.n_tensors, 2);
    int64_t v;
    assert_int_equal(nl_gguf_get_int(&f, "general.alignment", &v), NL_OK);
    assert_int_equal(v, 32);
    char name[16];
    assert_true(nl_gguf_str_copy(&f, "general.name", name, sizeof name));
    assert_string_equal(name, "tiny");
    const nl_gguf_kv *kv = nl_gguf_find_kv(&f, "v");
    assert_non_null(kv);
    assert_int_equal(kv->n, 2);
    assert_true(nl_gguf_arr_float(kv, 0) == 0.25 && nl_gguf_arr_float(kv, 1) == -3.0);
    assert_int_equal(nl_gguf_get_int(&f, "general.name", &v), NL_ERR_FORMAT); /* a string, not an int */
    assert_non_null(strstr(nl_last_error(), "general.name"));
    const nl_gguf_tensor *a = nl_gguf_find_tensor(&f, "a"), *b = nl_gguf_find_tensor(&f, "b");
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(a->bytes, 34);
    float out[32];
    assert_int_equal(nl_ggml_to_f32(a->type, a->data, a->numel, out), NL_OK);
    for (int j = 0; j < 32; j++) assert_true(out[j] == 0.5f * (float)(j - 16));
    assert_int_equal(b->ne[0], 2);
    assert_int_equal(nl_ggml_to_f32(b->type, b->data, b->numel, out), NL_OK);
    assert_true(out[0] == 1.5f && out[1] == -2.0f);
    nl_gguf_close(&f);
}

/* Every prefix is refused with a message; so is each corruption below, by name. */
static void expect_refused(const bb *x, const char *needle) {
    nl_gguf_file f;
    nl_clear_error();
    nl_status rc = nl_gguf_parse(&f, x->b, x->n, "bad.gguf");
    if (rc == NL_OK) nl_gguf_close(&f);
    assert_int_equal(rc, NL_ERR_FORMAT);
    if (!strstr(nl_last_error(), needle)) fail_msg("expected \"%s\" in \"%s\"", needle, nl_last_error());
}

static void test_malformed(void **s) {
    (void)s;
    bb x, y;
    build_valid(&x);
    for (size_t n = 0; n < x.n; n++) {
        y = x;
        y.n = n;
        expect_refused(&y, "bad.gguf");
    }
    /* byte offsets in build_valid: magic 0, version 4, n_tensors 8, n_kv 16, KV 0 key at 24 */
    size_t kv0_type = 24 + 8 + 17, kv1_type = kv0_type + 4 + 4 + 8 + 12;
    size_t kv2 = kv1_type + 4 + 8 + 4;
    size_t arr_type = kv2 + 8 + 1 + 4, t0 = arr_type + 4 + 8 + 8;
    size_t t0_ndim = t0 + 8 + 1, t0_ne = t0_ndim + 4, t0_type = t0_ne + 8, t0_off = t0_type + 4;
    size_t t1_off = t0_off + 8 + 8 + 1 + 4 + 16 + 4;
    struct {
        size_t at;
        int bytes;
        uint64_t v;
        const char *needle;
    } cases[] = {
        {0, 4, 0x46554748, "not a GGUF file"},
        {4, 4, 1, "version 1"},
        {8, 8, UINT64_MAX, "tensor count"},
        {16, 8, (uint64_t)1 << 60, "KV count"},
        {24, 8, (uint64_t)1 << 40, "key of KV 0"},
        {kv0_type, 4, 13, "unknown value type 13"},
        {kv0_type, 4, 5, "general.alignment has type int32"},
        {kv0_type + 4, 4, 48, "power of two"},
        {arr_type, 4, 9, "arrays of arrays"},
        {arr_type, 4, 77, "array of unknown type"},
        {arr_type + 4, 8, (uint64_t)1 << 61, "KV v: array of"},
        {t0_ndim, 4, 5, "5 dimensions"},
        {t0_ndim, 4, 0, "0 dimensions"},
        {t0_ne, 8, 0, "dimension 0 is 0"},
        {t0_ne, 8, 33, "not whole q8_0 blocks"},
        {t0_ne, 8, (uint64_t)1 << 62, "past the data area"},
        {t0_type, 4, 5, "unknown ggml type 5"},
        {t0_off, 8, 8, "not a multiple of the alignment"},
        {t0_off, 8, 1024, "past the data area"},
        {t1_off, 8, 32, "overlap"},
        {t0 + 8, 1, 'b', "duplicate tensor b"},
    };
    (void)kv2;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        y = x;
        for (int k = 0; k < cases[i].bytes; k++) y.b[cases[i].at + (size_t)k] = (uint8_t)(cases[i].v >> (8 * k));
        expect_refused(&y, cases[i].needle);
    }
    bb d;
    memset(&d, 0, sizeof d);
    u32(&d, 0x46554747);
    u32(&d, 3);
    u64(&d, 0);
    u64(&d, 2);
    str(&d, "k");
    u32(&d, 7); /* bool */
    u8(&d, 1);
    str(&d, "k");
    u32(&d, 7);
    u8(&d, 0);
    expect_refused(&d, "duplicate KV k");
    d.b[d.n - 1] = 2; /* and a bool of 2 */
    expect_refused(&d, "neither 0 nor 1");
    /* a NUL inside a key */
    memset(&d, 0, sizeof d);
    u32(&d, 0x46554747);
    u32(&d, 3);
    u64(&d, 0);
    u64(&d, 1);
    u64(&d, 3);
    memcpy(d.b + d.n, "a\0b", 3);
    d.n += 3;
    u32(&d, 0);
    u8(&d, 0);
    expect_refused(&d, "NUL");
}

static void test_writer_round_trip(void **s) {
    (void)s;
    char *dir = tu_tmpdir(), path[600];
    snprintf(path, sizeof path, "%s/w.gguf", dir);
    nl_gguf_writer w;
    nl_gguf_writer_init(&w);
    assert_int_equal(nl_gguf_writer_u32(&w, "u", 7), NL_OK);
    assert_int_equal(nl_gguf_writer_i32(&w, "i", -5), NL_OK);
    assert_int_equal(nl_gguf_writer_u64(&w, "q", (uint64_t)1 << 40), NL_OK);
    assert_int_equal(nl_gguf_writer_f32(&w, "f", 0.125f), NL_OK);
    assert_int_equal(nl_gguf_writer_bool(&w, "b", 1), NL_OK);
    assert_int_equal(nl_gguf_writer_str(&w, "s", "hello"), NL_OK);
    int32_t ia[3] = {1, -2, 3};
    assert_int_equal(nl_gguf_writer_arr(&w, "ia", NL_GGUF_INT32, 3, ia), NL_OK);
    const char *sa[2] = {"x", "yz"};
    assert_int_equal(nl_gguf_writer_arr_str(&w, "sa", 2, sa, NULL), NL_OK);
    assert_int_equal(nl_gguf_writer_u32(&w, "u", 8), NL_ERR_INVALID); /* duplicate */
    float t1[64];
    for (int i = 0; i < 64; i++) t1[i] = (float)i / 8 - 3;
    int64_t ne1[2] = {32, 2}, ne2[1] = {3};
    uint8_t q[68];
    assert_int_equal(nl_ggml_from_f32(NL_GGML_Q8_0, t1, 64, q), NL_OK);
    assert_int_equal(nl_gguf_writer_tensor(&w, "q8", NL_GGML_Q8_0, 2, ne1, q), NL_OK);
    assert_int_equal(nl_gguf_writer_tensor(&w, "f", NL_GGML_F32, 1, ne2, t1), NL_OK);
    int64_t bad[1] = {33};
    assert_int_equal(nl_gguf_writer_tensor(&w, "bad", NL_GGML_Q8_0, 1, bad, q), NL_ERR_INVALID);
    assert_int_equal(nl_gguf_writer_tensor(&w, "f", NL_GGML_F32, 1, ne2, t1), NL_ERR_INVALID);
    assert_int_equal(nl_gguf_writer_write(&w, path), NL_OK);
    nl_gguf_writer_free(&w);
    nl_gguf_file f;
    assert_int_equal(nl_gguf_open(&f, path), NL_OK);
    int64_t v;
    double d;
    assert_int_equal(nl_gguf_get_int(&f, "u", &v), NL_OK);
    assert_int_equal(v, 7);
    assert_int_equal(nl_gguf_get_int(&f, "i", &v), NL_OK);
    assert_int_equal(v, -5);
    assert_int_equal(nl_gguf_get_int(&f, "q", &v), NL_OK);
    assert_true(v == (int64_t)1 << 40);
    assert_int_equal(nl_gguf_get_float(&f, "f", &d), NL_OK);
    assert_true(d == 0.125);
    assert_int_equal(nl_gguf_get_int(&f, "b", &v), NL_OK);
    assert_int_equal(v, 1);
    char buf[16];
    assert_true(nl_gguf_str_copy(&f, "s", buf, sizeof buf));
    assert_string_equal(buf, "hello");
    const nl_gguf_kv *kv = nl_gguf_find_kv(&f, "ia");
    assert_true(kv && kv->n == 3 && nl_gguf_arr_int(kv, 1) == -2);
    kv = nl_gguf_find_kv(&f, "sa");
    uint64_t len;
    const char *p = nl_gguf_arr_str(kv, 1, &len);
    assert_true(len == 2 && !memcmp(p, "yz", 2));
    const nl_gguf_tensor *t = nl_gguf_find_tensor(&f, "q8");
    assert_true(t && t->offset % 32 == 0 && !memcmp(t->data, q, 68));
    t = nl_gguf_find_tensor(&f, "f");
    assert_true(t && t->offset % 32 == 0 && !memcmp(t->data, t1, 12));
    nl_gguf_close(&f);
    tu_rmdir(dir);
    free(dir);
}

/* Block formats against values derived from their layout. */
static void test_blocks(void **s) {
    (void)s;
    /* Q4_0: d = 2 (fp16 0x4000), byte j = (j & 15) | (15 - j) << 4 */
    uint8_t q4[18] = {0x00, 0x40};
    for (int j = 0; j < 16; j++) q4[2 + j] = (uint8_t)(j | (15 - j) << 4);
    float out[256];
    assert_int_equal(nl_ggml_to_f32(NL_GGML_Q4_0, q4, 32, out), NL_OK);
    for (int j = 0; j < 16; j++) {
        assert_true(out[j] == 2.0f * (float)(j - 8));
        assert_true(out[16 + j] == 2.0f * (float)(7 - j));
    }
    /* Q4_0 of llama.cpp's reference quantizer: d = max / -8 where max is the value of largest
     * magnitude (21 here: d = -2.625, fp16 0xC140), q = (int)(x / d + 8.5) capped at 15 */
    float x[32];
    for (int j = 0; j < 32; j++) x[j] = (float)(j - 10);
    assert_int_equal(nl_ggml_from_f32(NL_GGML_Q4_0, x, 32, q4), NL_OK);
    assert_int_equal(q4[0] | q4[1] << 8, 0xC140);
    assert_int_equal(q4[2] & 15, 12);     /* x = -10: 10 / 2.625 + 8.5 = 12.3 */
    assert_int_equal(q4[2 + 15] >> 4, 0); /* x = 21: -8 + 8.5 */
    assert_int_equal(nl_ggml_to_f32(NL_GGML_Q4_0, q4, 32, out), NL_OK);
    assert_true(out[31] == 21.0f && out[0] == -10.5f);
    x[3] = NAN;
    uint8_t q8[34];
    assert_int_equal(nl_ggml_from_f32(NL_GGML_Q8_0, x, 32, q8), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "value 3"));
    /* Q4_K: d = 1, dmin = 0.5; (scale, min) of sub-blocks 0-3 = (2, 1), of 4-7 = (3, 1); every
     * byte of nibbles 0x21: sub-block 2i reads the low nibble (1), 2i + 1 the high one (2):
     * x = d * scale * nibble - dmin * min */
    uint8_t k4[144] = {0x00, 0x3C, 0x00, 0x38, 2, 2, 2, 2, 1, 1, 1, 1, 0x13, 0x13, 0x13, 0x13};
    memset(k4 + 16, 0x21, 128);
    assert_int_equal(nl_ggml_to_f32(NL_GGML_Q4_K, k4, 256, out), NL_OK);
    static const float want[8] = {1.5f, 3.5f, 1.5f, 3.5f, 2.5f, 5.5f, 2.5f, 5.5f};
    for (int i = 0; i < 256; i++) assert_true(out[i] == want[i / 32]);
    /* Q6_K: d = 0.5, scales 1..16, low nibbles 5, high bits 2 (q = 5 | 2 << 4 = 37, minus 32 = 5):
     * x = 0.5 * scale * 5 with scale index 8h + 2g + l / 16 (h: half, g: quarter of the half) */
    uint8_t k6[210];
    memset(k6, 0x55, 128);
    memset(k6 + 128, 0xAA, 64);
    for (int i = 0; i < 16; i++) k6[192 + i] = (uint8_t)(i + 1);
    k6[208] = 0x00;
    k6[209] = 0x38;
    assert_int_equal(nl_ggml_to_f32(NL_GGML_Q6_K, k6, 256, out), NL_OK);
    for (int i = 0; i < 256; i++) {
        int h = i / 128, g = (i % 128) / 32, l = i % 32;
        assert_true(out[i] == 0.5f * (float)(8 * h + 2 * g + l / 16 + 1) * 5.0f);
    }
    assert_int_equal(nl_ggml_to_f32(NL_GGML_Q5_K, k6, 256, out), NL_ERR_UNSUPPORTED);
    assert_non_null(strstr(nl_last_error(), "q5_K"));
}

/* A small untied model with GQA and an FFN row (80) that is not whole blocks of 32. */
static void small_model(nl_model *m) {
    nl_arch a;
    memset(&a, 0, sizeof a);
    snprintf(a.name, sizeof a.name, "tiny-gguf");
    a.vocab_size = 256;
    a.dim = 64;
    a.n_layers = 2;
    a.n_heads = 4;
    a.n_kv_heads = 2;
    a.hidden_dim = 80;
    a.seq_len = 64;
    a.rope_theta = 10000;
    a.norm_eps = 1e-5;
    a.tied_embeddings = 0;
    assert_int_equal(nl_model_init(m, &a), NL_OK);
    nl_model_init_random(m, 7);
}

static void test_model_round_trip(void **s) {
    (void)s;
    char *dir = tu_tmpdir(), path[600], path2[600];
    nl_model m;
    small_model(&m);
    nl_tokenizer tok;
    assert_int_equal(nl_tokenizer_init_byte(&tok), NL_OK);
    static const uint32_t types[] = {NL_GGML_F32, NL_GGML_F16, NL_GGML_BF16, NL_GGML_Q8_0, NL_GGML_Q4_0};
    const nl_param_info *tab;
    int nt = nl_model_params_table(&m, &tab);
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        snprintf(path, sizeof path, "%s/m-%s.gguf", dir, nl_ggml_type_name(types[k]));
        assert_int_equal(nl_gguf_save(path, &m, &tok, types[k]), NL_OK);
        nl_model r;
        nl_tokenizer rt;
        nl_model_source src;
        assert_int_equal(nl_model_load(path, NULL, 0, &r, &rt, &src), NL_OK);
        assert_int_equal(src.format, NL_CKPT_GGUF);
        assert_int_equal(src.gguf_type, types[k]);
        assert_int_equal(rt.kind, NL_TOKENIZER_BYTE);
        assert_int_equal(r.arch.n_kv_heads, 2);
        assert_int_equal(r.arch.hidden_dim, 80);
        assert_int_equal(r.arch.tied_embeddings, 0);
        assert_true(r.arch.norm_eps == (double)(float)1e-5);
        assert_int_equal(r.n_params, m.n_params);
        for (int i = 0; i < nt; i++) {
            const nl_param_info *p = &tab[i];
            const float *x = m.params + p->offset, *y = r.params + p->offset;
            float *want = malloc(p->numel * sizeof(float));
            uint32_t t = p->ndim == 1 || p->shape[1] % nl_ggml_block_elems(types[k]) ? NL_GGML_F32 : types[k];
            uint8_t *blocks = malloc(p->numel * 4 + 64);
            assert_int_equal(nl_ggml_from_f32(t, x, (int64_t)p->numel, blocks), NL_OK);
            assert_int_equal(nl_ggml_to_f32(t, blocks, (int64_t)p->numel, want), NL_OK);
            if (memcmp(want, y, p->numel * sizeof(float)))
                fail_msg("%s: %s differs after the round trip", path, p->name);
            if (t == NL_GGML_F32) assert_memory_equal(x, y, p->numel * sizeof(float));
            if (t == NL_GGML_BF16)
                for (size_t j = 0; j < p->numel; j++) assert_true(y[j] == nl_fmt_round(NL_FMT_BF16, x[j]));
            free(want);
            free(blocks);
        }
        /* what was loaded, written again, is the same file */
        if (types[k] != NL_GGML_Q4_0) { /* Q4_0 rescales a block whose largest value is positive */
            snprintf(path2, sizeof path2, "%s/again.gguf", dir);
            assert_int_equal(nl_gguf_save(path2, &r, &rt, types[k]), NL_OK);
            size_t n1, n2;
            char *b1 = tu_read_file(path, &n1), *b2 = tu_read_file(path2, &n2);
            assert_int_equal(n1, n2);
            assert_memory_equal(b1, b2, n1);
            free(b1);
            free(b2);
        }
        nl_model_free(&r);
        nl_tokenizer_free(&rt);
    }
    /* the planner's shape from the metadata alone */
    nl_arch a;
    snprintf(path, sizeof path, "%s/m-q8_0.gguf", dir);
    assert_int_equal(nl_model_load_arch(path, &a), NL_OK);
    assert_int_equal(a.dim, 64);
    assert_int_equal(a.vocab_size, 256);
    /* unsupported export types and models are refused by name */
    assert_int_equal(nl_gguf_save(path, &m, &tok, NL_GGML_Q4_K), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "q4_K"));
    nl_tokenizer_free(&tok);
    nl_model_free(&m);
    tu_rmdir(dir);
    free(dir);
}

/* A model file with a tensor nanolm does not know, or one missing, is refused by name. */
static void test_model_refusals(void **s) {
    (void)s;
    char *dir = tu_tmpdir(), path[600];
    snprintf(path, sizeof path, "%s/x.gguf", dir);
    nl_gguf_writer w;
    nl_gguf_writer_init(&w);
    nl_gguf_writer_str(&w, "general.architecture", "qwen3");
    assert_int_equal(nl_gguf_writer_write(&w, path), NL_OK);
    nl_gguf_writer_free(&w);
    nl_model m;
    assert_int_equal(nl_model_load(path, NULL, 0, &m, NULL, NULL), NL_ERR_FORMAT);
    assert_non_null(strstr(nl_last_error(), "\"qwen3\""));
    nl_gguf_writer_init(&w);
    nl_gguf_writer_str(&w, "general.architecture", "llama");
    nl_gguf_writer_u32(&w, "llama.embedding_length", 32);
    assert_int_equal(nl_gguf_writer_write(&w, path), NL_OK);
    nl_gguf_writer_free(&w);
    assert_int_equal(nl_model_load(path, NULL, 0, &m, NULL, NULL), NL_ERR_FORMAT);
    assert_non_null(strstr(nl_last_error(), "llama.block_count"));
    tu_rmdir(dir);
    free(dir);
}

/* stories260K with its llama2.c tokenizer: exported, loaded back with the GGUF's own
 * SentencePiece vocabulary, encodes and generates as the original. */
static void test_stories_tokenizer(void **s) {
    (void)s;
    TU_REQUIRE_DATA(bin, "stories260K/stories260K.bin");
    TU_REQUIRE_DATA(tokp, "stories260K/tok512.bin");
    char *dir = tu_tmpdir(), path[600];
    snprintf(path, sizeof path, "%s/s.gguf", dir);
    nl_model m, r;
    nl_tokenizer tok, rt;
    assert_int_equal(nl_model_load(bin, tokp, 0, &m, &tok, NULL), NL_OK);
    assert_int_equal(nl_gguf_save(path, &m, &tok, NL_GGML_F32), NL_OK);
    assert_int_equal(nl_model_load(path, NULL, 0, &r, &rt, NULL), NL_OK);
    assert_int_equal(rt.kind, NL_TOKENIZER_LLAMA2C);
    assert_memory_equal(m.params, r.params, m.n_params * sizeof(float));
    const char *text = "Once upon a time, a little girl named Lily saw a big dog. \"Hi!\" she said.";
    int *a = NULL, *b = NULL;
    int64_t na, nb;
    assert_int_equal(nl_tokenizer_encode(&tok, text, strlen(text), 1, 0, &a, &na), NL_OK);
    assert_int_equal(nl_tokenizer_encode(&rt, text, strlen(text), 1, 0, &b, &nb), NL_OK);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, (size_t)na * sizeof(int));
    char *da, *db;
    size_t la, lb;
    assert_int_equal(nl_tokenizer_decode(&tok, a, na, &da, &la), NL_OK);
    assert_int_equal(nl_tokenizer_decode(&rt, b, nb, &db, &lb), NL_OK);
    assert_string_equal(da, db);
    nl_free(a);
    nl_free(b);
    nl_free(da);
    nl_free(db);
    nl_model_free(&m);
    nl_model_free(&r);
    nl_tokenizer_free(&tok);
    nl_tokenizer_free(&rt);
    tu_rmdir(dir);
    free(dir);
}

/* A gpt2 (byte-level BPE) vocabulary written by hand: bytes as GPT-2's printable characters,
 * one merge "h e" -> "he" and a control token. */
static void test_gpt2_tokenizer(void **s) {
    (void)s;
    char *dir = tu_tmpdir(), path[600];
    snprintf(path, sizeof path, "%s/g.gguf", dir);
    nl_model m;
    small_model(&m);
    /* 256 byte tokens in GPT-2's bytes_to_unicode order is long to write; the printable ASCII
     * bytes map to themselves, so a vocabulary of those, "he" and "<|eot|>" suffices for the
     * text "hehe hi" (space is U+0120 'Ġ' in GPT-2's table) */
    const char *toks[256];
    char store[256][8];
    int n = 0;
    for (int c = '!'; c <= '~'; c++) {
        store[n][0] = (char)c;
        store[n][1] = 0;
        toks[n] = store[n];
        n++;
    }
    int id_space = n;
    toks[n++] = "\xc4\xa0"; /* U+0120 */
    int id_he = n;
    toks[n++] = "he";
    int id_eot = n;
    toks[n++] = "<|eot|>";
    int32_t types[256];
    for (int i = 0; i < n; i++) types[i] = i == id_eot ? 3 : 1;
    const char *merges[1] = {"h e"};
    nl_gguf_writer w;
    nl_gguf_writer_init(&w);
    assert_int_equal(nl_gguf_writer_str(&w, "tokenizer.ggml.model", "gpt2"), NL_OK);
    assert_int_equal(nl_gguf_writer_arr_str(&w, "tokenizer.ggml.tokens", (uint64_t)n, toks, NULL), NL_OK);
    assert_int_equal(nl_gguf_writer_arr(&w, "tokenizer.ggml.token_type", NL_GGUF_INT32, (uint64_t)n, types), NL_OK);
    assert_int_equal(nl_gguf_writer_arr_str(&w, "tokenizer.ggml.merges", 1, merges, NULL), NL_OK);
    assert_int_equal(nl_gguf_writer_u32(&w, "tokenizer.ggml.eos_token_id", (uint32_t)id_eot), NL_OK);
    assert_int_equal(nl_gguf_writer_bool(&w, "tokenizer.ggml.add_bos_token", 0), NL_OK);
    assert_int_equal(nl_gguf_writer_write(&w, path), NL_OK);
    nl_gguf_writer_free(&w);
    nl_tokenizer t;
    if (nl_gguf_load_tokenizer(path, 256, &t)) fail_msg("%s", nl_last_error());
    assert_int_equal(t.kind, NL_TOKENIZER_HF);
    assert_int_equal(t.eos_id, id_eot);
    assert_int_equal(t.bos_id, -1);
    int *ids;
    int64_t k;
    assert_int_equal(nl_tokenizer_encode_special(&t, "hehe hi<|eot|>", 14, 1, 0, 1, &ids, &k), NL_OK);
    /* GPT-2's regex: "hehe", " hi", then the special token */
    int want[] = {id_he, id_he, id_space, 'h' - '!', 'i' - '!', id_eot};
    assert_int_equal(k, 6);
    assert_memory_equal(ids, want, sizeof want);
    nl_free(ids);
    nl_tokenizer_free(&t);
    nl_model_free(&m);
    tu_rmdir(dir);
    free(dir);
}

/* Q4_0 blocks are the int4 kernels' groups: loaded as they are, the kernels see exactly the
 * file's weights; an engine opened on a Q4_0 file runs int4 on those blocks. */
static void test_q4_0_kernels(void **s) {
    (void)s;
    enum { N = 5, K = 96 };
    float w[N * K], back[N * K], want[N * K];
    for (int i = 0; i < N * K; i++) w[i] = sinf(0.37f * (float)i) * (1.0f + (float)(i % 7));
    uint8_t blocks[N * K / 32 * 18];
    assert_int_equal(nl_ggml_from_f32(NL_GGML_Q4_0, w, N * K, blocks), NL_OK);
    assert_int_equal(nl_ggml_to_f32(NL_GGML_Q4_0, blocks, N * K, want), NL_OK);
    nl_mv_weight wt;
    assert_int_equal(nl_mv_weight_init_q4_0(&wt, blocks, N, K), NL_OK);
    assert_int_equal(nl_mv_int4_dequantize(&wt, back), NL_OK);
    assert_memory_equal(back, want, sizeof want);
    /* and the product against the scalar reference over those weights */
    float x[K], y[N], ref[N];
    for (int i = 0; i < K; i++) x[i] = cosf(0.11f * (float)i);
    assert_int_equal(nl_mv_forward(&wt, x, 1, y, 1), NL_OK);
    nl_mv_reference(ref, x, want, 1, N, K, 0);
    for (int n = 0; n < N; n++) assert_true(fabsf(y[n] - ref[n]) <= 0.05f * (1.0f + fabsf(ref[n])));
    nl_mv_weight_free(&wt);
    assert_int_equal(nl_mv_weight_init_q4_0(&wt, blocks, N, 80), NL_ERR_INVALID);

    char *dir = tu_tmpdir(), path[600];
    snprintf(path, sizeof path, "%s/q4.gguf", dir);
    nl_model m;
    small_model(&m);
    nl_tokenizer tok;
    assert_int_equal(nl_tokenizer_init_byte(&tok), NL_OK);
    assert_int_equal(nl_gguf_save(path, &m, &tok, NL_GGML_Q4_0), NL_OK);
    nl_engine *e;
    assert_int_equal(nl_engine_open(&e, path, NULL, NULL), NL_OK);
    assert_int_equal(nl_engine_weights(e), NL_WFMT_INT4); /* auto: the file's type */
    int32_t prompt[3] = {65, 66, 67};
    nl_sampling sp;
    nl_sampling_default(&sp);
    sp.temperature = 0;
    sp.max_tokens = 4;
    sp.ignore_eos = 1;
    uint64_t id;
    assert_int_equal(nl_engine_submit(e, prompt, 3, &sp, &id), NL_OK);
    while (nl_engine_busy(e)) assert_int_equal(nl_engine_step(e, NULL), NL_OK);
    nl_engine_output out;
    assert_int_equal(nl_engine_read(e, id, 1, &out), NL_OK);
    assert_int_equal(out.n_tokens, 4);
    nl_engine_output_free(&out);
    nl_engine_release(e, id);
    nl_engine_close(e);
    nl_tokenizer_free(&tok);
    nl_model_free(&m);
    tu_rmdir(dir);
    free(dir);
}

/* The commands with --ckpt model.gguf: export writes it, generate gives the text of the original
 * checkpoint, eval its loss, budget reads its shape. */
static void test_cli(void **s) {
    (void)s;
    TU_REQUIRE_DATA(bin, "stories260K/stories260K.bin");
    TU_REQUIRE_DATA(tokp, "stories260K/tok512.bin");
    TU_REQUIRE_DATA(text, "tinystories/tinystories_sample.txt");
    char *dir = tu_tmpdir(), args[3000], *out = NULL, *ref = NULL;
    snprintf(args, sizeof args, "export --ckpt %s --tokenizer %s --to gguf --dtype f32 %s/s.gguf", bin, tokp, dir);
    assert_int_equal(tu_run_cli(args, &out), 0);
    free(out);
    snprintf(args, sizeof args,
             "generate --ckpt %s/s.gguf --prompt 'Once upon a time' --steps 40 --temperature 0 --json", dir);
    assert_int_equal(tu_run_cli(args, &out), 0);
    snprintf(args, sizeof args,
             "generate --ckpt %s --tokenizer %s --prompt 'Once upon a time' --steps 40 --temperature 0 --json", bin,
             tokp);
    assert_int_equal(tu_run_cli(args, &ref), 0);
    const char *a = strstr(out, "\"text\""), *b = strstr(ref, "\"text\"");
    assert_non_null(a);
    assert_non_null(b);
    assert_memory_equal(a, b, strcspn(b, "\n,}"));
    free(out);
    free(ref);
    snprintf(args, sizeof args, "eval --ckpt %s/s.gguf --data %s --seq 64 --max-windows 8 --json", dir, text);
    assert_int_equal(tu_run_cli(args, &out), 0);
    snprintf(args, sizeof args, "eval --ckpt %s --tokenizer %s --data %s --seq 64 --max-windows 8 --json", bin, tokp,
             text);
    assert_int_equal(tu_run_cli(args, &ref), 0);
    a = strstr(out, "\"mean_loss\"");
    b = strstr(ref, "\"mean_loss\"");
    assert_non_null(a);
    assert_non_null(b);
    assert_memory_equal(a, b, strcspn(b, ",}"));
    free(out);
    free(ref);
    snprintf(args, sizeof args, "budget --model %s/s.gguf --json", dir);
    assert_int_equal(tu_run_cli(args, &out), 0);
    snprintf(args, sizeof args, "budget --model %s --json", bin);
    assert_int_equal(tu_run_cli(args, &ref), 0);
    assert_string_equal(out, ref); /* the shape from the metadata is the checkpoint's */
    free(out);
    free(ref);
    tu_rmdir(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hand_built),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_writer_round_trip),
        cmocka_unit_test(test_blocks),
        cmocka_unit_test(test_model_round_trip),
        cmocka_unit_test(test_model_refusals),
        cmocka_unit_test(test_stories_tokenizer),
        cmocka_unit_test(test_gpt2_tokenizer),
        cmocka_unit_test(test_cli),
        cmocka_unit_test(test_q4_0_kernels),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
