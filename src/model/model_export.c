/* A model as a llama2.c checkpoint (see include/nanolm/model_export.h). */
#include "nanolm/model_export.h"

#include <string.h>

#include "nanolm/llama2c.h"

nl_status nl_model_save_llama2c(const char *path, const nl_model *m) {
    const nl_arch *a = &m->arch;
    if (m->moe) return nl_fail(NL_ERR_INVALID, "%s: llama2.c's format has no mixture-of-experts layers", path);
    if (a->qkv_bias) return nl_fail(NL_ERR_INVALID, "%s: llama2.c's format has no q/k/v biases (qkv_bias)", path);
    if (a->rope_scaling_factor > 0)
        return nl_fail(NL_ERR_INVALID, "%s: llama2.c's format has no RoPE scaling (rope_scaling_factor %g)", path,
                       a->rope_scaling_factor);
    if (a->rope_theta != 10000.0 || a->norm_eps != 1e-5)
        return nl_fail(NL_ERR_INVALID,
                       "%s: llama2.c's format records neither rope_theta nor norm_eps (readers assume 10000 and "
                       "1e-5); this model has rope_theta %g, norm_eps %g",
                       path, a->rope_theta, a->norm_eps);
    if (m->hd * m->NH != m->C)
        return nl_fail(NL_ERR_INVALID, "%s: llama2.c's format needs head_dim = dim / n_heads (%lld != %lld / %lld)",
                       path, (long long)m->hd, (long long)m->C, (long long)m->NH);
    static const nl_param_kind kinds[] = {NL_PARAM_EMBED, NL_PARAM_RMS_ATT, NL_PARAM_WQ,        NL_PARAM_WK,
                                          NL_PARAM_WV,    NL_PARAM_WO,      NL_PARAM_RMS_FFN,   NL_PARAM_W1,
                                          NL_PARAM_W2,    NL_PARAM_W3,      NL_PARAM_RMS_FINAL, NL_PARAM_CLS};
    nl_llama2c_tensor lay[NL_LLAMA2C_MAX_TENSORS];
    int n = nl_llama2c_layout(a, lay);
    float *arrays[NL_LLAMA2C_MAX_TENSORS] = {0};
    nl_status rc = NL_OK;
    for (int k = 0; k < n && !rc; k++) {
        arrays[k] = nl_malloc((size_t)lay[k].numel * sizeof(float), "llama2.c array");
        if (!arrays[k]) {
            rc = NL_ERR_NOMEM;
            break;
        }
        int64_t used = 0; /* the tensors of this kind, in layer order */
        for (int i = 0; i < m->n_tensors; i++) {
            const nl_param_info *p = &m->table[i];
            if (p->kind != kinds[k]) continue;
            if (used + (int64_t)p->numel > lay[k].numel) break;
            memcpy(arrays[k] + used, m->params + p->offset, p->numel * sizeof(float));
            used += (int64_t)p->numel;
        }
        if (used != lay[k].numel)
            rc = nl_fail(NL_ERR_INVALID, "%s: array %s takes %lld floats but the model has %lld", path, lay[k].name,
                         (long long)lay[k].numel, (long long)used);
    }
    if (!rc) rc = nl_llama2c_write(path, a, (const float *const *)arrays);
    for (int k = 0; k < n; k++) nl_free(arrays[k]);
    return rc;
}
