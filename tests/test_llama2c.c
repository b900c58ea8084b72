/* llama2.c legacy checkpoints: the real stories260K.bin, round trips (tied and untied),
 * truncated and inconsistent files, write errors. */
#include "testutil.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "nanolm/arch.h"
#include "nanolm/base.h"
#include "nanolm/llama2c.h"

static void test_stories260k(void **state) {
    (void)state;
    TU_REQUIRE_DATA(path, "stories260K/stories260K.bin");
    nl_llama2c m;
    assert_int_equal(nl_llama2c_read(&m, path), NL_OK);
    /* The header documented in data/README.md. */
    assert_int_equal(m.arch.dim, 64);
    assert_int_equal(m.arch.hidden_dim, 172);
    assert_int_equal(m.arch.n_layers, 5);
    assert_int_equal(m.arch.n_heads, 8);
    assert_int_equal(m.arch.n_kv_heads, 4);
    assert_int_equal(m.arch.vocab_size, 512);
    assert_int_equal(m.arch.seq_len, 512);
    assert_int_equal(m.arch.tied_embeddings, 1);
    assert_string_equal(m.arch.name, "stories260K");
    assert_int_equal(m.n_tensors, 11);
    /* The weights are exactly the parameters arch.c counts for this shape. */
    nl_arch_params p;
    nl_arch_count_params(&m.arch, &p);
    assert_int_equal(m.n_weights, p.total);
    print_message("stories260K: %lld parameters in %d arrays\n", (long long)m.n_weights, m.n_tensors);
    const nl_llama2c_tensor *wk = nl_llama2c_find(&m, "wk");
    assert_non_null(wk);
    assert_int_equal(wk->shape[0], 5);
    assert_int_equal(wk->shape[1], 32);
    assert_int_equal(wk->shape[2], 64);
    assert_null(nl_llama2c_find(&m, "wcls"));
    /* Arrays are back to back and match the file bytes after the header. */
    size_t n;
    char *raw = tu_read_file(path, &n);
    assert_memory_equal(raw + 28, m.weights, (size_t)m.n_weights * 4);
    assert_true(m.tensors[10].data == m.weights + m.n_weights - 64); /* rms_final last */
    for (int64_t i = 0; i < m.n_weights; i++) assert_true(isfinite(m.weights[i]));
    /* The skipped RoPE tables are what nl_llama2c_rope_tables computes (PyTorch made them in fp32). */
    int64_t half = 512 * 4;
    float *cs = malloc(2 * (size_t)half * sizeof(float));
    nl_llama2c_rope_tables(&m.arch, cs, cs + half);
    const float *file_rope = (const float *)(raw + 28 + 4 * m.n_weights);
    double maxerr = 0;
    for (int64_t i = 0; i < 2 * half; i++) maxerr = fmax(maxerr, fabs((double)cs[i] - file_rope[i]));
    print_message("RoPE tables: max |computed - file| = %.3g\n", maxerr);
    assert_true(maxerr < 1e-4);
    free(cs);

    /* Export of what was read gives the same file: identical header and weights. */
    char *dir = tu_tmpdir();
    char out[256];
    snprintf(out, sizeof out, "%s/copy.bin", dir);
    const float *arrays[NL_LLAMA2C_MAX_TENSORS];
    for (int i = 0; i < m.n_tensors; i++) arrays[i] = m.tensors[i].data;
    assert_int_equal(nl_llama2c_write(out, &m.arch, arrays), NL_OK);
    size_t n2;
    char *copy = tu_read_file(out, &n2);
    assert_int_equal(n2, n);
    assert_memory_equal(copy, raw, 28 + 4 * (size_t)m.n_weights);
    free(copy);
    free(raw);
    nl_llama2c_free(&m);
    nl_llama2c_free(&m);
    tu_rmdir(dir);
    free(dir);
}

/* An untied GQA model with random weights survives write + read exactly. */
static void test_untied_round_trip(void **state) {
    (void)state;
    nl_arch a = tu_arch("tiny", 37, 16, 2, 4, 2, 24, 8);
    nl_llama2c_tensor t[NL_LLAMA2C_MAX_TENSORS];
    int n = nl_llama2c_layout(&a, t);
    assert_int_equal(n, 12);
    assert_string_equal(t[11].name, "wcls");
    nl_arch_params p;
    nl_arch_count_params(&a, &p);
    int64_t total = 0;
    for (int i = 0; i < n; i++) total += t[i].numel;
    assert_int_equal(total, p.total);
    float *w = malloc((size_t)total * sizeof(float));
    nl_rng r;
    nl_rng_seed(&r, 1);
    for (int64_t i = 0; i < total; i++) w[i] = (float)nl_rng_normal(&r);
    const float *arrays[NL_LLAMA2C_MAX_TENSORS];
    int64_t off = 0;
    for (int i = 0; i < n; i++) {
        arrays[i] = w + off;
        off += t[i].numel;
    }
    char *dir = tu_tmpdir();
    char path[256];
    snprintf(path, sizeof path, "%s/tiny.bin", dir);
    assert_int_equal(nl_llama2c_write(path, &a, arrays), NL_OK);
    size_t bytes;
    char *raw = tu_read_file(path, &bytes);
    int32_t h[7];
    memcpy(h, raw, 28);
    assert_int_equal(h[5], -37); /* untied: negative vocab_size */
    assert_int_equal(bytes, 28 + 4 * (size_t)(total + 8 * 4));
    /* The classifier follows the RoPE tables. */
    assert_memory_equal(raw + bytes - 4 * 37 * 16, arrays[11], 4 * 37 * 16);
    free(raw);
    nl_llama2c m;
    assert_int_equal(nl_llama2c_read(&m, path), NL_OK);
    assert_int_equal(m.arch.tied_embeddings, 0);
    assert_int_equal(m.arch.vocab_size, 37);
    assert_int_equal(m.n_tensors, 12);
    assert_string_equal(m.arch.name, "tiny");
    assert_memory_equal(m.weights, w, (size_t)total * 4);
    assert_memory_equal(nl_llama2c_find(&m, "wcls")->data, arrays[11], 4 * 37 * 16);
    nl_llama2c_free(&m);

    /* Write errors name the problem and keep the previous file. */
    arrays[3] = NULL;
    assert_int_equal(nl_llama2c_write(path, &a, arrays), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "array wk is NULL"));
    arrays[3] = w;
    nl_arch moe = a;
    moe.n_experts = 4;
    moe.top_k = 2;
    moe.expert_hidden_dim = 8;
    assert_int_equal(nl_llama2c_write(path, &moe, arrays), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "mixture-of-experts"));
    nl_arch bad = a;
    bad.n_kv_heads = 3;
    assert_int_equal(nl_llama2c_write(path, &bad, arrays), NL_ERR_INVALID);
    /* A write that fails part-way (file size limit) leaves the old file. */
    struct rlimit saved, lim;
    getrlimit(RLIMIT_FSIZE, &saved);
    lim = saved;
    lim.rlim_cur = 1024;
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    setrlimit(RLIMIT_FSIZE, &lim);
    nl_arch other = a;
    other.tied_embeddings = 1;
    nl_status rc = nl_llama2c_write(path, &other, arrays);
    setrlimit(RLIMIT_FSIZE, &saved);
    signal(SIGXFSZ, prev);
    assert_int_equal(rc, NL_ERR_IO);
    assert_int_equal(nl_llama2c_read(&m, path), NL_OK);
    assert_int_equal(m.arch.tied_embeddings, 0);
    nl_llama2c_free(&m);
    free(w);
    tu_rmdir(dir);
    free(dir);
}

static void write_bytes(const char *path, const void *b, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    if (n) assert_int_equal(fwrite(b, 1, n, f), n);
    fclose(f);
}

static void expect_fail(const char *path, nl_status code, const char *want) {
    nl_llama2c m;
    nl_status rc = nl_llama2c_read(&m, path);
    if (rc != code || !strstr(nl_last_error(), want))
        fail_msg("expected rc %d with \"%s\", got rc %d: %s", code, want, rc, nl_last_error());
    assert_null(m.weights);
}

static void test_bad_files(void **state) {
    (void)state;
    char *dir = tu_tmpdir();
    char path[256];
    snprintf(path, sizeof path, "%s/bad.bin", dir);
    expect_fail("/nonexistent/model.bin", NL_ERR_IO, "/nonexistent/model.bin");
    /* A valid small file, then damaged copies of it. */
    nl_arch a;
    assert_int_equal(nl_arch_preset("stories260k", &a), NL_OK);
    a.vocab_size = 32;
    a.seq_len = 16;
    a.n_layers = 1;
    nl_llama2c_tensor t[NL_LLAMA2C_MAX_TENSORS];
    int n = nl_llama2c_layout(&a, t);
    int64_t total = 0;
    for (int i = 0; i < n; i++) total += t[i].numel;
    float *w = calloc((size_t)total, sizeof(float));
    const float *arrays[NL_LLAMA2C_MAX_TENSORS];
    int64_t off = 0;
    for (int i = 0; i < n; i++) {
        arrays[i] = w + off;
        off += t[i].numel;
    }
    char good[256];
    snprintf(good, sizeof good, "%s/good.bin", dir);
    assert_int_equal(nl_llama2c_write(good, &a, arrays), NL_OK);
    size_t full;
    char *raw = tu_read_file(good, &full);
    size_t cuts[] = {0, 10, 27, 28, 1000, full - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        write_bytes(path, raw, cuts[i]);
        char want[128];
        if (cuts[i] < 28)
            snprintf(want, sizeof want, "truncated at byte %zu: the llama2.c header needs 28 bytes", cuts[i]);
        else
            snprintf(want, sizeof want, "truncated at byte %zu: expected %zu bytes for dim=64", cuts[i], full);
        expect_fail(path, NL_ERR_FORMAT, want);
    }
    /* Too long: the header does not describe this file. */
    char *longer = calloc(full + 4, 1);
    memcpy(longer, raw, full);
    write_bytes(path, longer, full + 4);
    expect_fail(path, NL_ERR_FORMAT, "implies");
    free(longer);
    /* Header fields out of range or inconsistent. */
    int32_t h[7];
    memcpy(h, raw, 28);
    int32_t hb[7];
    memcpy(hb, h, 28);
    hb[3] = 0;
    memcpy(raw, hb, 28);
    write_bytes(path, raw, full);
    expect_fail(path, NL_ERR_FORMAT, "header field n_heads = 0 is out of range");
    memcpy(hb, h, 28);
    hb[4] = 3;
    memcpy(raw, hb, 28);
    write_bytes(path, raw, full);
    expect_fail(path, NL_ERR_FORMAT, "n_heads 8 is not a multiple of n_kv_heads 3");
    memcpy(hb, h, 28);
    hb[0] = 0x7fffffff;
    memcpy(raw, hb, 28);
    write_bytes(path, raw, full);
    expect_fail(path, NL_ERR_FORMAT, "header field dim = 2147483647 is out of range");
    memcpy(hb, h, 28);
    hb[5] = -hb[5]; /* claims an untied classifier that is not there */
    memcpy(raw, hb, 28);
    write_bytes(path, raw, full);
    expect_fail(path, NL_ERR_FORMAT, "vocab_size=-32");
    free(raw);
    free(w);
    tu_rmdir(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stories260k),
        cmocka_unit_test(test_untied_round_trip),
        cmocka_unit_test(test_bad_files),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
