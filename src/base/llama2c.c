/* llama2.c legacy checkpoints: read into named fp32 arrays, write atomically. */
#include "nanolm/llama2c.h"
#include "nanolm/resources.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "nanolm's llama2.c I/O assumes a little-endian host"
#endif

static void set(nl_llama2c_tensor *t, const char *name, int ndim, int64_t a, int64_t b, int64_t c) {
    memset(t, 0, sizeof *t);
    t->name = name;
    t->ndim = ndim;
    t->shape[0] = a;
    t->shape[1] = b;
    t->shape[2] = c;
    t->numel = a * (ndim > 1 ? b : 1) * (ndim > 2 ? c : 1);
}

int nl_llama2c_layout(const nl_arch *a, nl_llama2c_tensor s[NL_LLAMA2C_MAX_TENSORS]) {
    int64_t L = a->n_layers, D = a->dim, H = a->hidden_dim, V = a->vocab_size;
    int64_t hs = a->n_heads > 0 ? a->dim / a->n_heads : 0;
    int64_t q = a->n_heads * hs, kv = a->n_kv_heads * hs;
    int n = 0;
    set(&s[n++], "token_embedding", 2, V, D, 0);
    set(&s[n++], "rms_att", 2, L, D, 0);
    set(&s[n++], "wq", 3, L, q, D);
    set(&s[n++], "wk", 3, L, kv, D);
    set(&s[n++], "wv", 3, L, kv, D);
    set(&s[n++], "wo", 3, L, D, q);
    set(&s[n++], "rms_ffn", 2, L, D, 0);
    set(&s[n++], "w1", 3, L, H, D);
    set(&s[n++], "w2", 3, L, D, H);
    set(&s[n++], "w3", 3, L, H, D);
    set(&s[n++], "rms_final", 1, D, 0, 0);
    if (!a->tied_embeddings) set(&s[n++], "wcls", 2, V, D, 0);
    return n;
}

void nl_llama2c_rope_tables(const nl_arch *a, float *cos_out, float *sin_out) {
    int64_t hs = a->dim / a->n_heads, half = hs / 2;
    double theta = a->rope_theta > 0 ? a->rope_theta : 10000.0;
    /* As llama2.c's model.py: fp32 frequencies theta^(-2i/hs), fp32 angles pos * freq. */
    for (int64_t i = 0; i < half; i++) {
        float freq = (float)(1.0 / pow(theta, (double)(2 * i) / (double)hs));
        for (int64_t pos = 0; pos < a->seq_len; pos++) {
            float ang = (float)pos * freq;
            cos_out[pos * half + i] = (float)cos((double)ang);
            sin_out[pos * half + i] = (float)sin((double)ang);
        }
    }
}

void nl_llama2c_free(nl_llama2c *m) {
    if (!m) return;
    nl_free(m->weights);
    memset(m, 0, sizeof *m);
}

const nl_llama2c_tensor *nl_llama2c_find(const nl_llama2c *m, const char *name) {
    for (int i = 0; i < m->n_tensors; i++)
        if (strcmp(m->tensors[i].name, name) == 0) return &m->tensors[i];
    return NULL;
}

/* The arch from the 7 header fields; fails naming the field when one is out of range. */
static nl_status arch_from_header(const char *path, const int32_t h[7], nl_arch *a) {
    static const char *names[7] = {"dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len"};
    for (int i = 0; i < 7; i++) {
        int32_t v = i == 5 && h[i] < 0 && h[i] != INT32_MIN ? -h[i] : h[i];
        if (v <= 0 || v > (1 << 24))
            return nl_fail(NL_ERR_FORMAT,
                           "%s: header field %s = %d is out of range 1..16777216 (not a llama2.c checkpoint?)", path,
                           names[i], (int)h[i]);
    }
    memset(a, 0, sizeof *a);
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    size_t len = strcspn(base, ".");
    if (len >= sizeof a->name) len = sizeof a->name - 1;
    memcpy(a->name, base, len);
    a->dim = h[0];
    a->hidden_dim = h[1];
    a->n_layers = h[2];
    a->n_heads = h[3];
    a->n_kv_heads = h[4];
    a->vocab_size = h[5] < 0 ? -(int64_t)h[5] : h[5];
    a->tied_embeddings = h[5] > 0;
    a->seq_len = h[6];
    a->rope_theta = 10000.0;
    a->norm_eps = 1e-5;
    nl_status rc = nl_arch_validate(a);
    if (rc) {
        char why[256];
        snprintf(why, sizeof why, "%s", nl_last_error()); /* nl_fail overwrites the message */
        return nl_fail(NL_ERR_FORMAT, "%s: header describes an invalid model: %s", path, why);
    }
    return NL_OK;
}

nl_status nl_llama2c_read(nl_llama2c *m, const char *path) {
    memset(m, 0, sizeof *m);
    FILE *f;
    NL_TRY(nl_file_open_read_stdio(path, &f));
    struct stat st;
    if (fstat(fileno(f), &st) != 0) {
        int e = errno;
        fclose(f);
        return nl_fail(NL_ERR_IO, "cannot stat %s: %s", path, strerror(e));
    }
    uint64_t size = (uint64_t)st.st_size;
    int32_t h[7];
    if (size < NL_LLAMA2C_HEADER_BYTES || fread(h, 4, 7, f) != 7) {
        fclose(f);
        return nl_fail(NL_ERR_FORMAT, "%s: truncated at byte %llu: the llama2.c header needs %d bytes", path,
                       (unsigned long long)size, NL_LLAMA2C_HEADER_BYTES);
    }
    nl_arch a;
    nl_status rc = arch_from_header(path, h, &a);
    if (rc) {
        fclose(f);
        return rc;
    }
    /* Header fields go up to 2^24 each, so products of three overflow int64: bound the total in
     * floating point first (found by fuzz/fuzz_llama2c.c); the exact checks below then fit. */
    double D = (double)a.dim, Hd = (double)a.hidden_dim, L = (double)a.n_layers, V = (double)a.vocab_size;
    double hsd = (double)(a.dim / a.n_heads), qd = (double)a.n_heads * hsd, kvd = (double)a.n_kv_heads * hsd;
    double approx = V * D * (a.tied_embeddings ? 1 : 2) + L * (2 * D + 2 * qd * D + 2 * kvd * D + 3 * Hd * D) + D +
                    (double)a.seq_len * hsd;
    if (4 * approx > 0x1p62) { /* no file is that long; exact sizes below cannot overflow */
        fclose(f);
        return nl_fail(NL_ERR_FORMAT,
                       "%s: truncated at byte %llu: the header (dim=%d hidden_dim=%d n_layers=%d n_heads=%d "
                       "n_kv_heads=%d vocab_size=%d seq_len=%d) implies %.4g bytes",
                       path, (unsigned long long)size, (int)h[0], (int)h[1], (int)h[2], (int)h[3], (int)h[4], (int)h[5],
                       (int)h[6], 4 * approx + NL_LLAMA2C_HEADER_BYTES);
    }
    nl_llama2c_tensor t[NL_LLAMA2C_MAX_TENSORS];
    int n = nl_llama2c_layout(&a, t);
    int64_t hs = a.dim / a.n_heads, rope = a.seq_len * hs; /* two tables of seq_len*hs/2 */
    int64_t n_weights = 0;
    for (int i = 0; i < n; i++) n_weights += t[i].numel;
    uint64_t expect = NL_LLAMA2C_HEADER_BYTES + 4 * (uint64_t)(n_weights + rope);
    char desc[200];
    snprintf(desc, sizeof desc,
             "dim=%lld hidden_dim=%lld n_layers=%lld n_heads=%lld n_kv_heads=%lld vocab_size=%d seq_len=%lld",
             (long long)a.dim, (long long)a.hidden_dim, (long long)a.n_layers, (long long)a.n_heads,
             (long long)a.n_kv_heads, (int)h[5], (long long)a.seq_len);
    if (size < expect) {
        fclose(f);
        return nl_fail(NL_ERR_FORMAT, "%s: truncated at byte %llu: expected %llu bytes for %s", path,
                       (unsigned long long)size, (unsigned long long)expect, desc);
    }
    if (size > expect) {
        fclose(f);
        return nl_fail(
            NL_ERR_FORMAT,
            "%s: %llu bytes but the header (%s) implies %llu: wrong header or not a llama2.c legacy checkpoint", path,
            (unsigned long long)size, desc, (unsigned long long)expect);
    }
    char what[600];
    snprintf(what, sizeof what, "%s: the weights (%s)", path, desc);
    nl_status mem = nl_mem_require((uint64_t)n_weights * sizeof(float), what);
    if (mem) {
        fclose(f);
        return mem;
    }
    float *w = nl_malloc((size_t)n_weights * sizeof(float), path);
    if (!w) {
        fclose(f);
        return NL_ERR_NOMEM;
    }
    /* Everything before the RoPE tables, skip them, then the classifier. */
    int64_t before = n_weights - (a.tied_embeddings ? 0 : a.vocab_size * a.dim);
    int ok = fread(w, sizeof(float), (size_t)before, f) == (size_t)before;
    ok = ok && fseek(f, (long)(4 * rope), SEEK_CUR) == 0;
    if (ok && before < n_weights)
        ok = fread(w + before, sizeof(float), (size_t)(n_weights - before), f) == (size_t)(n_weights - before);
    fclose(f);
    if (!ok) {
        nl_free(w);
        return nl_fail(NL_ERR_IO, "reading %s failed (short read)", path);
    }
    m->arch = a;
    m->n_tensors = n;
    m->weights = w;
    m->n_weights = n_weights;
    int64_t off = 0;
    for (int i = 0; i < n; i++) {
        m->tensors[i] = t[i];
        m->tensors[i].data = w + off;
        off += t[i].numel;
    }
    return NL_OK;
}

nl_status nl_llama2c_write(const char *path, const nl_arch *a, const float *const *arrays) {
    nl_status rc = nl_arch_validate(a);
    if (rc) {
        char why[256];
        snprintf(why, sizeof why, "%s", nl_last_error()); /* nl_fail overwrites the message */
        return nl_fail(NL_ERR_INVALID, "cannot write %s as llama2.c: %s", path, why);
    }
    if (a->n_experts > 0)
        return nl_fail(NL_ERR_INVALID, "cannot write %s: the llama2.c format has no mixture-of-experts layers", path);
    if (a->head_dim > 0 && a->head_dim != a->dim / a->n_heads)
        return nl_fail(NL_ERR_INVALID, "cannot write %s: the llama2.c format needs head_dim = dim / n_heads", path);
    const int64_t f[7] = {a->dim, a->hidden_dim, a->n_layers, a->n_heads, a->n_kv_heads, a->vocab_size, a->seq_len};
    int32_t h[7];
    for (int i = 0; i < 7; i++) {
        if (f[i] > INT32_MAX)
            return nl_fail(NL_ERR_INVALID, "cannot write %s: a header field (%lld) does not fit int32", path,
                           (long long)f[i]);
        h[i] = (int32_t)f[i];
    }
    if (!a->tied_embeddings) h[5] = -h[5];
    nl_llama2c_tensor t[NL_LLAMA2C_MAX_TENSORS];
    int n = nl_llama2c_layout(a, t);
    for (int i = 0; i < n; i++)
        if (!arrays[i]) return nl_fail(NL_ERR_INVALID, "cannot write %s: array %s is NULL", path, t[i].name);
    int64_t half = a->seq_len * (a->dim / a->n_heads) / 2;
    float *rope = nl_malloc(2 * (size_t)half * sizeof(float), "RoPE tables");
    if (!rope) return NL_ERR_NOMEM;
    nl_llama2c_rope_tables(a, rope, rope + half);
    nl_atomic_file af;
    rc = nl_atomic_open(&af, path);
    if (rc) {
        nl_free(rope);
        return rc;
    }
    rc = nl_atomic_write(&af, h, sizeof h);
    for (int i = 0; !rc && i < 11; i++) rc = nl_atomic_write(&af, arrays[i], (size_t)t[i].numel * sizeof(float));
    if (!rc) rc = nl_atomic_write(&af, rope, 2 * (size_t)half * sizeof(float));
    if (!rc && n == 12) rc = nl_atomic_write(&af, arrays[11], (size_t)t[11].numel * sizeof(float));
    nl_free(rope);
    if (rc) {
        nl_atomic_abort(&af);
        return rc;
    }
    return nl_atomic_commit(&af);
}
