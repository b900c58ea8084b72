/*
 * BPE tokenizers read from a Hugging Face tokenizer.json ("model": {"type": "BPE"}), in the two
 * forms Llama-family models ship:
 *
 * - byte-level (GPT-2, Llama 3, SmolLM, Qwen2, DeepSeek-V3): the text is split at added tokens,
 *   normalized (NFC where the file asks), cut into pre-tokens by the file's Split pre-tokenizers
 *   in order, each cutting the pieces of the one before (DeepSeek-V3 has three; GPT-2's regex when
 *   ByteLevel has use_regex; patterns Regex or String; behaviors Isolated, Removed,
 *   MergedWithPrevious, MergedWithNext, Contiguous as tokenizers' SplitDelimiterBehavior), each pre-token's bytes are mapped to printable characters (GPT-2's
 *   bytes_to_unicode) and merged by rank. ignore_merges: a pre-token that is itself a vocabulary
 *   entry is emitted as is (Llama 3).
 * - SentencePiece-style (Llama 2, TinyLlama, Mistral, Gemma 3): spaces become U+2581, a U+2581 is
 *   prepended (normalizer Prepend, or pre_tokenizer Metaspace; Gemma 3 prepends none and splits
 *   on " " merged with the previous piece), characters missing from the
 *   vocabulary become <0xXX> byte tokens (byte_fallback), then merges by rank.
 *
 * Merging follows tokenizers' Word::merge_all: repeatedly merge the adjacent pair with the
 * lowest merge rank, leftmost first. Added tokens (the file's "added_tokens") are matched in
 * the text before anything else: non-special ones always, special ones ("<|endoftext|>",
 * "<s>") only when the caller asks, as tokenizers' encode and tiktoken's allowed_special do.
 *
 * The regex runs on PCRE2 (UTF + Unicode properties); NFC comes from utf8proc.
 */
#ifndef NANOLM_BPE_H
#define NANOLM_BPE_H

#include <stddef.h>
#include <stdint.h>

#include "nanolm/base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nl_bpe nl_bpe;

/* Parses tokenizer.json text (`what` names the file in messages). Errors: NL_ERR_FORMAT naming
 * the file and the key (a model type other than BPE, a merge naming an unknown piece, a
 * pre_tokenizer, normalizer or regex nanolm does not implement, ids not covering 0..V-1),
 * NL_ERR_NOMEM. */
nl_status nl_bpe_parse(nl_bpe **out, const char *json, size_t json_bytes, const char *what);
void nl_bpe_free(nl_bpe *b);

/* Vocabulary size (max id + 1 over the vocabulary and the added tokens). */
int nl_bpe_vocab_size(const nl_bpe *b);
/* BOS / EOS ids (-1 when the file has none): BOS from the post_processor's template (the
 * special token before $A), EOS the first added token among </s>, <|end_of_text|>,
 * <|endoftext|>, <|im_end|>, <|eot_id|>. */
int nl_bpe_bos(const nl_bpe *b);
int nl_bpe_eos(const nl_bpe *b);
/* 1 when decoding drops the space that SentencePiece prepended before the first word. */
int nl_bpe_strips_first_space(const nl_bpe *b);

/* Writes the ids of text[0..n) into *out from index `at`, growing *out (malloc'd, *cap ids; NULL
 * and 0 to start) with realloc as needed: normalizers may lengthen the text, up to 4x + 256 bytes
 * a segment. special: match special added tokens in the text. Returns the count of ids in *out
 * (at + the new ones); -1 out of memory (NL_ERR_NOMEM set), -2 a normalizer grew the text past
 * its limit (NL_ERR_RANGE set); *out and *cap are updated either way. */
int64_t nl_bpe_encode(const nl_bpe *b, const char *text, size_t n, int special, int **out, int64_t *cap, int64_t at);

/* As nl_bpe_encode with special = 1, except that a special token is not matched where it
 * overlaps a byte with plain[i] != 0 (text from a user inside a chat template's output). */
int64_t nl_bpe_encode_marked(const nl_bpe *b, const char *text, size_t n, const unsigned char *plain, int **out,
                             int64_t *cap, int64_t at);

/* The bytes a token decodes to (a piece mapped back through bytes_to_unicode, U+2581 as a space,
 * <0xXX> as that byte, an added token as its content); NULL for an id outside the vocabulary
 * or a hole in it. *len receives the length (may contain NUL bytes). */
const char *nl_bpe_token_bytes(const nl_bpe *b, int id, size_t *len);
/* The vocabulary piece of id as the file spells it, or NULL. */
const char *nl_bpe_piece(const nl_bpe *b, int id);
/* Id of a piece as the file spells it (added tokens included), or -1. */
int nl_bpe_lookup(const nl_bpe *b, const char *piece);
/* 1 for a special added token. */
int nl_bpe_is_special(const nl_bpe *b, int id);
/* The tokenizer.json text it was parsed from (for writing it back). */
const char *nl_bpe_json(const nl_bpe *b, size_t *bytes);

#ifdef __cplusplus
}
#endif
#endif
