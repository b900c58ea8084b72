/* The planner's commands price a Hugging Face model folder: --model DIR (or its config.json)
 * reads the architecture from config.json, the same shape the loader builds the model from. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cjson/cJSON.h>

#include "testutil.h"

static void test_plan_reads_a_model_folder(void **state) {
    (void)state;
    const char *ck = tu_committed_data("stories260K/stories260K.bin");
    const char *tk = tu_committed_data("stories260K/tok512.bin");
    char *dir = tu_tmpdir();
    char args[2048], *out = NULL;
    snprintf(args, sizeof args, "export --to hf '%s/m' --ckpt '%s' --tokenizer '%s'", dir, ck, tk);
    assert_int_equal(tu_run_cli(args, &out), 0);
    free(out);

    /* budget --json on the folder counts stories260K's 260,032 parameters */
    snprintf(args, sizeof args, "budget --model '%s/m' --json", dir);
    tu_run_opts o = {.stdout_only = 1};
    assert_int_equal(tu_run_cli_ex(&o, args, &out, NULL), 0);
    assert_non_null(out);
    cJSON *doc = cJSON_Parse(out);
    if (!doc) fail_msg("budget --json did not parse: %s", out);
    char *flat = cJSON_PrintUnformatted(doc);
    assert_non_null(strstr(flat, "260032"));
    cJSON_free(flat);
    cJSON_Delete(doc);
    free(out);

    /* plan train and plan serve accept the folder and its config.json */
    snprintf(args, sizeof args, "plan train --model '%s/m' --gpus 8 --top 1", dir);
    assert_int_equal(tu_run_cli(args, &out), 0);
    assert_non_null(strstr(out, "260k parameters"));
    free(out);
    snprintf(args, sizeof args, "plan serve --model '%s/m/config.json'", dir);
    assert_int_equal(tu_run_cli(args, &out), 0);
    free(out);

    /* a folder of an architecture nanolm does not read: refused, naming the file and the key */
    snprintf(args, sizeof args,
             "mkdir -p '%s/bad' && printf '{\"architectures\":[\"GPT2LMHeadModel\"]}' > '%s/bad/config.json'", dir,
             dir);
    assert_int_equal(system(args), 0);
    snprintf(args, sizeof args, "plan train --model '%s/bad' --gpus 8", dir);
    assert_int_equal(tu_run_cli(args, &out), 2);
    assert_non_null(strstr(out, "bad/config.json"));
    assert_non_null(strstr(out, "architectures"));
    free(out);
    tu_rmdir(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_plan_reads_a_model_folder)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
