/* nanolm precision underflow on a llama2.c checkpoint: the tokenizer file the error message asks
 * for is accepted (it used to be refused as an unknown option). */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void test_llama2c_needs_tokenizer(void **state) {
    (void)state;
    TU_REQUIRE_DATA(ckpt, "stories260K/stories260K.bin");
    TU_REQUIRE_DATA(tok, "stories260K/tok512.bin");
    TU_REQUIRE_DATA(text, "tinystories/tinystories_head.txt");
    char args[2048], *out = NULL;
    /* without it: a failure that says which option to pass */
    snprintf(args, sizeof args, "precision underflow --ckpt '%s' --data '%s' --batch 1 --batches 1", ckpt, text);
    assert_int_equal(tu_run_cli(args, &out), 1);
    assert_non_null(strstr(out, "--tokenizer"));
    free(out);
    /* with it: the run goes through and reports 2 categories x 4 schemes */
    snprintf(args, sizeof args,
             "precision underflow --ckpt '%s' --tokenizer '%s' --data '%s' --batch 1 --batches 1 --json", ckpt, tok,
             text);
    int rc = tu_run_cli(args, &out);
    if (rc) fail_msg("%s -> %d: %s", args, rc, out ? out : "");
    cJSON *d = cJSON_Parse(out);
    assert_non_null(d);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(d, "rows")), 8);
    cJSON_Delete(d);
    free(out);
    assert_int_equal(tu_run_cli("precision underflow --help", &out), 0);
    assert_non_null(strstr(out, "--tokenizer"));
    free(out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama2c_needs_tokenizer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
