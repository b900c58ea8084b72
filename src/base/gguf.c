/* GGUF reader (validating, mmap) and atomic writer. See include/nanolm/gguf.h. */
#include "nanolm/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "nanolm/resources.h"

#define GGUF_MAGIC 0x46554747u /* "GGUF" little-endian */

/* ---- types --------------------------------------------------------------------------------- */

static const struct {
    uint32_t type;
    const char *name;
    int64_t blck, bytes;
} ggml_types[] = {
    {NL_GGML_F32, "f32", 1, 4},       {NL_GGML_F16, "f16", 1, 2},       {NL_GGML_Q4_0, "q4_0", 32, 18},
    {NL_GGML_Q4_1, "q4_1", 32, 20},   {NL_GGML_Q5_0, "q5_0", 32, 22},   {NL_GGML_Q5_1, "q5_1", 32, 24},
    {NL_GGML_Q8_0, "q8_0", 32, 34},   {NL_GGML_Q8_1, "q8_1", 32, 36},   {NL_GGML_Q2_K, "q2_K", 256, 84},
    {NL_GGML_Q3_K, "q3_K", 256, 110}, {NL_GGML_Q4_K, "q4_K", 256, 144}, {NL_GGML_Q5_K, "q5_K", 256, 176},
    {NL_GGML_Q6_K, "q6_K", 256, 210}, {NL_GGML_Q8_K, "q8_K", 256, 292}, {NL_GGML_I8, "i8", 1, 1},
    {NL_GGML_I16, "i16", 1, 2},       {NL_GGML_I32, "i32", 1, 4},       {NL_GGML_I64, "i64", 1, 8},
    {NL_GGML_F64, "f64", 1, 8},       {NL_GGML_BF16, "bf16", 1, 2},
};
#define N_GGML_TYPES (sizeof ggml_types / sizeof ggml_types[0])

static int type_index(uint32_t t) {
    for (size_t i = 0; i < N_GGML_TYPES; i++)
        if (ggml_types[i].type == t) return (int)i;
    return -1;
}
const char *nl_ggml_type_name(uint32_t type) {
    int i = type_index(type);
    return i < 0 ? NULL : ggml_types[i].name;
}
int64_t nl_ggml_block_elems(uint32_t type) {
    int i = type_index(type);
    return i < 0 ? 0 : ggml_types[i].blck;
}
static int64_t ggml_block_bytes(uint32_t type) {
    int i = type_index(type);
    return i < 0 ? 0 : ggml_types[i].bytes;
}

static const char *vtype_names[NL_GGUF_NVTYPES] = {"uint8", "int8",   "uint16", "int16",  "uint32", "int32",  "float32",
                                                   "bool",  "string", "array",  "uint64", "int64",  "float64"};
const char *nl_gguf_vtype_name(uint32_t vtype) { return vtype < NL_GGUF_NVTYPES ? vtype_names[vtype] : "?"; }

/* Bytes of one fixed-size value; 0 for STRING, ARRAY and unknown types. */
static size_t vtype_size(uint32_t t) {
    switch (t) {
    case NL_GGUF_UINT8:
    case NL_GGUF_INT8:
    case NL_GGUF_BOOL: return 1;
    case NL_GGUF_UINT16:
    case NL_GGUF_INT16: return 2;
    case NL_GGUF_UINT32:
    case NL_GGUF_INT32:
    case NL_GGUF_FLOAT32: return 4;
    case NL_GGUF_UINT64:
    case NL_GGUF_INT64:
    case NL_GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

uint64_t nl_ggml_nbytes(uint32_t type, int ndim, const int64_t *ne) {
    int64_t blck = nl_ggml_block_elems(type), bb = ggml_block_bytes(type);
    if (!blck || ndim < 1 || ndim > NL_GGUF_MAX_DIMS || ne[0] < 1 || ne[0] % blck) return 0;
    uint64_t rows = 1;
    for (int d = 1; d < ndim; d++) {
        if (ne[d] < 1 || rows > UINT64_MAX / (uint64_t)ne[d]) return 0;
        rows *= (uint64_t)ne[d];
    }
    uint64_t row = (uint64_t)(ne[0] / blck) * (uint64_t)bb;
    if (row && rows > (UINT64_MAX / 2) / row) return 0;
    return rows * row;
}

/* ---- reader -------------------------------------------------------------------------------- */

typedef struct cursor {
    const uint8_t *p;
    size_t pos, n;
    const char *name;
} cursor;

static uint64_t rd_le(const uint8_t *p, size_t k) {
    uint64_t v = 0;
    for (size_t i = 0; i < k; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static nl_status need(cursor *c, uint64_t k, const char *what) {
    if (k > c->n - c->pos)
        return nl_fail(NL_ERR_FORMAT, "%s: truncated at byte %zu: %s needs %" PRIu64 " bytes, %zu left", c->name,
                       c->pos, what, k, c->n - c->pos);
    return NL_OK;
}
static nl_status get_u32(cursor *c, uint32_t *v, const char *what) {
    NL_TRY(need(c, 4, what));
    *v = (uint32_t)rd_le(c->p + c->pos, 4);
    c->pos += 4;
    return NL_OK;
}
static nl_status get_u64(cursor *c, uint64_t *v, const char *what) {
    NL_TRY(need(c, 8, what));
    *v = rd_le(c->p + c->pos, 8);
    c->pos += 8;
    return NL_OK;
}
/* A string: u64 length (checked against the bytes left) and its bytes. */
static nl_status get_str(cursor *c, const char **s, uint64_t *len, const char *what) {
    size_t at = c->pos;
    NL_TRY(get_u64(c, len, what));
    if (*len > c->n - c->pos)
        return nl_fail(NL_ERR_FORMAT, "%s: byte %zu: %s has length %" PRIu64 " but only %zu bytes are left", c->name,
                       at, what, *len, c->n - c->pos);
    *s = (const char *)c->p + c->pos;
    c->pos += (size_t)*len;
    return NL_OK;
}
/* A key or tensor name: non-empty, no NUL, capped; copied NUL-terminated. */
static nl_status get_name(cursor *c, char **out, const char *what) {
    const char *s = NULL;
    uint64_t len = 0;
    size_t at = c->pos;
    NL_TRY(get_str(c, &s, &len, what));
    if (len == 0) return nl_fail(NL_ERR_FORMAT, "%s: byte %zu: %s is empty", c->name, at, what);
    if (len > NL_GGUF_MAX_NAME)
        return nl_fail(NL_ERR_FORMAT, "%s: byte %zu: %s is %" PRIu64 " bytes long (at most %d)", c->name, at, what, len,
                       NL_GGUF_MAX_NAME);
    if (memchr(s, 0, (size_t)len))
        return nl_fail(NL_ERR_FORMAT, "%s: byte %zu: %s contains a NUL byte", c->name, at, what);
    *out = malloc((size_t)len + 1);
    if (!*out) return nl_fail(NL_ERR_NOMEM, "%s: out of memory", c->name);
    memcpy(*out, s, (size_t)len);
    (*out)[len] = 0;
    return NL_OK;
}

static nl_status read_scalar(cursor *c, nl_gguf_kv *kv, uint32_t t) {
    size_t k = vtype_size(t);
    NL_TRY(need(c, k, kv->key));
    uint64_t raw = rd_le(c->p + c->pos, k);
    c->pos += k;
    switch (t) {
    case NL_GGUF_INT8: kv->v.i = (int8_t)raw; break;
    case NL_GGUF_INT16: kv->v.i = (int16_t)raw; break;
    case NL_GGUF_INT32: kv->v.i = (int32_t)raw; break;
    case NL_GGUF_INT64: kv->v.i = (int64_t)raw; break;
    case NL_GGUF_FLOAT32: {
        uint32_t b = (uint32_t)raw;
        float f;
        memcpy(&f, &b, 4);
        kv->v.f = f;
        break;
    }
    case NL_GGUF_FLOAT64: memcpy(&kv->v.f, &raw, 8); break;
    case NL_GGUF_BOOL:
        if (raw > 1)
            return nl_fail(NL_ERR_FORMAT, "%s: byte %zu: KV %s: bool value %u is neither 0 nor 1", c->name, c->pos - 1,
                           kv->key, (unsigned)raw);
        kv->v.u = raw;
        break;
    default: kv->v.u = raw; break;
    }
    return NL_OK;
}

static nl_status read_kv(cursor *c, nl_gguf_kv *kv, int64_t idx) {
    char what[64];
    snprintf(what, sizeof what, "key of KV %" PRId64, idx);
    NL_TRY(get_name(c, &kv->key, what));
    uint32_t t;
    size_t at = c->pos;
    NL_TRY(get_u32(c, &t, kv->key));
    if (t >= NL_GGUF_NVTYPES)
        return nl_fail(NL_ERR_FORMAT, "%s: byte %zu: KV %s has unknown value type %u", c->name, at, kv->key, t);
    kv->type = (nl_gguf_vtype)t;
    kv->n = 1;
    if (t == NL_GGUF_STRING) return get_str(c, &kv->str, &kv->str_len, kv->key);
    if (t != NL_GGUF_ARRAY) return read_scalar(c, kv, t);
    uint32_t et;
    at = c->pos;
    NL_TRY(get_u32(c, &et, kv->key));
    if (et >= NL_GGUF_NVTYPES)
        return nl_fail(NL_ERR_FORMAT, "%s: byte %zu: KV %s: array of unknown type %u", c->name, at, kv->key, et);
    if (et == NL_GGUF_ARRAY)
        return nl_fail(NL_ERR_FORMAT, "%s: byte %zu: KV %s: arrays of arrays are not supported", c->name, at, kv->key);
    kv->arr_type = (nl_gguf_vtype)et;
    at = c->pos;
    NL_TRY(get_u64(c, &kv->n, kv->key));
    kv->arr = c->p + c->pos;
    size_t left = c->n - c->pos;
    if (et != NL_GGUF_STRING) {
        size_t k = vtype_size(et);
        if (kv->n > left / k)
            return nl_fail(NL_ERR_FORMAT,
                           "%s: byte %zu: KV %s: array of %" PRIu64 " %s needs more than the %zu bytes left", c->name,
                           at, kv->key, kv->n, vtype_names[et], left);
        if (et == NL_GGUF_BOOL)
            for (uint64_t i = 0; i < kv->n; i++)
                if (kv->arr[i] > 1)
                    return nl_fail(NL_ERR_FORMAT, "%s: KV %s[%" PRIu64 "]: bool value %u is neither 0 nor 1", c->name,
                                   kv->key, i, kv->arr[i]);
        c->pos += (size_t)(kv->n * k);
        return NL_OK;
    }
    if (kv->n > left / 8)
        return nl_fail(NL_ERR_FORMAT,
                       "%s: byte %zu: KV %s: array of %" PRIu64 " strings needs more than the %zu bytes left", c->name,
                       at, kv->key, kv->n, left);
    kv->arr_strs = malloc((size_t)(kv->n ? kv->n : 1) * sizeof *kv->arr_strs);
    if (!kv->arr_strs) return nl_fail(NL_ERR_NOMEM, "%s: out of memory", c->name);
    for (uint64_t i = 0; i < kv->n; i++) {
        const char *s = NULL;
        uint64_t len = 0;
        kv->arr_strs[i] = c->p + c->pos;
        char w2[96];
        snprintf(w2, sizeof w2, "KV %.40s[%" PRIu64 "]", kv->key, i);
        NL_TRY(get_str(c, &s, &len, w2));
    }
    return NL_OK;
}

static nl_status read_tensor(cursor *c, nl_gguf_tensor *t, int64_t idx) {
    char what[64];
    snprintf(what, sizeof what, "name of tensor %" PRId64, idx);
    NL_TRY(get_name(c, &t->name, what));
    uint32_t nd;
    size_t at = c->pos;
    NL_TRY(get_u32(c, &nd, t->name));
    if (nd < 1 || nd > NL_GGUF_MAX_DIMS)
        return nl_fail(NL_ERR_FORMAT, "%s: byte %zu: tensor %s has %u dimensions (1..%d)", c->name, at, t->name, nd,
                       NL_GGUF_MAX_DIMS);
    t->ndim = (int)nd;
    for (int d = 0; d < NL_GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (int d = 0; d < t->ndim; d++) {
        uint64_t v;
        at = c->pos;
        NL_TRY(get_u64(c, &v, t->name));
        if (v < 1 || v > (uint64_t)INT64_MAX)
            return nl_fail(NL_ERR_FORMAT, "%s: byte %zu: tensor %s: dimension %d is %" PRIu64 " (must be >= 1)",
                           c->name, at, t->name, d, v);
        t->ne[d] = (int64_t)v;
    }
    at = c->pos;
    NL_TRY(get_u32(c, &t->type, t->name));
    if (!nl_ggml_type_name(t->type))
        return nl_fail(NL_ERR_FORMAT, "%s: byte %zu: tensor %s has unknown ggml type %u", c->name, at, t->name,
                       t->type);
    int64_t blck = nl_ggml_block_elems(t->type);
    if (t->ne[0] % blck)
        return nl_fail(NL_ERR_FORMAT, "%s: tensor %s: row of %" PRId64 " elements is not whole %s blocks of %" PRId64,
                       c->name, t->name, t->ne[0], nl_ggml_type_name(t->type), blck);
    uint64_t numel = 1;
    for (int d = 0; d < t->ndim; d++) {
        if (numel > (uint64_t)INT64_MAX / (uint64_t)t->ne[d])
            return nl_fail(NL_ERR_FORMAT, "%s: tensor %s: element count overflows", c->name, t->name);
        numel *= (uint64_t)t->ne[d];
    }
    t->numel = (int64_t)numel;
    t->bytes = nl_ggml_nbytes(t->type, t->ndim, t->ne);
    if (!t->bytes) return nl_fail(NL_ERR_FORMAT, "%s: tensor %s: byte size overflows", c->name, t->name);
    return get_u64(c, &t->offset, t->name);
}

static int cmp_tensor_off(const void *a, const void *b) {
    const nl_gguf_tensor *x = *(nl_gguf_tensor *const *)a, *y = *(nl_gguf_tensor *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}
static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Finds a duplicate among n names (sorted copy of the pointers); returns it or NULL. */
static const char *find_dup(char **names, int64_t n, nl_status *rc) {
    *rc = NL_OK;
    if (n < 2) return NULL;
    char **s = malloc((size_t)n * sizeof *s);
    if (!s) {
        *rc = nl_fail(NL_ERR_NOMEM, "out of memory");
        return NULL;
    }
    memcpy(s, names, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, cmp_str);
    const char *dup = NULL;
    for (int64_t i = 1; i < n && !dup; i++)
        if (!strcmp(s[i - 1], s[i])) dup = s[i];
    free(s);
    return dup;
}

static nl_status parse_all(nl_gguf_file *f) {
    cursor c = {f->bytes, 0, f->file_bytes, f->path};
    uint32_t magic;
    NL_TRY(get_u32(&c, &magic, "the magic"));
    if (magic != GGUF_MAGIC) return nl_fail(NL_ERR_FORMAT, "%s: not a GGUF file (magic 0x%08x)", f->path, magic);
    NL_TRY(get_u32(&c, &f->version, "the version"));
    if (f->version != 2 && f->version != 3)
        return nl_fail(NL_ERR_FORMAT, "%s: GGUF version %u is not supported (2 and 3 are)", f->path, f->version);
    uint64_t nt, nkv;
    NL_TRY(get_u64(&c, &nt, "the tensor count"));
    NL_TRY(get_u64(&c, &nkv, "the KV count"));
    /* a KV takes at least 8 + 1 + 4 + 1 bytes and a tensor 8 + 1 + 4 + 8 + 4 + 8 */
    size_t left = c.n - c.pos;
    if (nkv > left / 14)
        return nl_fail(NL_ERR_FORMAT, "%s: KV count %" PRIu64 " cannot fit in the %zu bytes left", f->path, nkv, left);
    if (nt > left / 33)
        return nl_fail(NL_ERR_FORMAT, "%s: tensor count %" PRIu64 " cannot fit in the %zu bytes left", f->path, nt,
                       left);
    f->kv = calloc(nkv ? nkv : 1, sizeof *f->kv);
    f->tensors = calloc(nt ? nt : 1, sizeof *f->tensors);
    if (!f->kv || !f->tensors) return nl_fail(NL_ERR_NOMEM, "%s: out of memory", f->path);
    f->alignment = NL_GGUF_DEFAULT_ALIGNMENT;
    for (uint64_t i = 0; i < nkv; i++) {
        f->n_kv = (int64_t)i + 1;
        NL_TRY(read_kv(&c, &f->kv[i], (int64_t)i));
        if (!strcmp(f->kv[i].key, "general.alignment")) {
            if (f->kv[i].type != NL_GGUF_UINT32)
                return nl_fail(NL_ERR_FORMAT, "%s: KV general.alignment has type %s, expected uint32", f->path,
                               vtype_names[f->kv[i].type]);
            uint64_t a = f->kv[i].v.u;
            if (a == 0 || (a & (a - 1)) || a > (1u << 20))
                return nl_fail(NL_ERR_FORMAT, "%s: general.alignment %" PRIu64 " is not a power of two up to 2^20",
                               f->path, a);
            f->alignment = (uint32_t)a;
        }
    }
    nl_status rc;
    uint64_t nmax = nkv > nt ? nkv : nt;
    char **names = malloc((size_t)(nmax ? nmax : 1) * sizeof *names);
    if (!names) return nl_fail(NL_ERR_NOMEM, "%s: out of memory", f->path);
    for (uint64_t i = 0; i < nkv; i++) names[i] = f->kv[i].key;
    const char *dup = find_dup(names, (int64_t)nkv, &rc);
    if (rc || dup) {
        free(names);
        return rc ? rc : nl_fail(NL_ERR_FORMAT, "%s: duplicate KV %s", f->path, dup);
    }
    for (uint64_t i = 0; i < nt; i++) {
        f->n_tensors = (int64_t)i + 1;
        rc = read_tensor(&c, &f->tensors[i], (int64_t)i);
        if (rc) {
            free(names);
            return rc;
        }
        names[i] = f->tensors[i].name;
    }
    dup = find_dup(names, (int64_t)nt, &rc);
    free(names);
    if (rc || dup) return rc ? rc : nl_fail(NL_ERR_FORMAT, "%s: duplicate tensor %s", f->path, dup);
    uint64_t start = ((uint64_t)c.pos + f->alignment - 1) / f->alignment * f->alignment;
    if (nt && start > c.n)
        return nl_fail(NL_ERR_FORMAT, "%s: truncated: the data area starts at byte %" PRIu64 " past the end (%zu)",
                       f->path, start, c.n);
    f->data_start = start > c.n ? c.n : start;
    uint64_t data_bytes = c.n - f->data_start;
    nl_gguf_tensor **order = malloc((size_t)(nt ? nt : 1) * sizeof *order);
    if (!order) return nl_fail(NL_ERR_NOMEM, "%s: out of memory", f->path);
    for (uint64_t i = 0; i < nt; i++) {
        nl_gguf_tensor *t = &f->tensors[i];
        order[i] = t;
        if (t->offset % f->alignment) {
            free(order);
            return nl_fail(NL_ERR_FORMAT, "%s: tensor %s: offset %" PRIu64 " is not a multiple of the alignment %u",
                           f->path, t->name, t->offset, f->alignment);
        }
        if (t->offset > data_bytes || t->bytes > data_bytes - t->offset) {
            free(order);
            return nl_fail(NL_ERR_FORMAT,
                           "%s: tensor %s: bytes [%" PRIu64 ", %" PRIu64 "+%" PRIu64
                           ") run past the data area (%" PRIu64 " bytes)",
                           f->path, t->name, t->offset, t->offset, t->bytes, data_bytes);
        }
        t->data = f->bytes + f->data_start + t->offset;
    }
    qsort(order, (size_t)nt, sizeof *order, cmp_tensor_off);
    for (uint64_t i = 1; i < nt; i++)
        if (order[i - 1]->offset + order[i - 1]->bytes > order[i]->offset) {
            rc = nl_fail(NL_ERR_FORMAT, "%s: tensors %s and %s overlap", f->path, order[i - 1]->name, order[i]->name);
            free(order);
            return rc;
        }
    free(order);
    return NL_OK;
}

nl_status nl_gguf_parse(nl_gguf_file *f, const void *bytes, size_t n, const char *name) {
    memset(f, 0, sizeof *f);
    f->path = strdup(name ? name : "gguf");
    if (!f->path) return nl_fail(NL_ERR_NOMEM, "out of memory");
    f->bytes = bytes;
    f->file_bytes = n;
    nl_status rc = parse_all(f);
    if (rc) nl_gguf_close(f);
    return rc;
}

nl_status nl_gguf_open(nl_gguf_file *f, const char *path) {
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
        nl_gguf_close(f);
        return nl_fail(NL_ERR_NOMEM, "out of memory");
    }
    nl_status rc = parse_all(f);
    if (rc) nl_gguf_close(f);
    return rc;
}

void nl_gguf_close(nl_gguf_file *f) {
    if (!f) return;
    for (int64_t i = 0; f->kv && i < f->n_kv; i++) {
        free(f->kv[i].key);
        free(f->kv[i].arr_strs);
    }
    for (int64_t i = 0; f->tensors && i < f->n_tensors; i++) free(f->tensors[i].name);
    free(f->kv);
    free(f->tensors);
    if (f->mapped || f->owned) nl_file_unmap(f->bytes, f->file_bytes, f->mapped);
    free(f->path);
    memset(f, 0, sizeof *f);
}

const nl_gguf_kv *nl_gguf_find_kv(const nl_gguf_file *f, const char *key) {
    for (int64_t i = 0; i < f->n_kv; i++)
        if (!strcmp(f->kv[i].key, key)) return &f->kv[i];
    return NULL;
}
const nl_gguf_tensor *nl_gguf_find_tensor(const nl_gguf_file *f, const char *name) {
    for (int64_t i = 0; i < f->n_tensors; i++)
        if (!strcmp(f->tensors[i].name, name)) return &f->tensors[i];
    return NULL;
}

static int is_int_type(uint32_t t) {
    return t == NL_GGUF_UINT8 || t == NL_GGUF_INT8 || t == NL_GGUF_UINT16 || t == NL_GGUF_INT16 ||
           t == NL_GGUF_UINT32 || t == NL_GGUF_INT32 || t == NL_GGUF_UINT64 || t == NL_GGUF_INT64 || t == NL_GGUF_BOOL;
}
static int is_signed_type(uint32_t t) {
    return t == NL_GGUF_INT8 || t == NL_GGUF_INT16 || t == NL_GGUF_INT32 || t == NL_GGUF_INT64;
}

nl_status nl_gguf_get_int_def(const nl_gguf_file *f, const char *key, int64_t def, int64_t *out) {
    const nl_gguf_kv *kv = nl_gguf_find_kv(f, key);
    if (!kv) {
        *out = def;
        return NL_OK;
    }
    if (!is_int_type(kv->type))
        return nl_fail(NL_ERR_FORMAT, "%s: KV %s has type %s, expected an integer", f->path, key,
                       vtype_names[kv->type]);
    if (!is_signed_type(kv->type) && kv->v.u > (uint64_t)INT64_MAX)
        return nl_fail(NL_ERR_FORMAT, "%s: KV %s = %" PRIu64 " is out of range", f->path, key, kv->v.u);
    *out = is_signed_type(kv->type) ? kv->v.i : (int64_t)kv->v.u;
    return NL_OK;
}
nl_status nl_gguf_get_int(const nl_gguf_file *f, const char *key, int64_t *out) {
    if (!nl_gguf_find_kv(f, key)) return nl_fail(NL_ERR_FORMAT, "%s: no KV %s", f->path, key);
    return nl_gguf_get_int_def(f, key, 0, out);
}
nl_status nl_gguf_get_float_def(const nl_gguf_file *f, const char *key, double def, double *out) {
    const nl_gguf_kv *kv = nl_gguf_find_kv(f, key);
    if (!kv) {
        *out = def;
        return NL_OK;
    }
    if (kv->type == NL_GGUF_FLOAT32 || kv->type == NL_GGUF_FLOAT64) {
        *out = kv->v.f;
        return NL_OK;
    }
    if (is_int_type(kv->type) && kv->type != NL_GGUF_BOOL) {
        *out = is_signed_type(kv->type) ? (double)kv->v.i : (double)kv->v.u;
        return NL_OK;
    }
    return nl_fail(NL_ERR_FORMAT, "%s: KV %s has type %s, expected a number", f->path, key, vtype_names[kv->type]);
}
nl_status nl_gguf_get_float(const nl_gguf_file *f, const char *key, double *out) {
    if (!nl_gguf_find_kv(f, key)) return nl_fail(NL_ERR_FORMAT, "%s: no KV %s", f->path, key);
    return nl_gguf_get_float_def(f, key, 0, out);
}
nl_status nl_gguf_get_str(const nl_gguf_file *f, const char *key, const char **s, uint64_t *len) {
    const nl_gguf_kv *kv = nl_gguf_find_kv(f, key);
    if (!kv) return nl_fail(NL_ERR_FORMAT, "%s: no KV %s", f->path, key);
    if (kv->type != NL_GGUF_STRING)
        return nl_fail(NL_ERR_FORMAT, "%s: KV %s has type %s, expected string", f->path, key, vtype_names[kv->type]);
    *s = kv->str;
    *len = kv->str_len;
    return NL_OK;
}
int nl_gguf_str_copy(const nl_gguf_file *f, const char *key, char *buf, size_t buf_bytes) {
    const nl_gguf_kv *kv = nl_gguf_find_kv(f, key);
    if (buf_bytes) buf[0] = 0;
    if (!kv || kv->type != NL_GGUF_STRING || !buf_bytes) return 0;
    size_t k = kv->str_len < buf_bytes - 1 ? (size_t)kv->str_len : buf_bytes - 1;
    memcpy(buf, kv->str, k);
    buf[k] = 0;
    return 1;
}
const char *nl_gguf_arr_str(const nl_gguf_kv *kv, uint64_t i, uint64_t *len) {
    *len = rd_le(kv->arr_strs[i], 8);
    return (const char *)kv->arr_strs[i] + 8;
}
double nl_gguf_arr_float(const nl_gguf_kv *kv, uint64_t i) {
    size_t k = vtype_size(kv->arr_type);
    uint64_t raw = rd_le(kv->arr + i * k, k);
    if (kv->arr_type == NL_GGUF_FLOAT32) {
        uint32_t b = (uint32_t)raw;
        float x;
        memcpy(&x, &b, 4);
        return x;
    }
    if (kv->arr_type == NL_GGUF_FLOAT64) {
        double x;
        memcpy(&x, &raw, 8);
        return x;
    }
    return (double)nl_gguf_arr_int(kv, i);
}
int64_t nl_gguf_arr_int(const nl_gguf_kv *kv, uint64_t i) {
    size_t k = vtype_size(kv->arr_type);
    uint64_t raw = rd_le(kv->arr + i * k, k);
    switch (kv->arr_type) {
    case NL_GGUF_INT8: return (int8_t)raw;
    case NL_GGUF_INT16: return (int16_t)raw;
    case NL_GGUF_INT32: return (int32_t)raw;
    default: return (int64_t)raw;
    }
}

/* ---- writer -------------------------------------------------------------------------------- */

void nl_gguf_writer_init(nl_gguf_writer *w) { memset(w, 0, sizeof *w); }

void nl_gguf_writer_free(nl_gguf_writer *w) {
    for (int64_t i = 0; i < w->n_kv; i++) free(w->keys[i]);
    free(w->keys);
    free(w->kv_bytes);
    for (int64_t i = 0; i < w->n_tensors; i++) {
        free(w->tensors[i].name);
        nl_free(w->tensors[i].owned);
    }
    free(w->tensors);
    memset(w, 0, sizeof *w);
}

static nl_status put(nl_gguf_writer *w, const void *p, size_t k) {
    if (w->kv_len + k > w->kv_cap) {
        size_t cap = w->kv_cap ? w->kv_cap : 256;
        while (cap < w->kv_len + k) cap *= 2;
        uint8_t *b = realloc(w->kv_bytes, cap);
        if (!b) return nl_fail(NL_ERR_NOMEM, "gguf writer: out of memory");
        w->kv_bytes = b;
        w->kv_cap = cap;
    }
    memcpy(w->kv_bytes + w->kv_len, p, k);
    w->kv_len += k;
    return NL_OK;
}
static nl_status put_u32(nl_gguf_writer *w, uint32_t v) {
    uint8_t b[4];
    for (int i = 0; i < 4; i++) b[i] = (uint8_t)(v >> (8 * i));
    return put(w, b, 4);
}
static nl_status put_u64(nl_gguf_writer *w, uint64_t v) {
    uint8_t b[8];
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
    return put(w, b, 8);
}
static nl_status put_str(nl_gguf_writer *w, const char *s, uint64_t len) {
    NL_TRY(put_u64(w, len));
    return put(w, s, (size_t)len);
}

/* Starts a KV: checks the key, records it, writes key and type. */
static nl_status kv_begin(nl_gguf_writer *w, const char *key, uint32_t type) {
    if (!key || !key[0]) return nl_fail(NL_ERR_INVALID, "gguf writer: empty KV key");
    for (int64_t i = 0; i < w->n_kv; i++)
        if (!strcmp(w->keys[i], key)) return nl_fail(NL_ERR_INVALID, "gguf writer: duplicate KV %s", key);
    if (w->n_kv == w->cap_keys) {
        int64_t cap = w->cap_keys ? 2 * w->cap_keys : 16;
        char **k = realloc(w->keys, (size_t)cap * sizeof *k);
        if (!k) return nl_fail(NL_ERR_NOMEM, "gguf writer: out of memory");
        w->keys = k;
        w->cap_keys = cap;
    }
    w->keys[w->n_kv] = strdup(key);
    if (!w->keys[w->n_kv]) return nl_fail(NL_ERR_NOMEM, "gguf writer: out of memory");
    w->n_kv++;
    NL_TRY(put_str(w, key, strlen(key)));
    return put_u32(w, type);
}

nl_status nl_gguf_writer_u32(nl_gguf_writer *w, const char *key, uint32_t v) {
    NL_TRY(kv_begin(w, key, NL_GGUF_UINT32));
    return put_u32(w, v);
}
nl_status nl_gguf_writer_i32(nl_gguf_writer *w, const char *key, int32_t v) {
    NL_TRY(kv_begin(w, key, NL_GGUF_INT32));
    return put_u32(w, (uint32_t)v);
}
nl_status nl_gguf_writer_u64(nl_gguf_writer *w, const char *key, uint64_t v) {
    NL_TRY(kv_begin(w, key, NL_GGUF_UINT64));
    return put_u64(w, v);
}
nl_status nl_gguf_writer_f32(nl_gguf_writer *w, const char *key, float v) {
    NL_TRY(kv_begin(w, key, NL_GGUF_FLOAT32));
    uint32_t b;
    memcpy(&b, &v, 4);
    return put_u32(w, b);
}
nl_status nl_gguf_writer_bool(nl_gguf_writer *w, const char *key, int v) {
    NL_TRY(kv_begin(w, key, NL_GGUF_BOOL));
    uint8_t b = v ? 1 : 0;
    return put(w, &b, 1);
}
nl_status nl_gguf_writer_str(nl_gguf_writer *w, const char *key, const char *s) {
    NL_TRY(kv_begin(w, key, NL_GGUF_STRING));
    return put_str(w, s, strlen(s));
}
nl_status nl_gguf_writer_arr(nl_gguf_writer *w, const char *key, nl_gguf_vtype elem, uint64_t n, const void *data) {
    size_t k = vtype_size(elem);
    if (!k)
        return nl_fail(NL_ERR_INVALID, "gguf writer: KV %s: arrays of %s need nl_gguf_writer_arr_str", key,
                       nl_gguf_vtype_name(elem));
    NL_TRY(kv_begin(w, key, NL_GGUF_ARRAY));
    NL_TRY(put_u32(w, elem));
    NL_TRY(put_u64(w, n));
    return put(w, data, (size_t)n * k); /* the host is little-endian (x86-64, aarch64) */
}
nl_status nl_gguf_writer_arr_str(nl_gguf_writer *w, const char *key, uint64_t n, const char *const *strs,
                                 const uint64_t *lens) {
    NL_TRY(kv_begin(w, key, NL_GGUF_ARRAY));
    NL_TRY(put_u32(w, NL_GGUF_STRING));
    NL_TRY(put_u64(w, n));
    for (uint64_t i = 0; i < n; i++) NL_TRY(put_str(w, strs[i], lens ? lens[i] : strlen(strs[i])));
    return NL_OK;
}

static nl_status add_tensor(nl_gguf_writer *w, const char *name, uint32_t type, int ndim, const int64_t *ne,
                            const void *data, void *owned) {
    if (!name || !name[0]) return nl_fail(NL_ERR_INVALID, "gguf writer: empty tensor name");
    if (ndim < 1 || ndim > NL_GGUF_MAX_DIMS)
        return nl_fail(NL_ERR_INVALID, "gguf writer: tensor %s: %d dimensions (1..4)", name, ndim);
    if (!nl_ggml_type_name(type)) return nl_fail(NL_ERR_INVALID, "gguf writer: tensor %s: unknown type %u", name, type);
    for (int d = 0; d < ndim; d++)
        if (ne[d] < 1)
            return nl_fail(NL_ERR_INVALID, "gguf writer: tensor %s: dimension %d is %lld", name, d, (long long)ne[d]);
    uint64_t bytes = nl_ggml_nbytes(type, ndim, ne);
    if (!bytes)
        return nl_fail(NL_ERR_INVALID, "gguf writer: tensor %s: row of %lld is not whole %s blocks", name,
                       (long long)ne[0], nl_ggml_type_name(type));
    if (!data) return nl_fail(NL_ERR_INVALID, "gguf writer: tensor %s: no data", name);
    for (int64_t i = 0; i < w->n_tensors; i++)
        if (!strcmp(w->tensors[i].name, name)) return nl_fail(NL_ERR_INVALID, "gguf writer: duplicate tensor %s", name);
    if (w->n_tensors == w->cap_tensors) {
        int64_t cap = w->cap_tensors ? 2 * w->cap_tensors : 16;
        nl_gguf_wtensor *t = realloc(w->tensors, (size_t)cap * sizeof *t);
        if (!t) return nl_fail(NL_ERR_NOMEM, "gguf writer: out of memory");
        w->tensors = t;
        w->cap_tensors = cap;
    }
    nl_gguf_wtensor *t = &w->tensors[w->n_tensors];
    memset(t, 0, sizeof *t);
    t->name = strdup(name);
    if (!t->name) return nl_fail(NL_ERR_NOMEM, "gguf writer: out of memory");
    t->type = type;
    t->ndim = ndim;
    for (int d = 0; d < NL_GGUF_MAX_DIMS; d++) t->ne[d] = d < ndim ? ne[d] : 1;
    t->bytes = bytes;
    t->data = data;
    t->owned = owned;
    w->n_tensors++;
    return NL_OK;
}
nl_status nl_gguf_writer_tensor(nl_gguf_writer *w, const char *name, uint32_t type, int ndim, const int64_t *ne,
                                const void *data) {
    return add_tensor(w, name, type, ndim, ne, data, NULL);
}
nl_status nl_gguf_writer_tensor_owned(nl_gguf_writer *w, const char *name, uint32_t type, int ndim, const int64_t *ne,
                                      void *data) {
    nl_status rc = add_tensor(w, name, type, ndim, ne, data, data);
    if (rc) nl_free(data);
    return rc;
}

static uint64_t pad_to(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

nl_status nl_gguf_writer_write(const nl_gguf_writer *w, const char *path) {
    /* header + KVs + tensor infos into one buffer (a scratch writer reuses the helpers) */
    nl_gguf_writer h;
    nl_gguf_writer_init(&h);
    nl_status rc = put_u32(&h, GGUF_MAGIC);
    if (!rc) rc = put_u32(&h, 3);
    if (!rc) rc = put_u64(&h, (uint64_t)w->n_tensors);
    if (!rc) rc = put_u64(&h, (uint64_t)w->n_kv);
    if (!rc && w->kv_len) rc = put(&h, w->kv_bytes, w->kv_len);
    uint64_t off = 0;
    for (int64_t i = 0; i < w->n_tensors && !rc; i++) {
        const nl_gguf_wtensor *t = &w->tensors[i];
        rc = put_str(&h, t->name, strlen(t->name));
        if (!rc) rc = put_u32(&h, (uint32_t)t->ndim);
        for (int d = 0; d < t->ndim && !rc; d++) rc = put_u64(&h, (uint64_t)t->ne[d]);
        if (!rc) rc = put_u32(&h, t->type);
        if (!rc) rc = put_u64(&h, off);
        off = pad_to(off + t->bytes, NL_GGUF_DEFAULT_ALIGNMENT);
    }
    static const uint8_t zeros[NL_GGUF_DEFAULT_ALIGNMENT] = {0};
    if (!rc) rc = put(&h, zeros, (size_t)(pad_to(h.kv_len, NL_GGUF_DEFAULT_ALIGNMENT) - h.kv_len));
    nl_atomic_file af;
    int opened = 0;
    if (!rc) {
        rc = nl_atomic_open(&af, path);
        opened = !rc;
    }
    if (!rc) rc = nl_atomic_write(&af, h.kv_bytes, h.kv_len);
    for (int64_t i = 0; i < w->n_tensors && !rc; i++) {
        const nl_gguf_wtensor *t = &w->tensors[i];
        rc = nl_atomic_write(&af, t->data, (size_t)t->bytes);
        size_t pad = (size_t)(pad_to(t->bytes, NL_GGUF_DEFAULT_ALIGNMENT) - t->bytes);
        if (!rc && pad) rc = nl_atomic_write(&af, zeros, pad);
    }
    nl_gguf_writer_free(&h);
    if (rc) {
        if (opened) nl_atomic_abort(&af);
        return rc;
    }
    return nl_atomic_commit(&af);
}
