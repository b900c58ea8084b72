/*
 * GGUF: read and write llama.cpp's model container (pure I/O, no model semantics).
 *
 * File layout (ggml's docs/gguf.md, version 2 and 3; all little-endian):
 *
 *   u32 magic "GGUF", u32 version, u64 n_tensors, u64 n_kv
 *   n_kv x  { string key, u32 value type, value }
 *             string = u64 length + that many UTF-8 bytes (no NUL)
 *             value  = a scalar of the type, a string, or an array:
 *                      u32 element type, u64 count, count elements (arrays of arrays are refused)
 *   n_tensors x { string name, u32 n_dims (1..4), n_dims x u64 ne, u32 ggml type, u64 offset }
 *   padding to `general.alignment` (u32, a power of two; 32 when absent)
 *   the data area: tensor i is `bytes` bytes at data + offset (offset a multiple of the alignment)
 *
 * ne[0] is the fastest-varying dimension (a PyTorch (out, in) weight has ne = {in, out}); a row
 * of ne[0] elements is ne[0] / block elements of the type's block bytes (Q8_0: 32 values in
 * 34 bytes), so ne[0] must be a multiple of the block size.
 *
 * The reader maps the file read-only and validates all of it before returning: the magic and
 * version, every count and length against the bytes left (no allocation sized by the file
 * before that check), known value and tensor types, UTF-8-free keys without NUL, duplicate keys
 * and tensor names, n_dims, dimensions (>= 1, product without overflow), rows whole blocks,
 * offsets aligned, inside the data area and not overlapping. Each error names the file, the
 * byte offset and the KV or tensor at fault.
 *
 * The writer collects KVs and tensors, then writes the file atomically (temp file, fsync,
 * rename) with alignment 32.
 */
#ifndef NANOLM_GGUF_H
#define NANOLM_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "nanolm/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Value types of a KV (gguf_type). */
typedef enum nl_gguf_vtype {
    NL_GGUF_UINT8 = 0,
    NL_GGUF_INT8 = 1,
    NL_GGUF_UINT16 = 2,
    NL_GGUF_INT16 = 3,
    NL_GGUF_UINT32 = 4,
    NL_GGUF_INT32 = 5,
    NL_GGUF_FLOAT32 = 6,
    NL_GGUF_BOOL = 7,
    NL_GGUF_STRING = 8,
    NL_GGUF_ARRAY = 9,
    NL_GGUF_UINT64 = 10,
    NL_GGUF_INT64 = 11,
    NL_GGUF_FLOAT64 = 12,
    NL_GGUF_NVTYPES
} nl_gguf_vtype;

/* Tensor element types (ggml_type; the values are the file's). */
typedef enum nl_ggml_type {
    NL_GGML_F32 = 0,
    NL_GGML_F16 = 1,
    NL_GGML_Q4_0 = 2,
    NL_GGML_Q4_1 = 3,
    NL_GGML_Q5_0 = 6,
    NL_GGML_Q5_1 = 7,
    NL_GGML_Q8_0 = 8,
    NL_GGML_Q8_1 = 9,
    NL_GGML_Q2_K = 10,
    NL_GGML_Q3_K = 11,
    NL_GGML_Q4_K = 12,
    NL_GGML_Q5_K = 13,
    NL_GGML_Q6_K = 14,
    NL_GGML_Q8_K = 15,
    NL_GGML_I8 = 24,
    NL_GGML_I16 = 25,
    NL_GGML_I32 = 26,
    NL_GGML_I64 = 27,
    NL_GGML_F64 = 28,
    NL_GGML_BF16 = 30,
    NL_GGML_NTYPES = 40
} nl_ggml_type;

#define NL_GGUF_MAX_DIMS          4
#define NL_GGUF_DEFAULT_ALIGNMENT 32
/* Refuse keys and tensor names longer than this (llama.cpp's GGML_MAX_NAME is 64 for tensors). */
#define NL_GGUF_MAX_NAME 65536

/* "f32", "q8_0", ... (llama.cpp's names); NULL for a type this reader does not know. */
const char *nl_ggml_type_name(uint32_t type);
/* Elements per block of a known type (1 for plain types); 0 when unknown. */
int64_t nl_ggml_block_elems(uint32_t type);
/* "uint8", ..., "array"; "?" when out of range. */
const char *nl_gguf_vtype_name(uint32_t vtype);

/* One KV. Scalars are decoded into the union; strings and arrays point into the mapping. */
typedef struct nl_gguf_kv {
    char *key; /* NUL-terminated copy */
    nl_gguf_vtype type;
    nl_gguf_vtype arr_type; /* ARRAY: element type */
    uint64_t n;             /* ARRAY: element count; 1 otherwise */
    union {
        uint64_t u; /* unsigned integers and bool */
        int64_t i;  /* signed integers */
        double f;   /* FLOAT32, FLOAT64 */
    } v;
    const char *str;          /* STRING: bytes (not NUL-terminated) */
    uint64_t str_len;         /* STRING: length */
    const uint8_t *arr;       /* ARRAY: the first element's bytes */
    const uint8_t **arr_strs; /* ARRAY of STRING: each element's u64 length field (n of them) */
} nl_gguf_kv;

typedef struct nl_gguf_tensor {
    char *name;
    uint32_t type; /* nl_ggml_type */
    int ndim;
    int64_t ne[NL_GGUF_MAX_DIMS]; /* ne[0] fastest; unused dims 1 */
    int64_t numel;
    uint64_t offset; /* from the start of the data area */
    uint64_t bytes;
    const void *data;
} nl_gguf_tensor;

typedef struct nl_gguf_file {
    char *path;
    const uint8_t *bytes;
    size_t file_bytes;
    uint32_t version;
    uint32_t alignment;
    int64_t n_kv, n_tensors;
    nl_gguf_kv *kv;
    nl_gguf_tensor *tensors; /* in header order */
    uint64_t data_start;     /* byte offset of the data area */
    int mapped, owned;
} nl_gguf_file;

/* Opens and validates a GGUF file (memory-mapped read-only). Errors: NL_ERR_IO (cannot open),
 * NL_ERR_FORMAT naming the file, the byte offset and the fault, NL_ERR_NOMEM; *f zeroed on error. */
nl_status nl_gguf_open(nl_gguf_file *f, const char *path);
/* Validates n bytes already in memory (borrowed; must outlive *f). `name` names it in messages. */
nl_status nl_gguf_parse(nl_gguf_file *f, const void *bytes, size_t n, const char *name);
void nl_gguf_close(nl_gguf_file *f);

/* The KV called `key` / the tensor called `name`, or NULL (no error set). */
const nl_gguf_kv *nl_gguf_find_kv(const nl_gguf_file *f, const char *key);
const nl_gguf_tensor *nl_gguf_find_tensor(const nl_gguf_file *f, const char *name);

/* Typed reads of a KV, each failing with NL_ERR_FORMAT naming the file and the key when the
 * key is missing (unless a _def variant supplies a default) or has another type. get_int
 * accepts every integer type and bool (range-checked into int64); get_float every float and
 * integer type; get_str a STRING (bytes, not NUL-terminated: *len). */
nl_status nl_gguf_get_int(const nl_gguf_file *f, const char *key, int64_t *out);
nl_status nl_gguf_get_int_def(const nl_gguf_file *f, const char *key, int64_t def, int64_t *out);
nl_status nl_gguf_get_float(const nl_gguf_file *f, const char *key, double *out);
nl_status nl_gguf_get_float_def(const nl_gguf_file *f, const char *key, double def, double *out);
nl_status nl_gguf_get_str(const nl_gguf_file *f, const char *key, const char **s, uint64_t *len);
/* Copies a STRING KV into buf (NUL-terminated, cut to buf_bytes - 1); "" when absent. Returns
 * 1 when present. */
int nl_gguf_str_copy(const nl_gguf_file *f, const char *key, char *buf, size_t buf_bytes);
/* Array element i (i < kv->n) of an ARRAY kv: as a string (bytes + length), as a double (float
 * and integer element types), as an int64 (integer element types). No checks beyond i. */
const char *nl_gguf_arr_str(const nl_gguf_kv *kv, uint64_t i, uint64_t *len);
double nl_gguf_arr_float(const nl_gguf_kv *kv, uint64_t i);
int64_t nl_gguf_arr_int(const nl_gguf_kv *kv, uint64_t i);

/* ---- writer -------------------------------------------------------------------------------- */
typedef struct nl_gguf_wtensor {
    char *name;
    uint32_t type;
    int ndim;
    int64_t ne[NL_GGUF_MAX_DIMS];
    uint64_t bytes;
    const void *data;
    void *owned;
} nl_gguf_wtensor;

typedef struct nl_gguf_writer {
    uint8_t *kv_bytes; /* the serialized KVs */
    size_t kv_len, kv_cap;
    int64_t n_kv;
    char **keys;
    int64_t cap_keys;
    nl_gguf_wtensor *tensors;
    int64_t n_tensors, cap_tensors;
} nl_gguf_writer;

void nl_gguf_writer_init(nl_gguf_writer *w);
void nl_gguf_writer_free(nl_gguf_writer *w);
/* Scalars. Errors: NL_ERR_INVALID for an empty or duplicate key, NL_ERR_NOMEM. */
nl_status nl_gguf_writer_u32(nl_gguf_writer *w, const char *key, uint32_t v);
nl_status nl_gguf_writer_i32(nl_gguf_writer *w, const char *key, int32_t v);
nl_status nl_gguf_writer_u64(nl_gguf_writer *w, const char *key, uint64_t v);
nl_status nl_gguf_writer_f32(nl_gguf_writer *w, const char *key, float v);
nl_status nl_gguf_writer_bool(nl_gguf_writer *w, const char *key, int v);
nl_status nl_gguf_writer_str(nl_gguf_writer *w, const char *key, const char *s);
/* An array of n fixed-size elements of type elem (not STRING or ARRAY), little-endian bytes. */
nl_status nl_gguf_writer_arr(nl_gguf_writer *w, const char *key, nl_gguf_vtype elem, uint64_t n, const void *data);
/* An array of n strings; lens == NULL: NUL-terminated. */
nl_status nl_gguf_writer_arr_str(nl_gguf_writer *w, const char *key, uint64_t n, const char *const *strs,
                                 const uint64_t *lens);
/* A tensor (ne[0] fastest, numel / block * block bytes of data, borrowed until write returns).
 * Errors (NL_ERR_INVALID naming the tensor): empty or duplicate name, ndim outside 1..4, a
 * dimension < 1, an unknown type, ne[0] not a multiple of the block. */
nl_status nl_gguf_writer_tensor(nl_gguf_writer *w, const char *name, uint32_t type, int ndim, const int64_t *ne,
                                const void *data);
/* As nl_gguf_writer_tensor, taking a nl_malloc'd buffer (freed by the writer, on error too). */
nl_status nl_gguf_writer_tensor_owned(nl_gguf_writer *w, const char *name, uint32_t type, int ndim, const int64_t *ne,
                                      void *data);
/* Writes version 3, alignment 32, atomically. Errors: NL_ERR_IO naming the file. */
nl_status nl_gguf_writer_write(const nl_gguf_writer *w, const char *path);

/* Bytes of a tensor of `type` with these dims; 0 when the type is unknown, ne[0] is not whole
 * blocks, or the size overflows. */
uint64_t nl_ggml_nbytes(uint32_t type, int ndim, const int64_t *ne);

#ifdef __cplusplus
}
#endif
#endif
