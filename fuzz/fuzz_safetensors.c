/* libFuzzer target: safetensors validation (nl_st_parse) on arbitrary bytes, then every read
 * path a caller uses on an accepted file (find, meta, widening to fp32, shape check). */
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "nanolm/safetensors.h"

#include "fuzz_targets.h"

int nl_fuzz_safetensors(const uint8_t *data, size_t size) {
    nl_st_file f;
    if (nl_st_parse(&f, data, size, "fuzz.safetensors") != NL_OK) {
        if (nl_last_error()[0] == '\0') abort(); /* every refusal must say why */
        return 0;
    }
    for (int i = 0; i < f.n_tensors; i++) {
        const nl_st_tensor *t = &f.tensors[i];
        if (t->end < t->begin || t->end > f.data_bytes) abort(); /* validated offsets */
        if (nl_st_find(&f, t->name) == NULL) abort();
        if (t->numel <= (1 << 20)) {
            float *out = malloc((size_t)(t->numel ? t->numel : 1) * sizeof(float));
            if (out) {
                nl_st_tensor_to_f32(t, out);
                (void)nl_st_read_f32(&f, t->name, t->ndim, t->shape, out);
                free(out);
            }
        }
        char buf[128];
        nl_st_shape_str(t->ndim, t->shape, buf, sizeof buf);
    }
    for (int i = 0; i < f.n_meta; i++)
        if (nl_st_meta(&f, f.meta_keys[i]) == NULL) abort();
    nl_st_close(&f);
    return 0;
}

#ifndef NL_FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return nl_fuzz_safetensors(data, size); }
#endif
