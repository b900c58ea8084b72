/* The stored training state is not trusted: every field of nanolm.train is validated (unit
 * tests of nl_ckpt_state_parse; fuzz/fuzz_train_state.c's corpus is replayed by
 * test_fuzz_regress), a checkpoint with a bad
 * step is refused by `train --resume` and `parallel train --resume` instead of crashing, a
 * resumed run must be the run the checkpoint recorded, outputs are checked before any work, and
 * SIGTERM saves a checkpoint and exits 0 without leaving a temporary file. */
#include "testutil.h"

#include <stdint.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nanolm/checkpoint.h"

#define SHAKES "tinyshakespeare/input.txt"
#define QUICK  "--batch 4 --seq 32 --eval-windows 4 --warmup 2"

/* A valid state as nl_ckpt_save writes it, with one field replaced by the caller. */
static const char *GOOD =
    "{\"step\":5,\"precision\":\"fp32\",\"rng\":[\"1\",\"2\",\"3\",\"4\"],"
    "\"adamw\":{\"t\":5,\"beta1\":0.9,\"beta2\":0.95,\"eps\":1e-8,\"weight_decay\":0.1},"
    "\"scaler\":{\"scale\":65536,\"good_steps\":5,\"skipped\":0,\"growth_interval\":2000},"
    "\"run\":{\"mup_base_dim\":0,\"loss_scaling\":1,\"qat\":\"\",\"fp8\":\"\",\"schedule\":\"cosine\",\"warmup\":2}}";

static char *replace(const char *s, const char *from, const char *to) {
    const char *p = strstr(s, from);
    assert_non_null(p);
    char *r = malloc(strlen(s) + strlen(to) + 1);
    memcpy(r, s, (size_t)(p - s));
    strcpy(r + (p - s), to);
    strcat(r, p + strlen(from));
    return r;
}

/* Parsing GOOD with `from` replaced by `to` fails naming `field`. */
static void expect_refused(const char *from, const char *to, const char *field) {
    char *j = replace(GOOD, from, to);
    nl_ckpt_state st;
    memset(&st, 0, sizeof st);
    nl_status rc = nl_ckpt_state_parse("x.st", j, &st);
    if (rc == NL_OK) print_message("accepted: %s\n", j);
    assert_int_equal(rc, NL_ERR_FORMAT);
    if (!strstr(nl_last_error(), field)) print_message("message \"%s\" does not name %s\n", nl_last_error(), field);
    assert_non_null(strstr(nl_last_error(), field));
    assert_non_null(strstr(nl_last_error(), "x.st"));
    free(j);
}

static void test_parse_good(void **state) {
    (void)state;
    nl_ckpt_state st;
    memset(&st, 0, sizeof st);
    assert_int_equal(nl_ckpt_state_parse("x.st", GOOD, &st), NL_OK);
    assert_int_equal(st.step, 5);
    assert_int_equal(st.rng.s[3], 4);
    assert_int_equal(st.run.warmup, 2);
    assert_string_equal(st.run.schedule, "cosine");
    /* a state written before the run block existed is still read (warmup unknown) */
    char *old = replace(GOOD,
                        ",\"run\":{\"mup_base_dim\":0,\"loss_scaling\":1,\"qat\":\"\",\"fp8\":\"\",\"schedule\":"
                        "\"cosine\",\"warmup\":2}",
                        "");
    assert_int_equal(nl_ckpt_state_parse("x.st", old, &st), NL_OK);
    assert_int_equal(st.run.warmup, -1);
    free(old);
}

static void test_parse_refuses_each_field(void **state) {
    (void)state;
    expect_refused("\"step\":5", "\"step\":-1", "step");
    expect_refused("\"step\":5", "\"step\":9223372036854775808", "step");
    expect_refused("\"step\":5", "\"step\":1e300", "step");
    expect_refused("\"step\":5", "\"step\":2.5", "step");
    expect_refused("\"step\":5", "\"step\":\"5\"", "step");
    expect_refused("\"fp32\"", "\"fp64\"", "precision");
    expect_refused("[\"1\",\"2\",\"3\",\"4\"]", "[\"0\",\"0\",\"0\",\"0\"]", "rng");
    expect_refused("[\"1\",\"2\",\"3\",\"4\"]", "[\"-1\",\"2\",\"3\",\"4\"]", "rng[0]");
    expect_refused("[\"1\",\"2\",\"3\",\"4\"]", "[\"1\",\"2\",\"3\",\"18446744073709551616\"]", "rng[3]");
    expect_refused("[\"1\",\"2\",\"3\",\"4\"]", "[\"1\",\"2\",\"3\"]", "rng");
    expect_refused("\"t\":5", "\"t\":6", "adamw.t");
    expect_refused("\"beta1\":0.9", "\"beta1\":1", "adamw.beta1");
    expect_refused("\"eps\":1e-8", "\"eps\":0", "adamw.eps");
    expect_refused("\"weight_decay\":0.1", "\"weight_decay\":-1", "adamw.weight_decay");
    expect_refused("\"scale\":65536", "\"scale\":1e999", "scaler.scale");
    expect_refused("\"scale\":65536", "\"scale\":0", "scaler.scale");
    expect_refused("\"scale\":65536", "\"scale\":1e39", "scaler.scale");
    expect_refused("\"good_steps\":5", "\"good_steps\":-3", "scaler.good_steps");
    expect_refused("\"skipped\":0", "\"skipped\":6", "scaler.skipped");
    expect_refused("\"growth_interval\":2000", "\"growth_interval\":0", "scaler.growth_interval");
    expect_refused("\"cosine\"", "\"linear\"", "run.schedule");
    expect_refused("\"warmup\":2", "\"warmup\":-2", "run.warmup");
    expect_refused("\"loss_scaling\":1", "\"loss_scaling\":2", "run.loss_scaling");
    expect_refused("\"mup_base_dim\":0", "\"mup_base_dim\":1e12", "run.mup_base_dim");
    expect_refused("\"adamw\":{", "\"adamw\":[{", "nanolm.train"); /* not JSON any more */
}

/* ---- end to end through the CLI ------------------------------------------------------------- */

static int run(const char *args, char **out) {
    int rc = tu_run_cli(args, out);
    if (out && *out) print_message("nanolm %s\n-> %d: %s\n", args, rc, *out);
    return rc;
}

/* Rewrites the safetensors header of `path` with `from` replaced by `to` (the data area is
 * untouched: its offsets are relative to its start). */
static void patch_header(const char *path, const char *from, const char *to) {
    size_t bytes = 0;
    char *buf = tu_read_file(path, &bytes);
    assert_non_null(buf);
    uint64_t hl = 0;
    memcpy(&hl, buf, 8);
    char *hdr = calloc(1, hl + 1);
    memcpy(hdr, buf + 8, hl);
    char *nh = replace(hdr, from, to);
    uint64_t nl = strlen(nh);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fwrite(&nl, 8, 1, f);
    fwrite(nh, 1, nl, f);
    fwrite(buf + 8 + hl, 1, bytes - 8 - hl, f);
    fclose(f);
    free(hdr);
    free(nh);
    free(buf);
}

static void copy_file(const char *from, const char *to) {
    size_t n = 0;
    char *b = tu_read_file(from, &n);
    assert_non_null(b);
    FILE *f = fopen(to, "wb");
    assert_non_null(f);
    fwrite(b, 1, n, f);
    fclose(f);
    free(b);
}

static void expect_fail(const char *args, const char *needle) {
    char *out = NULL;
    int rc = run(args, &out);
    assert_int_equal(rc, 1);
    assert_non_null(out);
    /* refused before any step was trained (train prints " val ", parallel train "  loss ") */
    assert_null(strstr(out, " val "));
    assert_null(strstr(out, "  loss "));
    if (!strstr(out, needle)) print_message("expected \"%s\" in the output\n", needle);
    assert_non_null(strstr(out, needle));
    assert_null(strstr(out, "double free"));
    assert_null(strstr(out, "corrupted"));
    free(out);
}

static void test_resume_bad_step_refused(void **state) {
    (void)state;
    TU_REQUIRE_DATA(data, SHAKES);
    char *dir = tu_tmpdir(), args[2048], good[512], bad[512];
    snprintf(args, sizeof args, "train --data %s --steps 4 --stop-after 2 %s --out %s/m.st", data, QUICK, dir);
    assert_int_equal(run(args, NULL), 0);
    snprintf(good, sizeof good, "%s/m.st", dir);
    const char *steps[] = {"-1", "9223372036854775808", "1e300"};
    for (int i = 0; i < 3; i++) {
        snprintf(bad, sizeof bad, "%s/bad%d.st", dir, i);
        copy_file(good, bad);
        char to[64];
        snprintf(to, sizeof to, "\\\"step\\\":%s,", steps[i]);
        patch_header(bad, "\\\"step\\\":2,", to);
        snprintf(args, sizeof args, "train --data %s --steps 4 %s --resume %s", data, QUICK, bad);
        expect_fail(args, "nanolm.train step");
        snprintf(args, sizeof args, "parallel train --data %s --steps 4 --batch 4 --seq 32 --resume %s", data, bad);
        expect_fail(args, "nanolm.train step");
    }
    tu_rmdir(dir);
    free(dir);
}

static void test_resume_must_match(void **state) {
    (void)state;
    TU_REQUIRE_DATA(data, SHAKES);
    char *dir = tu_tmpdir(), args[2048];
    snprintf(args, sizeof args, "train --data %s --steps 4 --stop-after 2 %s --out %s/m.st", data, QUICK, dir);
    assert_int_equal(run(args, NULL), 0);
    snprintf(args, sizeof args, "train --data %s --steps 4 %s --precision bf16 --resume %s/m.st", data, QUICK, dir);
    expect_fail(args, "precision fp32, this run asks for bf16");
    snprintf(args, sizeof args, "train --data %s --steps 4 %s --mup 16 --resume %s/m.st", data, QUICK, dir);
    expect_fail(args, "muP base width 0, this run asks for 16");
    snprintf(args, sizeof args,
             "train --data %s --steps 4 --batch 4 --seq 32 --eval-windows 4 --warmup 3 --resume %s/m.st", data, dir);
    expect_fail(args, "warmup 2 steps, this run asks for 3");
    snprintf(args, sizeof args, "train --data %s --steps 1 %s --resume %s/m.st", data, QUICK, dir);
    expect_fail(args, "already trained 2 steps");
    /* a restart of a run that already saved its last step: said, nothing trained, exit 0 */
    snprintf(args, sizeof args, "train --data %s --steps 2 %s --resume %s/m.st", data, QUICK, dir);
    char *out = NULL;
    assert_int_equal(run(args, &out), 0);
    assert_non_null(out);
    assert_non_null(strstr(out, "already trained all 2 steps"));
    assert_null(strstr(out, " val "));
    free(out);
    snprintf(args, sizeof args, "train --data %s --steps 4 %s --preset stories260k --resume %s/m.st", data, QUICK, dir);
    expect_fail(args, "holds model \"shakespeare-char\", the run asks for \"stories260k\"");
    /* --preset naming the checkpoint's own shape is accepted */
    snprintf(args, sizeof args, "train --data %s --steps 3 %s --preset shakespeare-char --resume %s/m.st", data, QUICK,
             dir);
    assert_int_equal(run(args, NULL), 0);
    tu_rmdir(dir);
    free(dir);
}

static void test_outputs_checked_first(void **state) {
    (void)state;
    TU_REQUIRE_DATA(data, SHAKES);
    char *dir = tu_tmpdir(), args[2048];
    snprintf(args, sizeof args, "train --data %s --steps 200 %s --out %s/nodir/x.st", data, QUICK, dir);
    expect_fail(args, "--out");
    snprintf(args, sizeof args, "train --data %s --steps 200 %s --log %s", data, QUICK, dir);
    expect_fail(args, "is a directory");
    snprintf(args, sizeof args, "train --data %s --steps 200 %s --svg %s/nodir/x.svg", data, QUICK, dir);
    expect_fail(args, "--svg");
    snprintf(args, sizeof args, "parallel train --data %s --steps 200 --out %s/nodir/x.st", data, dir);
    expect_fail(args, "--out");
    snprintf(args, sizeof args, "parallel train --data %s --steps 200 --svg %s/nodir/x.svg", data, dir);
    expect_fail(args, "--svg");
    tu_rmdir(dir);
    free(dir);
}

static void test_sigterm_saves_and_exits_0(void **state) {
    (void)state;
    TU_REQUIRE_DATA(data, SHAKES);
    char *dir = tu_tmpdir(), ckpt[512];
    snprintf(ckpt, sizeof ckpt, "%s/m.st", dir);
    const char *argv[] = {"train", "--data",   data, "--steps",        "100000", "--batch",
                          "4",     "--seq",    "32", "--eval-windows", "2",      "--eval-every",
                          "1",     "--warmup", "2",  "--out",          ckpt,     NULL};
    const tu_run_opts o = {.one_thread = 1, .stdout_only = 1};
    tu_proc p;
    assert_int_equal(tu_spawn_cli(&o, argv, &p), 0);
    assert_int_equal(tu_wait_for_output(&p, "step ", 3), 3); /* a few steps (and saves) done */
    kill(p.pid, SIGTERM);
    char *rest = NULL;
    int rc = tu_proc_finish(&p, &rest);
    assert_non_null(rest);
    print_message("after SIGTERM: %s", rest);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(rest, "stopped by SIGTERM"));
    assert_int_equal(tu_count_tmp(dir), 0);
    /* the checkpoint holds the step it stopped at, and the run resumes from it */
    nl_model m;
    char tok[64];
    assert_int_equal(nl_ckpt_load_model(ckpt, &m, tok), NL_OK);
    nl_ckpt_state st;
    memset(&st, 0, sizeof st);
    assert_int_equal(nl_ckpt_load_state(ckpt, &m, &st), NL_OK);
    nl_model_free(&m);
    assert_true(st.step >= 3);
    char args[2048];
    snprintf(args, sizeof args,
             "train --data %s --steps %lld --batch 4 --seq 32 --eval-windows 2 --warmup 2 --resume %s", data,
             (long long)st.step + 1, ckpt);
    assert_int_equal(run(args, NULL), 0);
    free(rest);
    tu_rmdir(dir);
    free(dir);
}

/* Two runs with the same --out: the second is refused, naming the first's PID, while the first
 * runs (it used to overwrite the first's checkpoint, and both reported it); after the first ends,
 * its lock file is gone and the same --out is free again. */
static void test_out_locked_by_one_run(void **state) {
    (void)state;
    TU_REQUIRE_DATA(data, SHAKES);
    char *dir = tu_tmpdir(), ckpt[512], lock[600], args[2048];
    snprintf(ckpt, sizeof ckpt, "%s/same.st", dir);
    snprintf(lock, sizeof lock, "%s.lock", ckpt);
    const char *argv[] = {"train", "--data",   data, "--steps",        "100000", "--batch",
                          "4",     "--seq",    "32", "--eval-windows", "2",      "--eval-every",
                          "1",     "--warmup", "2",  "--out",          ckpt,     NULL};
    const tu_run_opts o = {.one_thread = 1, .stdout_only = 1};
    tu_proc p;
    assert_int_equal(tu_spawn_cli(&o, argv, &p), 0);
    assert_int_equal(tu_wait_for_output(&p, "step ", 1), 1);
    char want[96];
    snprintf(want, sizeof want, "being written by another run (PID %ld", (long)p.pid);
    snprintf(args, sizeof args, "train --data %s --steps 4 %s --out %s", data, QUICK, ckpt);
    char *out = NULL;
    int rc = run(args, &out);
    int refused = rc == 1 && out && strstr(out, want) && !strstr(out, " val ");
    free(out);
    kill(p.pid, SIGTERM);
    char *rest = NULL;
    assert_int_equal(tu_proc_finish(&p, &rest), 0);
    free(rest);
    assert_true(refused);
    assert_int_equal(access(lock, F_OK), -1); /* removed by the run that held it */
    snprintf(args, sizeof args, "train --data %s --steps 4 %s --out %s", data, QUICK, ckpt);
    assert_int_equal(run(args, NULL), 0);
    tu_rmdir(dir);
    free(dir);
}

/* A short run (warmup steps/10, since the default 100 is not below its steps) is extended with
 * more --steps without repeating a --warmup the user never gave: resume takes the recorded one. */
static void test_resume_derives_warmup(void **state) {
    (void)state;
    TU_REQUIRE_DATA(data, SHAKES);
    char *dir = tu_tmpdir(), args[2048];
    snprintf(args, sizeof args, "train --data %s --steps 20 --batch 4 --seq 32 --eval-windows 2 --out %s/m.st", data,
             dir);
    assert_int_equal(run(args, NULL), 0);
    snprintf(args, sizeof args, "train --data %s --steps 30 --batch 4 --seq 32 --eval-windows 2 --resume %s/m.st", data,
             dir);
    assert_int_equal(run(args, NULL), 0);
    /* a --warmup given explicitly is still checked against the recorded one */
    snprintf(args, sizeof args,
             "train --data %s --steps 40 --batch 4 --seq 32 --eval-windows 2 --warmup 7 --resume %s/m.st", data, dir);
    expect_fail(args, "warmup 2 steps, this run asks for 7");
    tu_rmdir(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_good),
        cmocka_unit_test(test_parse_refuses_each_field),
        cmocka_unit_test(test_resume_bad_step_refused),
        cmocka_unit_test(test_resume_must_match),
        cmocka_unit_test(test_outputs_checked_first),
        cmocka_unit_test(test_sigterm_saves_and_exits_0),
        cmocka_unit_test(test_out_locked_by_one_run),
        cmocka_unit_test(test_resume_derives_warmup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
