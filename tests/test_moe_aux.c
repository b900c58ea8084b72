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
    const char *bin = getenv("NANOLM_BIN");
    const char *data = tu_committed_data("tinyshakespeare/input.txt");
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "OMP_NUM_THREADS=1 timeout -k 10 300 %s moe train --data %s --steps 200 --aux %s --json",
             bin ? bin : "build/nanolm", data, aux);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t cap = 1 << 22, len = 0, n;
    char *buf = malloc(cap);
    while ((n = fread(buf + len, 1, cap - len - 1, p)) > 0) len += n;
    buf[len] = 0;
    int st = pclose(p);
    if (!WIFEXITED(st) || WEXITSTATUS(st)) fail_msg("%s failed:\n%.2000s", cmd, buf);
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
                  "(loss %.4f)\n", off, l0, on, l1);
    assert_true(on < off);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_aux_balances)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
