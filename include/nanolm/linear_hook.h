/*
 * nanolm linear_hook: installing a model's linear hook (nl_linear_ops, nanolm/model.h) over the
 * one already there and taking it off again, and calling a linear through the hook that was
 * there before: the one home of what FP8 training and QAT both do with the hook.
 */
#ifndef NANOLM_LINEAR_HOOK_H
#define NANOLM_LINEAR_HOOK_H

#include "nanolm/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A hook and what it was installed over. */
typedef struct nl_linear_hook {
    nl_linear_ops ops;   /* installed as model->linear_ops */
    nl_linear_ops *prev; /* what was installed before (restored on remove) */
    nl_model *model;     /* borrowed; NULL when not installed */
} nl_linear_hook;

/* Installs (forward, backward, user) as m's linear hook, over the current one. */
void nl_linear_hook_install(nl_linear_hook *h, nl_model *m,
                            void (*forward)(void *, const nl_linear_site *, float *, const float *, const float *,
                                            int64_t, int64_t, int64_t),
                            void (*backward)(void *, const nl_linear_site *, float *, float *, const float *,
                                             const float *, const float *, int64_t, int64_t, int64_t),
                            void *user);
/* Puts the previous hook back if h is still the model's hook; safe on a hook never installed. */
void nl_linear_hook_remove(nl_linear_hook *h);

/* nl_linear_forward / nl_linear_backward of h's model through the hook h was installed over. */
void nl_linear_hook_forward_prev(const nl_linear_hook *h, const nl_linear_site *s, float *out, const float *in,
                                 const float *w, int64_t n, int64_t in_dim, int64_t out_dim);
void nl_linear_hook_backward_prev(const nl_linear_hook *h, const nl_linear_site *s, float *din, float *dw,
                                  const float *dout, const float *in, const float *w, int64_t n, int64_t in_dim,
                                  int64_t out_dim);

#ifdef __cplusplus
}
#endif

#endif
