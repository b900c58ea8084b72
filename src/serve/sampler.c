/* Per-request sampling (temperature, top-k, top-p, seed) and stop strings (sampler.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/model.h"
#include "nanolm/sampler.h"

void nl_sampling_default(nl_sampling *s) {
    memset(s, 0, sizeof *s);
    s->temperature = 1.0f;
    s->top_p = 1.0f;
    s->max_tokens = 16;
}

nl_status nl_sampling_check(const nl_sampling *s) {
    if (!isfinite(s->temperature) || s->temperature < 0)
        return nl_fail(NL_ERR_INVALID, "temperature must be finite and >= 0, got %g", (double)s->temperature);
    if (!(s->top_p > 0.0f && s->top_p <= 1.0f))
        return nl_fail(NL_ERR_INVALID, "top_p must be in (0, 1], got %g", (double)s->top_p);
    if (s->top_k < 0) return nl_fail(NL_ERR_INVALID, "top_k must be >= 0, got %d", s->top_k);
    if (s->n_stop < 0 || s->n_stop > NL_SAMPLING_MAX_STOP)
        return nl_fail(NL_ERR_INVALID, "at most %d stop strings, got %d", NL_SAMPLING_MAX_STOP, s->n_stop);
    for (int i = 0; i < s->n_stop; i++) {
        size_t n = strnlen(s->stop[i], NL_SAMPLING_MAX_STOP_LEN + 1);
        if (n == 0) return nl_fail(NL_ERR_INVALID, "stop string %d is empty", i);
        if (n > NL_SAMPLING_MAX_STOP_LEN)
            return nl_fail(NL_ERR_INVALID, "stop string %d is longer than %d bytes", i, NL_SAMPLING_MAX_STOP_LEN);
    }
    return NL_OK;
}

nl_status nl_sampling_add_stop(nl_sampling *s, const char *stop) {
    if (s->n_stop >= NL_SAMPLING_MAX_STOP)
        return nl_fail(NL_ERR_INVALID, "at most %d stop strings", NL_SAMPLING_MAX_STOP);
    size_t n = strlen(stop);
    if (n == 0) return nl_fail(NL_ERR_INVALID, "a stop string is empty");
    if (n > NL_SAMPLING_MAX_STOP_LEN)
        return nl_fail(NL_ERR_INVALID, "stop string '%.20s...' is longer than %d bytes", stop,
                       NL_SAMPLING_MAX_STOP_LEN);
    memcpy(s->stop[s->n_stop++], stop, n + 1);
    return NL_OK;
}

/* qsort by descending probability, ascending id on ties (a total order: same result always). */
typedef struct {
    float p;
    int32_t id;
} prob_id;
static int cmp_prob_desc(const void *a, const void *b) {
    const prob_id *x = a, *y = b;
    if (x->p != y->p) return x->p > y->p ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

nl_status nl_sampler_next(const nl_sampling *s, nl_rng *rng, float *logits, int64_t V, int32_t *scratch,
                          int32_t *token) {
    for (int64_t v = 0; v < V; v++)
        if (!isfinite(logits[v]))
            return nl_fail(NL_ERR_NUMERIC, "logit %lld of %lld is %g (NaN or infinite weights or activations)",
                           (long long)v, (long long)V, (double)logits[v]);
    if (s->temperature <= 0.0f || (s->top_k == 0 && s->top_p >= 1.0f)) {
        *token = nl_model_sample(logits, V, s->temperature, rng);
        return NL_OK;
    }
    /* softmax(logits / T), then the top-k / top-p set in descending order */
    int64_t best = 0;
    for (int64_t v = 1; v < V; v++)
        if (logits[v] > logits[best]) best = v;
    float mx = logits[best];
    prob_id *pi = nl_malloc((size_t)V * sizeof(prob_id), "sampling scratch");
    (void)scratch;
    if (!pi) return NL_ERR_NOMEM;
    double sum = 0.0;
    for (int64_t v = 0; v < V; v++) {
        pi[v].p = expf((logits[v] - mx) / s->temperature);
        pi[v].id = (int32_t)v;
        sum += pi[v].p;
    }
    qsort(pi, (size_t)V, sizeof *pi, cmp_prob_desc);
    int64_t keep = V;
    if (s->top_k > 0 && s->top_k < keep) keep = s->top_k;
    if (s->top_p < 1.0f) {
        double kept_sum = 0.0;
        for (int64_t i = 0; i < keep; i++) kept_sum += pi[i].p;
        double acc = 0.0;
        for (int64_t i = 0; i < keep; i++) {
            acc += pi[i].p;
            if (acc >= s->top_p * kept_sum) {
                keep = i + 1;
                break;
            }
        }
    }
    sum = 0.0;
    for (int64_t i = 0; i < keep; i++) sum += pi[i].p;
    double r = nl_rng_double(rng) * sum, acc = 0.0;
    int32_t pick = pi[keep - 1].id;
    for (int64_t i = 0; i < keep; i++) {
        acc += pi[i].p;
        if (r < acc) {
            pick = pi[i].id;
            break;
        }
    }
    nl_free(pi);
    *token = pick;
    return NL_OK;
}

int64_t nl_sampler_find_stop(const nl_sampling *s, const char *text, size_t len, size_t from, size_t *hold) {
    int64_t found = -1;
    for (int i = 0; i < s->n_stop; i++) {
        size_t n = strlen(s->stop[i]);
        if (n > len) continue;
        /* occurrences ending at or after `from` start at or after from - n + 1 */
        size_t start = from + 1 > n ? from + 1 - n : 0;
        for (size_t p = start; p + n <= len; p++)
            if (!memcmp(text + p, s->stop[i], n)) {
                if (found < 0 || (int64_t)p < found) found = (int64_t)p;
                break;
            }
    }
    if (hold) {
        *hold = 0;
        /* the longest suffix of text that is a proper prefix of a stop string */
        for (int i = 0; i < s->n_stop; i++) {
            size_t n = strlen(s->stop[i]);
            for (size_t k = n - 1; k > *hold; k--)
                if (k <= len && !memcmp(text + len - k, s->stop[i], k)) {
                    *hold = k;
                    break;
                }
        }
    }
    return found;
}
