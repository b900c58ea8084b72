/* Per-request sampling (temperature, top-k, top-p, seed) and stop strings (sampler.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/infer.h"
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

/* softmax(logits / T) up to its normalization (the exps against the largest logit), sorted by
 * cmp_prob_desc and cut to the top-k / top-p set: *out (nl_malloc'd) and its first *keep. */
static nl_status kept_set(const nl_sampling *s, const float *logits, int64_t V, float mx, prob_id **out,
                          int64_t *keep) {
    prob_id *pi = nl_malloc((size_t)V * sizeof(prob_id), "sampling scratch");
    if (!pi) return NL_ERR_NOMEM;
    for (int64_t v = 0; v < V; v++) {
        pi[v].p = expf((logits[v] - mx) / s->temperature);
        pi[v].id = (int32_t)v;
    }
    qsort(pi, (size_t)V, sizeof *pi, cmp_prob_desc);
    int64_t n = V;
    if (s->top_k > 0 && s->top_k < n) n = s->top_k;
    if (s->top_p < 1.0f) {
        double kept_sum = 0.0;
        for (int64_t i = 0; i < n; i++) kept_sum += pi[i].p;
        double acc = 0.0;
        for (int64_t i = 0; i < n; i++) {
            acc += pi[i].p;
            if (acc >= s->top_p * kept_sum) {
                n = i + 1;
                break;
            }
        }
    }
    *out = pi;
    *keep = n;
    return NL_OK;
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
    (void)scratch;
    prob_id *pi;
    int64_t keep;
    NL_TRY(kept_set(s, logits, V, logits[best], &pi, &keep));
    double sum = 0.0;
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

nl_status nl_sampler_probs(const nl_sampling *s, const float *logits, int64_t V, float *probs) {
    for (int64_t v = 0; v < V; v++)
        if (!isfinite(logits[v]))
            return nl_fail(NL_ERR_NUMERIC, "logit %lld of %lld is %g (NaN or infinite weights or activations)",
                           (long long)v, (long long)V, (double)logits[v]);
    int64_t best = 0;
    for (int64_t v = 1; v < V; v++)
        if (logits[v] > logits[best]) best = v;
    memset(probs, 0, (size_t)V * sizeof(float));
    if (s->temperature <= 0.0f) {
        probs[best] = 1.0f;
        return NL_OK;
    }
    prob_id *pi;
    int64_t keep;
    NL_TRY(kept_set(s, logits, V, logits[best], &pi, &keep));
    double sum = 0.0;
    for (int64_t i = 0; i < keep; i++) sum += pi[i].p;
    for (int64_t i = 0; i < keep; i++) probs[pi[i].id] = (float)(pi[i].p / sum);
    nl_free(pi);
    return NL_OK;
}

/* A draw from weights w (V, not normalized, sum > 0). */
static int32_t draw(nl_rng *rng, const double *w, int64_t V, double sum) {
    double r = nl_rng_double(rng) * sum, acc = 0.0;
    int32_t last = 0;
    for (int64_t v = 0; v < V; v++) {
        if (w[v] <= 0) continue;
        acc += w[v];
        last = (int32_t)v;
        if (r < acc) return (int32_t)v;
    }
    return last;
}

nl_status nl_sampler_verify(const nl_sampling *s, nl_rng *rng, float *logits, int64_t V, const int32_t *draft,
                            const float *q, int64_t k, float *probs, int32_t *out, int64_t *n_out) {
    *n_out = 0;
    for (int64_t j = 0; j <= k; j++) {
        float *row = logits + j * V;
        if (j == k || s->temperature <= 0.0f) { /* the last row, or greedy: the plain draw */
            NL_TRY(nl_sampler_next(s, rng, row, V, NULL, &out[j]));
            *n_out = j + 1;
            if (j == k || out[j] != draft[j]) return NL_OK;
            continue;
        }
        NL_TRY(nl_sampler_probs(s, row, V, probs));
        const int32_t d = draft[j];
        const double qd = q ? (double)q[j * V + d] : 1.0, pd = (double)probs[d];
        if (qd > 0 && nl_rng_double(rng) * qd < pd) { /* accepted with probability min(1, p/q) */
            out[j] = d;
            continue;
        }
        /* rejected: the residual max(0, p - q) */
        double *w = nl_malloc((size_t)V * sizeof(double), "speculative residual");
        if (!w) return NL_ERR_NOMEM;
        double sum = 0.0;
        for (int64_t v = 0; v < V; v++) {
            double qv = q ? (double)q[j * V + v] : (v == d ? 1.0 : 0.0), r = (double)probs[v] - qv;
            w[v] = r > 0 ? r : 0;
            sum += w[v];
        }
        if (!(sum > 0)) /* p == q: never rejected in exact arithmetic; draw from p */
            for (int64_t v = 0; v < V; v++) sum += (w[v] = (double)probs[v]);
        out[j] = draw(rng, w, V, sum);
        nl_free(w);
        *n_out = j + 1;
        return NL_OK;
    }
    return NL_OK;
}

int64_t nl_sampler_ngram_draft(const int32_t *toks, int64_t n, int ngram_max, int64_t k, int32_t *out) {
    for (int64_t g = ngram_max < n - 1 ? ngram_max : n - 1; g >= 1 && k > 0; g--) {
        const int32_t *suf = toks + n - g;
        for (int64_t i = n - g - 1; i >= 0; i--) {
            if (memcmp(toks + i, suf, (size_t)g * sizeof(int32_t))) continue;
            /* what followed, read on into the drafts themselves where it reaches the end (as an LZ77
             * copy): a text that repeats with period n - g - i drafts k tokens of it */
            for (int64_t c = 0; c < k; c++) out[c] = i + g + c < n ? toks[i + g + c] : out[i + g + c - n];
            return k;
        }
    }
    return 0;
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
