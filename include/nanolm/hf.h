/*
 * Hugging Face model folders: what `huggingface-cli download` leaves on disk for a Llama-family
 * model, read into an nl_model and written back.
 *
 *   DIR/config.json                     architectures, sizes, rope, norm eps, tying
 *   DIR/model.safetensors               one shard, or
 *   DIR/model.safetensors.index.json    {"weight_map": {tensor name: shard file}} and
 *   DIR/model-0000i-of-0000N.safetensors the shards it names
 *   DIR/tokenizer.json                  (read by nanolm/tokenizer.h)
 *
 * Families: LlamaForCausalLM (Llama 2/3, TinyLlama, SmolLM/SmolLM2), MistralForCausalLM,
 * Qwen2ForCausalLM (q/k/v biases). config.json keys read: architectures, vocab_size,
 * hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads,
 * head_dim, rms_norm_eps, rope_theta, rope_scaling {rope_type|type "llama3", factor,
 * low_freq_factor, high_freq_factor, original_max_position_embeddings}, max_position_embeddings,
 * tie_word_embeddings, hidden_act (silu only), attention_bias / mlp_bias (Llama: false only),
 * sliding_window (Mistral; Qwen2 with use_sliding_window): the context is capped to the window,
 * where full attention and sliding-window attention agree.
 *
 * Weights: F32, BF16 or F16 tensors, read from the memory-mapped shards and converted once into
 * the model's fp32 parameters (no intermediate copy of a shard). Hugging Face stores q_proj and
 * k_proj rows (and Qwen2's q/k biases) in the rotate-half order of its RoPE; NanoLM rotates
 * adjacent pairs (Meta's order), so the loader reorders the rows of each head
 * (hf row p*hd/2 + i -> row 2i + p) and the writer reorders them back: attention scores are the
 * same, and load(save(m)) gives m's bytes back.
 */
#ifndef NANOLM_HF_H
#define NANOLM_HF_H

#include <stdint.h>

#include "nanolm/arch.h"
#include "nanolm/base.h"
#include "nanolm/model.h"
#include "nanolm/safetensors.h"
#include "nanolm/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Context the commands load a folder with: max_position_embeddings (131072 for Llama 3.2) would
 * size RoPE tables and KV caches for far more tokens than they use. */
#define NL_HF_DEFAULT_MAX_SEQ 4096

/* 1 when `path` is a directory (a model folder), else 0. */
int nl_hf_is_folder(const char *path);

/* Reads the architecture from config.json. `path` is the folder or the config.json file.
 * Errors (NL_ERR_IO, NL_ERR_FORMAT) name the file and the key: a missing or non-integer size,
 * an architecture other than the three above, a rope_scaling type other than llama3 (or
 * "default"), hidden_act other than silu, attention_bias / mlp_bias on a Llama model. */
nl_status nl_arch_from_hf_config(const char *path, nl_arch *a);

/* Loads a model folder: config.json, then every tensor from model.safetensors or the shards of
 * model.safetensors.index.json. max_seq > 0 caps the context (seq_len) below
 * max_position_embeddings (the RoPE tables and a KV cache are sized by it); 0 keeps it.
 * Errors (NL_ERR_FORMAT unless noted) name the file and the key: a shard the index names that
 * does not exist (NL_ERR_IO), a tensor missing from every shard, a tensor whose shape disagrees
 * with config.json, a dtype other than F32/BF16/F16, a tensor nanolm does not use (such as an
 * o_proj bias), a model larger than memory (NL_ERR_NOMEM). On error *m is zeroed. */
nl_status nl_hf_load_model(const char *dir, int64_t max_seq, nl_model *m);

/* The tokenizer of a model loaded from `model_path`: `tok_path` when given (a tokenizer.json
 * when it ends in ".json", else a llama2.c tokenizer.bin), else the folder's tokenizer.json when
 * model_path is a folder, else by the checkpoint's tokenizer kind ("byte"; others need
 * tok_path). V is the model's vocabulary. The one rule every command uses. Errors name the
 * file, or say to pass --tokenizer. */
nl_status nl_hf_load_tokenizer(const char *model_path, const char *kind, const char *tok_path, int64_t V,
                               nl_tokenizer *tok);

/* A tokenizer on its own, from `path`: a Hugging Face folder (its tokenizer.json), a
 * tokenizer.json, a llama2.c tokenizer.bin, a GGUF file (its tokenizer.ggml.* or
 * tokenizer.huggingface.json, nanolm/gguf_model.h), or "byte". Errors name the file. */
nl_status nl_hf_open_tokenizer(const char *path, nl_tokenizer *tok);

/* Writes `m` as a model folder: config.json (Qwen2ForCausalLM with q/k/v biases, else
 * LlamaForCausalLM), its weights as `dtype` (F32, BF16 or F16) in shards of at most
 * shard_bytes each (0: one model.safetensors; more than one shard adds
 * model.safetensors.index.json), and tokenizer.json when tok is not NULL. Creates the folder
 * if needed; each file is written atomically. Errors: NL_ERR_INVALID (MoE models, another
 * dtype), NL_ERR_IO naming the file. */
nl_status nl_hf_save(const char *dir, const nl_model *m, const nl_tokenizer *tok, nl_st_dtype dtype,
                     uint64_t shard_bytes);

/* Reorders the rows of a q or k projection (n_heads heads of hd rows, `cols` values per row;
 * cols = 1 for a bias) between Hugging Face's rotate-half order and NanoLM's adjacent pairs.
 * to_hf = 0: dst row h*hd + 2i + p = src row h*hd + p*hd/2 + i; to_hf = 1: the inverse. */
void nl_hf_permute_rows(float *dst, const float *src, int64_t n_heads, int64_t hd, int64_t cols, int to_hf);

#ifdef __cplusplus
}
#endif
#endif
