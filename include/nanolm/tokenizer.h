/*
 * Tokenizers: text <-> token ids.
 *
 * - byte-level: vocab 256, token = byte value, no special tokens. Works on any file.
 * - llama2.c: the SentencePiece-style vocabulary of llama2.c's tokenizer.bin files
 *   (int32 max_token_length, then per token {float32 score, int32 len, len bytes}), with
 *   0 <unk>, 1 BOS, 2 EOS, 3..258 byte fallbacks <0x00>..<0xFF>, merges from 259 on.
 *   Encoding and decoding follow llama2.c's run.c: BOS, a dummy-prefix space, one token per
 *   UTF-8 codepoint found in the vocabulary (else one byte-fallback token per byte, id byte+3),
 *   then repeatedly merge the adjacent pair whose concatenation is the vocabulary piece with the
 *   highest score (leftmost on ties) until no pair merges. Decoding maps <0xXX> pieces to the
 *   raw byte and drops the leading space of the piece right after BOS.
 *
 * Encoding long texts: run.c rescans every pair after each merge (quadratic). nanolm keeps the
 * candidate merges in a heap (same choice: best score, leftmost on ties), and when every piece
 * looks like [spaces][non-spaces] (true for tok512.bin and Llama's SentencePiece vocabularies)
 * it merges word by word, since no merge can cross a position where a space follows a
 * non-space. The tokens are identical to run.c's; a 1 MB file encodes in a fraction of a second.
 */
#ifndef NANOLM_TOKENIZER_H
#define NANOLM_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "nanolm/base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum nl_tokenizer_kind {
    NL_TOKENIZER_BYTE = 0,
    NL_TOKENIZER_LLAMA2C = 1,
    NL_TOKENIZER_HF = 2 /* tokenizer.json BPE (nanolm/bpe.h) */
} nl_tokenizer_kind;

struct nl_bpe;

typedef struct nl_tokenizer {
    nl_tokenizer_kind kind;
    int vocab_size;
    int bos_id, eos_id;    /* -1 when the tokenizer has none (byte-level) */
    int max_token_length;  /* longest piece in bytes */
    char **pieces;         /* (vocab_size,) NUL-terminated piece strings */
    float *scores;         /* (vocab_size,) merge scores (0 for byte-level) */
    int *sorted_ids;       /* (vocab_size,) ids sorted by piece, for lookup */
    int dummy_prefix_id;   /* id of " " (llama2.c), -1 for byte-level */
    int words_independent; /* 1: pieces never contain a space after a non-space */
    char byte_pieces[512]; /* byte b as a 1-byte string at [2b] */
    struct nl_bpe *bpe;    /* NL_TOKENIZER_HF only (pieces, scores, sorted_ids are NULL) */
} nl_tokenizer;

/* The byte-level tokenizer (vocab 256). Returns NL_ERR_NOMEM only. */
nl_status nl_tokenizer_init_byte(nl_tokenizer *t);
/* Loads a llama2.c tokenizer file. vocab_size > 0: the file must hold exactly that many
 * tokens (the model's vocab); 0: as many as the file holds. Errors (NL_ERR_IO, NL_ERR_FORMAT
 * naming the file): "truncated at byte N: token I needs L bytes", a negative or too long piece
 * length, a NaN score, a NUL byte inside a piece, fewer than 259 tokens or byte-fallback
 * pieces not at 3..258, no " " piece for the dummy prefix, token count != vocab_size.
 * On error *t is zeroed. */
nl_status nl_tokenizer_load_llama2c(nl_tokenizer *t, const char *path, int vocab_size);
/* A llama2.c-style (SentencePiece, score-merged) vocabulary from memory: n pieces (lens[i] bytes
 * each, or NUL-terminated when lens is NULL; spaces as ' ', not U+2581) and their scores, laid out
 * as nl_tokenizer_load_llama2c requires (<unk>, BOS, EOS, <0x00>..<0xFF> at 3..258, a " " piece);
 * bos_id / eos_id >= 0 replace the default 1 / 2. `what` names the source in messages (a GGUF
 * file). Errors as nl_tokenizer_load_llama2c; on error *t is zeroed. */
nl_status nl_tokenizer_init_spm(nl_tokenizer *t, int n, const char *const *pieces, const size_t *lens,
                                const float *scores, int bos_id, int eos_id, const char *what);
/* Loads a Hugging Face tokenizer.json (BPE: byte-level or SentencePiece-style, see
 * nanolm/bpe.h). vocab_size > 0: the model's vocabulary, which must hold every id of the file
 * (models often pad theirs: ids beyond the file decode to nothing). Errors: NL_ERR_IO,
 * NL_ERR_FORMAT naming the file and the key. On error *t is zeroed. */
nl_status nl_tokenizer_load_json(nl_tokenizer *t, const char *path, int vocab_size);
/* As nl_tokenizer_load_json, from tokenizer.json text in memory (`what` names it in messages). */
nl_status nl_tokenizer_parse_json(nl_tokenizer *t, const char *json, size_t json_bytes, const char *what,
                                  int vocab_size);
/* Writes the tokenizer as tokenizer.json (atomically): a loaded tokenizer.json as it was read;
 * the byte-level tokenizer as a 256-piece byte-level BPE without merges; a llama2.c vocabulary
 * as SentencePiece-style BPE with byte fallback whose merges are ranked by the merged piece's
 * score (so both encode the same). Errors: NL_ERR_IO naming the file, NL_ERR_NOMEM. */
nl_status nl_tokenizer_save_json(const nl_tokenizer *t, const char *path);
/* Frees a tokenizer (safe on a zeroed struct). */
void nl_tokenizer_free(nl_tokenizer *t);
/* "byte", "llama2c" or "hf". */
const char *nl_tokenizer_kind_name(nl_tokenizer_kind kind);

/* Encodes text[0..text_bytes) into a new array (*tokens, free with nl_free; *n_tokens ids).
 * bos/eos: prepend BOS / append EOS when the tokenizer has them (ignored for byte-level).
 * A NUL byte inside the text is encoded like any other byte. Errors: NL_ERR_NOMEM,
 * NL_ERR_RANGE when the text exceeds INT32_MAX bytes. */
nl_status nl_tokenizer_encode(const nl_tokenizer *t, const char *text, size_t text_bytes, int bos, int eos,
                              int **tokens, int64_t *n_tokens);
/* As nl_tokenizer_encode; special = 1 also turns special tokens written in the text
 * ("<|endoftext|>", "<s>") into their ids (tokenizer.json only; the others have none). */
nl_status nl_tokenizer_encode_special(const nl_tokenizer *t, const char *text, size_t text_bytes, int bos, int eos,
                                      int special, int **tokens, int64_t *n_tokens);
/* As nl_tokenizer_encode_special with special = 1, except that special tokens are not matched
 * where they overlap a byte with plain[i] != 0 (plain: text_bytes marks, e.g. a chat prompt's
 * bytes that came from the user, nl_chat_template_apply_marked). plain NULL: every byte may hold
 * a special token. */
nl_status nl_tokenizer_encode_marked(const nl_tokenizer *t, const char *text, size_t text_bytes, int bos, int eos,
                                     const unsigned char *plain, int **tokens, int64_t *n_tokens);
/* The vocabulary entry of `id` as the tokenizer spells it ("Ġworld" in a byte-level
 * tokenizer.json, " world" in llama2.c's, the byte itself for the byte tokenizer), or NULL for an id
 * outside the vocabulary or a hole in it. */
const char *nl_tokenizer_vocab_piece(const nl_tokenizer *t, int id);
/* Id of the piece exactly equal to `piece`, or -1. */
int nl_tokenizer_lookup(const nl_tokenizer *t, const char *piece);

/* The bytes that `token` prints after `prev_token` (prev = -1 at the start), as run.c's
 * decode: a <0xXX> piece becomes that byte, and after BOS a leading space is dropped. Returns a
 * pointer into the tokenizer and sets *len (a <0x00> piece is 1 byte, the NUL); NULL with
 * NL_ERR_INVALID set when the token is outside the vocabulary. */
const char *nl_tokenizer_piece(const nl_tokenizer *t, int prev_token, int token, size_t *len);
/* Decodes a sequence into a new NUL-terminated string (*text, free with nl_free; *text_bytes).
 * BOS and EOS produce no text. Error: NL_ERR_INVALID naming the position of an id outside
 * the vocabulary; NL_ERR_NOMEM. */
nl_status nl_tokenizer_decode(const nl_tokenizer *t, const int *tokens, int64_t n_tokens, char **text,
                              size_t *text_bytes);
/* run.c's safe_printf rule: 0 for an empty piece or a single byte that is neither printable
 * nor whitespace (a raw control byte), 1 otherwise. */
int nl_tokenizer_piece_printable(const char *piece, size_t len);
/* Writes the piece to f when nl_tokenizer_piece_printable says so. */
void nl_tokenizer_print_piece(FILE *f, const char *piece, size_t len);
/* s[0..n) as one line of text, to show a piece or the bytes a token decodes to: valid UTF-8 kept,
 * control bytes, backslashes and bytes that are not UTF-8 (a token that holds part of a
 * character) escaped as \n \t \r \\ \xHH. nl_malloc'd; NULL when out of memory (the error set). */
char *nl_tokenizer_escape(const char *s, size_t n);

#ifdef __cplusplus
}
#endif
#endif
