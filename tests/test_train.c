/* nanolm train / eval / generate end to end: determinism, bit-exact resume, checkpoints, peak
 * memory against --report-memory, a non-finite loss, and bad input. Runs the CLI on tiny
 * shakespeare-char runs (tinyshakespeare from data/). */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#define SHAKES "tinyshakespeare/input.txt"
/* a few quick steps of the shakespeare-char preset */
#define QUICK "--batch 4 --seq 32 --eval-windows 4 --warmup 2"

static int run(const char *args, char **out) {
    int rc = tu_run_cli(args, out);
    if (rc != 0 && out && *out) print_message("nanolm %s\n-> %d: %s\n", args, rc, *out);
    return rc;
}

/* Column `col` (0-based) of CSV rows whose step is in [from, to], joined with ';'. */
static char *csv_column(const char *path, int col, int from, int to) {
    char *text = tu_read_file(path, NULL);
    assert_non_null(text);
    char *res = calloc(1, strlen(text) + 1);
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        int step = atoi(line);
        if (step < from || step > to) continue;
        const char *p = line;
        for (int c = 0; c < col && p; c++) {
            p = strchr(p, ',');
            if (p) p++;
        }
        assert_non_null(p);
        size_t n = strcspn(p, ",");
        strncat(res, p, n);
        strcat(res, ";");
    }
    free(text);
    return res;
}

static void test_same_seed_same_losses(void **state) {
    (void)state;
    TU_REQUIRE_DATA(data, SHAKES);
    char *dir = tu_tmpdir(), args[2048];
    for (int r = 0; r < 2; r++) {
        snprintf(args, sizeof args, "train --data %s --steps 6 %s --seed 7 --log %s/run%d.csv", data, QUICK, dir, r);
        assert_int_equal(run(args, NULL), 0);
    }
    char p0[512], p1[512];
    snprintf(p0, sizeof p0, "%s/run0.csv", dir);
    snprintf(p1, sizeof p1, "%s/run1.csv", dir);
    char *a = csv_column(p0, 2, 1, 6), *b = csv_column(p1, 2, 1, 6);
    print_message("losses %s\n", a);
    assert_true(strlen(a) > 12);
    assert_string_equal(a, b);
    /* another seed gives another trajectory */
    snprintf(args, sizeof args, "train --data %s --steps 6 %s --seed 8 --log %s/run2.csv", data, QUICK, dir);
    assert_int_equal(run(args, NULL), 0);
    snprintf(p1, sizeof p1, "%s/run2.csv", dir);
    char *c = csv_column(p1, 2, 1, 6);
    assert_string_not_equal(a, c);
    free(a);
    free(b);
    free(c);
    tu_rmdir(dir);
    free(dir);
}

static void test_resume_bit_identical(void **state) {
    (void)state;
    TU_REQUIRE_DATA(data, SHAKES);
    char *dir = tu_tmpdir(), args[2048], *out = NULL;
    /* uninterrupted: 8 steps */
    snprintf(args, sizeof args, "train --data %s --steps 8 %s --log %s/full.csv --out %s/full.st", data, QUICK, dir,
             dir);
    assert_int_equal(run(args, NULL), 0);
    /* interrupted after step 4 of the same 8-step schedule, then resumed */
    snprintf(args, sizeof args, "train --data %s --steps 8 --stop-after 4 %s --out %s/part.st", data, QUICK, dir);
    assert_int_equal(run(args, NULL), 0);
    snprintf(args, sizeof args,
             "train --data %s --steps 8 %s --resume %s/part.st --out %s/part.st --log %s/resumed.csv", data, QUICK, dir,
             dir, dir);
    assert_int_equal(run(args, &out), 0);
    assert_non_null(strstr(out, "resumed"));
    free(out);
    char p0[512], p1[512];
    snprintf(p0, sizeof p0, "%s/full.csv", dir);
    snprintf(p1, sizeof p1, "%s/resumed.csv", dir);
    for (int col = 1; col <= 4; col++) { /* lr, train loss, val loss, grad norm */
        char *a = csv_column(p0, col, 5, 8), *b = csv_column(p1, col, 5, 8);
        if (col == 2) print_message("steps 5..8: %s\n", a);
        assert_true(strlen(a) > 8);
        assert_string_equal(a, b);
        free(a);
        free(b);
    }
    /* the final checkpoints (weights, Adam moments, step) are byte-identical */
    size_t na, nb;
    snprintf(p0, sizeof p0, "%s/full.st", dir);
    snprintf(p1, sizeof p1, "%s/part.st", dir);
    char *fa = tu_read_file(p0, &na), *fb = tu_read_file(p1, &nb);
    assert_non_null(fa);
    assert_non_null(fb);
    assert_int_equal(na, nb);
    assert_memory_equal(fa, fb, na);
    free(fa);
    free(fb);
    tu_rmdir(dir);
    free(dir);
}

/* eval and generate on a checkpoint written by train; greedy is deterministic, sampling is
 * seeded. */
static void test_eval_generate_checkpoint(void **state) {
    (void)state;
    TU_REQUIRE_DATA(data, SHAKES);
    char *dir = tu_tmpdir(), args[2048], *out = NULL, *out2 = NULL;
    snprintf(args, sizeof args, "train --data %s --steps 4 %s --out %s/m.st", data, QUICK, dir);
    assert_int_equal(run(args, NULL), 0);
    /* evaluate on the first 16384 bytes: (16384 - 1) / 64 = 255 windows of 64 tokens */
    char head[512];
    snprintf(head, sizeof head, "%s/head.txt", dir);
    char *text = tu_read_file(data, NULL);
    assert_non_null(text);
    FILE *f = fopen(head, "wb");
    fwrite(text, 1, 16384, f);
    fclose(f);
    free(text);
    snprintf(args, sizeof args, "eval --ckpt %s/m.st --data %s --seq 64 --batch 8 --json", dir, head);
    assert_int_equal(run(args, &out), 0);
    char *p = strstr(out, "\"mean_loss\":");
    assert_non_null(p);
    double loss = atof(p + 12);
    print_message("eval loss after 4 steps: %.4f\n", loss);
    assert_true(loss > 2.0 && loss < log(256.0) + 0.5);
    p = strstr(out, "\"tokens\":");
    assert_non_null(p);
    assert_int_equal(atol(p + 9), 255 * 64);
    free(out);
    snprintf(args, sizeof args, "generate --ckpt %s/m.st --prompt 'ROMEO:' --steps 30 --temperature 0.8 --seed 5", dir);
    assert_int_equal(run(args, &out), 0);
    assert_int_equal(run(args, &out2), 0);
    assert_int_equal(strncmp(out, "ROMEO:", 6), 0);
    char *s1 = strstr(out, "\ngenerate: "), *s2 = strstr(out2, "\ngenerate: "); /* the speed line on stderr */
    assert_non_null(s1);
    assert_non_null(s2);
    *s1 = *s2 = 0;
    print_message("sampled: %s\n", out);
    assert_true(strlen(out) > 6);
    assert_string_equal(out, out2);
    free(out);
    free(out2);
    tu_rmdir(dir);
    free(dir);
}

/* Peak RSS of a training process <= 1.2 x the bytes --report-memory prints + 64 MiB. */
static void test_peak_rss_vs_report(void **state) {
    (void)state;
    TU_REQUIRE_DATA(data, SHAKES);
    char args[2048], *out = NULL;
    snprintf(args, sizeof args, "train --data %s --steps 2 --batch 12 --eval-windows 12 --report-memory --json", data);
    assert_int_equal(run(args, &out), 0);
    char *p = strstr(out, "\"total\":");
    assert_non_null(p);
    double total = atof(p + 8);
    struct rusage ru;
    assert_int_equal(getrusage(RUSAGE_CHILDREN, &ru), 0);
    double peak = (double)ru.ru_maxrss * 1024.0;
    print_message("reported %.1f MiB, peak RSS %.1f MiB, bound %.1f MiB\n", total / 1048576, peak / 1048576,
                  (1.2 * total + 64 * 1048576.0) / 1048576);
    assert_true(total > 30e6); /* activations of (12, 64) alone are ~34 MiB */
    assert_true(peak <= 1.2 * total + 64 * 1048576.0);
    free(out);
}

/* A diverging run stops with a clear message and keeps the last good checkpoint: the file on
 * disk is the one of the last step whose validation loss was finite, and it still evaluates. */
static void test_nonfinite_loss_keeps_checkpoint(void **state) {
    (void)state;
    TU_REQUIRE_DATA(data, SHAKES);
    char *dir = tu_tmpdir(), args[2048], *out = NULL;
    snprintf(args, sizeof args, "train --data %s --steps 6 --stop-after 2 %s --out %s/m.st", data, QUICK, dir);
    assert_int_equal(run(args, NULL), 0);
    char path[512];
    snprintf(path, sizeof path, "%s/m.st", dir);
    size_t n0, n1;
    char *before = tu_read_file(path, &n0);
    assert_non_null(before);
    snprintf(args, sizeof args,
             "train --data %s --steps 6 %s --eval-every 1 --lr 1e30 --clip 0 --resume %s/m.st --out %s/m.st", data,
             QUICK, dir, dir);
    int rc = tu_run_cli(args, &out);
    print_message("%s", out);
    assert_int_equal(rc, 1);
    assert_true(strstr(out, "loss is nan") || strstr(out, "loss is inf"));
    assert_non_null(strstr(out, "training stopped"));
    assert_non_null(strstr(out, "last good checkpoint is"));
    free(out);
    char *after = tu_read_file(path, &n1);
    assert_non_null(after);
    assert_int_equal(n0, n1); /* same tensors, rewritten only at good steps */
    free(before);
    free(after);
    snprintf(args, sizeof args, "generate --ckpt %s --prompt 'To' --steps 8 --temperature 0", path);
    assert_int_equal(run(args, NULL), 0);
    tu_rmdir(dir);
    free(dir);
}

static void expect_error(const char *args, int code, const char *needle) {
    char *out = NULL;
    int rc = tu_run_cli(args, &out);
    print_message("nanolm %s\n  -> %d %s", args, rc, out ? out : "");
    assert_int_equal(rc, code);
    assert_non_null(out);
    if (!strstr(out, needle)) fail_msg("expected '%s' in: %s", needle, out);
    free(out);
}

static void test_bad_input(void **state) {
    (void)state;
    TU_REQUIRE_DATA(data, SHAKES);
    char *dir = tu_tmpdir(), args[2048], path[512];
    snprintf(args, sizeof args, "train --data %s/missing.txt --steps 1", dir);
    expect_error(args, 1, "missing.txt");
    snprintf(path, sizeof path, "%s/empty.txt", dir);
    FILE *f = fopen(path, "w");
    fclose(f);
    snprintf(args, sizeof args, "train --data %s --steps 1", path);
    expect_error(args, 1, "empty");
    snprintf(path, sizeof path, "%s/short.txt", dir);
    f = fopen(path, "w");
    fputs("To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer.\n", f);
    fclose(f);
    snprintf(args, sizeof args, "train --data %s --steps 1", path);
    expect_error(args, 1, "window");
    snprintf(args, sizeof args, "train --data %s --steps 1 --precision fp7", data);
    expect_error(args, 2, "fp7");
    snprintf(args, sizeof args, "train --data %s --steps 1 --seq 65", data);
    expect_error(args, 1, "seq_len");
    snprintf(args, sizeof args, "train --data %s --bogus", data);
    expect_error(args, 2, "--bogus");
    snprintf(args, sizeof args, "train --data %s --steps 1 --lr 1e-3 --lr-min 1e-2", data);
    expect_error(args, 2, "--lr-min");
    /* a checkpoint, then a truncated copy and a mismatched tokenizer */
    snprintf(args, sizeof args, "train --data %s --steps 1 %s --out %s/m.st", data, QUICK, dir);
    assert_int_equal(tu_run_cli(args, NULL), 0);
    snprintf(path, sizeof path, "%s/m.st", dir);
    size_t n;
    char *bytes = tu_read_file(path, &n);
    assert_non_null(bytes);
    snprintf(path, sizeof path, "%s/trunc.st", dir);
    f = fopen(path, "wb");
    fwrite(bytes, 1, n / 2, f);
    fclose(f);
    free(bytes);
    snprintf(args, sizeof args, "eval --ckpt %s --data %s", path, data);
    expect_error(args, 1, "trunc.st");
    snprintf(args, sizeof args, "generate --ckpt %s --prompt hi", path);
    expect_error(args, 1, "trunc.st");
    snprintf(args, sizeof args, "train --data %s --steps 2 --resume %s", data, path);
    expect_error(args, 1, "trunc.st");
    const char *tok = tu_data_path("stories260K/tok512.bin");
    if (tok) {
        snprintf(args, sizeof args, "eval --ckpt %s/m.st --tokenizer %s --data %s", dir, tok, data);
        expect_error(args, 1, "tok512.bin");
    }
    /* prompt longer than seq_len (64 bytes) */
    snprintf(args, sizeof args,
             "generate --ckpt %s/m.st --prompt 'Now is the winter of our discontent made glorious summer by this sun "
             "of York' --steps 10",
             dir);
    expect_error(args, 2, "longer than the model's seq_len 64");
    tu_rmdir(dir);
    free(dir);
}

int main(void) {
    /* child processes: sleep rather than spin in OpenMP barriers (the test machine is shared) */
    setenv("OMP_WAIT_POLICY", "passive", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_seed_same_losses),           cmocka_unit_test(test_resume_bit_identical),
        cmocka_unit_test(test_eval_generate_checkpoint),        cmocka_unit_test(test_peak_rss_vs_report),
        cmocka_unit_test(test_nonfinite_loss_keeps_checkpoint), cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
