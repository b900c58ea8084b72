/*
 * BPE tokenizers from tokenizer.json: byte-level (GPT-2, Llama 3, Qwen2) and SentencePiece-style
 * with byte fallback (Llama 2). See include/nanolm/bpe.h.
 */
#include "nanolm/bpe.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <cjson/cJSON.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* GPT-2's pre-tokenizer (tokenizers' ByteLevel with use_regex, and openai/gpt-2 encoder.py). */
static const char GPT2_REGEX[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
static const char SPM_SPACE[] = "\xe2\x96\x81"; /* U+2581 LOWER ONE EIGHTH BLOCK */

enum { MODE_BYTELEVEL = 1, MODE_SPM = 2 };
enum { NORM_PREPEND = 1, NORM_REPLACE = 2, NORM_NFC = 3 };

typedef struct norm_op {
    int kind;
    char *a, *b; /* PREPEND: a = text; REPLACE: a -> b */
} norm_op;

/* A Split pre-tokenizer (tokenizers' SplitDelimiterBehavior), or ByteLevel's regex (Isolated). */
enum { SPLIT_ISOLATED, SPLIT_REMOVED, SPLIT_MERGED_PREV, SPLIT_MERGED_NEXT, SPLIT_CONTIGUOUS };
#define MAX_SPLITS 8
typedef struct split_stage {
    pcre2_code *re;
    int behavior, invert;
} split_stage;

typedef struct added_tok {
    char *s;
    size_t len;
    int id, special;
} added_tok;

struct nl_bpe {
    char *json;
    size_t json_bytes;
    int V;
    char **pieces;   /* (V) file spelling, NULL for a hole */
    char **dec;      /* (V) decoded bytes */
    size_t *dec_len; /* (V) */
    int *vh;         /* string -> id, open addressing over pieces (id + 1, 0 = empty) */
    uint32_t vh_mask;
    uint64_t *mkey; /* merges: (a << 32 | b) + 1, 0 = empty */
    int32_t *mrank, *mnew;
    uint32_t m_mask;
    int n_added;
    added_tok *added;
    int first_byte[257]; /* added tokens sorted by first byte: [first_byte[c], first_byte[c+1]) */
    int *added_order;
    int mode;
    int byte_fallback, ignore_merges, unk_id, fuse_unk;
    int n_norm;
    norm_op norm[8];
    int meta_prepend;     /* Metaspace pre-tokenizer: 0 never, 1 always, 2 first */
    int meta_split;       /* Metaspace split at U+2581 */
    int meta;             /* a Metaspace pre-tokenizer is present */
    int add_prefix_space; /* ByteLevel */
    split_stage split[MAX_SPLITS]; /* pre-tokenizer splits, applied in order (none: the segment is one word) */
    int n_split;
    int byte_ids[256];    /* byte-level: id of the piece of byte b; SPM: <0xXX> ids (-1: none) */
    char b2u[256][3];     /* byte -> UTF-8 of its printable code point */
    uint8_t b2u_len[256];
    int16_t u2b[324]; /* code point (< 324) -> byte, -1 */
    int bos, eos, strip_first;
};

/* ---- hashing -------------------------------------------------------------------------------- */

static uint32_t hash_bytes(const char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 16777619u;
    /* FNV's low bits mix poorly and the tables index by them: finish with murmur3's fmix32 */
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    h ^= h >> 16;
    return h;
}

static uint32_t hash_pair(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return (uint32_t)k;
}

static int vocab_get(const nl_bpe *b, const char *s, size_t n) {
    for (uint32_t i = hash_bytes(s, n) & b->vh_mask;; i = (i + 1) & b->vh_mask) {
        int e = b->vh[i];
        if (!e) return -1;
        const char *p = b->pieces[e - 1];
        if (strlen(p) == n && !memcmp(p, s, n)) return e - 1;
    }
}

static void vocab_put(nl_bpe *b, int id) {
    const char *p = b->pieces[id];
    for (uint32_t i = hash_bytes(p, strlen(p)) & b->vh_mask;; i = (i + 1) & b->vh_mask) {
        if (!b->vh[i]) {
            b->vh[i] = id + 1;
            return;
        }
        if (!strcmp(b->pieces[b->vh[i] - 1], p)) return; /* first id wins */
    }
}

/* Merge of (l, r): rank and the merged id, or rank -1. */
static int merge_get(const nl_bpe *b, int l, int r, int *new_id) {
    uint64_t key = ((uint64_t)(uint32_t)l << 32 | (uint32_t)r) + 1;
    for (uint32_t i = hash_pair(key) & b->m_mask;; i = (i + 1) & b->m_mask) {
        if (!b->mkey[i]) return -1;
        if (b->mkey[i] == key) {
            *new_id = b->mnew[i];
            return b->mrank[i];
        }
    }
}

static void merge_put(nl_bpe *b, int l, int r, int rank, int new_id) {
    uint64_t key = ((uint64_t)(uint32_t)l << 32 | (uint32_t)r) + 1;
    for (uint32_t i = hash_pair(key) & b->m_mask;; i = (i + 1) & b->m_mask) {
        if (!b->mkey[i]) {
            b->mkey[i] = key;
            b->mrank[i] = rank;
            b->mnew[i] = new_id;
            return;
        }
        if (b->mkey[i] == key) return; /* a repeated merge keeps its first (lowest) rank */
    }
}

static uint32_t pow2_above(size_t n) {
    uint32_t c = 16;
    while (c < 2 * n + 16) c <<= 1;
    return c;
}

/* ---- the merge loop (tokenizers' Word::merge_all) ------------------------------------------- */

typedef struct cand {
    int rank, pos, ver_l, ver_r;
} cand;

typedef struct scratch {
    int *prev, *next, *ver, cap;
    cand *heap;
    int nh, heap_cap;
} scratch;

static int cand_less(const cand *a, const cand *b) { return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos; }

static void hpush(scratch *s, cand c) {
    int i = s->nh++;
    s->heap[i] = c;
    while (i > 0 && cand_less(&s->heap[i], &s->heap[(i - 1) / 2])) {
        cand t = s->heap[i];
        s->heap[i] = s->heap[(i - 1) / 2];
        s->heap[(i - 1) / 2] = t;
        i = (i - 1) / 2;
    }
}

static cand hpop(scratch *s) {
    cand top = s->heap[0];
    s->heap[0] = s->heap[--s->nh];
    for (int i = 0;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < s->nh && cand_less(&s->heap[l], &s->heap[m])) m = l;
        if (r < s->nh && cand_less(&s->heap[r], &s->heap[m])) m = r;
        if (m == i) break;
        cand t = s->heap[i];
        s->heap[i] = s->heap[m];
        s->heap[m] = t;
        i = m;
    }
    return top;
}

static int scratch_reserve(scratch *s, int n) {
    if (n <= s->cap) return 0;
    int cap = n * 2 + 16;
    int *p = realloc(s->prev, (size_t)cap * sizeof(int)), *q, *v;
    if (!p) return -1;
    s->prev = p;
    if (!(q = realloc(s->next, (size_t)cap * sizeof(int)))) return -1;
    s->next = q;
    if (!(v = realloc(s->ver, (size_t)cap * sizeof(int)))) return -1;
    s->ver = v;
    cand *h = realloc(s->heap, (size_t)cap * 3 * sizeof(cand));
    if (!h) return -1;
    s->heap = h;
    s->cap = cap;
    s->heap_cap = cap * 3;
    return 0;
}

static void push_pair(const nl_bpe *b, scratch *s, const int *sym, int l) {
    int r = s->next[l], nid = -1;
    if (r < 0) return;
    int rank = merge_get(b, sym[l], sym[r], &nid);
    if (rank < 0) return;
    cand c = {rank, l, s->ver[l], s->ver[r]};
    hpush(s, c);
}

/* Merges sym[0..n) in place; returns the new count. */
static int merge_all(const nl_bpe *b, int *sym, int n, scratch *s) {
    if (n < 2) return n;
    if (scratch_reserve(s, n)) return -1;
    for (int i = 0; i < n; i++) {
        s->prev[i] = i - 1;
        s->next[i] = i + 1 < n ? i + 1 : -1;
        s->ver[i] = 0;
    }
    s->nh = 0;
    for (int i = 0; i + 1 < n; i++) push_pair(b, s, sym, i);
    while (s->nh) {
        cand c = hpop(s);
        int l = c.pos, r = s->next[l];
        if (s->ver[l] != c.ver_l || r < 0 || s->ver[r] != c.ver_r || s->ver[l] < 0) continue;
        int nid = -1;
        if (merge_get(b, sym[l], sym[r], &nid) != c.rank) continue;
        sym[l] = nid;
        s->ver[l]++;
        s->ver[r] = -1; /* dead */
        s->next[l] = s->next[r];
        if (s->next[r] >= 0) s->prev[s->next[r]] = l;
        if (s->prev[l] >= 0) push_pair(b, s, sym, s->prev[l]);
        push_pair(b, s, sym, l);
    }
    int m = 0;
    for (int i = 0; i >= 0; i = s->next[i]) sym[m++] = sym[i];
    return m;
}

/* ---- loading -------------------------------------------------------------------------------- */

void nl_bpe_free(nl_bpe *b) {
    if (!b) return;
    for (int i = 0; i < b->V; i++) {
        free(b->pieces ? b->pieces[i] : NULL);
        free(b->dec ? b->dec[i] : NULL);
    }
    free(b->pieces);
    free(b->dec);
    free(b->dec_len);
    free(b->vh);
    free(b->mkey);
    free(b->mrank);
    free(b->mnew);
    for (int i = 0; i < b->n_added; i++) free(b->added[i].s);
    free(b->added);
    free(b->added_order);
    for (int i = 0; i < b->n_norm; i++) {
        free(b->norm[i].a);
        free(b->norm[i].b);
    }
    for (int i = 0; i < b->n_split; i++) pcre2_code_free(b->split[i].re);
    free(b->json);
    free(b);
}

static void init_byte_map(nl_bpe *b) {
    /* bytes_to_unicode (openai/gpt-2 encoder.py): printable Latin-1 bytes map to themselves,
     * the other 68 to 256, 257, ... in byte order. */
    int n = 0;
    for (int i = 0; i < 324; i++) b->u2b[i] = -1;
    for (int c = 0; c < 256; c++) {
        int keep = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF);
        int cp = keep ? c : 256 + n++;
        b->b2u_len[c] = (uint8_t)utf8proc_encode_char(cp, (utf8proc_uint8_t *)b->b2u[c]);
        b->u2b[cp] = (int16_t)c;
    }
}

static nl_status bad(nl_bpe *b, const char *what, const char *fmt, const char *arg) {
    char msg[512];
    snprintf(msg, sizeof msg, fmt, arg);
    nl_bpe_free(b);
    return nl_fail(NL_ERR_FORMAT, "%s: %s", what, msg);
}

static const char *jstr(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int jbool(const cJSON *o, const char *key, int def) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : def;
}

/* Normalizers: Sequence, Prepend, Replace (String pattern), NFC; NULL = none. */
static nl_status parse_normalizer(nl_bpe *b, const cJSON *n, const char *what) {
    if (!n || cJSON_IsNull(n)) return NL_OK;
    const char *ty = jstr(n, "type");
    if (ty && !strcmp(ty, "Sequence")) {
        const cJSON *e;
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(n, "normalizers")) NL_TRY(parse_normalizer(b, e, what));
        return NL_OK;
    }
    if (b->n_norm == 8) return nl_fail(NL_ERR_FORMAT, "%s: key \"normalizer\": too many steps", what);
    norm_op *op = &b->norm[b->n_norm];
    if (ty && !strcmp(ty, "Prepend") && jstr(n, "prepend")) {
        op->kind = NORM_PREPEND;
        op->a = strdup(jstr(n, "prepend"));
    } else if (ty && !strcmp(ty, "Replace") && jstr(n, "content") &&
               jstr(cJSON_GetObjectItemCaseSensitive(n, "pattern"), "String")) {
        op->kind = NORM_REPLACE;
        op->a = strdup(jstr(cJSON_GetObjectItemCaseSensitive(n, "pattern"), "String"));
        op->b = strdup(jstr(n, "content"));
        if (op->a && !op->a[0])
            return nl_fail(NL_ERR_FORMAT, "%s: key \"normalizer\": Replace of an empty string", what);
    } else if (ty && !strcmp(ty, "NFC")) {
        op->kind = NORM_NFC;
    } else {
        return nl_fail(NL_ERR_FORMAT,
                       "%s: key \"normalizer\": type \"%s\" is not supported (Sequence, Prepend, Replace, NFC)", what,
                       ty ? ty : "?");
    }
    if ((op->kind != NORM_NFC && !op->a) || (op->kind == NORM_REPLACE && !op->b)) return NL_ERR_NOMEM;
    b->n_norm++;
    return NL_OK;
}

/* Adds a split stage: a regex (or, literal, a String pattern) with its behavior. */
static nl_status add_split(nl_bpe *b, const char *pat, int literal, int behavior, int invert, const char *what) {
    if (b->n_split == MAX_SPLITS)
        return nl_fail(NL_ERR_FORMAT, "%s: key \"pre_tokenizer\": more than %d splits", what, MAX_SPLITS);
    if (!pat[0]) return nl_fail(NL_ERR_FORMAT, "%s: key \"pre_tokenizer\": Split with an empty pattern", what);
    int err;
    PCRE2_SIZE off;
    split_stage *sp = &b->split[b->n_split];
    sp->re =
        pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED,
                      PCRE2_UTF | PCRE2_MATCH_INVALID_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP), &err, &off, NULL);
    sp->behavior = behavior;
    sp->invert = invert;
    if (!sp->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return nl_fail(NL_ERR_FORMAT, "%s: key \"pre_tokenizer\": regex error at offset %zu: %s", what, (size_t)off,
                       (const char *)msg);
    }
    pcre2_jit_compile(sp->re, PCRE2_JIT_COMPLETE); /* optional: falls back to the interpreter */
    b->n_split++;
    return NL_OK;
}

/* Pre-tokenizers: Sequence, ByteLevel, Split (Regex or String; Isolated, Removed, MergedWithPrevious,
 * MergedWithNext, Contiguous; invert), Metaspace; NULL = none. Splits apply in their order, each to
 * the pieces of the one before (DeepSeek-V3: digits, then CJK runs, then its word regex). */
static nl_status parse_pretok(nl_bpe *b, const cJSON *p, const char *what) {
    if (!p || cJSON_IsNull(p)) return NL_OK;
    const char *ty = jstr(p, "type");
    if (ty && !strcmp(ty, "Sequence")) {
        const cJSON *e;
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(p, "pretokenizers")) NL_TRY(parse_pretok(b, e, what));
        return NL_OK;
    }
    if (ty && !strcmp(ty, "ByteLevel")) {
        b->mode = MODE_BYTELEVEL;
        b->add_prefix_space = jbool(p, "add_prefix_space", 0);
        if (jbool(p, "use_regex", 1)) NL_TRY(add_split(b, GPT2_REGEX, 0, SPLIT_ISOLATED, 0, what));
        return NL_OK;
    }
    if (ty && !strcmp(ty, "Split")) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(p, "pattern");
        const char *beh = jstr(p, "behavior"), *re = jstr(pat, "Regex"), *lit = jstr(pat, "String");
        static const char *const names[] = {"Isolated", "Removed", "MergedWithPrevious", "MergedWithNext",
                                            "Contiguous"};
        int behavior = -1;
        for (int k = 0; beh && k < 5; k++)
            if (!strcmp(beh, names[k])) behavior = k;
        if ((!re && !lit) || behavior < 0)
            return nl_fail(
                NL_ERR_FORMAT,
                "%s: key \"pre_tokenizer\": Split needs a pattern {\"Regex\"} or {\"String\"} and a behavior "
                "(Isolated, Removed, MergedWithPrevious, MergedWithNext, Contiguous), got \"%s\"",
                what, beh ? beh : "none");
        if (jbool(p, "invert", 0))
            return nl_fail(NL_ERR_FORMAT, "%s: key \"pre_tokenizer\": Split with invert true is not supported", what);
        return add_split(b, re ? re : lit, !re, behavior, 0, what);
    }
    if (ty && !strcmp(ty, "Metaspace")) {
        const char *rep = jstr(p, "replacement"), *scheme = jstr(p, "prepend_scheme");
        if (rep && strcmp(rep, SPM_SPACE))
            return nl_fail(NL_ERR_FORMAT, "%s: key \"pre_tokenizer\": Metaspace replacement other than U+2581", what);
        b->mode = MODE_SPM;
        b->meta = 1;
        b->meta_split = jbool(p, "split", 1);
        b->meta_prepend = scheme ? (!strcmp(scheme, "first")   ? 2
                                    : !strcmp(scheme, "never") ? 0
                                                               : 1)
                                 : jbool(p, "add_prefix_space", 1);
        return NL_OK;
    }
    return nl_fail(NL_ERR_FORMAT,
                   "%s: key \"pre_tokenizer\": type \"%s\" is not supported (Sequence, ByteLevel, Split, Metaspace)",
                   what, ty ? ty : "?");
}

/* Does the decoder strip the first space (Strip start 1, or Metaspace that prepends)? */
static int decoder_strips(const cJSON *d) {
    if (!d) return 0;
    const char *ty = jstr(d, "type");
    if (!ty) return 0;
    if (!strcmp(ty, "Sequence")) {
        const cJSON *e;
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(d, "decoders")) if (decoder_strips(e)) return 1;
        return 0;
    }
    if (!strcmp(ty, "Strip")) {
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(d, "start");
        return cJSON_IsNumber(st) && st->valuedouble >= 1;
    }
    if (!strcmp(ty, "Metaspace")) {
        const char *scheme = jstr(d, "prepend_scheme");
        return scheme ? strcmp(scheme, "never") != 0 : jbool(d, "add_prefix_space", 1);
    }
    return 0;
}

/* Decoded bytes of a vocabulary piece. */
static int decode_piece(nl_bpe *b, int id) {
    const char *p = b->pieces[id];
    size_t n = strlen(p);
    char *out = malloc(n + 1);
    if (!out) return -1;
    size_t k = 0;
    unsigned hx;
    if (b->mode == MODE_SPM && n == 6 && p[0] == '<' && p[1] == '0' && p[2] == 'x' && p[5] == '>' &&
        sscanf(p + 3, "%2x", &hx) == 1) {
        out[k++] = (char)hx;
    } else if (b->mode == MODE_SPM) {
        for (size_t i = 0; i < n;) {
            if (!strncmp(p + i, SPM_SPACE, 3)) {
                out[k++] = ' ';
                i += 3;
            } else {
                out[k++] = p[i++];
            }
        }
    } else {
        for (size_t i = 0; i < n;) {
            utf8proc_int32_t cp;
            utf8proc_ssize_t l = utf8proc_iterate((const utf8proc_uint8_t *)p + i, (utf8proc_ssize_t)(n - i), &cp);
            if (l > 0 && cp >= 0 && cp < 324 && b->u2b[cp] >= 0) {
                out[k++] = (char)b->u2b[cp];
                i += (size_t)l;
            } else {
                size_t L = l > 0 ? (size_t)l : 1;
                memcpy(out + k, p + i, L);
                k += L;
                i += L;
            }
        }
    }
    b->dec[id] = out;
    b->dec_len[id] = k;
    return 0;
}

static int cmp_added(const void *x, const void *y, void *ctx) {
    const added_tok *a = ctx;
    const added_tok *p = &a[*(const int *)x], *q = &a[*(const int *)y];
    if ((uint8_t)p->s[0] != (uint8_t)q->s[0]) return (uint8_t)p->s[0] - (uint8_t)q->s[0];
    return p->len > q->len ? -1 : p->len < q->len; /* longest first: leftmost-longest */
}

static nl_status parse_added(nl_bpe *b, const cJSON *arr, const char *what, int *max_id) {
    int n = cJSON_IsArray(arr) ? cJSON_GetArraySize(arr) : 0;
    b->added = calloc((size_t)n + 1, sizeof *b->added);
    b->added_order = calloc((size_t)n + 1, sizeof(int));
    if (!b->added || !b->added_order) return NL_ERR_NOMEM;
    const cJSON *e;
    cJSON_ArrayForEach(e, arr) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
        const char *c = jstr(e, "content");
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble > 1e7 || !c || !c[0])
            return nl_fail(NL_ERR_FORMAT, "%s: key \"added_tokens\": entry %d needs an id and a non-empty content",
                           what, b->n_added);
        added_tok *t = &b->added[b->n_added];
        t->id = (int)id->valuedouble;
        t->special = jbool(e, "special", 0);
        t->len = strlen(c);
        if (!(t->s = strdup(c))) return NL_ERR_NOMEM;
        if (t->id > *max_id) *max_id = t->id;
        b->added_order[b->n_added] = b->n_added;
        b->n_added++;
    }
    qsort_r(b->added_order, (size_t)b->n_added, sizeof(int), cmp_added, b->added);
    int j = 0;
    for (int c = 0; c <= 256; c++) {
        while (j < b->n_added && (uint8_t)b->added[b->added_order[j]].s[0] < c) j++;
        b->first_byte[c] = j;
    }
    return NL_OK;
}

/* Checks model.vocab (ids are integers in [0, 1e7]) and raises *max_id to the largest id. */
static nl_status check_vocab_ids(const cJSON *vocab, const char *what, int *max_id) {
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab) {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble > 1e7 || e->valuedouble != (int)e->valuedouble)
            return nl_fail(NL_ERR_FORMAT, "%s: key \"model.vocab\": \"%s\" has no valid id", what, e->string);
        if ((int)e->valuedouble > *max_id) *max_id = (int)e->valuedouble;
    }
    return NL_OK;
}

/* Fills b->pieces from model.vocab and the added tokens (b->V already set), then the vocabulary
 * hash. Two pieces for one id are refused. */
static nl_status load_pieces(nl_bpe *b, const cJSON *vocab, const char *what) {
    b->pieces = calloc((size_t)b->V, sizeof(char *));
    b->dec = calloc((size_t)b->V, sizeof(char *));
    b->dec_len = calloc((size_t)b->V, sizeof(size_t));
    b->vh_mask = pow2_above((size_t)b->V) - 1;
    b->vh = calloc((size_t)b->vh_mask + 1, sizeof(int));
    if (!b->pieces || !b->dec || !b->dec_len || !b->vh) return NL_ERR_NOMEM;
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab) {
        int id = (int)e->valuedouble;
        if (b->pieces[id])
            return nl_fail(NL_ERR_FORMAT, "%s: key \"model.vocab\": id %d is given to \"%s\" and \"%s\"", what, id,
                           b->pieces[id], e->string);
        if (!(b->pieces[id] = strdup(e->string))) return NL_ERR_NOMEM;
    }
    for (int i = 0; i < b->n_added; i++) {
        added_tok *t = &b->added[i];
        if (b->pieces[t->id] && strcmp(b->pieces[t->id], t->s))
            return nl_fail(NL_ERR_FORMAT, "%s: key \"added_tokens\": id %d is \"%s\" in the vocabulary but \"%s\" here",
                           what, t->id, b->pieces[t->id], t->s);
        if (!b->pieces[t->id] && !(b->pieces[t->id] = strdup(t->s))) return NL_ERR_NOMEM;
    }
    for (int i = 0; i < b->V; i++)
        if (b->pieces[i]) vocab_put(b, i);
    return NL_OK;
}

/* Reads model.merges ("a b" strings or ["a", "b"] pairs; rank = position) into the merge table. */
static nl_status load_merges(nl_bpe *b, const cJSON *merges, const char *what) {
    int nm = cJSON_GetArraySize(merges), rank = 0;
    b->m_mask = pow2_above((size_t)nm) - 1;
    b->mkey = calloc((size_t)b->m_mask + 1, sizeof(uint64_t));
    b->mrank = calloc((size_t)b->m_mask + 1, sizeof(int32_t));
    b->mnew = calloc((size_t)b->m_mask + 1, sizeof(int32_t));
    if (!b->mkey || !b->mrank || !b->mnew) return NL_ERR_NOMEM;
    char *cat = NULL;
    size_t cat_cap = 0;
    nl_status rc = NL_OK;
    const cJSON *e;
    cJSON_ArrayForEach(e, merges) {
        const char *l = NULL, *r = NULL;
        size_t ll = 0, rl = 0;
        if (cJSON_IsString(e)) {
            const char *sp = e->valuestring[0] ? strchr(e->valuestring + 1, ' ') : NULL; /* "" has no pair */
            if (sp) {
                l = e->valuestring;
                ll = (size_t)(sp - l);
                r = sp + 1;
                rl = strlen(r);
            }
        } else if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2 && cJSON_IsString(cJSON_GetArrayItem(e, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(e, 1))) {
            l = cJSON_GetArrayItem(e, 0)->valuestring;
            r = cJSON_GetArrayItem(e, 1)->valuestring;
            ll = strlen(l);
            rl = strlen(r);
        }
        int li = l ? vocab_get(b, l, ll) : -1, ri = r ? vocab_get(b, r, rl) : -1;
        if (ll + rl + 1 > cat_cap) {
            cat_cap = 2 * (ll + rl + 1);
            char *c2 = realloc(cat, cat_cap);
            if (!c2) {
                rc = NL_ERR_NOMEM;
                break;
            }
            cat = c2;
        }
        int ni = -1;
        if (li >= 0 && ri >= 0) {
            memcpy(cat, l, ll);
            memcpy(cat + ll, r, rl);
            ni = vocab_get(b, cat, ll + rl);
        }
        if (ni < 0) {
            rc = nl_fail(NL_ERR_FORMAT,
                         "%s: key \"model.merges\": merge %d (%s) names a piece missing from the vocabulary", what,
                         rank, cJSON_IsString(e) ? e->valuestring : "a pair");
            break;
        }
        merge_put(b, li, ri, rank++, ni);
    }
    free(cat);
    return rc;
}

/* The id of each byte (byte-level symbol or <0xNN> piece) and the decoded text of every id;
 * added tokens decode to their content. */
static nl_status build_decoding(nl_bpe *b) {
    for (int c = 0; c < 256; c++) {
        if (b->mode == MODE_BYTELEVEL) {
            b->byte_ids[c] = vocab_get(b, b->b2u[c], b->b2u_len[c]);
        } else {
            char hx[8];
            snprintf(hx, sizeof hx, "<0x%02X>", c);
            b->byte_ids[c] = vocab_get(b, hx, 6);
        }
    }
    for (int i = 0; i < b->V; i++)
        if (b->pieces[i] && decode_piece(b, i)) return NL_ERR_NOMEM;
    for (int i = 0; i < b->n_added; i++) {
        added_tok *t = &b->added[i];
        char *c = malloc(t->len + 1);
        if (!c) return NL_ERR_NOMEM;
        memcpy(c, t->s, t->len + 1);
        free(b->dec[t->id]);
        b->dec[t->id] = c;
        b->dec_len[t->id] = t->len;
    }
    return NL_OK;
}

/* BOS: the special token before $A in the post-processor's single template; EOS: the first
 * added token with a well-known end-of-text name. */
static void find_bos_eos(nl_bpe *b, const cJSON *root) {
    const cJSON *pp = cJSON_GetObjectItemCaseSensitive(root, "post_processor");
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(pp, "single");
    const char *ppt = jstr(pp, "type");
    const cJSON *e;
    if (ppt && !strcmp(ppt, "Sequence")) {
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(pp, "processors")) {
            const cJSON *s1 = cJSON_GetObjectItemCaseSensitive(e, "single");
            if (s1) single = s1;
        }
    }
    if (cJSON_IsArray(single)) {
        const cJSON *first = cJSON_GetArrayItem(single, 0);
        const char *sid = jstr(cJSON_GetObjectItemCaseSensitive(first, "SpecialToken"), "id");
        if (sid) b->bos = vocab_get(b, sid, strlen(sid));
    }
    static const char *const eos_names[] = {"</s>", "<|end_of_text|>", "<|endoftext|>", "<|im_end|>", "<|eot_id|>"};
    for (size_t k = 0; k < sizeof eos_names / sizeof eos_names[0] && b->eos < 0; k++)
        for (int i = 0; i < b->n_added; i++)
            if (!strcmp(b->added[i].s, eos_names[k])) {
                b->eos = b->added[i].id;
                break;
            }
}

/* Everything nl_bpe_parse reads from the parsed tokenizer.json, in order. */
static nl_status parse_tokenizer(nl_bpe *b, const cJSON *root, const char *json, size_t json_bytes, const char *what) {
    nl_status rc;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const char *mty = jstr(model, "type");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (!mty || strcmp(mty, "BPE"))
        return nl_fail(NL_ERR_FORMAT, "%s: key \"model.type\" is \"%s\"; nanolm reads BPE tokenizers", what,
                       mty ? mty : "missing");
    if (!cJSON_IsObject(vocab) || !cJSON_IsArray(merges))
        return nl_fail(NL_ERR_FORMAT, "%s: key \"model.vocab\" must be an object and \"model.merges\" a list", what);
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (cJSON_IsNumber(d) && d->valuedouble > 0)
        return nl_fail(NL_ERR_FORMAT, "%s: key \"model.dropout\": BPE dropout is not supported", what);
    int max_id = -1;
    if ((rc = check_vocab_ids(vocab, what, &max_id))) return rc;
    if ((rc = parse_added(b, cJSON_GetObjectItemCaseSensitive(root, "added_tokens"), what, &max_id))) return rc;
    if (max_id < 0) return nl_fail(NL_ERR_FORMAT, "%s: key \"model.vocab\" is empty", what);
    b->V = max_id + 1;
    if ((rc = load_pieces(b, vocab, what))) return rc;
    b->byte_fallback = jbool(model, "byte_fallback", 0);
    b->ignore_merges = jbool(model, "ignore_merges", 0);
    b->fuse_unk = jbool(model, "fuse_unk", 0);
    const char *unk = jstr(model, "unk_token");
    if (unk) b->unk_id = vocab_get(b, unk, strlen(unk));
    if ((rc = parse_normalizer(b, cJSON_GetObjectItemCaseSensitive(root, "normalizer"), what))) return rc;
    if ((rc = parse_pretok(b, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), what))) return rc;
    if (!b->mode) b->mode = MODE_SPM;
    b->strip_first = b->mode == MODE_SPM && decoder_strips(cJSON_GetObjectItemCaseSensitive(root, "decoder"));
    if ((rc = load_merges(b, merges, what))) return rc;
    if ((rc = build_decoding(b))) return rc;
    find_bos_eos(b, root);
    if (!(b->json = malloc(json_bytes + 1))) return NL_ERR_NOMEM;
    memcpy(b->json, json, json_bytes);
    b->json[json_bytes] = 0;
    b->json_bytes = json_bytes;
    return NL_OK;
}

nl_status nl_bpe_parse(nl_bpe **out, const char *json, size_t json_bytes, const char *what) {
    *out = NULL;
    nl_bpe *b = calloc(1, sizeof *b);
    if (!b) return nl_fail(NL_ERR_NOMEM, "out of memory reading %s", what);
    b->bos = b->eos = b->unk_id = -1;
    init_byte_map(b);
    cJSON *root = cJSON_ParseWithLength(json, json_bytes);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return bad(b, what, "%snot a JSON object (tokenizer.json)", "");
    }
    nl_status rc = parse_tokenizer(b, root, json, json_bytes, what);
    cJSON_Delete(root);
    if (rc) {
        if (rc == NL_ERR_NOMEM) nl_fail(rc, "out of memory reading %s", what);
        nl_bpe_free(b);
        return rc;
    }
    *out = b;
    return NL_OK;
}

/* ---- encoding ------------------------------------------------------------------------------- */

typedef struct buf {
    char *p;
    size_t n, cap;
} buf;

static int buf_put(buf *b, const void *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = 2 * (b->n + n + 1);
        char *p = realloc(b->p, cap);
        if (!p) return -1;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

/* Word cache of one encode call: pre-token bytes -> ids (byte-level; a 1 MB text repeats its
 * words). */
typedef struct wcache {
    uint32_t mask;
    struct went {
        uint32_t hash, len;
        int64_t key_off, ids_off;
        int n_ids;
    } * e;
    buf keys;
    int *ids;
    int64_t n_ids, cap_ids;
    int64_t used;
} wcache;

typedef struct enc_state {
    const nl_bpe *b;
    int *out; /* the caller's array, grown here: normalizers may lengthen the text */
    int64_t n, cap;
    size_t norm_limit; /* most bytes a segment's normalized text may take */
    int too_long;      /* a normalizer grew the text past norm_limit */
    int *sym;
    int sym_cap;
    scratch s;
    buf t1, t2;
    wcache wc;
} enc_state;

static int sym_reserve(enc_state *st, size_t n) {
    if ((int64_t)n <= st->sym_cap) return 0;
    int cap = (int)(2 * n + 16);
    int *p = realloc(st->sym, (size_t)cap * sizeof(int));
    if (!p) return -1;
    st->sym = p;
    st->sym_cap = cap;
    return 0;
}

/* Room for k more ids in st->out. */
static int out_reserve(enc_state *st, int64_t k) {
    if (st->n + k <= st->cap) return 0;
    int64_t cap = 2 * (st->n + k) + 64;
    size_t bytes;
    if (cap > INT32_MAX || nl_mul_overflows((size_t)cap, sizeof(int), &bytes)) return -1;
    int *p = realloc(st->out, bytes);
    if (!p) return -1;
    st->out = p;
    st->cap = cap;
    return 0;
}

/* BPE of one byte-level pre-token (raw bytes); appends ids. */
static int encode_bytelevel_word(enc_state *st, const char *w, size_t n) {
    const nl_bpe *b = st->b;
    wcache *c = &st->wc;
    uint32_t h = hash_bytes(w, n);
    if (c->e) {
        for (uint32_t i = h & c->mask;; i = (i + 1) & c->mask) {
            struct went *x = &c->e[i];
            if (!x->len) break;
            if (x->hash == h && x->len == n && !memcmp(c->keys.p + x->key_off, w, n)) {
                if (out_reserve(st, x->n_ids)) return -1;
                memcpy(st->out + st->n, c->ids + x->ids_off, (size_t)x->n_ids * sizeof(int));
                st->n += x->n_ids;
                return 0;
            }
        }
    }
    int64_t start = st->n;
    if (sym_reserve(st, n) || out_reserve(st, (int64_t)n + 1)) return -1;
    int m = 0, direct = -1;
    if (b->ignore_merges) {
        st->t1.n = 0;
        for (size_t i = 0; i < n; i++)
            if (buf_put(&st->t1, b->b2u[(uint8_t)w[i]], b->b2u_len[(uint8_t)w[i]])) return -1;
        direct = vocab_get(b, st->t1.p, st->t1.n);
    }
    if (direct >= 0) {
        st->out[st->n++] = direct;
    } else {
        for (size_t i = 0; i < n; i++) {
            int id = b->byte_ids[(uint8_t)w[i]];
            if (id < 0) id = b->unk_id;
            if (id >= 0) st->sym[m++] = id;
        }
        m = merge_all(b, st->sym, m, &st->s);
        if (m < 0) return -1;
        memcpy(st->out + st->n, st->sym, (size_t)m * sizeof(int));
        st->n += m;
    }
    /* remember it (the table is sized once; full means no more caching) */
    if (!c->e || n == 0 || n > 256 || (uint64_t)(c->used + 1) * 2 > (uint64_t)c->mask) return 0;
    int nid = (int)(st->n - start);
    if (c->n_ids + nid > c->cap_ids) {
        int64_t cap = 2 * (c->n_ids + nid) + 1024;
        int *p = realloc(c->ids, (size_t)cap * sizeof(int));
        if (!p) return 0;
        c->ids = p;
        c->cap_ids = cap;
    }
    size_t koff = c->keys.n;
    if (buf_put(&c->keys, w, n)) return 0;
    for (uint32_t i = h & c->mask;; i = (i + 1) & c->mask)
        if (!c->e[i].len) {
            c->e[i] = (struct went){h, (uint32_t)n, (int64_t)koff, c->n_ids, nid};
            break;
        }
    memcpy(c->ids + c->n_ids, st->out + start, (size_t)nid * sizeof(int));
    c->n_ids += nid;
    c->used++;
    return 0;
}

/* 1 when every one of the n bytes has a <0xNN> piece (byte fallback needs all of them, not only
 * the first: found by fuzz/fuzz_tokenizer_json.c, a vocabulary missing <0x98> emitted id -1). */
static int bytes_known(const nl_bpe *b, const char *s, size_t n) {
    for (size_t k = 0; k < n; k++)
        if (b->byte_ids[(uint8_t)s[k]] < 0) return 0;
    return 1;
}

/* BPE of one SentencePiece-style word (normalized UTF-8); appends ids. */
static int encode_spm_word(enc_state *st, const char *w, size_t n) {
    const nl_bpe *b = st->b;
    if (!n) return 0;
    if (out_reserve(st, (int64_t)n + 1)) return -1; /* at most one id a byte */
    if (b->ignore_merges) {
        int id = vocab_get(b, w, n);
        if (id >= 0) {
            st->out[st->n++] = id;
            return 0;
        }
    }
    if (sym_reserve(st, n)) return -1;
    int m = 0;
    int prev_unk = 0;
    for (size_t i = 0; i < n;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t l = utf8proc_iterate((const utf8proc_uint8_t *)w + i, (utf8proc_ssize_t)(n - i), &cp);
        size_t L = l > 0 ? (size_t)l : 1;
        int id = vocab_get(b, w + i, L);
        if (id >= 0) {
            st->sym[m++] = id;
            prev_unk = 0;
        } else if (b->byte_fallback && bytes_known(b, w + i, L)) {
            for (size_t k = 0; k < L; k++) st->sym[m++] = b->byte_ids[(uint8_t)w[i + k]];
            prev_unk = 0;
        } else if (b->unk_id >= 0) {
            if (!(b->fuse_unk && prev_unk)) st->sym[m++] = b->unk_id;
            prev_unk = 1;
        }
        i += L;
    }
    m = merge_all(b, st->sym, m, &st->s);
    if (m < 0) return -1;
    memcpy(st->out + st->n, st->sym, (size_t)m * sizeof(int));
    st->n += m;
    return 0;
}

/* Normalizers may lengthen text (NFC up to 3x, Replace without bound): a segment of n bytes may
 * grow to at most NL_NORM_GROWTH * n + NL_NORM_SLACK bytes. */
#define NL_NORM_GROWTH 4
#define NL_NORM_SLACK  256

/* Applies the normalizers to seg into st->t1 (returns the text to use and its length); -1 out
 * of memory, -2 the text grew past st->norm_limit (st->too_long set). */
static int normalize(enc_state *st, const char *seg, size_t n, const char **res, size_t *res_n) {
    const nl_bpe *b = st->b;
    const char *cur = seg;
    size_t cn = n;
    buf *outb = &st->t1, *other = &st->t2;
    for (int k = 0; k < b->n_norm; k++) {
        const norm_op *op = &b->norm[k];
        outb->n = 0;
        if (op->kind == NORM_PREPEND) {
            if (!cn) continue; /* tokenizers: nothing is prepended to an empty string */
            if (buf_put(outb, op->a, strlen(op->a)) || buf_put(outb, cur, cn)) return -1;
        } else if (op->kind == NORM_REPLACE) {
            size_t al = strlen(op->a), bl = strlen(op->b);
            if (buf_put(outb, "", 0)) return -1;
            for (size_t i = 0; i < cn;) {
                if (outb->n > st->norm_limit) break;
                if (i + al <= cn && !memcmp(cur + i, op->a, al)) {
                    if (buf_put(outb, op->b, bl)) return -1;
                    i += al;
                } else {
                    if (buf_put(outb, cur + i, 1)) return -1;
                    i++;
                }
            }
        } else { /* NFC: ASCII is already NFC */
            size_t i = 0;
            while (i < cn && (uint8_t)cur[i] < 0x80) i++;
            if (i == cn) continue;
            utf8proc_uint8_t *r = NULL;
            utf8proc_ssize_t rl = utf8proc_map((const utf8proc_uint8_t *)cur, (utf8proc_ssize_t)cn, &r,
                                               UTF8PROC_STABLE | UTF8PROC_COMPOSE);
            if (rl < 0) continue; /* invalid UTF-8: left as it is */
            int e = buf_put(outb, r, (size_t)rl);
            free(r);
            if (e) return -1;
        }
        if (outb->n > st->norm_limit) {
            st->too_long = 1;
            return -2;
        }
        cur = outb->p;
        cn = outb->n;
        buf *t = outb;
        outb = other;
        other = t;
    }
    *res = cur;
    *res_n = cn;
    return 0;
}

typedef int (*word_fn)(enc_state *, const char *, size_t);

/* Split stage k over p[0..n): tokenizers' find_matches (spans alternating between gaps and matches,
 * empty matches included), then the stage's behavior; each resulting piece goes to stage k + 1,
 * after the last stage to `word`. */
static int split_run(enc_state *st, const char *p, size_t n, int k, word_fn word) {
    const nl_bpe *b = st->b;
    if (!n) return 0;
    if (k == b->n_split) return word(st, p, n);
    const split_stage *sp = &b->split[k];
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(sp->re, NULL);
    if (!md) return -1;
    int rc = 0;
    if (sp->behavior == SPLIT_ISOLATED && !sp->invert) { /* the common case: no span list */
        size_t off = 0, done = 0;
        while (!rc && off <= n) {
            int r = pcre2_match(sp->re, (PCRE2_SPTR)p, n, off, 0, md, NULL);
            if (r < 0) break;
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            size_t s0 = ov[0], s1 = ov[1];
            if (s0 > done) rc = split_run(st, p + done, s0 - done, k + 1, word); /* the gap before the match */
            if (!rc && s1 > s0) rc = split_run(st, p + s0, s1 - s0, k + 1, word);
            done = s1 > done ? s1 : done;
            if (s1 == s0) { /* empty match: step one character */
                off = s1 + 1;
                while (off < n && ((uint8_t)p[off] & 0xC0) == 0x80) off++;
            } else {
                off = s1;
            }
            if (off > n) break;
        }
        if (!rc && done < n) rc = split_run(st, p + done, n - done, k + 1, word);
        pcre2_match_data_free(md);
        return rc;
    }
    /* spans: (start, end, is_match), at most 2 per match plus the tail */
    size_t cap = 64, ns = 0;
    size_t(*sp3)[3] = malloc(cap * sizeof *sp3);
    if (!sp3) rc = -1;
    size_t off = 0, prev = 0;
    while (!rc && off <= n) {
        int r = pcre2_match(sp->re, (PCRE2_SPTR)p, n, off, 0, md, NULL);
        if (r < 0) break;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t s0 = ov[0], s1 = ov[1];
        if (ns + 3 > cap) {
            size_t(*g)[3] = realloc(sp3, 2 * cap * sizeof *sp3);
            if (!g) {
                rc = -1;
                break;
            }
            sp3 = g;
            cap *= 2;
        }
        if (s0 > prev) {
            sp3[ns][0] = prev, sp3[ns][1] = s0, sp3[ns][2] = (size_t)sp->invert;
            ns++;
        }
        sp3[ns][0] = s0, sp3[ns][1] = s1, sp3[ns][2] = (size_t)!sp->invert;
        ns++;
        prev = s1;
        if (s1 == s0) {
            off = s1 + 1;
            while (off < n && ((uint8_t)p[off] & 0xC0) == 0x80) off++;
        } else {
            off = s1;
        }
    }
    if (!rc && prev < n) {
        sp3[ns][0] = prev, sp3[ns][1] = n, sp3[ns][2] = (size_t)sp->invert;
        ns++;
    }
    pcre2_match_data_free(md);
    /* the behavior: pieces [a, b) in order (merged in place into sp3[0..np)) */
    size_t np = 0;
    if (!rc) {
        int prev_match = 0;
        if (sp->behavior == SPLIT_MERGED_NEXT) { /* fold from the right */
            size_t w = ns;
            for (size_t i = ns; i-- > 0;) {
                int m = (int)sp3[i][2];
                if (m && !prev_match && w < ns) {
                    sp3[w][0] = sp3[i][0];
                } else {
                    w--;
                    sp3[w][0] = sp3[i][0];
                    sp3[w][1] = sp3[i][1];
                }
                prev_match = m;
            }
            for (size_t i = w; i < ns; i++) {
                sp3[np][0] = sp3[i][0];
                sp3[np][1] = sp3[i][1];
                np++;
            }
        } else {
            for (size_t i = 0; i < ns; i++) {
                int m = (int)sp3[i][2];
                int merge = sp->behavior == SPLIT_MERGED_PREV  ? m && !prev_match
                            : sp->behavior == SPLIT_CONTIGUOUS ? m == prev_match
                                                               : 0;
                if (sp->behavior == SPLIT_REMOVED && m) {
                    prev_match = m;
                    continue;
                }
                if (merge && np) {
                    sp3[np - 1][1] = sp3[i][1];
                } else {
                    sp3[np][0] = sp3[i][0];
                    sp3[np][1] = sp3[i][1];
                    np++;
                }
                prev_match = m;
            }
        }
    }
    for (size_t i = 0; !rc && i < np; i++) rc = split_run(st, p + sp3[i][0], sp3[i][1] - sp3[i][0], k + 1, word);
    free(sp3);
    return rc;
}

/* Encodes one segment of text between added tokens. first: the segment starts the input. */
static int encode_segment(enc_state *st, const char *seg, size_t n, int first) {
    const nl_bpe *b = st->b;
    if (!n) return 0;
    const char *t;
    size_t tn;
    st->norm_limit = n > (SIZE_MAX - NL_NORM_SLACK) / NL_NORM_GROWTH ? SIZE_MAX : NL_NORM_GROWTH * n + NL_NORM_SLACK;
    if (normalize(st, seg, n, &t, &tn)) return -1;
    /* copy out of the normalizer's buffers: the word steps below reuse them */
    buf text = {0};
    if (b->mode == MODE_BYTELEVEL && b->add_prefix_space && tn && t[0] != ' ' && buf_put(&text, " ", 1)) return -1;
    if (b->meta) {
        int pre = b->meta_prepend == 1 || (b->meta_prepend == 2 && first);
        if (pre && tn && strncmp(t, SPM_SPACE, 3) && buf_put(&text, SPM_SPACE, 3)) return -1;
        for (size_t i = 0; i < tn; i++)
            if (t[i] == ' ' ? buf_put(&text, SPM_SPACE, 3) : buf_put(&text, t + i, 1)) {
                free(text.p);
                return -1;
            }
    } else if (buf_put(&text, t, tn)) {
        free(text.p);
        return -1;
    }
    int rc = 0;
    word_fn word = b->mode == MODE_BYTELEVEL ? encode_bytelevel_word : encode_spm_word;
    if (b->n_split) {
        rc = split_run(st, text.p, text.n, 0, word);
    } else if (b->meta && b->meta_split) { /* words start at each U+2581 */
        size_t w0 = 0;
        for (size_t i = 1; !rc && i <= text.n; i++)
            if (i == text.n || (i + 3 <= text.n && !memcmp(text.p + i, SPM_SPACE, 3))) {
                rc = word(st, text.p + w0, i - w0);
                w0 = i;
            }
    } else {
        rc = word(st, text.p, text.n);
    }
    free(text.p);
    return rc;
}

/* 1 when no byte of [i, i + len) is marked plain (special tokens may not be matched there). */
static int special_ok(const unsigned char *plain, size_t i, size_t len) {
    if (!plain) return 1;
    for (size_t k = 0; k < len; k++)
        if (plain[i + k]) return 0;
    return 1;
}

static int64_t encode_impl(const nl_bpe *b, const char *text, size_t n, int special, const unsigned char *plain,
                           int **out, int64_t *cap, int64_t at);

int64_t nl_bpe_encode(const nl_bpe *b, const char *text, size_t n, int special, int **out, int64_t *cap, int64_t at) {
    return encode_impl(b, text, n, special, NULL, out, cap, at);
}

int64_t nl_bpe_encode_marked(const nl_bpe *b, const char *text, size_t n, const unsigned char *plain, int **out,
                             int64_t *cap, int64_t at) {
    return encode_impl(b, text, n, 1, plain, out, cap, at);
}

static int64_t encode_impl(const nl_bpe *b, const char *text, size_t n, int special, const unsigned char *plain,
                           int **out, int64_t *cap, int64_t at) {
    enc_state st;
    memset(&st, 0, sizeof st);
    st.b = b;
    st.out = *out;
    st.cap = *cap;
    st.n = at;
    if (b->mode == MODE_BYTELEVEL && n > 4096) { /* a word cache pays off on long texts */
        st.wc.mask = pow2_above(n / 32 < (1u << 16) ? n / 32 : (1u << 16)) - 1; /* a text's distinct words */
        st.wc.e = calloc((size_t)st.wc.mask + 1, sizeof *st.wc.e);
    }
    int rc = 0;
    size_t seg = 0;
    int first = 1;
    for (size_t i = 0; !rc && i < n;) {
        /* leftmost-longest added token at i */
        int hit = -1;
        uint8_t c = (uint8_t)text[i];
        for (int j = b->first_byte[c]; j < b->first_byte[c + 1]; j++) {
            const added_tok *t = &b->added[b->added_order[j]];
            if ((!t->special || (special && special_ok(plain, i, t->len))) && t->len <= n - i &&
                !memcmp(text + i, t->s, t->len)) {
                hit = b->added_order[j];
                break;
            }
        }
        if (hit < 0) {
            i++;
            continue;
        }
        rc = encode_segment(&st, text + seg, i - seg, first);
        first = 0;
        if (!rc) rc = out_reserve(&st, 1);
        if (!rc) st.out[st.n++] = b->added[hit].id;
        i += b->added[hit].len;
        seg = i;
    }
    if (!rc) rc = encode_segment(&st, text + seg, n - seg, first);
    free(st.sym);
    free(st.s.prev);
    free(st.s.next);
    free(st.s.ver);
    free(st.s.heap);
    free(st.t1.p);
    free(st.t2.p);
    free(st.wc.e);
    free(st.wc.keys.p);
    free(st.wc.ids);
    *out = st.out;
    *cap = st.cap;
    if (rc) {
        if (st.too_long)
            nl_fail(NL_ERR_RANGE,
                    "the tokenizer's normalizer lengthens a text of %zu bytes more than %dx (+%d bytes); refused", n,
                    NL_NORM_GROWTH, NL_NORM_SLACK);
        else
            nl_fail(NL_ERR_NOMEM, "out of memory encoding %zu bytes", n);
        return st.too_long ? -2 : -1;
    }
    return st.n;
}

/* ---- queries -------------------------------------------------------------------------------- */

int nl_bpe_vocab_size(const nl_bpe *b) { return b->V; }
int nl_bpe_bos(const nl_bpe *b) { return b->bos; }
int nl_bpe_eos(const nl_bpe *b) { return b->eos; }
int nl_bpe_strips_first_space(const nl_bpe *b) { return b->strip_first; }

const char *nl_bpe_token_bytes(const nl_bpe *b, int id, size_t *len) {
    if (id < 0 || id >= b->V || !b->dec[id]) return NULL;
    *len = b->dec_len[id];
    return b->dec[id];
}

const char *nl_bpe_piece(const nl_bpe *b, int id) { return id < 0 || id >= b->V ? NULL : b->pieces[id]; }

int nl_bpe_lookup(const nl_bpe *b, const char *piece) { return vocab_get(b, piece, strlen(piece)); }

int nl_bpe_is_special(const nl_bpe *b, int id) {
    for (int i = 0; i < b->n_added; i++)
        if (b->added[i].id == id) return b->added[i].special;
    return 0;
}

const char *nl_bpe_json(const nl_bpe *b, size_t *bytes) {
    *bytes = b->json_bytes;
    return b->json;
}
