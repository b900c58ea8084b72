/* Byte-level and llama2.c tokenizers. See include/nanolm/tokenizer.h. */
#include "nanolm/tokenizer.h"

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "nanolm's tokenizer loader assumes a little-endian host"
#endif

const char *nl_tokenizer_kind_name(nl_tokenizer_kind k) {
    return k == NL_TOKENIZER_BYTE ? "byte" : k == NL_TOKENIZER_LLAMA2C ? "llama2c" : "?";
}

static void init_byte_pieces(nl_tokenizer *t) {
    for (int b = 0; b < 256; b++) {
        t->byte_pieces[2 * b] = (char)b;
        t->byte_pieces[2 * b + 1] = '\0';
    }
}

void nl_tokenizer_free(nl_tokenizer *t) {
    if (!t) return;
    if (t->pieces)
        for (int i = 0; i < t->vocab_size; i++) free(t->pieces[i]);
    free(t->pieces);
    free(t->scores);
    free(t->sorted_ids);
    memset(t, 0, sizeof *t);
}

nl_status nl_tokenizer_init_byte(nl_tokenizer *t) {
    memset(t, 0, sizeof *t);
    t->kind = NL_TOKENIZER_BYTE;
    t->vocab_size = 256;
    t->bos_id = t->eos_id = t->dummy_prefix_id = -1;
    t->max_token_length = 1;
    t->words_independent = 1;
    init_byte_pieces(t);
    t->pieces = calloc(256, sizeof(char *));
    t->scores = calloc(256, sizeof(float));
    t->sorted_ids = calloc(256, sizeof(int));
    if (!t->pieces || !t->scores || !t->sorted_ids) {
        nl_tokenizer_free(t);
        return nl_fail(NL_ERR_NOMEM, "out of memory creating the byte tokenizer");
    }
    for (int b = 0; b < 256; b++) {
        t->sorted_ids[b] = b;
        if (!(t->pieces[b] = calloc(2, 1))) { /* own copies: the struct may be copied by value */
            nl_tokenizer_free(t);
            return nl_fail(NL_ERR_NOMEM, "out of memory creating the byte tokenizer");
        }
        t->pieces[b][0] = (char)b;
    }
    return NL_OK;
}

/* ---- lookup: ids sorted by (piece, id); the lowest id wins among equal pieces ---- */

typedef struct { const char *s; int id; } entry;

static int cmp_entry(const void *a, const void *b) {
    const entry *x = a, *y = b;
    int c = strcmp(x->s, y->s);
    return c ? c : (x->id > y->id) - (x->id < y->id);
}

int nl_tokenizer_lookup(const nl_tokenizer *t, const char *piece) {
    if (t->kind == NL_TOKENIZER_BYTE) return piece[0] && !piece[1] ? (unsigned char)piece[0] : -1;
    int lo = 0, hi = t->vocab_size; /* first index whose piece is >= `piece` */
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (strcmp(t->pieces[t->sorted_ids[mid]], piece) < 0) lo = mid + 1;
        else hi = mid;
    }
    return lo < t->vocab_size && strcmp(t->pieces[t->sorted_ids[lo]], piece) == 0 ? t->sorted_ids[lo] : -1;
}

/* ---- llama2.c file ---- */

static int is_byte_piece(const char *p, int *byte) {
    static const char hex[] = "0123456789ABCDEF";
    if (strlen(p) != 6 || memcmp(p, "<0x", 3) != 0 || p[5] != '>') return 0;
    const char *h = strchr(hex, p[3]), *l = strchr(hex, p[4]);
    if (!h || !l || !p[3] || !p[4]) return 0;
    *byte = (int)((h - hex) * 16 + (l - hex));
    return 1;
}

static nl_status load_fail(nl_tokenizer *t, char *buf, nl_status rc) {
    nl_free(buf);
    nl_tokenizer_free(t);
    return rc;
}

nl_status nl_tokenizer_load_llama2c(nl_tokenizer *t, const char *path, int vocab_size) {
    memset(t, 0, sizeof *t);
    char *buf;
    size_t n;
    NL_TRY(nl_read_file(path, &buf, &n));
    const unsigned char *b = (const unsigned char *)buf;
    t->kind = NL_TOKENIZER_LLAMA2C;
    if (n < 4)
        return load_fail(t, buf, nl_fail(NL_ERR_FORMAT, "%s: truncated at byte %zu: a llama2.c tokenizer starts with a 4-byte max_token_length", path, n));
    int32_t mtl;
    memcpy(&mtl, b, 4);
    if (mtl < 1 || mtl > 65536)
        return load_fail(t, buf, nl_fail(NL_ERR_FORMAT, "%s: max_token_length %d is out of range 1..65536 (not a llama2.c tokenizer?)", path, (int)mtl));
    /* Count the tokens first (each needs at least 8 bytes) to size the arrays. */
    size_t cap = vocab_size > 0 ? (size_t)vocab_size : (n - 4) / 8 + 1;
    t->pieces = calloc(cap, sizeof(char *));
    t->scores = calloc(cap, sizeof(float));
    if (!t->pieces || !t->scores)
        return load_fail(t, buf, nl_fail(NL_ERR_NOMEM, "out of memory loading %s", path));
    size_t p = 4;
    int count = 0;
    while (vocab_size > 0 ? count < vocab_size : p < n) {
        if (p + 8 > n)
            return load_fail(t, buf, nl_fail(NL_ERR_FORMAT, "%s: truncated at byte %zu: token %d needs 8 bytes of score and length at byte %zu%s",
                                             path, n, count, p, vocab_size > 0 ? " (expected a vocabulary of that size)" : ""));
        float score;
        int32_t len;
        memcpy(&score, b + p, 4);
        memcpy(&len, b + p + 4, 4);
        if (isnan(score))
            return load_fail(t, buf, nl_fail(NL_ERR_FORMAT, "%s: token %d has a NaN score", path, count));
        if (len < 0 || len > mtl)
            return load_fail(t, buf, nl_fail(NL_ERR_FORMAT, "%s: token %d has length %d, outside 0..max_token_length %d", path, count, (int)len, (int)mtl));
        if (p + 8 + (size_t)len > n)
            return load_fail(t, buf, nl_fail(NL_ERR_FORMAT, "%s: truncated at byte %zu: token %d needs %d bytes at byte %zu", path, n, count, (int)len, p + 8));
        if (memchr(b + p + 8, 0, (size_t)len))
            return load_fail(t, buf, nl_fail(NL_ERR_FORMAT, "%s: token %d contains a NUL byte", path, count));
        char *s = malloc((size_t)len + 1);
        if (!s) return load_fail(t, buf, nl_fail(NL_ERR_NOMEM, "out of memory loading %s", path));
        memcpy(s, b + p + 8, (size_t)len);
        s[len] = '\0';
        t->pieces[count] = s;
        t->scores[count] = score;
        t->vocab_size = ++count; /* so that free() releases the pieces read so far */
        p += 8 + (size_t)len;
    }
    if (p < n)
        return load_fail(t, buf, nl_fail(NL_ERR_FORMAT, "%s: %zu bytes left after %d tokens: the file holds more tokens than the model's vocab_size %d",
                                         path, n - p, count, vocab_size));
    nl_free(buf);
    buf = NULL;
    if (count < 259)
        return load_fail(t, buf, nl_fail(NL_ERR_FORMAT, "%s: %d tokens; a llama2.c vocabulary has at least 259 (<unk>, BOS, EOS, 256 byte fallbacks)", path, count));
    for (int i = 0; i < 256; i++) {
        int byte;
        if (!is_byte_piece(t->pieces[3 + i], &byte) || byte != i)
            return load_fail(t, buf, nl_fail(NL_ERR_FORMAT, "%s: token %d is \"%s\", expected the byte fallback <0x%02X>", path, 3 + i, t->pieces[3 + i], i));
    }
    t->max_token_length = 0;
    t->words_independent = 1;
    for (int i = 0; i < count; i++) {
        const char *s = t->pieces[i];
        int len = (int)strlen(s);
        if (len > t->max_token_length) t->max_token_length = len;
        size_t lead = strspn(s, " ");
        if (strchr(s + lead, ' ')) t->words_independent = 0;
    }
    entry *e = malloc((size_t)count * sizeof *e);
    t->sorted_ids = malloc((size_t)count * sizeof(int));
    if (!e || !t->sorted_ids) { free(e); return load_fail(t, buf, nl_fail(NL_ERR_NOMEM, "out of memory loading %s", path)); }
    for (int i = 0; i < count; i++) { e[i].s = t->pieces[i]; e[i].id = i; }
    qsort(e, (size_t)count, sizeof *e, cmp_entry);
    for (int i = 0; i < count; i++) t->sorted_ids[i] = e[i].id;
    free(e);
    t->bos_id = 1;
    t->eos_id = 2;
    init_byte_pieces(t);
    t->dummy_prefix_id = nl_tokenizer_lookup(t, " ");
    if (t->dummy_prefix_id < 0)
        return load_fail(t, buf, nl_fail(NL_ERR_FORMAT, "%s: no \" \" token for the dummy prefix", path));
    return NL_OK;
}

/* ---- encode ---- */

/* run.c's merge loop over tok[0..m): merge the best-scoring adjacent pair (leftmost on ties)
 * until none merges. pair_id/pair_score cache the merge of (tok[i], tok[i+1]); `cat` holds
 * 2*max_token_length+1 bytes. Returns the new length. */
static int64_t merge(const nl_tokenizer *t, int *tok, int64_t m, int *pair_id, float *pair_score, char *cat) {
    for (int64_t i = 0; i + 1 < m; i++) {
        strcpy(cat, t->pieces[tok[i]]);
        strcat(cat, t->pieces[tok[i + 1]]);
        pair_id[i] = nl_tokenizer_lookup(t, cat);
        pair_score[i] = pair_id[i] >= 0 ? t->scores[pair_id[i]] : 0;
    }
    for (;;) {
        float best = -1e10f;
        int64_t at = -1;
        for (int64_t i = 0; i + 1 < m; i++)
            if (pair_id[i] >= 0 && pair_score[i] > best) { best = pair_score[i]; at = i; }
        if (at < 0) return m;
        tok[at] = pair_id[at];
        memmove(tok + at + 1, tok + at + 2, (size_t)(m - at - 2) * sizeof *tok);
        memmove(pair_id + at, pair_id + at + 1, (size_t)(m - at - 2) * sizeof *pair_id);
        memmove(pair_score + at, pair_score + at + 1, (size_t)(m - at - 2) * sizeof *pair_score);
        m--;
        for (int64_t i = at > 0 ? at - 1 : 0; i <= at && i + 1 < m; i++) { /* the two changed pairs */
            strcpy(cat, t->pieces[tok[i]]);
            strcat(cat, t->pieces[tok[i + 1]]);
            pair_id[i] = nl_tokenizer_lookup(t, cat);
            pair_score[i] = pair_id[i] >= 0 ? t->scores[pair_id[i]] : 0;
        }
    }
}

/* run.c's first pass over text[s..e): one token per UTF-8 codepoint found in the vocabulary,
 * else one byte-fallback token (byte + 3) per byte. Appends to out, returns the new count. */
static int64_t codepoints(const nl_tokenizer *t, const unsigned char *text, size_t len, size_t s, size_t e,
                          int *out, int64_t n) {
    char buf[8];
    int sl = 0;
    for (size_t i = s; i < e; i++) {
        unsigned char c = text[i];
        if ((c & 0xC0) != 0x80) sl = 0;
        buf[sl++] = (char)c;
        buf[sl] = '\0';
        unsigned char next = i + 1 < len ? text[i + 1] : 0;
        if ((next & 0xC0) == 0x80 && sl < 4) continue;
        int id = memchr(buf, 0, (size_t)sl) ? -1 : nl_tokenizer_lookup(t, buf);
        if (id >= 0) out[n++] = id;
        else
            for (int j = 0; j < sl; j++) out[n++] = (unsigned char)buf[j] + 3;
        sl = 0;
    }
    return n;
}

nl_status nl_tokenizer_encode(const nl_tokenizer *t, const char *text, size_t text_bytes, int bos, int eos,
                              int **tokens, int64_t *n_tokens) {
    *tokens = NULL;
    *n_tokens = 0;
    if (text_bytes > INT32_MAX)
        return nl_fail(NL_ERR_RANGE, "text of %zu bytes is too long to encode at once", text_bytes);
    const unsigned char *s = (const unsigned char *)text;
    int *out = nl_malloc((text_bytes + 3) * sizeof(int), "encoded tokens");
    if (!out) return NL_ERR_NOMEM;
    int64_t n = 0;
    if (t->kind == NL_TOKENIZER_BYTE) {
        for (size_t i = 0; i < text_bytes; i++) out[n++] = s[i];
        *tokens = out;
        *n_tokens = n;
        return NL_OK;
    }
    /* Scratch for the merge loop, sized for the longest word (or the whole text). */
    size_t longest = 0;
    for (size_t w = 0, i = 1; i <= text_bytes; i++)
        if (i == text_bytes || (t->words_independent && s[i] == ' ' && s[i - 1] != ' ')) {
            if (i - w > longest) longest = i - w;
            w = i;
        }
    int *pair_id = nl_malloc((longest + 2) * sizeof(int), "merge scratch");
    float *pair_score = nl_malloc((longest + 2) * sizeof(float), "merge scratch");
    char *cat = nl_malloc(2 * (size_t)t->max_token_length + 2, "merge scratch");
    if (!pair_id || !pair_score || !cat) {
        nl_free(out); nl_free(pair_id); nl_free(pair_score); nl_free(cat);
        return NL_ERR_NOMEM;
    }
    if (bos && t->bos_id >= 0) out[n++] = t->bos_id;
    size_t w = 0; /* start of the current word */
    for (size_t i = 1; text_bytes && i <= text_bytes; i++) {
        if (i < text_bytes && !(t->words_independent && s[i] == ' ' && s[i - 1] != ' ')) continue;
        int64_t start = n;
        if (w == 0) out[n++] = t->dummy_prefix_id; /* run.c: dummy prefix before non-empty text */
        n = codepoints(t, s, text_bytes, w, i, out, n);
        n = start + merge(t, out + start, n - start, pair_id, pair_score, cat);
        w = i;
    }
    if (eos && t->eos_id >= 0) out[n++] = t->eos_id;
    nl_free(pair_id);
    nl_free(pair_score);
    nl_free(cat);
    *tokens = out;
    *n_tokens = n;
    return NL_OK;
}

/* ---- decode ---- */

const char *nl_tokenizer_piece(const nl_tokenizer *t, int prev_token, int token, size_t *len) {
    if (token < 0 || token >= t->vocab_size) {
        nl_fail(NL_ERR_INVALID, "token %d is outside the vocabulary (0..%d)", token, t->vocab_size - 1);
        return NULL;
    }
    if (t->kind == NL_TOKENIZER_BYTE) { *len = 1; return &t->byte_pieces[2 * token]; }
    const char *p = t->pieces[token];
    if (t->bos_id >= 0 && prev_token == t->bos_id && p[0] == ' ') p++;
    int byte;
    if (is_byte_piece(p, &byte)) { *len = 1; return &t->byte_pieces[2 * byte]; }
    *len = strlen(p);
    return p;
}

nl_status nl_tokenizer_decode(const nl_tokenizer *t, const int *tokens, int64_t n_tokens, char **text,
                              size_t *text_bytes) {
    *text = NULL;
    *text_bytes = 0;
    size_t cap = 0;
    for (int64_t i = 0; i < n_tokens; i++) {
        if (tokens[i] < 0 || tokens[i] >= t->vocab_size)
            return nl_fail(NL_ERR_INVALID, "token %d at position %lld is outside the vocabulary (0..%d)", tokens[i],
                           (long long)i, t->vocab_size - 1);
        cap += strlen(t->pieces[tokens[i]]) + 1;
    }
    char *out = nl_malloc(cap + 1, "decoded text");
    if (!out) return NL_ERR_NOMEM;
    size_t n = 0;
    int prev = -1;
    for (int64_t i = 0; i < n_tokens; i++) {
        int tok = tokens[i];
        if (tok != t->bos_id && tok != t->eos_id) {
            size_t len;
            const char *p = nl_tokenizer_piece(t, prev, tok, &len);
            memcpy(out + n, p, len);
            n += len;
        }
        prev = tok;
    }
    out[n] = '\0';
    *text = out;
    *text_bytes = n;
    return NL_OK;
}

int nl_tokenizer_piece_printable(const char *piece, size_t len) {
    if (!piece || len == 0) return 0;
    if (len == 1) {
        unsigned char c = (unsigned char)piece[0];
        return isprint(c) || isspace(c);
    }
    return 1;
}

void nl_tokenizer_print_piece(FILE *f, const char *piece, size_t len) {
    if (nl_tokenizer_piece_printable(piece, len)) fwrite(piece, 1, len, f);
}
