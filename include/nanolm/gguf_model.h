/*
 * GGUF models (llama.cpp's files, nanolm/gguf.h) read into an nl_model and written from one.
 *
 * Architecture "llama" (Llama 1/2/3, Mistral, TinyLlama, SmolLM as llama.cpp converts them).
 * Keys read: general.architecture, general.name, llama.embedding_length, llama.block_count,
 * llama.feed_forward_length, llama.attention.head_count, llama.attention.head_count_kv,
 * llama.attention.key_length (head size), llama.context_length, llama.rope.freq_base,
 * llama.attention.layer_norm_rms_epsilon, llama.vocab_size; a llama.rope.scaling.type other
 * than "none" is refused.
 *
 * Tensors (ggml's ne = {in, out} is PyTorch's (out, in) row-major):
 *   token_embd.weight, output_norm.weight, output.weight (absent: tied to the embedding),
 *   blk.N.attn_norm / attn_q / attn_k / attn_v / attn_output / ffn_norm / ffn_gate / ffn_up /
 *   ffn_down .weight
 * Rows of attn_q and attn_k: llama.cpp's converter permutes Hugging Face's rotate-half rows
 * back into Meta's interleaved pairs (its RoPE "normal" mode rotates x[2i], x[2i+1]), which is
 * NanoLM's order: they are copied as they are (nanolm/hf.h permutes, GGUF does not).
 * Element types F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K, converted once into the model's
 * fp32 parameters straight from the mapping (no intermediate copy); any other type, shape or
 * tensor name is refused by name.
 *
 * Tokenizer (tokenizer.ggml.*): "llama" (SentencePiece: tokens, scores; U+2581 read as a space)
 * onto the llama2.c tokenizer (llama.cpp's SPM merges by score like llama2.c's run.c); "gpt2"
 * (byte-level BPE: tokens, merges, token_type, pre) onto the tokenizer.json BPE with the
 * pre-tokenizer regex tokenizer.ggml.pre names (gpt-2/default, llama-bpe, qwen2, smollm);
 * tokenizer.huggingface.json when present; bos/eos from tokenizer.ggml.bos/eos_token_id.
 */
#ifndef NANOLM_GGUF_MODEL_H
#define NANOLM_GGUF_MODEL_H

#include <stdint.h>

#include "nanolm/arch.h"
#include "nanolm/base.h"
#include "nanolm/gguf.h"
#include "nanolm/matvec.h"
#include "nanolm/model.h"
#include "nanolm/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when the file starts with the GGUF magic. */
int nl_gguf_is_file(const char *path);

/* The architecture of an opened file (llama.* keys; vocab and tying from the tensors).
 * max_seq > 0 caps seq_len. Errors: NL_ERR_FORMAT naming the file and the key. */
nl_status nl_gguf_read_arch(const nl_gguf_file *f, int64_t max_seq, nl_arch *a);
/* Opens `path` and reads its architecture only (the planner's shape). */
nl_status nl_gguf_arch(const char *path, int64_t max_seq, nl_arch *a);

/* What a loaded file held. */
typedef struct nl_gguf_info {
    uint32_t linear_type; /* the type of blk.0.attn_q.weight (e.g. NL_GGML_Q8_0) */
    int n_types;          /* distinct tensor types */
    uint32_t types[8];
} nl_gguf_info;

/* Loads the model of a GGUF file (see above). info may be NULL. On error *m is zeroed. */
nl_status nl_gguf_load_model(const char *path, int64_t max_seq, nl_model *m, nl_gguf_info *info);
/* The tokenizer stored in the file (see above); V is the model's vocabulary. */
nl_status nl_gguf_load_tokenizer(const char *path, int64_t V, nl_tokenizer *tok);

/* Replaces INT4 decode weights made from m's fp32 matrices by the Q4_0 blocks of the GGUF file m
 * was loaded from (nl_mv_weight_init_q4_0: the file's own scales and codes, so decode computes
 * with exactly llama.cpp's weights). w holds 4 * L + 1 weights in the order the model lays out
 * its linears: per layer q|k|v fused (QKV, C), o (C, NH*hd), gate|up fused (2H, C), down (C, H);
 * then the classifier (output.weight, or token_embd.weight when tied). A group whose tensors are
 * not all Q4_0 keeps its weight. *replaced (may be NULL) receives how many were replaced.
 * Errors: NL_ERR_FORMAT/IO naming the file, NL_ERR_NOMEM. */
nl_status nl_gguf_int4_weights(const char *path, const nl_model *m, nl_mv_weight *w, int *replaced);

/* Writes m as a llama-architecture GGUF: matrices (embedding, linears, classifier) as `type`
 * (F32, F16, BF16, Q8_0, Q4_0; a matrix whose row is not whole blocks of 32 stays F32, as
 * llama.cpp's converter does), norms F32; the tokenizer: a llama2.c vocabulary as "llama"
 * (SentencePiece), a tokenizer.json as tokenizer.huggingface.json, the byte tokenizer as byte
 * pieces (and nanolm.tokenizer "byte" so nanolm reads it back as such). Errors: NL_ERR_INVALID
 * (MoE, q/k/v biases, a type not listed), NL_ERR_IO naming the file. */
nl_status nl_gguf_save(const char *path, const nl_model *m, const nl_tokenizer *tok, uint32_t type);

#ifdef __cplusplus
}
#endif
#endif
