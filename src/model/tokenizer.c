/* Byte-level and llama2.c tokenizers. See include/nanolm/tokenizer.h. */
#include "nanolm/tokenizer.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <stdio.h>
#include <sys/stat.h>

#include "nanolm/bpe.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "nanolm's tokenizer loader assumes a little-endian host"
#endif

const char *nl_tokenizer_kind_name(nl_tokenizer_kind k) {
    return k == NL_TOKENIZER_BYTE ? "byte" : k == NL_TOKENIZER_LLAMA2C ? "llama2c" : k == NL_TOKENIZER_HF ? "hf" : "?";
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
    nl_bpe_free(t->bpe);
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

typedef struct {
    const char *s;
    int id;
} entry;

static int cmp_entry(const void *a, const void *b) {
    const entry *x = a, *y = b;
    int c = strcmp(x->s, y->s);
    return c ? c : (x->id > y->id) - (x->id < y->id);
}

int nl_tokenizer_lookup(const nl_tokenizer *t, const char *piece) {
    if (t->kind == NL_TOKENIZER_HF) return nl_bpe_lookup(t->bpe, piece);
    if (t->kind == NL_TOKENIZER_BYTE) return piece[0] && !piece[1] ? (unsigned char)piece[0] : -1;
    int lo = 0, hi = t->vocab_size; /* first index whose piece is >= `piece` */
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (strcmp(t->pieces[t->sorted_ids[mid]], piece) < 0)
            lo = mid + 1;
        else
            hi = mid;
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

/* Checks a SentencePiece-style vocabulary (pieces with spaces, scores) as llama2.c lays it out
 * and builds the lookup. */
static nl_status finish_spm(nl_tokenizer *t, const char *path) {
    if (t->vocab_size < 259)
        return load_fail(
            t, NULL,
            nl_fail(NL_ERR_FORMAT,
                    "%s: %d tokens; a llama2.c vocabulary has at least 259 (<unk>, BOS, EOS, 256 byte fallbacks)", path,
                    t->vocab_size));
    for (int i = 0; i < 256; i++) {
        int byte;
        if (!is_byte_piece(t->pieces[3 + i], &byte) || byte != i)
            return load_fail(t, NULL,
                             nl_fail(NL_ERR_FORMAT, "%s: token %d is \"%s\", expected the byte fallback <0x%02X>", path,
                                     3 + i, t->pieces[3 + i], i));
    }
    t->max_token_length = 0;
    t->words_independent = 1;
    for (int i = 0; i < t->vocab_size; i++) {
        const char *s = t->pieces[i];
        int len = (int)strlen(s);
        if (len > t->max_token_length) t->max_token_length = len;
        size_t lead = strspn(s, " ");
        if (strchr(s + lead, ' ')) t->words_independent = 0;
    }
    entry *e = malloc((size_t)t->vocab_size * sizeof *e);
    t->sorted_ids = malloc((size_t)t->vocab_size * sizeof(int));
    if (!e || !t->sorted_ids) {
        free(e);
        return load_fail(t, NULL, nl_fail(NL_ERR_NOMEM, "out of memory loading %s", path));
    }
    for (int i = 0; i < t->vocab_size; i++) {
        e[i].s = t->pieces[i];
        e[i].id = i;
    }
    qsort(e, (size_t)t->vocab_size, sizeof *e, cmp_entry);
    for (int i = 0; i < t->vocab_size; i++) t->sorted_ids[i] = e[i].id;
    free(e);
    t->bos_id = 1;
    t->eos_id = 2;
    init_byte_pieces(t);
    t->dummy_prefix_id = nl_tokenizer_lookup(t, " ");
    if (t->dummy_prefix_id < 0)
        return load_fail(t, NULL, nl_fail(NL_ERR_FORMAT, "%s: no \" \" token for the dummy prefix", path));
    return NL_OK;
}

nl_status nl_tokenizer_load_llama2c(nl_tokenizer *t, const char *path, int vocab_size) {
    memset(t, 0, sizeof *t);
    char *buf;
    size_t n;
    NL_TRY(nl_read_file(path, &buf, &n));
    const unsigned char *b = (const unsigned char *)buf;
    t->kind = NL_TOKENIZER_LLAMA2C;
    if (n < 4)
        return load_fail(
            t, buf,
            nl_fail(NL_ERR_FORMAT,
                    "%s: truncated at byte %zu: a llama2.c tokenizer starts with a 4-byte max_token_length", path, n));
    int32_t mtl;
    memcpy(&mtl, b, 4);
    if (mtl < 1 || mtl > 65536)
        return load_fail(t, buf,
                         nl_fail(NL_ERR_FORMAT,
                                 "%s: max_token_length %d is out of range 1..65536 (not a llama2.c tokenizer?)", path,
                                 (int)mtl));
    /* Count the tokens first (each needs at least 8 bytes) to size the arrays. */
    size_t cap = vocab_size > 0 ? (size_t)vocab_size : (n - 4) / 8 + 1;
    t->pieces = calloc(cap, sizeof(char *));
    t->scores = calloc(cap, sizeof(float));
    if (!t->pieces || !t->scores) return load_fail(t, buf, nl_fail(NL_ERR_NOMEM, "out of memory loading %s", path));
    size_t p = 4;
    int count = 0;
    while (vocab_size > 0 ? count < vocab_size : p < n) {
        if (p + 8 > n)
            return load_fail(
                t, buf,
                nl_fail(NL_ERR_FORMAT,
                        "%s: truncated at byte %zu: token %d needs 8 bytes of score and length at byte %zu%s", path, n,
                        count, p, vocab_size > 0 ? " (expected a vocabulary of that size)" : ""));
        float score;
        int32_t len;
        memcpy(&score, b + p, 4);
        memcpy(&len, b + p + 4, 4);
        if (isnan(score)) return load_fail(t, buf, nl_fail(NL_ERR_FORMAT, "%s: token %d has a NaN score", path, count));
        if (len < 0 || len > mtl)
            return load_fail(t, buf,
                             nl_fail(NL_ERR_FORMAT, "%s: token %d has length %d, outside 0..max_token_length %d", path,
                                     count, (int)len, (int)mtl));
        if (p + 8 + (size_t)len > n)
            return load_fail(t, buf,
                             nl_fail(NL_ERR_FORMAT, "%s: truncated at byte %zu: token %d needs %d bytes at byte %zu",
                                     path, n, count, (int)len, p + 8));
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
        return load_fail(
            t, buf,
            nl_fail(NL_ERR_FORMAT,
                    "%s: %zu bytes left after %d tokens: the file holds more tokens than the model's vocab_size %d",
                    path, n - p, count, vocab_size));
    nl_free(buf);
    return finish_spm(t, path);
}

nl_status nl_tokenizer_init_spm(nl_tokenizer *t, int n, const char *const *pieces, const size_t *lens,
                                const float *scores, int bos_id, int eos_id, const char *what) {
    memset(t, 0, sizeof *t);
    t->kind = NL_TOKENIZER_LLAMA2C;
    t->pieces = calloc((size_t)(n > 0 ? n : 1), sizeof(char *));
    t->scores = calloc((size_t)(n > 0 ? n : 1), sizeof(float));
    if (!t->pieces || !t->scores) return load_fail(t, NULL, nl_fail(NL_ERR_NOMEM, "out of memory loading %s", what));
    for (int i = 0; i < n; i++) {
        size_t len = lens ? lens[i] : strlen(pieces[i]);
        if (memchr(pieces[i], 0, len))
            return load_fail(t, NULL, nl_fail(NL_ERR_FORMAT, "%s: token %d contains a NUL byte", what, i));
        if (isnan(scores[i]))
            return load_fail(t, NULL, nl_fail(NL_ERR_FORMAT, "%s: token %d has a NaN score", what, i));
        char *s = malloc(len + 1);
        if (!s) return load_fail(t, NULL, nl_fail(NL_ERR_NOMEM, "out of memory loading %s", what));
        memcpy(s, pieces[i], len);
        s[len] = '\0';
        t->pieces[i] = s;
        t->scores[i] = scores[i];
        t->vocab_size = i + 1;
    }
    NL_TRY(finish_spm(t, what));
    if (bos_id >= 0 && bos_id < n) t->bos_id = bos_id;
    if (eos_id >= 0 && eos_id < n) t->eos_id = eos_id;
    return NL_OK;
}

/* ---- encode ---- */

/* Scratch of the merge loop for sequences of up to `cap` tokens. */
typedef struct merge_cand {
    float score;
    int left, right, id;
    uint32_t ver_left, ver_right;
} merge_cand;
typedef struct merge_scratch {
    int *prev, *next; /* (cap,) doubly linked list of live symbols, -1 at the ends */
    uint32_t *ver;    /* (cap,) bumped whenever a symbol's token changes */
    char *alive;      /* (cap,) */
    merge_cand *heap; /* (3*cap,) candidate merges, best first */
    int n_heap;
    char *cat; /* 2*max_token_length+2 bytes */
} merge_scratch;

/* Heap order = run.c's choice: higher score first, then the leftmost pair. Symbols keep their
 * left-to-right order when merged, so the original index of the left symbol orders pairs. */
static int cand_before(const merge_cand *a, const merge_cand *b) {
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static void heap_push(merge_scratch *s, merge_cand c) {
    int i = s->n_heap++;
    while (i > 0 && cand_before(&c, &s->heap[(i - 1) / 2])) {
        s->heap[i] = s->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    s->heap[i] = c;
}

static merge_cand heap_pop(merge_scratch *s) {
    merge_cand top = s->heap[0], last = s->heap[--s->n_heap];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= s->n_heap) break;
        if (c + 1 < s->n_heap && cand_before(&s->heap[c + 1], &s->heap[c])) c++;
        if (!cand_before(&s->heap[c], &last)) break;
        s->heap[i] = s->heap[c];
        i = c;
    }
    if (s->n_heap) s->heap[i] = last;
    return top;
}

/* Pushes the merge of symbols (l, r) if their concatenation is a piece that run.c would take
 * (score > -1e10, its initial best). */
static void push_pair(const nl_tokenizer *t, merge_scratch *s, const int *tok, int l, int r) {
    if (l < 0 || r < 0) return;
    strcpy(s->cat, t->pieces[tok[l]]);
    strcat(s->cat, t->pieces[tok[r]]);
    int id = nl_tokenizer_lookup(t, s->cat);
    if (id < 0 || !(t->scores[id] > -1e10f)) return;
    merge_cand c = {t->scores[id], l, r, id, s->ver[l], s->ver[r]};
    heap_push(s, c);
}

/* run.c's merge loop over tok[0..m): repeatedly merge the adjacent pair whose concatenation is
 * the highest-scoring piece (leftmost on ties) until none merges. run.c rescans all pairs per
 * merge (quadratic); this keeps candidates in a heap and drops stale ones when popped, which
 * gives the same merges in O(m log m). Returns the new length (tokens compacted in place). */
static int64_t merge(const nl_tokenizer *t, int *tok, int64_t m, merge_scratch *s) {
    if (m < 2) return m;
    s->n_heap = 0;
    for (int i = 0; i < m; i++) {
        s->prev[i] = i - 1;
        s->next[i] = i + 1 < m ? i + 1 : -1;
        s->ver[i] = 0;
        s->alive[i] = 1;
    }
    for (int i = 0; i + 1 < m; i++) push_pair(t, s, tok, i, i + 1);
    while (s->n_heap) {
        merge_cand c = heap_pop(s);
        if (!s->alive[c.left] || !s->alive[c.right] || s->next[c.left] != c.right || s->ver[c.left] != c.ver_left ||
            s->ver[c.right] != c.ver_right)
            continue; /* stale: one of the symbols changed since the candidate was pushed */
        int l = c.left, r = c.right;
        tok[l] = c.id;
        s->ver[l]++;
        s->alive[r] = 0;
        s->next[l] = s->next[r];
        if (s->next[r] >= 0) s->prev[s->next[r]] = l;
        push_pair(t, s, tok, s->prev[l], l);
        push_pair(t, s, tok, l, s->next[l]);
    }
    int64_t n = 0;
    for (int i = 0; i >= 0; i = s->next[i]) tok[n++] = tok[i]; /* symbol 0 is never merged away */
    return n;
}

/* run.c's first pass over text[s..e): one token per UTF-8 codepoint found in the vocabulary,
 * else one byte-fallback token (byte + 3) per byte. Appends to out, returns the new count. */
static int64_t codepoints(const nl_tokenizer *t, const unsigned char *text, size_t len, size_t s, size_t e, int *out,
                          int64_t n) {
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
        if (id >= 0)
            out[n++] = id;
        else
            for (int j = 0; j < sl; j++) out[n++] = (unsigned char)buf[j] + 3;
        sl = 0;
    }
    return n;
}

const char *nl_tokenizer_vocab_piece(const nl_tokenizer *t, int id) {
    if (id < 0 || id >= t->vocab_size) return NULL;
    if (t->kind == NL_TOKENIZER_HF) return nl_bpe_piece(t->bpe, id);
    if (t->kind == NL_TOKENIZER_BYTE) return t->byte_pieces + 2 * id;
    return t->pieces[id];
}

nl_status nl_tokenizer_encode(const nl_tokenizer *t, const char *text, size_t text_bytes, int bos, int eos,
                              int **tokens, int64_t *n_tokens) {
    return nl_tokenizer_encode_special(t, text, text_bytes, bos, eos, 0, tokens, n_tokens);
}

/* tokenizer.json: BOS, the BPE ids, EOS. plain: no special token where it marks a byte. */
static nl_status encode_hf(const nl_tokenizer *t, const char *text, size_t text_bytes, int bos, int eos, int special,
                           const unsigned char *plain, int **tokens, int64_t *n_tokens) {
    int64_t cap = (int64_t)text_bytes + 8; /* grown by nl_bpe_encode as the normalized text needs */
    int *out = nl_malloc((size_t)cap * sizeof(int), "encoded tokens");
    if (!out) return NL_ERR_NOMEM;
    int64_t n = 0;
    if (bos && t->bos_id >= 0) out[n++] = t->bos_id;
    n = plain ? nl_bpe_encode_marked(t->bpe, text, text_bytes, plain, &out, &cap, n)
              : nl_bpe_encode(t->bpe, text, text_bytes, special, &out, &cap, n);
    int *grown = n == cap ? realloc(out, (size_t)(cap + 1) * sizeof(int)) : out; /* room for EOS */
    if (n < 0 || !grown) {
        nl_free(out);
        return n == -2 ? NL_ERR_RANGE
               : n < 0 ? NL_ERR_NOMEM
                       : nl_fail(NL_ERR_NOMEM, "out of memory encoding %zu bytes", text_bytes);
    }
    out = grown;
    if (eos && t->eos_id >= 0) out[n++] = t->eos_id;
    *tokens = out;
    *n_tokens = n;
    return NL_OK;
}

nl_status nl_tokenizer_encode_marked(const nl_tokenizer *t, const char *text, size_t text_bytes, int bos, int eos,
                                     const unsigned char *plain, int **tokens, int64_t *n_tokens) {
    if (t->kind != NL_TOKENIZER_HF || !plain || text_bytes > INT32_MAX / 2 - 8)
        return nl_tokenizer_encode_special(t, text, text_bytes, bos, eos, 1, tokens, n_tokens);
    *tokens = NULL;
    *n_tokens = 0;
    return encode_hf(t, text, text_bytes, bos, eos, 1, plain, tokens, n_tokens);
}

nl_status nl_tokenizer_encode_special(const nl_tokenizer *t, const char *text, size_t text_bytes, int bos, int eos,
                                      int special, int **tokens, int64_t *n_tokens) {
    *tokens = NULL;
    *n_tokens = 0;
    if (text_bytes > INT32_MAX / 2 - 8)
        return nl_fail(NL_ERR_RANGE, "text of %zu bytes is too long to encode at once", text_bytes);
    if (t->kind == NL_TOKENIZER_HF) return encode_hf(t, text, text_bytes, bos, eos, special, NULL, tokens, n_tokens);
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
    size_t cap = longest + 2; /* + the dummy prefix */
    merge_scratch ms = {0};
    ms.prev = nl_malloc(cap * sizeof(int), "merge scratch");
    ms.next = nl_malloc(cap * sizeof(int), "merge scratch");
    ms.ver = nl_malloc(cap * sizeof(uint32_t), "merge scratch");
    ms.alive = nl_malloc(cap, "merge scratch");
    ms.heap = nl_malloc(3 * cap * sizeof(merge_cand), "merge scratch"); /* m-1 + 2 per merge */
    ms.cat = nl_malloc(2 * (size_t)t->max_token_length + 2, "merge scratch");
    nl_status rc = ms.prev && ms.next && ms.ver && ms.alive && ms.heap && ms.cat ? NL_OK : NL_ERR_NOMEM;
    if (rc) goto done;
    if (bos && t->bos_id >= 0) out[n++] = t->bos_id;
    size_t w = 0; /* start of the current word */
    for (size_t i = 1; text_bytes && i <= text_bytes; i++) {
        if (i < text_bytes && !(t->words_independent && s[i] == ' ' && s[i - 1] != ' ')) continue;
        int64_t start = n;
        if (w == 0) out[n++] = t->dummy_prefix_id; /* run.c: dummy prefix before non-empty text */
        n = codepoints(t, s, text_bytes, w, i, out, n);
        n = start + merge(t, out + start, n - start, &ms);
        w = i;
    }
    if (eos && t->eos_id >= 0) out[n++] = t->eos_id;
    *tokens = out;
    *n_tokens = n;
    out = NULL;
done:
    nl_free(out);
    nl_free(ms.prev);
    nl_free(ms.next);
    nl_free(ms.ver);
    nl_free(ms.alive);
    nl_free(ms.heap);
    nl_free(ms.cat);
    return rc;
}

/* ---- decode ---- */

const char *nl_tokenizer_piece(const nl_tokenizer *t, int prev_token, int token, size_t *len) {
    if (token < 0 || token >= t->vocab_size) {
        nl_fail(NL_ERR_INVALID, "token %d is outside the vocabulary (0..%d)", token, t->vocab_size - 1);
        return NULL;
    }
    if (t->kind == NL_TOKENIZER_BYTE) {
        *len = 1;
        return &t->byte_pieces[2 * token];
    }
    if (t->kind == NL_TOKENIZER_HF) {
        const char *b = nl_bpe_token_bytes(t->bpe, token, len);
        if (!b) { /* an id of the model's padded vocabulary that the file does not define */
            *len = 0;
            return "";
        }
        if (*len && b[0] == ' ' && nl_bpe_strips_first_space(t->bpe) && (prev_token < 0 || prev_token == t->bos_id)) {
            (*len)--;
            b++;
        }
        return b;
    }
    const char *p = t->pieces[token];
    if (t->bos_id >= 0 && prev_token == t->bos_id && p[0] == ' ') p++;
    int byte;
    if (is_byte_piece(p, &byte)) {
        *len = 1;
        return &t->byte_pieces[2 * byte];
    }
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
        size_t len = 1;
        if (t->kind == NL_TOKENIZER_HF)
            nl_tokenizer_piece(t, -1, tokens[i], &len);
        else
            len = strlen(t->pieces[tokens[i]]);
        cap += len + 1;
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

/* ---- tokenizer.json ---- */

nl_status nl_tokenizer_load_json(nl_tokenizer *t, const char *path, int vocab_size) {
    memset(t, 0, sizeof *t);
    struct stat st;
    if (stat(path, &st) != 0) return nl_fail(NL_ERR_IO, "cannot open %s", path);
    if (!S_ISREG(st.st_mode)) return nl_fail(NL_ERR_IO, "%s: not a regular file", path);
    char *buf;
    size_t n;
    NL_TRY(nl_read_file(path, &buf, &n));
    nl_status rc = nl_tokenizer_parse_json(t, buf, n, path, vocab_size);
    nl_free(buf);
    return rc;
}

nl_status nl_tokenizer_parse_json(nl_tokenizer *t, const char *json, size_t json_bytes, const char *path,
                                  int vocab_size) {
    memset(t, 0, sizeof *t);
    NL_TRY(nl_bpe_parse(&t->bpe, json, json_bytes, path));
    int V = nl_bpe_vocab_size(t->bpe);
    if (vocab_size > 0 && V > vocab_size) {
        nl_tokenizer_free(t);
        return nl_fail(NL_ERR_FORMAT, "%s: the tokenizer has ids up to %d but the model's vocabulary is %d", path,
                       V - 1, vocab_size);
    }
    t->kind = NL_TOKENIZER_HF;
    t->vocab_size = vocab_size > 0 ? vocab_size : V;
    t->bos_id = nl_bpe_bos(t->bpe);
    t->eos_id = nl_bpe_eos(t->bpe);
    t->dummy_prefix_id = -1;
    init_byte_pieces(t);
    for (int i = 0; i < V; i++) {
        size_t len;
        if (nl_bpe_token_bytes(t->bpe, i, &len) && (int)len > t->max_token_length) t->max_token_length = (int)len;
    }
    return NL_OK;
}

/* GPT-2's bytes_to_unicode code point of byte c. */
static int byte_to_cp(int c) {
    if ((c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF)) return c;
    int n = 0;
    for (int k = 0; k < c; k++)
        if (!((k >= '!' && k <= '~') || (k >= 0xA1 && k <= 0xAC) || (k >= 0xAE && k <= 0xFF))) n++;
    return 256 + n;
}

/* A piece of the llama2.c vocabulary as tokenizer.json spells it (' ' -> U+2581). */
static char *spm_piece(const char *p) {
    size_t n = strlen(p), k = 0;
    char *o = malloc(3 * n + 1);
    if (!o) return NULL;
    for (size_t i = 0; i < n; i++) {
        if (p[i] == ' ') {
            memcpy(o + k, "\xe2\x96\x81", 3);
            k += 3;
        } else {
            o[k++] = p[i];
        }
    }
    o[k] = 0;
    return o;
}

typedef struct spm_merge {
    float score;
    int id, left, right;
} spm_merge;

static int cmp_merge(const void *a, const void *b) {
    const spm_merge *x = a, *y = b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    if (x->id != y->id) return x->id < y->id ? -1 : 1;
    return x->left < y->left ? -1 : x->left > y->left;
}

static cJSON *added_token(int id, const char *content) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "id", id);
    cJSON_AddStringToObject(o, "content", content);
    cJSON_AddBoolToObject(o, "single_word", 0);
    cJSON_AddBoolToObject(o, "lstrip", 0);
    cJSON_AddBoolToObject(o, "rstrip", 0);
    cJSON_AddBoolToObject(o, "normalized", 0);
    cJSON_AddBoolToObject(o, "special", 1);
    return o;
}

static cJSON *json_step(const char *type) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", type);
    return o;
}

/* tokenizer.json for the byte-level and llama2.c vocabularies (see nl_tokenizer_save_json). */
static cJSON *tokenizer_json(const nl_tokenizer *t) {
    cJSON *root = cJSON_CreateObject(), *model = cJSON_CreateObject(), *vocab = cJSON_CreateObject();
    cJSON *merges = cJSON_CreateArray(), *added = cJSON_CreateArray();
    cJSON_AddStringToObject(root, "version", "1.0");
    cJSON_AddNullToObject(root, "truncation");
    cJSON_AddNullToObject(root, "padding");
    cJSON_AddItemToObject(root, "added_tokens", added);
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddNullToObject(model, "dropout");
    if (t->kind == NL_TOKENIZER_BYTE) {
        cJSON_AddNullToObject(root, "normalizer");
        cJSON *pre = json_step("ByteLevel");
        cJSON_AddBoolToObject(pre, "add_prefix_space", 0);
        cJSON_AddBoolToObject(pre, "trim_offsets", 1);
        cJSON_AddBoolToObject(pre, "use_regex", 0);
        cJSON_AddItemToObject(root, "pre_tokenizer", pre);
        cJSON_AddNullToObject(root, "post_processor");
        cJSON *dec = json_step("ByteLevel");
        cJSON_AddBoolToObject(dec, "add_prefix_space", 0);
        cJSON_AddBoolToObject(dec, "trim_offsets", 1);
        cJSON_AddBoolToObject(dec, "use_regex", 0);
        cJSON_AddItemToObject(root, "decoder", dec);
        cJSON_AddNullToObject(model, "unk_token");
        cJSON_AddBoolToObject(model, "byte_fallback", 0);
        for (int c = 0; c < 256; c++) {
            char u[8] = {0};
            int cp = byte_to_cp(c);
            if (cp < 0x80)
                u[0] = (char)cp;
            else {
                u[0] = (char)(0xC0 | (cp >> 6));
                u[1] = (char)(0x80 | (cp & 0x3F));
            }
            cJSON_AddNumberToObject(vocab, u, c);
        }
    } else {
        cJSON_AddItemToArray(added, added_token(0, "<unk>"));
        cJSON_AddItemToArray(added, added_token(t->bos_id, "<s>"));
        cJSON_AddItemToArray(added, added_token(t->eos_id, "</s>"));
        cJSON *norm = json_step("Sequence"), *steps = cJSON_AddArrayToObject(norm, "normalizers");
        cJSON *pre = json_step("Prepend");
        cJSON_AddStringToObject(pre, "prepend", "\xe2\x96\x81");
        cJSON_AddItemToArray(steps, pre);
        cJSON *rep = json_step("Replace"), *pat = cJSON_AddObjectToObject(rep, "pattern");
        cJSON_AddStringToObject(pat, "String", " ");
        cJSON_AddStringToObject(rep, "content", "\xe2\x96\x81");
        cJSON_AddItemToArray(steps, rep);
        cJSON_AddItemToObject(root, "normalizer", norm);
        cJSON_AddNullToObject(root, "pre_tokenizer");
        cJSON *pp = json_step("TemplateProcessing"), *single = cJSON_AddArrayToObject(pp, "single");
        cJSON *st = cJSON_CreateObject(), *sti = cJSON_AddObjectToObject(st, "SpecialToken");
        cJSON_AddStringToObject(sti, "id", "<s>");
        cJSON_AddNumberToObject(sti, "type_id", 0);
        cJSON_AddItemToArray(single, st);
        cJSON *sq = cJSON_CreateObject(), *sqi = cJSON_AddObjectToObject(sq, "Sequence");
        cJSON_AddStringToObject(sqi, "id", "A");
        cJSON_AddNumberToObject(sqi, "type_id", 0);
        cJSON_AddItemToArray(single, sq);
        cJSON *pair = cJSON_AddArrayToObject(pp, "pair");
        cJSON_AddItemToArray(pair, cJSON_Duplicate(st, 1));
        cJSON_AddItemToArray(pair, cJSON_Duplicate(sq, 1));
        cJSON *stk = cJSON_AddObjectToObject(pp, "special_tokens"), *bos = cJSON_AddObjectToObject(stk, "<s>");
        cJSON_AddStringToObject(bos, "id", "<s>");
        cJSON *ids = cJSON_AddArrayToObject(bos, "ids");
        cJSON_AddItemToArray(ids, cJSON_CreateNumber(t->bos_id));
        cJSON *toks = cJSON_AddArrayToObject(bos, "tokens");
        cJSON_AddItemToArray(toks, cJSON_CreateString("<s>"));
        cJSON_AddItemToObject(root, "post_processor", pp);
        cJSON *dec = json_step("Sequence"), *ds = cJSON_AddArrayToObject(dec, "decoders");
        cJSON *r2 = json_step("Replace"), *p2 = cJSON_AddObjectToObject(r2, "pattern");
        cJSON_AddStringToObject(p2, "String", "\xe2\x96\x81");
        cJSON_AddStringToObject(r2, "content", " ");
        cJSON_AddItemToArray(ds, r2);
        cJSON_AddItemToArray(ds, json_step("ByteFallback"));
        cJSON_AddItemToArray(ds, json_step("Fuse"));
        cJSON *strip = json_step("Strip");
        cJSON_AddStringToObject(strip, "content", " ");
        cJSON_AddNumberToObject(strip, "start", 1);
        cJSON_AddNumberToObject(strip, "stop", 0);
        cJSON_AddItemToArray(ds, strip);
        cJSON_AddItemToObject(root, "decoder", dec);
        cJSON_AddStringToObject(model, "unk_token", "<unk>");
        cJSON_AddBoolToObject(model, "byte_fallback", 1);
        cJSON_AddBoolToObject(model, "fuse_unk", 1);
        char **sp = calloc((size_t)t->vocab_size, sizeof(char *));
        for (int i = 0; sp && i < t->vocab_size; i++) {
            const char *p = i == 0 ? "<unk>" : i == t->bos_id ? "<s>" : i == t->eos_id ? "</s>" : t->pieces[i];
            sp[i] = spm_piece(p);
            if (sp[i] && !cJSON_GetObjectItemCaseSensitive(vocab, sp[i])) cJSON_AddNumberToObject(vocab, sp[i], i);
        }
        /* merges: every split of a piece into two pieces, ranked by the merged piece's score (the
         * llama2.c rule: the highest-scoring concatenation merges first) */
        size_t nm = 0, cap = 1024;
        spm_merge *ms = malloc(cap * sizeof *ms);
        for (int i = 3; ms && sp && i < t->vocab_size; i++) {
            const char *p = t->pieces[i];
            size_t n = strlen(p);
            int byte;
            if (n < 2 || is_byte_piece(p, &byte) || i == t->bos_id || i == t->eos_id) continue;
            char *left = malloc(n + 1);
            if (!left) break;
            for (size_t k = 1; k < n; k++) {
                memcpy(left, p, k);
                left[k] = 0;
                int l = nl_tokenizer_lookup(t, left), r = nl_tokenizer_lookup(t, p + k);
                if (l < 3 || r < 3 || l == t->bos_id || r == t->bos_id || l == t->eos_id || r == t->eos_id) continue;
                if (nm == cap) {
                    spm_merge *m2 = realloc(ms, 2 * cap * sizeof *ms);
                    if (!m2) break;
                    ms = m2;
                    cap *= 2;
                }
                ms[nm++] = (spm_merge){t->scores[i], i, l, r};
            }
            free(left);
        }
        if (ms) qsort(ms, nm, sizeof *ms, cmp_merge);
        for (size_t k = 0; ms && sp && k < nm; k++) {
            cJSON *pr = cJSON_CreateArray();
            cJSON_AddItemToArray(pr, cJSON_CreateString(sp[ms[k].left]));
            cJSON_AddItemToArray(pr, cJSON_CreateString(sp[ms[k].right]));
            cJSON_AddItemToArray(merges, pr);
        }
        free(ms);
        for (int i = 0; sp && i < t->vocab_size; i++) free(sp[i]);
        free(sp);
    }
    cJSON_AddItemToObject(model, "vocab", vocab);
    cJSON_AddItemToObject(model, "merges", merges);
    cJSON_AddItemToObject(root, "model", model);
    return root;
}

nl_status nl_tokenizer_save_json(const nl_tokenizer *t, const char *path) {
    if (t->kind == NL_TOKENIZER_HF) {
        size_t n;
        const char *js = nl_bpe_json(t->bpe, &n);
        return nl_write_file_atomic(path, js, n);
    }
    cJSON *root = tokenizer_json(t);
    char *s = root ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!s) return nl_fail(NL_ERR_NOMEM, "out of memory writing %s", path);
    nl_status rc = nl_write_file_atomic(path, s, strlen(s));
    free(s);
    return rc;
}

/* Length of the valid UTF-8 sequence at s[0..n) (a code point), or 0. */
static size_t utf8_len(const unsigned char *s, size_t n) {
    size_t l = s[0] >= 0xF0 && s[0] <= 0xF4 ? 4 : s[0] >= 0xE0 ? 3 : s[0] >= 0xC2 && s[0] <= 0xDF ? 2 : 0;
    if (s[0] >= 0xF5 || l > n) return 0;
    for (size_t k = 1; k < l; k++)
        if ((s[k] & 0xC0) != 0x80) return 0;
    if (l == 3 && ((s[0] == 0xE0 && s[1] < 0xA0) || (s[0] == 0xED && s[1] >= 0xA0))) return 0;
    if (l == 4 && ((s[0] == 0xF0 && s[1] < 0x90) || (s[0] == 0xF4 && s[1] >= 0x90))) return 0;
    return l;
}

char *nl_tokenizer_escape(const char *s, size_t n) {
    char *o = nl_malloc(4 * n + 1, "escaped text"), *p = o;
    if (!o) return NULL;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        size_t l = c >= 0x80 ? utf8_len((const unsigned char *)s + i, n - i) : 0;
        if (l) {
            memcpy(p, s + i, l);
            p += l;
            i += l - 1;
        } else if (c >= 0x80)
            p += sprintf(p, "\\x%02x", c);
        else if (c == '\n')
            p += sprintf(p, "\\n");
        else if (c == '\t')
            p += sprintf(p, "\\t");
        else if (c == '\r')
            p += sprintf(p, "\\r");
        else if (c == '\\')
            p += sprintf(p, "\\\\");
        else if (c < 0x20 || c == 0x7f)
            p += sprintf(p, "\\x%02x", c);
        else
            *p++ = (char)c;
    }
    *p = 0;
    return o;
}
