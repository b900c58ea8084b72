/* base/: errors, allocation, RNG determinism, atomic files, SVG, arch counts, CLI errors. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "nanolm/arch.h"
#include "nanolm/base.h"
#include "nanolm/capture.h"
#include "nanolm/svg.h"

static void test_error_message(void **state) {
    (void)state;
    nl_status rc = nl_fail(NL_ERR_INVALID, "bits must be 2..8, got %d", 9);
    assert_int_equal(rc, NL_ERR_INVALID);
    assert_string_equal(nl_last_error(), "bits must be 2..8, got 9");
    /* Wrapping the last error with context must not corrupt it. */
    nl_fail(NL_ERR_IO, "reading %s: %s", "x.bin", nl_last_error());
    assert_string_equal(nl_last_error(), "reading x.bin: bits must be 2..8, got 9");
    nl_clear_error();
    assert_string_equal(nl_last_error(), "");
}

static void test_alloc_overflow(void **state) {
    (void)state;
    void *p = nl_calloc(SIZE_MAX / 2, 4, "huge buffer");
    assert_null(p);
    assert_non_null(strstr(nl_last_error(), "huge buffer"));
    p = nl_malloc(100, "small");
    assert_non_null(p);
    assert_int_equal((uintptr_t)p % 64, 0);
    nl_free(p);
}

static void test_rng_deterministic(void **state) {
    (void)state;
    nl_rng a, b;
    nl_rng_seed(&a, 42);
    nl_rng_seed(&b, 42);
    for (int i = 0; i < 1000; i++) assert_true(nl_rng_u64(&a) == nl_rng_u64(&b));
    nl_rng_seed(&b, 43);
    assert_true(nl_rng_u64(&a) != nl_rng_u64(&b));
    /* Moments of the normal generator. */
    double s = 0, s2 = 0;
    int n = 200000;
    for (int i = 0; i < n; i++) {
        double x = nl_rng_normal(&a);
        s += x;
        s2 += x * x;
    }
    assert_true(fabs(s / n) < 0.01);
    assert_true(fabs(s2 / n - 1) < 0.02);
    for (int i = 0; i < 1000; i++) {
        float f = nl_rng_float(&a);
        assert_true(f >= 0 && f < 1);
        assert_true(nl_rng_below(&a, 7) < 7);
    }
}

static void test_atomic_file(void **state) {
    (void)state;
    char *dir = tu_tmpdir();
    assert_non_null(dir);
    char path[256];
    snprintf(path, sizeof path, "%s/x.bin", dir);
    assert_int_equal(nl_write_file_atomic(path, "old", 3), NL_OK);
    nl_atomic_file af;
    assert_int_equal(nl_atomic_open(&af, path), NL_OK);
    assert_int_equal(nl_atomic_write(&af, "new-but-aborted", 15), NL_OK);
    nl_atomic_abort(&af); /* a failed write must leave the old file intact */
    char *d;
    size_t n;
    assert_int_equal(nl_read_file(path, &d, &n), NL_OK);
    assert_int_equal(n, 3);
    assert_memory_equal(d, "old", 3);
    nl_free(d);
    assert_int_equal(nl_write_file_atomic(path, "newer", 5), NL_OK);
    assert_int_equal(nl_read_file(path, &d, &n), NL_OK);
    assert_int_equal(n, 5);
    nl_free(d);
    /* Reading a missing file names it. */
    char missing[300];
    snprintf(missing, sizeof missing, "%s/nope", dir);
    assert_int_equal(nl_read_file(missing, &d, &n), NL_ERR_IO);
    assert_non_null(strstr(nl_last_error(), "nope"));
    tu_rmdir(dir);
    free(dir);
}

static void test_svg_plot(void **state) {
    (void)state;
    char *dir = tu_tmpdir();
    char path[256];
    snprintf(path, sizeof path, "%s/p.svg", dir);
    double x[] = {1, 2, 3, 4}, y[] = {4, 3, 2.5, 2.2};
    nl_svg_series s = {.name = "loss <train>", .x = x, .y = y, .n = 4};
    nl_svg_plot_opts o = {.title = "t", .xlabel = "step", .ylabel = "loss"};
    assert_int_equal(nl_svg_plot(path, &o, &s, 1), NL_OK);
    char *svg = tu_read_file(path, NULL);
    assert_non_null(svg);
    assert_non_null(strstr(svg, "<svg"));
    assert_non_null(strstr(svg, "</svg>"));
    assert_non_null(strstr(svg, "loss &lt;train&gt;"));
    assert_non_null(strstr(svg, "<polyline"));
    free(svg);
    tu_rmdir(dir);
    free(dir);
}

static void test_arch_stories260k_params(void **state) {
    (void)state;
    nl_arch a;
    assert_int_equal(nl_arch_preset("stories260k", &a), NL_OK);
    assert_int_equal(nl_arch_validate(&a), NL_OK);
    nl_arch_params p;
    nl_arch_count_params(&a, &p);
    /* From the llama2.c file layout in data/README.md: 260,032 floats of weights. */
    assert_int_equal(p.total, 260032);
    assert_int_equal(p.embedding, 512 * 64);
    assert_int_equal(p.classifier, 0);
    assert_int_not_equal(nl_arch_preset("nope", &a), NL_OK);
    assert_non_null(strstr(nl_last_error(), "nope"));
}

static void test_arch_validate_names_field(void **state) {
    (void)state;
    nl_arch a;
    assert_int_equal(nl_arch_preset("small", &a), NL_OK);
    a.n_kv_heads = 4; /* 6 heads not a multiple of 4 */
    assert_int_equal(nl_arch_validate(&a), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "n_kv_heads"));
}

/* Overrides of a shape: a field left at 0 (shared experts: below 0) keeps the shape's; heads sets
 * the KV heads too unless they are given. */
static void test_arch_override(void **state) {
    (void)state;
    nl_arch a, b;
    assert_int_equal(nl_arch_preset("small", &a), NL_OK);
    b = a;
    nl_arch_override o = {.shared_experts = -1};
    nl_arch_override_apply(&o, &b);
    assert_memory_equal(&a, &b, sizeof a);
    o = (nl_arch_override){.dim = 96, .heads = 6, .hidden = 256, .shared_experts = -1};
    nl_arch_override_apply(&o, &b);
    assert_true(b.dim == 96 && b.n_heads == 6 && b.n_kv_heads == 6 && b.hidden_dim == 256);
    assert_true(b.n_layers == a.n_layers && b.n_shared_experts == a.n_shared_experts);
    o.kv_heads = 2, o.layers = 3, o.experts = 8, o.top_k = 2, o.shared_experts = 0, o.expert_hidden = 32;
    b.n_shared_experts = 1;
    nl_arch_override_apply(&o, &b);
    assert_true(b.n_kv_heads == 2 && b.n_heads == 6 && b.n_layers == 3);
    assert_true(b.n_experts == 8 && b.top_k == 2 && b.n_shared_experts == 0 && b.expert_hidden_dim == 32);
}

static void test_arch_json(void **state) {
    (void)state;
    nl_arch a, b;
    assert_int_equal(nl_arch_preset("shakespeare-char", &a), NL_OK);
    a.n_experts = 8;
    a.top_k = 2;
    a.expert_hidden_dim = 64;
    a.n_shared_experts = 1;
    a.first_moe_layer = 1;
    char *js = nl_arch_to_json(&a);
    assert_non_null(js);
    assert_int_equal(nl_arch_from_json("x.safetensors", js, &b), NL_OK);
    assert_memory_equal(&a, &b, sizeof a);
    free(js);
    /* A size that is not an integer (or absurd) is refused with the file and the field named. */
    assert_int_equal(nl_arch_from_json("bad.safetensors",
                                       "{\"vocab_size\":256.5,\"dim\":8,\"n_layers\":1,"
                                       "\"n_heads\":1,\"n_kv_heads\":1,\"hidden_dim\":8,\"seq_len\":8}",
                                       &b),
                     NL_ERR_FORMAT);
    assert_non_null(strstr(nl_last_error(), "bad.safetensors"));
    assert_non_null(strstr(nl_last_error(), "vocab_size"));
    assert_int_equal(nl_arch_from_json("big.safetensors",
                                       "{\"vocab_size\":1e300,\"dim\":8,\"n_layers\":1,"
                                       "\"n_heads\":1,\"n_kv_heads\":1,\"hidden_dim\":8,\"seq_len\":8}",
                                       &b),
                     NL_ERR_FORMAT);
    assert_int_equal(nl_arch_from_json("nodim.safetensors", "{\"vocab_size\":8}", &b), NL_ERR_FORMAT);
    assert_non_null(strstr(nl_last_error(), "dim"));
}

static void test_cli_errors(void **state) {
    (void)state;
    char *out = NULL;
    assert_int_equal(tu_run_cli("no-such-command", &out), 2);
    assert_non_null(strstr(out, "no-such-command"));
    free(out);
    assert_int_equal(tu_run_cli("version --bogus", &out), 2);
    assert_non_null(strstr(out, "--bogus"));
    free(out);
    assert_int_equal(tu_run_cli("--help", &out), 0);
    assert_non_null(strstr(out, "usage"));
    free(out);
    assert_int_equal(tu_run_cli("version --json", &out), 0);
    assert_non_null(strstr(out, "\"version\""));
    free(out);
}

/* A command that writes to both streams and exits with its argument. */
static int two_streams(int argc, char **argv) {
    printf("out of %s\n", argv[0]);
    fprintf(stderr, "err of %s\n", argv[0]);
    return argc > 1 ? atoi(argv[1]) : 0;
}

/* nl_capture_run: stdout when the command succeeds, stderr when it fails, the streams put back. */
static void test_capture_run(void **state) {
    (void)state;
    char *ok_args[] = {"cmd", NULL}, *fail_args[] = {"cmd", "3", NULL};
    int status = -1;
    char *text = nl_capture_run(two_streams, 1, ok_args, &status);
    assert_non_null(text);
    assert_int_equal(status, 0);
    assert_string_equal(text, "out of cmd\n");
    free(text);
    text = nl_capture_run(two_streams, 2, fail_args, &status);
    assert_non_null(text);
    assert_int_equal(status, 3);
    assert_string_equal(text, "err of cmd\n");
    free(text);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_capture_run),
        cmocka_unit_test(test_error_message),
        cmocka_unit_test(test_alloc_overflow),
        cmocka_unit_test(test_rng_deterministic),
        cmocka_unit_test(test_atomic_file),
        cmocka_unit_test(test_svg_plot),
        cmocka_unit_test(test_arch_stories260k_params),
        cmocka_unit_test(test_arch_validate_names_field),
        cmocka_unit_test(test_arch_json),
        cmocka_unit_test(test_arch_override),
        cmocka_unit_test(test_cli_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
