/* safetensors reader (validating, mmap) and atomic writer. See include/nanolm/safetensors.h. */
#include "nanolm/safetensors.h"
#include "nanolm/resources.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "nanolm's safetensors I/O assumes a little-endian host"
#endif

/* ---- dtypes ---- */

static const struct {
    const char *name;
    size_t size;
} dtypes[NL_ST_NDTYPES] = {
    [NL_ST_F32] = {"F32", 4}, [NL_ST_F16] = {"F16", 2}, [NL_ST_BF16] = {"BF16", 2}, [NL_ST_I8] = {"I8", 1},
    [NL_ST_U8] = {"U8", 1},   [NL_ST_I32] = {"I32", 4}, [NL_ST_I64] = {"I64", 8},   [NL_ST_F64] = {"F64", 8},
};

const char *nl_st_dtype_name(nl_st_dtype d) { return (unsigned)d < NL_ST_NDTYPES ? dtypes[d].name : "?"; }

size_t nl_st_dtype_size(nl_st_dtype d) { return (unsigned)d < NL_ST_NDTYPES ? dtypes[d].size : 0; }

nl_status nl_st_dtype_parse(const char *name, nl_st_dtype *out) {
    for (int i = 0; i < NL_ST_NDTYPES; i++)
        if (strcmp(name, dtypes[i].name) == 0) {
            *out = (nl_st_dtype)i;
            return NL_OK;
        }
    return nl_fail(NL_ERR_FORMAT, "unknown dtype \"%s\" (known: F32 F16 BF16 I8 U8 I32 I64 F64)", name);
}

/* ---- 16-bit float widening (exact) ---- */

static float f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float nl_st_bf16_to_f32(uint16_t bits) { return f32_from_bits((uint32_t)bits << 16); }

float nl_st_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (exp == 0) { /* zero or subnormal: mant * 2^-24, exact in fp32 */
        float v = (float)mant * 0x1p-24f;
        return sign ? -v : v;
    }
    if (exp == 31) return f32_from_bits(sign | 0x7f800000u | (mant << 13)); /* inf / NaN */
    return f32_from_bits(sign | ((exp + 112u) << 23) | (mant << 13));       /* rebias 15 -> 127 */
}

char *nl_st_shape_str(int ndim, const int64_t *shape, char *buf, size_t n) {
    size_t len = 0;
    if (n == 0) return buf;
    buf[0] = '\0';
    len += (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && len < n; i++)
        len += (size_t)snprintf(buf + len, n - len, "%s%lld", i ? "," : "", (long long)shape[i]);
    if (len < n) snprintf(buf + len, n - len, "]");
    return buf;
}

/* ---- reader ---- */

void nl_st_close(nl_st_file *f) {
    if (!f) return;
    for (int i = 0; i < f->n_tensors; i++) free(f->tensors[i].name);
    free(f->tensors);
    for (int i = 0; i < f->n_meta; i++) {
        free(f->meta_keys[i]);
        free(f->meta_values[i]);
    }
    free(f->meta_keys);
    free(f->meta_values);
    if (f->mapped || f->owned) nl_file_unmap(f->bytes, f->file_bytes, f->mapped);
    free(f->path);
    memset(f, 0, sizeof *f);
}

/* A JSON number that is a non-negative integer <= 2^53. */
static int json_uint(const cJSON *it, uint64_t *out) {
    if (!cJSON_IsNumber(it)) return 0;
    double v = it->valuedouble;
    if (!(v >= 0) || v > 9007199254740992.0 || floor(v) != v) return 0;
    *out = (uint64_t)v;
    return 1;
}

static int cmp_offset(const void *a, const void *b) {
    const nl_st_tensor *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

static int cmp_strp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Fails on the first name that occurs twice in names[0..n). `what` = "tensor"/"metadata key". */
static nl_status check_unique(const char *file, char **names, int n, const char *what) {
    if (n < 2) return NL_OK;
    char **s = malloc((size_t)n * sizeof *s);
    if (!s) return nl_fail(NL_ERR_NOMEM, "out of memory checking %s", file);
    memcpy(s, names, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, cmp_strp);
    for (int i = 1; i < n; i++)
        if (strcmp(s[i - 1], s[i]) == 0) {
            nl_status rc = nl_fail(NL_ERR_FORMAT, "%s: duplicate %s \"%s\" in the header", file, what, s[i]);
            free(s);
            return rc;
        }
    free(s);
    return NL_OK;
}

/* Parses one tensor entry of the header into t (name already set). */
static nl_status parse_tensor(const char *file, const cJSON *e, nl_st_tensor *t) {
    const char *nm = t->name;
    if (!cJSON_IsObject(e))
        return nl_fail(NL_ERR_FORMAT, "%s: tensor \"%s\": header entry is not a JSON object", file, nm);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *of = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(dt))
        return nl_fail(NL_ERR_FORMAT, "%s: tensor \"%s\": missing or non-string \"dtype\"", file, nm);
    if (nl_st_dtype_parse(dt->valuestring, &t->dtype) != NL_OK)
        return nl_fail(NL_ERR_FORMAT, "%s: tensor \"%s\": unknown dtype \"%s\" (known: F32 F16 BF16 I8 U8 I32 I64 F64)",
                       file, nm, dt->valuestring);
    if (!cJSON_IsArray(sh))
        return nl_fail(NL_ERR_FORMAT, "%s: tensor \"%s\": missing or non-array \"shape\"", file, nm);
    int nd = cJSON_GetArraySize(sh);
    if (nd > NL_ST_MAX_DIMS)
        return nl_fail(NL_ERR_FORMAT, "%s: tensor \"%s\" has %d dimensions (at most %d supported)", file, nm, nd,
                       NL_ST_MAX_DIMS);
    t->ndim = nd;
    uint64_t numel = 1;
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, sh) {
        uint64_t d;
        if (!json_uint(it, &d))
            return nl_fail(NL_ERR_FORMAT, "%s: tensor \"%s\": shape[%d] is not a non-negative integer", file, nm, i);
        t->shape[i++] = (int64_t)d;
        if (__builtin_mul_overflow(numel, d, &numel) || numel > (1ULL << 62))
            return nl_fail(NL_ERR_FORMAT, "%s: tensor \"%s\": shape is absurdly large", file, nm);
    }
    t->numel = (int64_t)numel;
    if (!cJSON_IsArray(of) || cJSON_GetArraySize(of) != 2 || !json_uint(cJSON_GetArrayItem(of, 0), &t->begin) ||
        !json_uint(cJSON_GetArrayItem(of, 1), &t->end))
        return nl_fail(NL_ERR_FORMAT,
                       "%s: tensor \"%s\": \"data_offsets\" must be [BEGIN, END] of non-negative integers", file, nm);
    if (t->end < t->begin)
        return nl_fail(NL_ERR_FORMAT, "%s: tensor \"%s\": data_offsets [%llu, %llu] end before they begin", file, nm,
                       (unsigned long long)t->begin, (unsigned long long)t->end);
    uint64_t need;
    if (__builtin_mul_overflow(numel, (uint64_t)nl_st_dtype_size(t->dtype), &need)) {
        char sb[160];
        return nl_fail(NL_ERR_FORMAT, "%s: tensor \"%s\": shape %s of %s needs more than 2^64 bytes", file, nm,
                       nl_st_shape_str(t->ndim, t->shape, sb, sizeof sb), nl_st_dtype_name(t->dtype));
    }
    if (need != t->end - t->begin) {
        char sb[160];
        return nl_fail(NL_ERR_FORMAT, "%s: tensor \"%s\": shape %s of %s needs %llu bytes but offsets span %llu", file,
                       nm, nl_st_shape_str(t->ndim, t->shape, sb, sizeof sb), nl_st_dtype_name(t->dtype),
                       (unsigned long long)need, (unsigned long long)(t->end - t->begin));
    }
    return NL_OK;
}

static nl_status parse_metadata(const char *file, const cJSON *m, nl_st_file *f) {
    if (!cJSON_IsObject(m)) return nl_fail(NL_ERR_FORMAT, "%s: \"__metadata__\" is not a JSON object", file);
    int n = cJSON_GetArraySize(m);
    f->meta_keys = calloc((size_t)n + 1, sizeof(char *));
    f->meta_values = calloc((size_t)n + 1, sizeof(char *));
    if (!f->meta_keys || !f->meta_values) return nl_fail(NL_ERR_NOMEM, "out of memory reading %s", file);
    const cJSON *it;
    cJSON_ArrayForEach(it, m) {
        if (!cJSON_IsString(it))
            return nl_fail(NL_ERR_FORMAT, "%s: __metadata__ value of \"%s\" is not a string", file, it->string);
        f->meta_keys[f->n_meta] = strdup(it->string);
        f->meta_values[f->n_meta] = strdup(it->valuestring);
        f->n_meta++;
        if (!f->meta_keys[f->n_meta - 1] || !f->meta_values[f->n_meta - 1])
            return nl_fail(NL_ERR_NOMEM, "out of memory reading %s", file);
    }
    return check_unique(file, f->meta_keys, f->n_meta, "metadata key");
}

/* Validates the header and data layout of f->bytes[0..file_bytes). */
static nl_status parse_all(nl_st_file *f) {
    const char *file = f->path;
    size_t n = f->file_bytes;
    if (n < 8)
        return nl_fail(NL_ERR_FORMAT,
                       "%s: truncated at byte %zu: a safetensors file starts with an 8-byte header length", file, n);
    uint64_t hn;
    memcpy(&hn, f->bytes, 8);
    if (hn > NL_ST_MAX_HEADER_BYTES)
        return nl_fail(NL_ERR_FORMAT, "%s: header length %llu exceeds the %llu-byte limit (not a safetensors file?)",
                       file, (unsigned long long)hn, (unsigned long long)NL_ST_MAX_HEADER_BYTES);
    if (hn > n - 8)
        return nl_fail(NL_ERR_FORMAT,
                       "%s: truncated at byte %zu: the header needs %llu bytes (file must be at least %llu bytes)",
                       file, n, (unsigned long long)hn, (unsigned long long)(hn + 8));
    if (hn < 2 || f->bytes[8] != '{')
        return nl_fail(NL_ERR_FORMAT, "%s: header does not start with '{' (not a safetensors file?)", file);
    f->header_bytes = hn;
    f->data = f->bytes + 8 + hn;
    f->data_bytes = n - 8 - hn;

    const char *js = (const char *)f->bytes + 8, *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(js, (size_t)hn, &end, 0);
    if (!root) {
        size_t at = end ? (size_t)(end - js) : 0;
        if (!end && cJSON_GetErrorPtr()) at = (size_t)(cJSON_GetErrorPtr() - js);
        return nl_fail(NL_ERR_FORMAT, "%s: malformed JSON in the header near byte %zu", file, 8 + at);
    }
    nl_status rc = NL_OK;
    for (const char *p = end; p < js + hn; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            rc = nl_fail(NL_ERR_FORMAT, "%s: unexpected byte 0x%02x after the header JSON at byte %zu", file,
                         (unsigned char)*p, (size_t)(p - js) + 8);
            goto done;
        }
    if (!cJSON_IsObject(root)) {
        rc = nl_fail(NL_ERR_FORMAT, "%s: header JSON is not an object", file);
        goto done;
    }
    int n_items = cJSON_GetArraySize(root);
    f->tensors = calloc((size_t)n_items + 1, sizeof *f->tensors);
    if (!f->tensors) {
        rc = nl_fail(NL_ERR_NOMEM, "out of memory reading %s", file);
        goto done;
    }
    int seen_meta = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, root) {
        if (strcmp(it->string, "__metadata__") == 0) {
            if (seen_meta++) {
                rc = nl_fail(NL_ERR_FORMAT, "%s: duplicate \"__metadata__\" in the header", file);
                goto done;
            }
            if ((rc = parse_metadata(file, it, f))) goto done;
            continue;
        }
        nl_st_tensor *t = &f->tensors[f->n_tensors++];
        if (!(t->name = strdup(it->string))) {
            rc = nl_fail(NL_ERR_NOMEM, "out of memory reading %s", file);
            goto done;
        }
        if ((rc = parse_tensor(file, it, t))) goto done;
        if (t->end > f->data_bytes) {
            rc = nl_fail(NL_ERR_FORMAT,
                         "%s: truncated at byte %zu: tensor \"%s\" needs data bytes [%llu, %llu) but the data area has "
                         "%llu bytes (file must be at least %llu bytes)",
                         file, n, t->name, (unsigned long long)t->begin, (unsigned long long)t->end,
                         (unsigned long long)f->data_bytes, (unsigned long long)(8 + hn + t->end));
            goto done;
        }
        t->data = f->data + t->begin;
    }
    {
        char **names = malloc(((size_t)f->n_tensors + 1) * sizeof *names);
        if (!names) {
            rc = nl_fail(NL_ERR_NOMEM, "out of memory reading %s", file);
            goto done;
        }
        for (int i = 0; i < f->n_tensors; i++) names[i] = f->tensors[i].name;
        rc = check_unique(file, names, f->n_tensors, "tensor");
        free(names);
        if (rc) goto done;
    }
    /* File order; the tensors must tile the data area exactly. */
    qsort(f->tensors, (size_t)f->n_tensors, sizeof *f->tensors, cmp_offset);
    uint64_t pos = 0;
    for (int i = 0; i < f->n_tensors; i++) {
        const nl_st_tensor *t = &f->tensors[i];
        if (t->begin < pos) {
            rc = nl_fail(NL_ERR_FORMAT,
                         "%s: tensor \"%s\" (data bytes [%llu, %llu)) overlaps tensor \"%s\" (which ends at %llu)",
                         file, t->name, (unsigned long long)t->begin, (unsigned long long)t->end,
                         f->tensors[i - 1].name, (unsigned long long)pos);
            goto done;
        }
        if (t->begin > pos) {
            rc = nl_fail(NL_ERR_FORMAT,
                         "%s: hole in the data area: bytes [%llu, %llu) before tensor \"%s\" belong to no tensor", file,
                         (unsigned long long)pos, (unsigned long long)t->begin, t->name);
            goto done;
        }
        pos = t->end;
    }
    if (pos != f->data_bytes)
        rc = nl_fail(
            NL_ERR_FORMAT,
            "%s: %llu bytes after the last tensor belong to no tensor (data area %llu bytes, tensors end at %llu)",
            file, (unsigned long long)(f->data_bytes - pos), (unsigned long long)f->data_bytes,
            (unsigned long long)pos);
done:
    cJSON_Delete(root);
    return rc;
}

nl_status nl_st_parse(nl_st_file *f, const void *bytes, size_t n, const char *name) {
    memset(f, 0, sizeof *f);
    f->path = strdup(name ? name : "(memory)");
    if (!f->path) return nl_fail(NL_ERR_NOMEM, "out of memory");
    f->bytes = bytes;
    f->file_bytes = n;
    nl_status rc = parse_all(f);
    if (rc) nl_st_close(f);
    return rc;
}

nl_status nl_st_open(nl_st_file *f, const char *path) {
    memset(f, 0, sizeof *f);
    const void *p;
    size_t n;
    int mapped;
    NL_TRY(nl_file_map(path, &p, &n, &mapped));
    f->path = strdup(path);
    f->bytes = p;
    f->file_bytes = n;
    f->mapped = mapped;
    f->owned = !mapped;
    if (!f->path) {
        nl_st_close(f);
        return nl_fail(NL_ERR_NOMEM, "out of memory");
    }
    nl_status rc = parse_all(f);
    if (rc) nl_st_close(f);
    return rc;
}

const nl_st_tensor *nl_st_find(const nl_st_file *f, const char *name) {
    for (int i = 0; i < f->n_tensors; i++)
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}

const char *nl_st_meta(const nl_st_file *f, const char *key) {
    for (int i = 0; i < f->n_meta; i++)
        if (strcmp(f->meta_keys[i], key) == 0) return f->meta_values[i];
    return NULL;
}

void nl_st_tensor_to_f32(const nl_st_tensor *t, float *out) {
    const uint8_t *p = t->data;
    int64_t n = t->numel;
    switch (t->dtype) {
    case NL_ST_F32:
        if (n) memcpy(out, p, (size_t)n * 4);
        break;
    case NL_ST_F16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            out[i] = nl_st_f16_to_f32(h);
        }
        break;
    case NL_ST_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            out[i] = nl_st_bf16_to_f32(h);
        }
        break;
    case NL_ST_I8:
        for (int64_t i = 0; i < n; i++) out[i] = (float)(int8_t)p[i];
        break;
    case NL_ST_U8:
        for (int64_t i = 0; i < n; i++) out[i] = (float)p[i];
        break;
    case NL_ST_I32:
        for (int64_t i = 0; i < n; i++) {
            int32_t v;
            memcpy(&v, p + 4 * i, 4);
            out[i] = (float)v;
        }
        break;
    case NL_ST_I64:
        for (int64_t i = 0; i < n; i++) {
            int64_t v;
            memcpy(&v, p + 8 * i, 8);
            out[i] = (float)v;
        }
        break;
    case NL_ST_F64:
        for (int64_t i = 0; i < n; i++) {
            double v;
            memcpy(&v, p + 8 * i, 8);
            out[i] = (float)v;
        }
        break;
    default: break;
    }
}

nl_status nl_st_read_f32(const nl_st_file *f, const char *name, int ndim, const int64_t *shape, float *out) {
    const nl_st_tensor *t = nl_st_find(f, name);
    if (!t) return nl_fail(NL_ERR_FORMAT, "%s: no tensor \"%s\"", f->path, name);
    int same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = t->shape[i] == shape[i];
    if (!same) {
        char a[160], b[160];
        return nl_fail(NL_ERR_FORMAT, "%s: tensor \"%s\" has shape %s but %s is needed", f->path, name,
                       nl_st_shape_str(t->ndim, t->shape, a, sizeof a), nl_st_shape_str(ndim, shape, b, sizeof b));
    }
    nl_st_tensor_to_f32(t, out);
    return NL_OK;
}

/* ---- writer ---- */

void nl_st_writer_init(nl_st_writer *w) { memset(w, 0, sizeof *w); }

void nl_st_writer_free(nl_st_writer *w) {
    for (int i = 0; i < w->n_tensors; i++) {
        free(w->tensors[i].name);
        nl_free(w->tensors[i].owned);
    }
    free(w->tensors);
    for (int i = 0; i < w->n_meta; i++) {
        free(w->meta_keys[i]);
        free(w->meta_values[i]);
    }
    free(w->meta_keys);
    free(w->meta_values);
    memset(w, 0, sizeof *w);
}

nl_status nl_st_writer_add(nl_st_writer *w, const char *name, nl_st_dtype dtype, int ndim, const int64_t *shape,
                           const void *data) {
    if (!name || !*name) return nl_fail(NL_ERR_INVALID, "safetensors writer: empty tensor name");
    if (strcmp(name, "__metadata__") == 0)
        return nl_fail(NL_ERR_INVALID, "safetensors writer: \"__metadata__\" cannot name a tensor");
    if ((unsigned)dtype >= NL_ST_NDTYPES)
        return nl_fail(NL_ERR_INVALID, "safetensors writer: tensor \"%s\": unknown dtype %d", name, (int)dtype);
    if (ndim < 0 || ndim > NL_ST_MAX_DIMS)
        return nl_fail(NL_ERR_INVALID, "safetensors writer: tensor \"%s\": %d dimensions (0..%d supported)", name, ndim,
                       NL_ST_MAX_DIMS);
    uint64_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return nl_fail(NL_ERR_INVALID, "safetensors writer: tensor \"%s\": shape[%d] = %lld is negative", name, i,
                           (long long)shape[i]);
        if (__builtin_mul_overflow(numel, (uint64_t)shape[i], &numel) || numel > (1ULL << 60))
            return nl_fail(NL_ERR_INVALID, "safetensors writer: tensor \"%s\": shape too large", name);
    }
    uint64_t bytes = numel * nl_st_dtype_size(dtype);
    if (bytes && !data) return nl_fail(NL_ERR_INVALID, "safetensors writer: tensor \"%s\": NULL data", name);
    for (int i = 0; i < w->n_tensors; i++)
        if (strcmp(w->tensors[i].name, name) == 0)
            return nl_fail(NL_ERR_INVALID, "safetensors writer: duplicate tensor name \"%s\"", name);
    if (w->n_tensors == w->cap_tensors) {
        int cap = w->cap_tensors ? 2 * w->cap_tensors : 32;
        nl_st_writer_tensor *nt = realloc(w->tensors, (size_t)cap * sizeof *nt);
        if (!nt) return nl_fail(NL_ERR_NOMEM, "out of memory adding tensor \"%s\"", name);
        w->tensors = nt;
        w->cap_tensors = cap;
    }
    nl_st_writer_tensor *t = &w->tensors[w->n_tensors];
    memset(t, 0, sizeof *t);
    if (!(t->name = strdup(name))) return nl_fail(NL_ERR_NOMEM, "out of memory adding tensor \"%s\"", name);
    t->dtype = dtype;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    t->bytes = bytes;
    t->data = data;
    w->n_tensors++;
    return NL_OK;
}

nl_status nl_st_writer_add_owned(nl_st_writer *w, const char *name, nl_st_dtype dtype, int ndim, const int64_t *shape,
                                 void *data) {
    nl_status rc = nl_st_writer_add(w, name, dtype, ndim, shape, data);
    if (rc) {
        nl_free(data);
        return rc;
    }
    w->tensors[w->n_tensors - 1].owned = data;
    return NL_OK;
}

nl_status nl_st_writer_meta(nl_st_writer *w, const char *key, const char *value) {
    if (!key || !value) return nl_fail(NL_ERR_INVALID, "safetensors writer: NULL metadata key or value");
    for (int i = 0; i < w->n_meta; i++)
        if (strcmp(w->meta_keys[i], key) == 0) {
            char *v = strdup(value);
            if (!v) return nl_fail(NL_ERR_NOMEM, "out of memory setting metadata \"%s\"", key);
            free(w->meta_values[i]);
            w->meta_values[i] = v;
            return NL_OK;
        }
    if (w->n_meta == w->cap_meta) {
        int cap = w->cap_meta ? 2 * w->cap_meta : 16;
        char **k = realloc(w->meta_keys, (size_t)cap * sizeof *k);
        if (!k) return nl_fail(NL_ERR_NOMEM, "out of memory setting metadata \"%s\"", key);
        w->meta_keys = k;
        char **v = realloc(w->meta_values, (size_t)cap * sizeof *v);
        if (!v) return nl_fail(NL_ERR_NOMEM, "out of memory setting metadata \"%s\"", key);
        w->meta_values = v;
        w->cap_meta = cap;
    }
    char *k = strdup(key), *v = strdup(value);
    if (!k || !v) {
        free(k);
        free(v);
        return nl_fail(NL_ERR_NOMEM, "out of memory setting metadata \"%s\"", key);
    }
    w->meta_keys[w->n_meta] = k;
    w->meta_values[w->n_meta] = v;
    w->n_meta++;
    return NL_OK;
}

/* A JSON integer printed exactly (cJSON would go through a double and %g). */
static cJSON *json_int(uint64_t v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%llu", (unsigned long long)v);
    return cJSON_CreateRaw(buf);
}

/* Builds the header text, padded with spaces so that 8 + length is a multiple of 8. */
static char *build_header(const nl_st_writer *w, size_t *len_out) {
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    int ok = 1;
    if (w->n_meta) {
        cJSON *m = cJSON_AddObjectToObject(root, "__metadata__");
        ok = m != NULL;
        for (int i = 0; ok && i < w->n_meta; i++)
            ok = cJSON_AddStringToObject(m, w->meta_keys[i], w->meta_values[i]) != NULL;
    }
    uint64_t off = 0;
    for (int i = 0; ok && i < w->n_tensors; i++) {
        const nl_st_writer_tensor *t = &w->tensors[i];
        cJSON *e = cJSON_AddObjectToObject(root, t->name);
        cJSON *shape = e ? cJSON_CreateArray() : NULL, *offs = e ? cJSON_CreateArray() : NULL;
        ok = e && shape && offs && cJSON_AddStringToObject(e, "dtype", nl_st_dtype_name(t->dtype));
        if (shape) cJSON_AddItemToObject(e, "shape", shape);
        if (offs) cJSON_AddItemToObject(e, "data_offsets", offs);
        for (int d = 0; ok && d < t->ndim; d++) ok = cJSON_AddItemToArray(shape, json_int((uint64_t)t->shape[d]));
        ok = ok && cJSON_AddItemToArray(offs, json_int(off)) && cJSON_AddItemToArray(offs, json_int(off + t->bytes));
        off += t->bytes;
    }
    char *js = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!js) return NULL;
    size_t n = strlen(js), padded = (n + 7) / 8 * 8; /* 8 + padded is then a multiple of 8 */
    char *out = malloc(padded + 1);
    if (out) {
        memcpy(out, js, n);
        memset(out + n, ' ', padded - n);
        out[padded] = '\0';
        *len_out = padded;
    }
    cJSON_free(js);
    return out;
}

nl_status nl_st_writer_write(const nl_st_writer *w, const char *path) {
    size_t hlen = 0;
    char *header = build_header(w, &hlen);
    if (!header) return nl_fail(NL_ERR_NOMEM, "out of memory building the safetensors header for %s", path);
    nl_atomic_file af;
    nl_status rc = nl_atomic_open(&af, path);
    if (rc) {
        free(header);
        return rc;
    }
    uint64_t hn = hlen;
    rc = nl_atomic_write(&af, &hn, 8);
    if (!rc) rc = nl_atomic_write(&af, header, hlen);
    free(header);
    for (int i = 0; !rc && i < w->n_tensors; i++)
        rc = nl_atomic_write(&af, w->tensors[i].data, (size_t)w->tensors[i].bytes);
    if (rc) {
        nl_atomic_abort(&af);
        return rc;
    }
    return nl_atomic_commit(&af);
}
