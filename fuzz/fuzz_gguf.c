/* libFuzzer target: the GGUF reader (nl_gguf_parse) on arbitrary bytes, then what a caller does
 * with an accepted file: typed KV reads, array elements, tensor data converted to fp32, the
 * llama architecture from the metadata, and (for a file whose model is small) the whole model
 * and tokenizer load through nl_model_load. */
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "nanolm/ggml_quant.h"
#include "nanolm/gguf.h"
#include "nanolm/gguf_model.h"
#include "nanolm/model_load.h"

#include "fuzz_targets.h"

int nl_fuzz_gguf(const uint8_t *data, size_t size) {
    nl_gguf_file f;
    if (nl_gguf_parse(&f, data, size, "fuzz.gguf") != NL_OK) {
        if (nl_last_error()[0] == '\0') abort(); /* every refusal must say why */
        return 0;
    }
    volatile double sink = 0;
    for (int64_t i = 0; i < f.n_kv; i++) {
        const nl_gguf_kv *kv = &f.kv[i];
        if (nl_gguf_find_kv(&f, kv->key) != kv) abort(); /* keys are unique */
        int64_t v;
        double d;
        (void)nl_gguf_get_int(&f, kv->key, &v);
        (void)nl_gguf_get_float(&f, kv->key, &d);
        if (kv->type == NL_GGUF_ARRAY && kv->n) {
            uint64_t last = kv->n - 1, len;
            if (kv->arr_type == NL_GGUF_STRING) {
                const char *s = nl_gguf_arr_str(kv, last, &len);
                if ((const uint8_t *)s + len > data + size) abort();
                if (len) sink += (unsigned char)s[len - 1];
            } else if (kv->arr_type != NL_GGUF_BOOL)
                sink += nl_gguf_arr_float(kv, last);
        }
    }
    for (int64_t i = 0; i < f.n_tensors; i++) {
        const nl_gguf_tensor *t = &f.tensors[i];
        if ((const uint8_t *)t->data + t->bytes > data + size) abort(); /* inside the file */
        if (nl_gguf_find_tensor(&f, t->name) != t) abort();
        if (t->numel <= (1 << 16) && nl_ggml_can_dequantize(t->type)) {
            float *out = malloc((size_t)t->numel * sizeof(float));
            if (out && nl_ggml_to_f32(t->type, t->data, t->numel, out) != NL_OK) abort();
            if (out) sink += out[t->numel - 1];
            free(out);
        }
    }
    nl_arch a;
    int small = 0;
    if (nl_gguf_read_arch(&f, 256, &a) == NL_OK) {
        nl_arch_params np;
        nl_arch_count_params(&a, &np);
        small = np.total <= (1 << 20);
    } else if (nl_last_error()[0] == '\0')
        abort();
    nl_gguf_close(&f);
    (void)sink;
    if (!small) return 0;
    const char *path = fz_memfile(data, size);
    if (!path) return 0;
    nl_model m;
    nl_tokenizer tok;
    if (nl_model_load(path, NULL, 256, &m, &tok, NULL) != NL_OK) {
        if (nl_last_error()[0] == '\0') abort();
        return 0;
    }
    int *ids = NULL;
    int64_t n = 0;
    if (nl_tokenizer_encode(&tok, "Hi there", 8, 1, 0, &ids, &n) == NL_OK)
        for (int64_t i = 0; i < n; i++)
            if (ids[i] < 0 || ids[i] >= m.V) abort();
    nl_free(ids);
    nl_tokenizer_free(&tok);
    nl_model_free(&m);
    return 0;
}

#ifndef NL_FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return nl_fuzz_gguf(data, size); }
#endif
