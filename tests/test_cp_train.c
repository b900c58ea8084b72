/* Context-parallel training under mpirun against one process with the same seed and global
 * batch: NanoLM-MoE (moe-course-tiny, aux loss off: its groups are whole sequences) with
 * sequences of 64 tokens split over CP = 2 and CP = 4 ranks (chunks of 16 and 8, each rank
 * holding two), and CP = 2 x DP = 2, 20 steps each: losses within 1e-5 relative. The
 * activation bytes per rank (--report-memory, model activations + ring-attention contexts)
 * fall as 1/CP: CP = 4 holds exactly half of CP = 2; the one-process figure (standard
 * attention with its (T, T) probabilities) is printed beside them. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cjson/cJSON.h>

#include "testutil.h"

#define STEPS 20

static cJSON *run(int np, int cp, int batch) {
    const char *data = tu_committed_data("tinyshakespeare/input.txt");
    char args[1024], *buf = NULL;
    snprintf(args, sizeof args,
             "moe train --data %s --steps %d --batch %d --seq 64 --aux 0 --cp %d --json --report-memory", data, STEPS,
             batch, cp);
    const tu_run_opts o = {.np = np, .timeout_s = 300, .one_thread = 1};
    int rc = tu_run_cli_ex(&o, args, &buf, NULL);
    assert_non_null(buf);
    if (rc) fail_msg("np %d: nanolm %s failed:\n%.3000s", np, args, buf);
    char *brace = strchr(buf, '{');
    cJSON *doc = brace ? cJSON_Parse(brace) : NULL;
    if (!doc) fail_msg("np %d: nanolm %s: no JSON", np, args);
    free(buf);
    return doc;
}

static double loss_at(const cJSON *doc, int s) {
    return cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(doc, "steps"), s),
                                            "loss")
        ->valuedouble;
}

static double act0(const cJSON *doc) {
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(doc, "memory");
    return cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(m, "activations"), 0)->valuedouble;
}

static void compare(const cJSON *ref, const cJSON *got, const char *what) {
    double worst = 0;
    for (int s = 0; s < STEPS; s++) {
        double r = fabs(loss_at(got, s) - loss_at(ref, s)) / fabs(loss_at(ref, s));
        if (r > worst) worst = r;
    }
    print_message("%-16s loss rel diff max %.2e over %d steps, final loss %.5f, activations per rank %.0f B\n", what,
                  worst, STEPS, loss_at(got, STEPS - 1), act0(got));
    if (worst > 1e-5) fail_msg("%s: relative difference %.3g > 1e-5", what, worst);
}

static void test_cp(void **state) {
    (void)state;
    cJSON *ref = run(0, 1, 2), *c2 = run(2, 2, 2), *c4 = run(4, 4, 2), *c2d2 = run(4, 2, 1);
    print_message("one process      final loss %.5f, activations %.0f B (standard attention, (T, T) probabilities)\n",
                  loss_at(ref, STEPS - 1), act0(ref));
    compare(ref, c2, "cp 2");
    compare(ref, c4, "cp 4");
    compare(ref, c2d2, "cp 2 x dp 2");
    /* 1/CP: every rank of CP = 4 holds exactly half of a CP = 2 rank */
    assert_true(act0(c4) * 4 == act0(c2) * 2);
    assert_true(act0(c2) < act0(ref));
    cJSON_Delete(ref), cJSON_Delete(c2), cJSON_Delete(c4), cJSON_Delete(c2d2);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_cp)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
