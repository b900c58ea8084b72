/* One JSON shape per command whatever the layout: `train --json` and `train --dp 1 --json` (the
 * distributed runtime on one rank; needs MPI) print the same fields, a layout only adds its own.
 * Every key of the one-process report must be in the layout's report with the same kind of value
 * (number, string, array, object; null stands for a number that is not there, such as a loss not
 * yet measured), and the layout's report adds the layout's fields. */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *SHAPE = "--preset shakespeare-char --seq 16";

static cJSON *run_json(const char *layout) {
    char args[2048], *out = NULL;
    snprintf(args, sizeof args, "train --data %s %s --steps 2 --batch 4 --eval-windows 4 %s --json",
             tu_committed_data("tinyshakespeare/input.txt"), SHAPE, layout);
    const tu_run_opts o = {.timeout_s = 300, .one_thread = 1, .stdout_only = 1};
    int rc = tu_run_cli_ex(&o, args, &out, NULL);
    if (rc) print_message("nanolm %s\n%s\n", args, out ? out : "");
    assert_int_equal(rc, 0);
    cJSON *j = cJSON_Parse(out);
    if (!j) print_message("not JSON:\n%s\n", out);
    assert_non_null(j);
    free(out);
    return j;
}

/* The kind of a JSON value, null counting as a number. */
static int kind(const cJSON *v) {
    if (cJSON_IsNull(v) || cJSON_IsNumber(v)) return 1;
    if (cJSON_IsString(v)) return 2;
    if (cJSON_IsArray(v)) return 3;
    if (cJSON_IsObject(v)) return 4;
    return 5;
}

static void train_json_one_shape(void **state) {
    (void)state;
    cJSON *one = run_json(""), *dp = run_json("--dp 1");
    int missing = 0, n = 0;
    for (const cJSON *v = one->child; v; v = v->next, n++) {
        const cJSON *w = cJSON_GetObjectItemCaseSensitive(dp, v->string);
        if (!w)
            print_error("train --dp 1 --json has no \"%s\" (train --json has it)\n", v->string), missing++;
        else if (kind(v) != kind(w))
            print_error("\"%s\" is a different kind of value with --dp 1\n", v->string), missing++;
    }
    assert_true(n >= 8); /* preset, parameters, steps, train_loss, val_loss, wall_s, tokens_per_s, skipped_steps */
    assert_int_equal(missing, 0);
    /* the same run: the same model and number of steps, losses that are numbers */
    static const char *const same[] = {"preset", "parameters", "steps"};
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++) {
        char *a = cJSON_PrintUnformatted(cJSON_GetObjectItem(one, same[i]));
        char *b = cJSON_PrintUnformatted(cJSON_GetObjectItem(dp, same[i]));
        assert_string_equal(a, b);
        free(a);
        free(b);
    }
    assert_true(cJSON_IsNumber(cJSON_GetObjectItem(dp, "train_loss")));
    assert_true(cJSON_IsNumber(cJSON_GetObjectItem(one, "train_loss")));
    /* the layout adds its fields */
    assert_non_null(cJSON_GetObjectItem(dp, "ranks"));
    assert_non_null(cJSON_GetObjectItem(dp, "per_rank"));
    cJSON_Delete(one);
    cJSON_Delete(dp);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(train_json_one_shape)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
