/*
 * The entry points of the libFuzzer targets fuzz/fuzz_<name>.c. Each takes one fuzz input and
 * returns 0; it aborts when the code under test breaks an invariant. The fuzz build wraps each
 * in LLVMFuzzerTestOneInput; the normal build compiles them (with NL_FUZZ_NO_MAIN) into a small
 * library that tests/test_fuzz_regress.c links to replay the corpora and the findings.
 */
#ifndef NANOLM_FUZZ_TARGETS_H
#define NANOLM_FUZZ_TARGETS_H

#include <stddef.h>
#include <stdint.h>

int nl_fuzz_catalog(const uint8_t *data, size_t size);
int nl_fuzz_chat_template(const uint8_t *data, size_t size);
int nl_fuzz_checkpoint(const uint8_t *data, size_t size);
int nl_fuzz_cli_numbers(const uint8_t *data, size_t size);
int nl_fuzz_data(const uint8_t *data, size_t size);
int nl_fuzz_formats_cli(const uint8_t *data, size_t size);
int nl_fuzz_gguf(const uint8_t *data, size_t size);
int nl_fuzz_http_request(const uint8_t *data, size_t size);
int nl_fuzz_http_server(const uint8_t *data, size_t size);
int nl_fuzz_kv_transfer(const uint8_t *data, size_t size);
int nl_fuzz_llama2c(const uint8_t *data, size_t size);
int nl_fuzz_names(const uint8_t *data, size_t size);
int nl_fuzz_prefill_answer(const uint8_t *data, size_t size);
int nl_fuzz_safetensors(const uint8_t *data, size_t size);
int nl_fuzz_scaling_csv(const uint8_t *data, size_t size);
int nl_fuzz_tokenizer(const uint8_t *data, size_t size);
int nl_fuzz_tokenizer_json(const uint8_t *data, size_t size);
int nl_fuzz_train_state(const uint8_t *data, size_t size);

#endif
