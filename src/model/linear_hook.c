/* A model's linear hook installed over the previous one, removed, and bypassed for one call
 * (nanolm/linear_hook.h). */
#include "nanolm/linear_hook.h"

void nl_linear_hook_install(nl_linear_hook *h, nl_model *m,
                            void (*forward)(void *, const nl_linear_site *, float *, const float *, const float *,
                                            int64_t, int64_t, int64_t),
                            void (*backward)(void *, const nl_linear_site *, float *, float *, const float *,
                                             const float *, const float *, int64_t, int64_t, int64_t),
                            void *user) {
    h->ops = (nl_linear_ops){.forward = forward, .backward = backward, .user = user};
    h->model = m;
    h->prev = m->linear_ops;
    m->linear_ops = &h->ops;
}

void nl_linear_hook_remove(nl_linear_hook *h) {
    if (h->model && h->model->linear_ops == &h->ops) h->model->linear_ops = h->prev;
    h->model = NULL;
}

void nl_linear_hook_forward_prev(const nl_linear_hook *h, const nl_linear_site *s, float *out, const float *in,
                                 const float *w, int64_t n, int64_t in_dim, int64_t out_dim) {
    nl_linear_ops *mine = h->model->linear_ops;
    h->model->linear_ops = h->prev;
    nl_linear_forward(h->model, s, out, in, w, n, in_dim, out_dim);
    h->model->linear_ops = mine;
}

void nl_linear_hook_backward_prev(const nl_linear_hook *h, const nl_linear_site *s, float *din, float *dw,
                                  const float *dout, const float *in, const float *w, int64_t n, int64_t in_dim,
                                  int64_t out_dim) {
    nl_linear_ops *mine = h->model->linear_ops;
    h->model->linear_ops = h->prev;
    nl_linear_backward(h->model, s, din, dw, dout, in, w, n, in_dim, out_dim);
    h->model->linear_ops = mine;
}
