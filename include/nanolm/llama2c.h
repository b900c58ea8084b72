/*
 * llama2.c's legacy checkpoint format (karpathy/llama2.c, "version 0" of export.py), read and
 * written as plain named fp32 arrays: pure I/O, no model semantics.
 *
 * Layout (all little-endian):
 *   7 x int32     dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len
 *                 (vocab_size < 0: the classifier is NOT tied and follows at the end; |vocab|)
 *   fp32 arrays in this order (shapes as PyTorch nn.Linear weights, (out, in), per layer L):
 *     token_embedding (vocab, dim)
 *     rms_att         (L, dim)
 *     wq              (L, n_heads*hs, dim)        hs = dim / n_heads
 *     wk              (L, n_kv_heads*hs, dim)
 *     wv              (L, n_kv_heads*hs, dim)
 *     wo              (L, dim, n_heads*hs)
 *     rms_ffn         (L, dim)
 *     w1              (L, hidden_dim, dim)        gate
 *     w2              (L, dim, hidden_dim)        down
 *     w3              (L, hidden_dim, dim)        up
 *     rms_final       (dim)
 *     (RoPE tables, 2 x seq_len*hs/2 floats: cos then sin; skipped on read, regenerated on write)
 *     wcls            (vocab, dim)                only when vocab_size < 0 in the header
 *
 * The file does not record rope_theta or norm_eps; the reader sets llama2.c's values (10000,
 * 1e-5).
 */
#ifndef NANOLM_LLAMA2C_H
#define NANOLM_LLAMA2C_H

#include <stdint.h>

#include "nanolm/arch.h"
#include "nanolm/base.h"

#ifdef __cplusplus
extern "C" {
#endif

#define NL_LLAMA2C_HEADER_BYTES 28
#define NL_LLAMA2C_MAX_TENSORS  12

/* One weight array; `data` points into the checkpoint's single allocation. */
typedef struct nl_llama2c_tensor {
    const char *name; /* "token_embedding", "rms_att", "wq", ..., "rms_final", "wcls" */
    int ndim;
    int64_t shape[3];
    int64_t numel;
    float *data;
} nl_llama2c_tensor;

/* A checkpoint in memory: the arch from the header and its arrays in file order
 * (11 arrays when the classifier is tied, 12 with "wcls" last otherwise). */
typedef struct nl_llama2c {
    nl_arch arch;
    int n_tensors;
    nl_llama2c_tensor tensors[NL_LLAMA2C_MAX_TENSORS];
    float *weights;    /* one allocation with all arrays back to back (file order) */
    int64_t n_weights; /* floats in `weights` */
} nl_llama2c;

/* Reads and validates a checkpoint. The arch gets name = file name without directory and
 * extension (cut to 63 chars), rope_theta 10000, norm_eps 1e-5, tied_embeddings from the sign
 * of vocab_size, and must pass nl_arch_validate. Errors: NL_ERR_IO (cannot open/read),
 * NL_ERR_FORMAT naming the file: "truncated at byte N (expected M bytes for dim=...)", a
 * header field out of range, or a size larger than the header implies; NL_ERR_NOMEM.
 * On error *m is zeroed. */
nl_status nl_llama2c_read(nl_llama2c *m, const char *path);
/* Frees the arrays (safe on a zeroed struct). */
void nl_llama2c_free(nl_llama2c *m);
/* The array called `name`, or NULL. */
const nl_llama2c_tensor *nl_llama2c_find(const nl_llama2c *m, const char *name);

/* Fills `shapes` with the names and shapes of the arrays `arch` has in a llama2.c file, in
 * file order (data pointers NULL); returns how many (11 or 12). */
int nl_llama2c_layout(const nl_arch *arch, nl_llama2c_tensor shapes[NL_LLAMA2C_MAX_TENSORS]);

/* Writes a checkpoint atomically. `arrays` holds nl_llama2c_layout(arch) pointers in file
 * order (wcls last when arch->tied_embeddings == 0). The RoPE tables are computed from
 * arch->rope_theta as llama2.c's export does. Errors: NL_ERR_INVALID (arch fails validation,
 * does not fit int32 fields, uses MoE or a head_dim other than dim/n_heads, NULL array),
 * NL_ERR_IO naming the file (the previous file is kept). */
nl_status nl_llama2c_write(const char *path, const nl_arch *arch, const float *const *arrays);

/* The RoPE tables of the legacy format: cos and sin, each (seq_len, head_size/2), of
 * pos * theta^(-2i/head_size). */
void nl_llama2c_rope_tables(const nl_arch *arch, float *cos_out, float *sin_out);

#ifdef __cplusplus
}
#endif
#endif
