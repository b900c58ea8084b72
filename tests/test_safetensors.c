/* safetensors: round trip, 16-bit decoders, every malformed case, atomic writes, and files
 * written by / for numpy through tests/ref/ scripts. */
#include "testutil.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include "nanolm/base.h"
#include "nanolm/safetensors.h"

/* ---- helpers ---- */

/* A file image: 8-byte length of `json` (padded with `pad` spaces), the JSON, then data. */
static uint8_t *image(const char *json, size_t pad, const void *data, size_t data_bytes, size_t *n) {
    size_t jl = strlen(json);
    uint64_t hn = jl + pad;
    *n = 8 + hn + data_bytes;
    uint8_t *b = malloc(*n + 1);
    memcpy(b, &hn, 8);
    memcpy(b + 8, json, jl);
    memset(b + 8 + jl, ' ', pad);
    if (data_bytes) memcpy(b + 8 + hn, data, data_bytes);
    return b;
}

/* Parses an image that must be rejected with NL_ERR_FORMAT and a message containing `want`. */
static void expect_bad(const uint8_t *b, size_t n, const char *want) {
    nl_st_file f;
    nl_status rc = nl_st_parse(&f, b, n, "bad.safetensors");
    if (rc != NL_ERR_FORMAT || !strstr(nl_last_error(), want) || !strstr(nl_last_error(), "bad.safetensors"))
        fail_msg("expected a format error containing \"%s\", got rc=%d \"%s\"", want, rc, nl_last_error());
    /* A failed parse leaves the struct zeroed and closing it is harmless. */
    assert_int_equal(f.n_tensors, 0);
    nl_st_close(&f);
}

static void expect_bad_json(const char *json, size_t data_bytes, const char *want) {
    uint8_t data[256] = {0};
    assert_true(data_bytes <= sizeof data);
    size_t n;
    uint8_t *b = image(json, 0, data, data_bytes, &n);
    expect_bad(b, n, want);
    free(b);
}

/* The tensors the C writer emits in round trip and in the committed nanolm-written fixture. */
typedef struct sample {
    float f32[24];
    uint16_t bf16[6], f16[6];
    int8_t i8[5];
    uint8_t u8[3];
    int32_t i32[2];
    int64_t i64[2];
    float scalar;
} sample;

static void sample_fill(sample *s) {
    for (int i = 0; i < 24; i++) s->f32[i] = (float)i * 0.5f - 3.0f;
    for (int i = 0; i < 6; i++) { /* (i-5)/4 is exact in bf16: keep the top 16 bits */
        float v = (float)(i - 5) * 0.25f;
        uint32_t u;
        memcpy(&u, &v, 4);
        s->bf16[i] = (uint16_t)(u >> 16);
    }
    /* IEEE binary16 encodings: 1, -2, 0.5, 65504 (max), 2^-24 (min subnormal), +inf. */
    const uint16_t h[6] = {0x3C00, 0xC000, 0x3800, 0x7BFF, 0x0001, 0x7C00};
    memcpy(s->f16, h, sizeof h);
    const int8_t q[5] = {-128, -1, 0, 1, 127};
    memcpy(s->i8, q, sizeof q);
    s->u8[0] = 0;
    s->u8[1] = 7;
    s->u8[2] = 255;
    s->i32[0] = -7;
    s->i32[1] = 2147483647;
    s->i64[0] = -((int64_t)1 << 40);
    s->i64[1] = 3;
    s->scalar = 42.5f;
}

static void sample_add(nl_st_writer *w, const sample *s) {
    int64_t s234[3] = {2, 3, 4}, s23[2] = {2, 3}, s6[1] = {6}, s5[1] = {5}, s3[1] = {3}, s2[1] = {2};
    assert_int_equal(nl_st_writer_meta(w, "arch", "test"), NL_OK);
    assert_int_equal(nl_st_writer_meta(w, "note", "replaced below"), NL_OK);
    assert_int_equal(nl_st_writer_meta(w, "note", "written by nanolm"), NL_OK);
    assert_int_equal(nl_st_writer_add(w, "w.f32", NL_ST_F32, 3, s234, s->f32), NL_OK);
    assert_int_equal(nl_st_writer_add(w, "w.bf16", NL_ST_BF16, 2, s23, s->bf16), NL_OK);
    assert_int_equal(nl_st_writer_add(w, "w.f16", NL_ST_F16, 1, s6, s->f16), NL_OK);
    assert_int_equal(nl_st_writer_add(w, "w.i8", NL_ST_I8, 1, s5, s->i8), NL_OK);
    assert_int_equal(nl_st_writer_add(w, "w.u8", NL_ST_U8, 1, s3, s->u8), NL_OK);
    assert_int_equal(nl_st_writer_add(w, "w.i32", NL_ST_I32, 1, s2, s->i32), NL_OK);
    assert_int_equal(nl_st_writer_add(w, "w.i64", NL_ST_I64, 1, s2, s->i64), NL_OK);
    assert_int_equal(nl_st_writer_add(w, "scalar", NL_ST_F32, 0, NULL, &s->scalar), NL_OK);
}

static int count_tmp_files(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) n += strstr(e->d_name, ".tmp.") != NULL;
    if (d) closedir(d);
    return n;
}

/* ---- tests ---- */

static void test_round_trip(void **state) {
    (void)state;
    char *dir = tu_tmpdir();
    char path[256];
    snprintf(path, sizeof path, "%s/rt.safetensors", dir);
    sample s;
    sample_fill(&s);
    nl_st_writer w;
    nl_st_writer_init(&w);
    sample_add(&w, &s);
    /* An owned buffer and an empty tensor. */
    float *own = nl_malloc(4 * sizeof(float), "owned");
    for (int i = 0; i < 4; i++) own[i] = (float)i + 0.125f;
    int64_t s4[1] = {4}, s0[2] = {0, 7};
    assert_int_equal(nl_st_writer_add_owned(&w, "owned", NL_ST_F32, 1, s4, own), NL_OK);
    assert_int_equal(nl_st_writer_add(&w, "empty", NL_ST_F32, 2, s0, NULL), NL_OK);
    assert_int_equal(nl_st_writer_write(&w, path), NL_OK);
    nl_st_writer_free(&w);

    nl_st_file f;
    assert_int_equal(nl_st_open(&f, path), NL_OK);
    assert_int_equal(f.n_tensors, 10);
    assert_int_equal((8 + f.header_bytes) % 8, 0); /* data area 8-aligned, padding is spaces */
    assert_int_equal(f.bytes[8 + f.header_bytes - 1] == ' ' || f.bytes[8 + f.header_bytes - 1] == '}', 1);
    assert_string_equal(nl_st_meta(&f, "arch"), "test");
    assert_string_equal(nl_st_meta(&f, "note"), "written by nanolm");
    assert_null(nl_st_meta(&f, "nope"));
    assert_null(nl_st_find(&f, "nope"));
    /* File order is the order of adding. */
    const char *order[] = {"w.f32", "w.bf16", "w.f16", "w.i8", "w.u8", "w.i32", "w.i64", "scalar", "owned", "empty"};
    for (int i = 0; i < 10; i++) assert_string_equal(f.tensors[i].name, order[i]);

    const nl_st_tensor *t = nl_st_find(&f, "w.f32");
    assert_non_null(t);
    assert_int_equal(t->dtype, NL_ST_F32);
    assert_int_equal(t->ndim, 3);
    assert_int_equal(t->shape[0], 2);
    assert_int_equal(t->shape[1], 3);
    assert_int_equal(t->shape[2], 4);
    assert_int_equal(t->numel, 24);
    assert_memory_equal(t->data, s.f32, sizeof s.f32);
    float buf[24];
    int64_t want[3] = {2, 3, 4};
    assert_int_equal(nl_st_read_f32(&f, "w.f32", 3, want, buf), NL_OK);
    for (int i = 0; i < 24; i++) assert_true(buf[i] == (float)i * 0.5f - 3.0f);

    int64_t s23[2] = {2, 3};
    assert_int_equal(nl_st_read_f32(&f, "w.bf16", 2, s23, buf), NL_OK);
    for (int i = 0; i < 6; i++) assert_true(buf[i] == (float)(i - 5) * 0.25f);
    t = nl_st_find(&f, "w.f16");
    nl_st_tensor_to_f32(t, buf);
    assert_true(buf[0] == 1.0f && buf[1] == -2.0f && buf[2] == 0.5f && buf[3] == 65504.0f);
    assert_true(buf[4] == ldexpf(1.0f, -24) && isinf(buf[5]) && buf[5] > 0);
    nl_st_tensor_to_f32(nl_st_find(&f, "w.i8"), buf);
    assert_true(buf[0] == -128 && buf[1] == -1 && buf[2] == 0 && buf[3] == 1 && buf[4] == 127);
    nl_st_tensor_to_f32(nl_st_find(&f, "w.u8"), buf);
    assert_true(buf[0] == 0 && buf[1] == 7 && buf[2] == 255);
    nl_st_tensor_to_f32(nl_st_find(&f, "w.i32"), buf);
    assert_true(buf[0] == -7 && buf[1] == 2147483648.0f);
    nl_st_tensor_to_f32(nl_st_find(&f, "w.i64"), buf);
    assert_true(buf[0] == -1099511627776.0f && buf[1] == 3);
    t = nl_st_find(&f, "scalar");
    assert_int_equal(t->ndim, 0);
    assert_int_equal(t->numel, 1);
    nl_st_tensor_to_f32(t, buf);
    assert_true(buf[0] == 42.5f);
    nl_st_tensor_to_f32(nl_st_find(&f, "owned"), buf);
    assert_true(buf[3] == 3.125f);
    t = nl_st_find(&f, "empty");
    assert_int_equal(t->numel, 0);
    assert_int_equal(t->begin, t->end);

    /* Shape check names the tensor and both shapes; missing tensors are named too. */
    int64_t wrong[2] = {3, 2};
    assert_int_equal(nl_st_read_f32(&f, "w.bf16", 2, wrong, buf), NL_ERR_FORMAT);
    assert_non_null(strstr(nl_last_error(), "tensor \"w.bf16\" has shape [2,3] but [3,2] is needed"));
    assert_int_equal(nl_st_read_f32(&f, "model.norm.weight", 2, wrong, buf), NL_ERR_FORMAT);
    assert_non_null(strstr(nl_last_error(), "no tensor \"model.norm.weight\""));
    nl_st_close(&f);
    nl_st_close(&f); /* idempotent */
    tu_rmdir(dir);
    free(dir);
}

static void test_writer_rejects(void **state) {
    (void)state;
    nl_st_writer w;
    nl_st_writer_init(&w);
    float x[4] = {0};
    int64_t s4[1] = {4}, neg[1] = {-1};
    assert_int_equal(nl_st_writer_add(&w, "a", NL_ST_F32, 1, s4, x), NL_OK);
    assert_int_equal(nl_st_writer_add(&w, "a", NL_ST_F32, 1, s4, x), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "duplicate tensor name \"a\""));
    assert_int_equal(nl_st_writer_add(&w, "__metadata__", NL_ST_F32, 1, s4, x), NL_ERR_INVALID);
    assert_int_equal(nl_st_writer_add(&w, "", NL_ST_F32, 1, s4, x), NL_ERR_INVALID);
    assert_int_equal(nl_st_writer_add(&w, "b", NL_ST_F32, 1, neg, x), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "\"b\": shape[0] = -1"));
    assert_int_equal(nl_st_writer_add(&w, "c", NL_ST_F32, 9, s4, x), NL_ERR_INVALID);
    assert_int_equal(nl_st_writer_add(&w, "d", NL_ST_NDTYPES, 1, s4, x), NL_ERR_INVALID);
    assert_int_equal(nl_st_writer_add(&w, "e", NL_ST_F32, 1, s4, NULL), NL_ERR_INVALID);
    assert_int_equal(w.n_tensors, 1);
    /* Writing into a directory that does not exist fails with the path in the message. */
    assert_int_equal(nl_st_writer_write(&w, "/nonexistent-dir/x.safetensors"), NL_ERR_IO);
    assert_non_null(strstr(nl_last_error(), "/nonexistent-dir/x.safetensors"));
    nl_st_writer_free(&w);
}

/* The 16-bit decoders against ldexp-based references, for all 65536 bit patterns. */
static void test_half_decoders(void **state) {
    (void)state;
    for (uint32_t b = 0; b < 65536; b++) {
        int sign = (b >> 15) & 1, e = (b >> 10) & 31, m = b & 1023;
        float got = nl_st_f16_to_f32((uint16_t)b);
        double ref;
        if (e == 31)
            ref = m ? NAN : INFINITY;
        else if (e == 0)
            ref = ldexp(m, -24);
        else
            ref = ldexp(1024 + m, e - 25);
        if (sign) ref = -ref;
        if (isnan(ref))
            assert_true(isnan(got));
        else if ((double)got != ref || !signbit(got) != !signbit(ref))
            fail_msg("f16 0x%04x: got %g want %g", b, got, ref);

        int be = (b >> 7) & 255, bm = b & 127;
        float bg = nl_st_bf16_to_f32((uint16_t)b);
        if (be == 255)
            ref = bm ? NAN : INFINITY;
        else if (be == 0)
            ref = ldexp(bm, -133);
        else
            ref = ldexp(128 + bm, be - 134);
        if (sign) ref = -ref;
        if (isnan(ref))
            assert_true(isnan(bg));
        else if ((double)bg != ref || !signbit(bg) != !signbit(ref))
            fail_msg("bf16 0x%04x: got %g want %g", b, bg, ref);
    }
    nl_st_dtype d;
    assert_int_equal(nl_st_dtype_parse("BF16", &d), NL_OK);
    assert_int_equal(d, NL_ST_BF16);
    assert_int_equal(nl_st_dtype_size(d), 2);
    assert_int_equal(nl_st_dtype_parse("F8_E4M3", &d), NL_ERR_FORMAT);
    assert_non_null(strstr(nl_last_error(), "F8_E4M3"));
}

static void test_malformed(void **state) {
    (void)state;
    /* numel * element size wraps around 2^64: [2^31, 2^31] F32 once "needed 0 bytes". */
    expect_bad_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[2147483648,2147483648],\"data_offsets\":[0,0]}}", 0,
                    "tensor \"a\": shape [2147483648,2147483648] of F32 needs more than 2^64 bytes");
    /* Shorter than the length field. */
    uint8_t five[5] = {1, 0, 0, 0, 0};
    expect_bad(five, 5, "truncated at byte 5");
    expect_bad(five, 0, "truncated at byte 0");
    /* Header length beyond the end of the file. */
    size_t n;
    uint8_t *b = image("{}", 0, NULL, 0, &n);
    uint64_t big = 100;
    memcpy(b, &big, 8);
    expect_bad(b, n, "truncated at byte 10: the header needs 100 bytes");
    /* Absurd header size. */
    big = 1ULL << 40;
    memcpy(b, &big, 8);
    expect_bad(b, n, "exceeds the 100000000-byte limit");
    free(b);

    expect_bad_json("[1,2]", 0, "does not start with '{'");
    expect_bad_json("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], ", 4, "malformed JSON in the header near byte");
    expect_bad_json("{} x", 0, "unexpected byte 0x78 after the header JSON at byte 11");
    expect_bad_json("{\"a\": 3}", 0, "tensor \"a\": header entry is not a JSON object");
    expect_bad_json("{\"a\": {\"dtype\": \"F8\", \"shape\": [1], \"data_offsets\": [0, 1]}}", 1,
                    "tensor \"a\": unknown dtype \"F8\"");
    expect_bad_json("{\"a\": {\"shape\": [1], \"data_offsets\": [0, 4]}}", 4, "missing or non-string \"dtype\"");
    expect_bad_json("{\"a\": {\"dtype\": \"F32\", \"data_offsets\": [0, 4]}}", 4, "non-array \"shape\"");
    expect_bad_json("{\"a\": {\"dtype\": \"F32\", \"shape\": [-1], \"data_offsets\": [0, 4]}}", 4,
                    "shape[0] is not a non-negative integer");
    expect_bad_json("{\"a\": {\"dtype\": \"F32\", \"shape\": [1.5], \"data_offsets\": [0, 4]}}", 4,
                    "shape[0] is not a non-negative integer");
    expect_bad_json("{\"a\": {\"dtype\": \"F32\", \"shape\": [1,1,1,1,1,1,1,1,1], \"data_offsets\": [0, 4]}}", 4,
                    "has 9 dimensions");
    expect_bad_json("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0]}}", 4,
                    "\"data_offsets\" must be [BEGIN, END]");
    expect_bad_json("{\"a\": {\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [4, 0]}}", 4,
                    "end before they begin");
    expect_bad_json("{\"a\": {\"dtype\": \"F32\", \"shape\": [4294967296, 4294967296], \"data_offsets\": [0, 4]}}", 4,
                    "absurdly large");
    /* Shape x dtype size vs offsets. */
    expect_bad_json("{\"w\": {\"dtype\": \"F32\", \"shape\": [2, 3], \"data_offsets\": [0, 20]}}", 20,
                    "tensor \"w\": shape [2,3] of F32 needs 24 bytes but offsets span 20");
    /* Overlap, hole, trailing bytes. */
    expect_bad_json("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
                    " \"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}",
                    12, "tensor \"b\" (data bytes [4, 12)) overlaps tensor \"a\" (which ends at 8)");
    expect_bad_json("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
                    " \"b\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 12]}}",
                    12, "hole in the data area: bytes [4, 8) before tensor \"b\"");
    expect_bad_json("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}", 10,
                    "6 bytes after the last tensor");
    /* Data truncated: the tensor runs past the end of the file. */
    expect_bad_json("{\"a\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]}}", 10,
                    "truncated at byte");
    /* Duplicates. */
    expect_bad_json("{\"a\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0, 1]},"
                    " \"a\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [1, 2]}}",
                    2, "duplicate tensor \"a\"");
    expect_bad_json("{\"__metadata__\": {\"k\": 1}}", 0, "__metadata__ value of \"k\" is not a string");
    expect_bad_json("{\"__metadata__\": {\"k\": \"1\", \"k\": \"2\"}}", 0, "duplicate metadata key \"k\"");
    expect_bad_json("{\"__metadata__\": [1]}", 0, "\"__metadata__\" is not a JSON object");
    /* A header with only metadata and no tensors is valid. */
    b = image("{\"__metadata__\": {\"k\": \"v\"}}", 3, NULL, 0, &n);
    nl_st_file f;
    assert_int_equal(nl_st_parse(&f, b, n, "meta-only"), NL_OK);
    assert_string_equal(nl_st_meta(&f, "k"), "v");
    nl_st_close(&f);
    free(b);
}

/* Every prefix of a valid file is rejected; random byte damage never crashes the reader. */
static void test_truncations_and_damage(void **state) {
    (void)state;
    char *dir = tu_tmpdir();
    char path[256];
    snprintf(path, sizeof path, "%s/t.safetensors", dir);
    sample s;
    sample_fill(&s);
    nl_st_writer w;
    nl_st_writer_init(&w);
    sample_add(&w, &s);
    assert_int_equal(nl_st_writer_write(&w, path), NL_OK);
    nl_st_writer_free(&w);
    size_t n;
    uint8_t *full = (uint8_t *)tu_read_file(path, &n);
    assert_non_null(full);
    nl_st_file f;
    for (size_t k = 0; k < n; k++) {
        nl_status rc = nl_st_parse(&f, full, k, "cut");
        if (rc != NL_ERR_FORMAT) fail_msg("prefix of %zu/%zu bytes accepted (rc=%d)", k, n, rc);
        char want[64];
        snprintf(want, sizeof want, "truncated at byte %zu", k);
        if (!strstr(nl_last_error(), want)) fail_msg("prefix %zu: message lacks \"%s\": %s", k, want, nl_last_error());
    }
    assert_int_equal(nl_st_parse(&f, full, n, "whole"), NL_OK);
    nl_st_close(&f);
    nl_rng r;
    nl_rng_seed(&r, 7);
    uint8_t *dam = malloc(n);
    int accepted = 0;
    for (int trial = 0; trial < 3000; trial++) {
        memcpy(dam, full, n);
        int flips = 1 + (int)nl_rng_below(&r, 3);
        for (int j = 0; j < flips; j++) dam[nl_rng_below(&r, n)] ^= (uint8_t)(1 + nl_rng_below(&r, 255));
        if (nl_st_parse(&f, dam, n, "damaged") == NL_OK) {
            accepted++; /* damage in tensor data or a still-valid header: must stay consistent */
            for (int i = 0; i < f.n_tensors; i++) assert_true(f.tensors[i].end <= f.data_bytes);
            nl_st_close(&f);
        }
    }
    print_message("damaged files accepted as valid: %d / 3000 (flips inside tensor data)\n", accepted);
    free(dam);
    free(full);
    tu_rmdir(dir);
    free(dir);
}

/* A write that fails part-way (file size limit) or cannot start leaves the old file intact. */
static void test_atomic_write(void **state) {
    (void)state;
    char *dir = tu_tmpdir();
    char path[256];
    snprintf(path, sizeof path, "%s/ckpt.safetensors", dir);
    sample s;
    sample_fill(&s);
    nl_st_writer w;
    nl_st_writer_init(&w);
    sample_add(&w, &s);
    assert_int_equal(nl_st_writer_write(&w, path), NL_OK);
    nl_st_writer_free(&w);
    size_t old_n;
    char *old = tu_read_file(path, &old_n);

    /* A bigger file, written under a 64 KiB file-size limit: the write fails mid-way. */
    size_t big_n = 1 << 16;
    float *big = nl_calloc(big_n, sizeof(float), "big");
    int64_t shape[1] = {(int64_t)big_n};
    nl_st_writer_init(&w);
    assert_int_equal(nl_st_writer_add(&w, "big", NL_ST_F32, 1, shape, big), NL_OK);
    struct rlimit saved, lim;
    getrlimit(RLIMIT_FSIZE, &saved);
    lim = saved;
    lim.rlim_cur = 65536;
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    nl_status rc = nl_st_writer_write(&w, path);
    setrlimit(RLIMIT_FSIZE, &saved);
    signal(SIGXFSZ, prev);
    assert_int_equal(rc, NL_ERR_IO);
    assert_non_null(strstr(nl_last_error(), "ckpt.safetensors"));
    print_message("failed write reported: %s\n", nl_last_error());
    size_t now_n;
    char *now = tu_read_file(path, &now_n);
    assert_int_equal(now_n, old_n);
    assert_memory_equal(now, old, old_n);
    free(now);
    assert_int_equal(count_tmp_files(dir), 0);
    nl_st_file f;
    assert_int_equal(nl_st_open(&f, path), NL_OK); /* the old checkpoint still loads */
    assert_int_equal(f.n_tensors, 8);
    nl_st_close(&f);

    /* Without the limit the same write succeeds and replaces the file. */
    assert_int_equal(nl_st_writer_write(&w, path), NL_OK);
    nl_st_writer_free(&w);
    nl_free(big);
    assert_int_equal(nl_st_open(&f, path), NL_OK);
    assert_int_equal(f.n_tensors, 1);
    assert_int_equal(f.tensors[0].numel, (int64_t)big_n);
    nl_st_close(&f);
    free(old);
    tu_rmdir(dir);
    free(dir);
}

static void test_open_errors(void **state) {
    (void)state;
    nl_st_file f;
    assert_int_equal(nl_st_open(&f, "/nonexistent/model.safetensors"), NL_ERR_IO);
    assert_non_null(strstr(nl_last_error(), "/nonexistent/model.safetensors"));
    char *dir = tu_tmpdir();
    char path[256];
    snprintf(path, sizeof path, "%s/empty.safetensors", dir);
    assert_int_equal(nl_write_file_atomic(path, "", 0), NL_OK);
    assert_int_equal(nl_st_open(&f, path), NL_ERR_FORMAT);
    assert_non_null(strstr(nl_last_error(), "truncated at byte 0"));
    assert_int_equal(nl_st_open(&f, dir), NL_ERR_IO);
    tu_rmdir(dir);
    free(dir);
}

/* A file written by tests/ref/st_write_fixture.py (numpy, hand-made header). */
static void test_numpy_fixture(void **state) {
    (void)state;
    nl_st_file f;
    assert_int_equal(nl_st_open(&f, tu_src_path("tests/ref/st_from_numpy.safetensors")), NL_OK);
    assert_int_equal(f.n_tensors, 11);
    assert_string_equal(nl_st_meta(&f, "source"), "numpy");
    assert_string_equal(f.tensors[0].name, "s.scalar"); /* file order, not header order */
    float v[12];
    int64_t s34[2] = {3, 4};
    assert_int_equal(nl_st_read_f32(&f, "a.f32", 2, s34, v), NL_OK);
    for (int i = 0; i < 12; i++) assert_true(v[i] == (float)i * 0.25f - 1.5f);
    float h[8], h32[8];
    nl_st_tensor_to_f32(nl_st_find(&f, "h.f16"), h);
    nl_st_tensor_to_f32(nl_st_find(&f, "h.as_f32"), h32);
    for (int i = 0; i < 8; i++) assert_memory_equal(&h[i], &h32[i], 4); /* bitwise, -0 included */
    assert_true(signbit(h[1]) && h[1] == 0 && h[5] == ldexpf(1, -24) && isinf(h[6]));
    assert_true(fabsf(h[7] - 1.0f / 3.0f) < 1e-3f && h[7] != 1.0f / 3.0f);
    float b[6], b32[6];
    nl_st_tensor_to_f32(nl_st_find(&f, "b.bf16"), b);
    nl_st_tensor_to_f32(nl_st_find(&f, "b.as_f32"), b32);
    for (int i = 0; i < 6; i++) assert_memory_equal(&b[i], &b32[i], 4);
    assert_true(b[4] == ldexpf(1, -130) && isinf(b[5]) && b[5] < 0);
    nl_st_tensor_to_f32(nl_st_find(&f, "q.i8"), v);
    assert_true(v[0] == -128 && v[4] == 127);
    nl_st_tensor_to_f32(nl_st_find(&f, "u.u8"), v);
    assert_true(v[2] == 128 && v[3] == 255);
    nl_st_tensor_to_f32(nl_st_find(&f, "i.i32"), v);
    assert_true(v[0] == -2147483648.0f && v[2] == 2147483648.0f);
    nl_st_tensor_to_f32(nl_st_find(&f, "l.i64"), v);
    assert_true(v[0] == -1099511627776.0f && v[1] == 1099511627776.0f);
    nl_st_tensor_to_f32(nl_st_find(&f, "s.scalar"), v);
    assert_true(v[0] == 42.5f);
    assert_int_equal(nl_st_find(&f, "empty")->numel, 0);
    nl_st_close(&f);
}

/* The writer's bytes equal the committed tests/ref/st_from_nanolm.safetensors, which
 * tests/ref/st_check_nanolm.py parses by hand. NANOLM_REGEN_FIXTURES=1 rewrites it. */
static void test_nanolm_fixture(void **state) {
    (void)state;
    const char *fixture = tu_src_path("tests/ref/st_from_nanolm.safetensors");
    char *dir = tu_tmpdir();
    char path[256];
    snprintf(path, sizeof path, "%s/w.safetensors", dir);
    const char *regen = getenv("NANOLM_REGEN_FIXTURES");
    sample s;
    sample_fill(&s);
    nl_st_writer w;
    nl_st_writer_init(&w);
    sample_add(&w, &s);
    assert_int_equal(nl_st_writer_write(&w, regen && *regen == '1' ? fixture : path), NL_OK);
    nl_st_writer_free(&w);
    if (regen && *regen == '1')
        print_message("rewrote %s\n", fixture);
    else {
        size_t a, b;
        char *mine = tu_read_file(path, &a), *committed = tu_read_file(fixture, &b);
        assert_non_null(committed);
        assert_int_equal(a, b);
        assert_memory_equal(mine, committed, a);
        free(mine);
        free(committed);
    }
    tu_rmdir(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_writer_rejects),
        cmocka_unit_test(test_half_decoders),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_truncations_and_damage),
        cmocka_unit_test(test_atomic_write),
        cmocka_unit_test(test_open_errors),
        cmocka_unit_test(test_numpy_fixture),
        cmocka_unit_test(test_nanolm_fixture),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
