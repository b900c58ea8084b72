/*
 * safetensors: read and write the Hugging Face tensor file format (pure I/O, no model
 * semantics; "st" below stands for safetensors).
 *
 * File layout (https://github.com/huggingface/safetensors, "Format"):
 *
 *   bytes [0, 8)         N, the header length, u64 little-endian
 *   bytes [8, 8+N)       JSON object, UTF-8, may be padded at the end with spaces:
 *                          {"__metadata__": {"key": "value", ...},        (optional, string->string)
 *                           "tensor.name": {"dtype": "F32", "shape": [2, 3],
 *                                           "data_offsets": [BEGIN, END]}, ...}
 *   bytes [8+N, EOF)     the data area; a tensor's bytes are [8+N+BEGIN, 8+N+END), little-endian,
 *                        row-major. The tensors cover the data area exactly: no holes, no overlap.
 *
 * The writer pads the header with spaces so that the data area starts at a multiple of 8 bytes,
 * writes tensors in the order they were added, and writes atomically (temp file, fsync, rename):
 * a failed or interrupted write leaves any previous file at the path untouched.
 *
 * The reader maps the file read-only and validates all of it before returning: header length
 * against the file size, well-formed JSON, known dtypes, shape product x dtype size == offset
 * span, offsets inside the data area, no overlaps, no holes, no duplicate names, and a header
 * size cap. Each error names the file and what is wrong ("truncated at byte N", "tensor X:
 * shape [a,b] needs N bytes but offsets span M").
 */
#ifndef NANOLM_SAFETENSORS_H
#define NANOLM_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "nanolm/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Element types. The names in the file are the enum names without the prefix ("F32"). */
typedef enum nl_st_dtype {
    NL_ST_F32 = 0,
    NL_ST_F16,
    NL_ST_BF16,
    NL_ST_I8,
    NL_ST_U8,
    NL_ST_I32,
    NL_ST_I64,
    NL_ST_F64,
    NL_ST_NDTYPES
} nl_st_dtype;

#define NL_ST_MAX_DIMS 8
/* Refuse headers larger than this (the reference implementation uses the same cap). */
#define NL_ST_MAX_HEADER_BYTES 100000000ULL

/* "F32", "BF16", ...; "?" for an out-of-range value. */
const char *nl_st_dtype_name(nl_st_dtype dtype);
/* Bytes per element (4 for F32, 2 for BF16, ...); 0 for an out-of-range value. */
size_t nl_st_dtype_size(nl_st_dtype dtype);
/* Parses a dtype name ("F32"). Returns NL_ERR_FORMAT naming the unknown string. */
nl_status nl_st_dtype_parse(const char *name, nl_st_dtype *out);

/* One tensor of an opened file. `data` points into the file mapping (little-endian, possibly
 * not aligned to the element size: read it through nl_st_tensor_to_f32 or memcpy). */
typedef struct nl_st_tensor {
    char *name;
    nl_st_dtype dtype;
    int ndim; /* 0 = scalar (one element) */
    int64_t shape[NL_ST_MAX_DIMS];
    int64_t numel;       /* product of shape (1 for a scalar) */
    uint64_t begin, end; /* data_offsets: bytes [begin, end) of the data area */
    const void *data;    /* end - begin bytes */
} nl_st_tensor;

/* An opened (validated) safetensors file. Tensors are listed in file order (by offset). */
typedef struct nl_st_file {
    char *path;
    const uint8_t *bytes; /* the whole file */
    size_t file_bytes;
    uint64_t header_bytes; /* N, the JSON length */
    const uint8_t *data;   /* bytes + 8 + N */
    uint64_t data_bytes;
    int n_tensors;
    nl_st_tensor *tensors; /* (n_tensors,) in file order */
    int n_meta;
    char **meta_keys, **meta_values; /* (n_meta,) __metadata__ in header order */
    int mapped;                      /* 1: bytes is an mmap, 0: borrowed or malloc'd */
    int owned;                       /* 1: bytes was malloc'd by the reader */
} nl_st_file;

/* Opens and validates a safetensors file (memory-mapped read-only, or read into memory where
 * mapping fails). On error returns NL_ERR_IO (cannot open/read), NL_ERR_FORMAT (malformed; the
 * message names the file and the fault) or NL_ERR_NOMEM, and leaves *f zeroed. */
nl_status nl_st_open(nl_st_file *f, const char *path);
/* Validates `n` bytes already in memory as a safetensors file; `name` is used in messages.
 * The buffer is borrowed and must outlive *f. Same errors as nl_st_open. */
nl_status nl_st_parse(nl_st_file *f, const void *bytes, size_t n, const char *name);
/* Releases an opened file (safe on a zeroed struct). */
void nl_st_close(nl_st_file *f);

/* The tensor called `name`, or NULL (no error is set). */
const nl_st_tensor *nl_st_find(const nl_st_file *f, const char *name);
/* The __metadata__ value for `key`, or NULL. */
const char *nl_st_meta(const nl_st_file *f, const char *key);

/* Converts a tensor to fp32 into `out` (t->numel floats). F32 is copied, BF16 and F16 are
 * widened exactly (subnormals, infinities and NaN kept), integers are converted to the nearest
 * float. Never fails for a tensor of a validated file. */
void nl_st_tensor_to_f32(const nl_st_tensor *t, float *out);
/* Looks up `name`, checks its shape is exactly shape[0..ndim) and converts it to fp32 into
 * `out`. Errors: NL_ERR_FORMAT "FILE: no tensor NAME" or "FILE: tensor NAME has shape [a,b]
 * but [c,d] is needed". */
nl_status nl_st_read_f32(const nl_st_file *f, const char *name, int ndim, const int64_t *shape, float *out);
/* Formats a shape as "[a,b,c]" into buf (always NUL-terminated); returns buf. */
char *nl_st_shape_str(int ndim, const int64_t *shape, char *buf, size_t buf_bytes);

/* Exact widening of one 16-bit float to fp32 (bits in, value out). */
float nl_st_bf16_to_f32(uint16_t bits);
float nl_st_f16_to_f32(uint16_t bits);

/* ---- writer --------------------------------------------------------------------------------
 * Collects named tensors and metadata, then writes them in one atomic step:
 *
 *   nl_st_writer w;
 *   nl_st_writer_init(&w);
 *   nl_st_writer_meta(&w, "arch", "stories260k");
 *   int64_t shape[2] = {512, 64};
 *   nl_st_writer_add(&w, "model.embed_tokens.weight", NL_ST_F32, 2, shape, emb);
 *   rc = nl_st_writer_write(&w, "model.safetensors");
 *   nl_st_writer_free(&w);
 *
 * Tensor data is borrowed (not copied) and must stay valid until nl_st_writer_write returns;
 * nl_st_writer_add_owned hands a nl_malloc'd buffer over to the writer instead. */
typedef struct nl_st_writer_tensor {
    char *name;
    nl_st_dtype dtype;
    int ndim;
    int64_t shape[NL_ST_MAX_DIMS];
    uint64_t bytes;
    const void *data;
    void *owned; /* freed by nl_st_writer_free */
} nl_st_writer_tensor;

typedef struct nl_st_writer {
    int n_tensors, cap_tensors;
    nl_st_writer_tensor *tensors;
    int n_meta, cap_meta;
    char **meta_keys, **meta_values;
} nl_st_writer;

void nl_st_writer_init(nl_st_writer *w);
/* Adds a tensor (little-endian elements of `dtype`, row-major, numel(shape) of them). Errors
 * (NL_ERR_INVALID, message names the tensor): empty or duplicate name, "__metadata__", ndim
 * outside 0..NL_ST_MAX_DIMS, negative dimension, unknown dtype, NULL data for a non-empty
 * tensor; NL_ERR_NOMEM. */
nl_status nl_st_writer_add(nl_st_writer *w, const char *name, nl_st_dtype dtype, int ndim, const int64_t *shape,
                           const void *data);
/* As nl_st_writer_add, but the writer takes `data` (from nl_malloc) and frees it; it is freed
 * on error too. */
nl_status nl_st_writer_add_owned(nl_st_writer *w, const char *name, nl_st_dtype dtype, int ndim, const int64_t *shape,
                                 void *data);
/* Sets a __metadata__ entry (copied; a repeated key replaces the value). */
nl_status nl_st_writer_meta(nl_st_writer *w, const char *key, const char *value);
/* Writes the file atomically. On error (NL_ERR_IO naming the file, NL_ERR_NOMEM) a previous
 * file at `path` is left intact and no temporary file remains. */
nl_status nl_st_writer_write(const nl_st_writer *w, const char *path);
/* Frees the writer's copies and owned buffers (not borrowed tensor data). */
void nl_st_writer_free(nl_st_writer *w);

#ifdef __cplusplus
}
#endif
#endif
