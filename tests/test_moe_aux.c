/* The load-balancing loss does its job: moe-course-tiny (64 routed experts, top-6) trained for
 * 200 steps without and with the Switch/GShard auxiliary loss; the max/mean expert load
 * (mean over MoE layers, averaged over the last 20 steps) must be lower with it. Both figures
 * are printed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cjson/cJSON.h>

#include "testutil.h"

static double last_load(const char *aux, double *loss) {
    const char *data = tu_committed_data("tinyshakespeare/input.txt");
    char args[2048], *buf = NULL;
    snprintf(args, sizeof args, "moe train --data %s --steps 200 --aux %s --json", data, aux);
    const tu_run_opts o = {.timeout_s = 300, .one_thread = 1, .stdout_only = 1};
    int rc = tu_run_cli_ex(&o, args, &buf, NULL);
    assert_non_null(buf);
    if (rc) fail_msg("nanolm %s failed:\n%.2000s", args, buf);
    cJSON *doc = cJSON_Parse(buf);
    assert_non_null(doc);
    const cJSON *steps = cJSON_GetObjectItemCaseSensitive(doc, "steps");
    assert_int_equal(cJSON_GetArraySize(steps), 200);
    double r = 0, l = 0;
    for (int s = 180; s < 200; s++) {
        const cJSON *x = cJSON_GetArrayItem(steps, s);
        r += cJSON_GetObjectItemCaseSensitive(x, "max_mean_load")->valuedouble / 20;
        l += cJSON_GetObjectItemCaseSensitive(x, "loss")->valuedouble / 20;
    }
    cJSON_Delete(doc);
    free(buf);
    *loss = l;
    return r;
}

static void test_aux_balances(void **state) {
    (void)state;
    double l0, l1;
    double off = last_load("0", &l0), on = last_load("0.01", &l1);
    print_message("max/mean expert load, steps 180-199: without aux loss %.3f (loss %.4f), with aux 0.01 %.3f "
                  "(loss %.4f)\n",
                  off, l0, on, l1);
    assert_true(on < off);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_aux_balances)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
