/* tokenizer.json BPE (nanolm/bpe.h) against independent implementations: token ids of 11,445
 * texts (synthetic Unicode, emoji, numbers, whitespace runs, special tokens, and lines of the
 * ../shared/data corpora) as js-tiktoken and @huggingface/tokenizers give them
 * (tests/ref/make_tok_fixture.mjs wrote tests/ref/tok_fixture.json), among them DeepSeek-V3's three
 * Splits in sequence and Gemma 3's normalizer and Split; decode(encode(x)) == x; the merged Split
 * behaviors give the pieces tokenizers documents;
 * the SentencePiece-style export of tok512.bin encodes as the llama2.c tokenizer does. */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/bpe.h"
#include "nanolm/tokenizer.h"
#include "quant_check.h"

static uint32_t fnv32_ids(const int *ids, int64_t n) {
    uint32_t h = 0x811c9dc5u;
    for (int64_t i = 0; i < n; i++)
        for (int k = 0; k < 4; k++) h = (h ^ (((uint32_t)ids[i] >> (8 * k)) & 255u)) * 16777619u;
    return h;
}

typedef struct texts {
    int n;
    char **s;
    size_t *len;
    int *skip; /* the corpus file was missing: no text at this index */
} texts;

static char *dup_n(const char *s, size_t n) {
    char *p = malloc(n + 1);
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

/* Rebuilds the fixture's text list: synthetic, then each source's non-empty lines. */
static void load_texts(const cJSON *fx, texts *t) {
    const cJSON *syn = cJSON_GetObjectItem(fx, "synthetic"), *src = cJSON_GetObjectItem(fx, "sources"), *e;
    int total = cJSON_GetArraySize(syn);
    cJSON_ArrayForEach(e, src) total += (int)cJSON_GetObjectItem(e, "count")->valuedouble;
    t->n = 0;
    t->s = calloc((size_t)total, sizeof(char *));
    t->len = calloc((size_t)total, sizeof(size_t));
    t->skip = calloc((size_t)total, sizeof(int));
    cJSON_ArrayForEach(e, syn) {
        t->len[t->n] = strlen(e->valuestring);
        t->s[t->n++] = strdup(e->valuestring);
    }
    cJSON_ArrayForEach(e, src) {
        int count = (int)cJSON_GetObjectItem(e, "count")->valuedouble;
        const char *file = cJSON_GetObjectItem(e, "file")->valuestring;
        const char *path = tu_data_path(file);
        size_t n = 0;
        char *body = path ? tu_read_file(path, &n) : NULL;
        if (!body) {
            print_message("[  SKIP    ] %d texts: needs ../shared/data/%s (not present)\n", count, file);
            for (int k = 0; k < count; k++) t->skip[t->n++] = 1;
            continue;
        }
        if (cJSON_IsTrue(cJSON_GetObjectItem(e, "whole"))) {
            t->len[t->n] = n;
            t->s[t->n++] = dup_n(body, n);
        } else {
            int got = 0;
            for (size_t i = 0; i < n && got < count;) {
                size_t j = i;
                while (j < n && body[j] != '\n') j++;
                if (j > i) {
                    t->len[t->n] = j - i;
                    t->s[t->n++] = dup_n(body + i, j - i);
                    got++;
                }
                i = j + 1;
            }
            assert_int_equal(got, count);
        }
        free(body);
    }
    assert_int_equal(t->n, total);
}

static void free_texts(texts *t) {
    for (int i = 0; i < t->n; i++) free(t->s[i]);
    free(t->s);
    free(t->len);
    free(t->skip);
}

/* tokenizer.json for a fixture header with GPT-2's vocabulary and merges; NULL when the data
 * is missing. */
static char *gpt2_json(const cJSON *header) {
    const char *enc = tu_data_path("gpt2/encoder.json");
    const char *bpe = tu_data_path("gpt2/vocab.bpe");
    if (!enc || !bpe) return NULL;
    size_t n;
    char *etext = tu_read_file(enc, &n);
    cJSON *vocab = cJSON_ParseWithLength(etext, n);
    free(etext);
    char *btext = tu_read_file(bpe, &n);
    cJSON *merges = cJSON_CreateArray();
    char *line = strchr(btext, '\n') + 1; /* "#version: 0.2" */
    while (line && *line) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        if (*line) cJSON_AddItemToArray(merges, cJSON_CreateString(line));
        line = nl ? nl + 1 : NULL;
    }
    free(btext);
    cJSON *root = cJSON_Duplicate(header, 1);
    cJSON *model = cJSON_GetObjectItem(root, "model");
    cJSON_AddItemToObject(model, "vocab", vocab);
    cJSON_AddItemToObject(model, "merges", merges);
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

static void load_json_text(nl_tokenizer *tok, const char *json, const char *dir, const char *name) {
    char path[600];
    snprintf(path, sizeof path, "%s/%s.json", dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(json, f);
    fclose(f);
    QOK(nl_tokenizer_load_json(tok, path, 0));
}

/* Encodes every text (special tokens matched, as both references do) and compares hashes. */
static void check_variant(const nl_tokenizer *tok, const char *name, const char *hashes, const texts *t,
                          int check_round_trip) {
    int mismatches = 0, checked = 0, rt_bad = 0;
    int64_t total = 0;
    for (int i = 0; i < t->n; i++) {
        if (t->skip[i]) continue;
        int *ids;
        int64_t n;
        QOK(nl_tokenizer_encode_special(tok, t->s[i], t->len[i], 0, 0, 1, &ids, &n));
        char got[9];
        snprintf(got, sizeof got, "%08x", fnv32_ids(ids, n));
        checked++;
        total += n;
        if (memcmp(got, hashes + 8 * i, 8)) {
            if (mismatches < 5) {
                print_message("%s: text %d differs (%lld ids): \"%.80s\"\n   ids:", name, i, (long long)n, t->s[i]);
                for (int64_t k = 0; k < n && k < 24; k++) print_message(" %d", ids[k]);
                print_message("\n");
            }
            mismatches++;
        }
        /* SentencePiece writes spaces as U+2581: a U+2581 in the text decodes as a space */
        if (check_round_trip == 2 && strstr(t->s[i], "\xe2\x96\x81")) check_round_trip = 3;
        if ((check_round_trip == 1 || check_round_trip == 2) && !strstr(t->s[i], "<|endoftext|>") &&
            !strstr(t->s[i], "<s>") && !strstr(t->s[i], "</s>") && !strstr(t->s[i], "<unk>")) {
            char *back;
            size_t bn;
            QOK(nl_tokenizer_decode(tok, ids, n, &back, &bn));
            if (bn != t->len[i] || memcmp(back, t->s[i], bn)) {
                if (rt_bad < 3)
                    print_message("%s: decode(encode(text %d)) = \"%.60s\" != \"%.60s\"\n", name, i, back, t->s[i]);
                rt_bad++;
            }
            nl_free(back);
        }
        if (check_round_trip == 3) check_round_trip = 2;
        nl_free(ids);
    }
    print_message("%s: %d texts, %lld tokens, %d differ from the reference, %d round trips differ\n", name, checked,
                  (long long)total, mismatches, rt_bad);
    assert_int_equal(mismatches, 0);
    assert_int_equal(rt_bad, 0);
}

static void test_against_references(void **state) {
    (void)state;
    size_t n;
    char *txt = tu_read_file(tu_src_path("tests/ref/tok_fixture.json"), &n);
    assert_non_null(txt);
    cJSON *fx = cJSON_ParseWithLength(txt, n);
    free(txt);
    assert_non_null(fx);
    texts t;
    load_texts(fx, &t);
    assert_true(t.n >= 10000);
    char *dir = tu_tmpdir();
    const cJSON *v;
    cJSON_ArrayForEach(v, cJSON_GetObjectItem(fx, "variants")) {
        const char *name = cJSON_GetObjectItem(v, "name")->valuestring;
        const char *hashes = cJSON_GetObjectItem(v, "hashes")->valuestring;
        assert_int_equal(strlen(hashes), 8 * (size_t)t.n);
        nl_tokenizer tok;
        if (!strcmp(name, "gemma3-style")) {
            /* Gemma 3's normalizer, Split pre-tokenizer and decoder on the export of tok512.bin */
            const char *tp = tu_data_path("stories260K/tok512.bin");
            if (!tp) {
                print_message("[  SKIP    ] %s: needs ../shared/data/stories260K/tok512.bin\n", name);
                continue;
            }
            nl_tokenizer l2c;
            QOK(nl_tokenizer_load_llama2c(&l2c, tp, 0));
            char path[600];
            snprintf(path, sizeof path, "%s/spm-for-gemma.json", dir);
            QOK(nl_tokenizer_save_json(&l2c, path));
            nl_tokenizer_free(&l2c);
            size_t jn;
            char *js = tu_read_file(path, &jn);
            cJSON *root = cJSON_ParseWithLength(js, jn);
            free(js);
            const cJSON *patch = cJSON_GetObjectItem(v, "spm_patch"), *e;
            cJSON_ArrayForEach(e, patch) cJSON_ReplaceItemInObject(root, e->string, cJSON_Duplicate(e, 1));
            js = cJSON_PrintUnformatted(root);
            cJSON_Delete(root);
            load_json_text(&tok, js, dir, name);
            free(js);
            check_variant(&tok, name, hashes, &t, 2); /* a U+2581 in a text decodes as a space */
        } else if (!strcmp(name, "spm-tok512")) {
            const char *tp = tu_data_path("stories260K/tok512.bin");
            if (!tp) {
                print_message("[  SKIP    ] %s: needs ../shared/data/stories260K/tok512.bin\n", name);
                continue;
            }
            nl_tokenizer l2c;
            QOK(nl_tokenizer_load_llama2c(&l2c, tp, 0));
            char path[600];
            snprintf(path, sizeof path, "%s/spm.json", dir);
            QOK(nl_tokenizer_save_json(&l2c, path));
            size_t jn;
            char *js = tu_read_file(path, &jn);
            int *bytes = malloc(jn * sizeof(int));
            for (size_t k = 0; k < jn; k++) bytes[k] = (uint8_t)js[k];
            char h[9];
            snprintf(h, sizeof h, "%08x", fnv32_ids(bytes, (int64_t)jn));
            free(bytes);
            free(js);
            /* the references encoded this very file */
            assert_string_equal(h, cJSON_GetObjectItem(v, "tokenizer_fnv32")->valuestring);
            QOK(nl_tokenizer_load_json(&tok, path, 0));
            assert_int_equal(tok.bos_id, 1);
            assert_int_equal(tok.eos_id, 2);
            check_variant(&tok, name, hashes, &t, 2);
            /* the same ids as nanolm's llama2.c tokenizer (which follows run.c) */
            int diff = 0;
            for (int i = 0; i < t.n; i++) {
                if (t.skip[i]) continue;
                int *a, *b;
                int64_t na, nb;
                QOK(nl_tokenizer_encode(&l2c, t.s[i], t.len[i], 1, 0, &a, &na));
                QOK(nl_tokenizer_encode(&tok, t.s[i], t.len[i], 1, 0, &b, &nb));
                /* a U+2581 in the text is a space to SentencePiece but three bytes to llama2.c */
                if ((na != nb || memcmp(a, b, (size_t)na * sizeof(int))) && !strstr(t.s[i], "\xe2\x96\x81")) {
                    if (diff < 5) print_message("llama2c vs tokenizer.json differ on text %d \"%.60s\"\n", i, t.s[i]);
                    diff++;
                }
                nl_free(a);
                nl_free(b);
            }
            assert_int_equal(diff, 0);
            nl_tokenizer_free(&l2c);
        } else {
            const cJSON *h = cJSON_GetObjectItem(v, "tokenizer");
            if (!h) { /* "gpt2": js-tiktoken's own ranks, encoded with the GPT-2 tokenizer.json */
                const cJSON *w;
                cJSON_ArrayForEach(
                    w, cJSON_GetObjectItem(
                           fx, "variants")) if (!strcmp(cJSON_GetObjectItem(w, "name")->valuestring,
                                                        cJSON_GetObjectItem(v, "tokenizer_from")->valuestring)) h =
                    cJSON_GetObjectItem(w, "tokenizer");
            }
            assert_non_null(h);
            char *js = gpt2_json(h);
            if (!js) {
                print_message("[  SKIP    ] %s: needs ../shared/data/gpt2/encoder.json and vocab.bpe\n", name);
                continue;
            }
            load_json_text(&tok, js, dir, name);
            free(js);
            assert_int_equal(tok.vocab_size, 50257);
            assert_int_equal(tok.eos_id, 50256);
            /* an NFC normalizer changes "e\u0301" to "\u00e9": decoding gives the NFC text; a Removed
             * split drops the tabs */
            check_variant(&tok, name, hashes, &t, strcmp(name, "qwen2-style") && strcmp(name, "split-behaviors"));
        }
        nl_tokenizer_free(&tok);
    }
    free_texts(&t);
    cJSON_Delete(fx);
    tu_rmdir(dir);
    free(dir);
}

/* Special tokens only when asked; the known GPT-2 ids of a few strings. */
static void test_special_and_known_ids(void **state) {
    (void)state;
    size_t n;
    char *txt = tu_read_file(tu_src_path("tests/ref/tok_fixture.json"), &n);
    cJSON *fx = cJSON_ParseWithLength(txt, n);
    free(txt);
    const cJSON *h = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(fx, "variants"), 1), "tokenizer");
    char *js = gpt2_json(h);
    if (!js) {
        cJSON_Delete(fx);
        print_message("[  SKIP    ] needs ../shared/data/gpt2\n");
        skip();
        return;
    }
    char *dir = tu_tmpdir();
    nl_tokenizer tok;
    load_json_text(&tok, js, dir, "gpt2");
    free(js);
    int *ids;
    int64_t k;
    /* "Hello world" = [15496, 995] (GPT-2, as in OpenAI's and tiktoken's documentation) */
    QOK(nl_tokenizer_encode(&tok, "Hello world", 11, 0, 0, &ids, &k));
    assert_int_equal(k, 2);
    assert_int_equal(ids[0], 15496);
    assert_int_equal(ids[1], 995);
    nl_free(ids);
    const char *s = "a<|endoftext|>b";
    QOK(nl_tokenizer_encode_special(&tok, s, strlen(s), 0, 0, 1, &ids, &k));
    assert_int_equal(k, 3);
    assert_int_equal(ids[1], 50256);
    nl_free(ids);
    QOK(nl_tokenizer_encode_special(&tok, s, strlen(s), 0, 0, 0, &ids, &k));
    assert_true(k > 3);
    for (int64_t i = 0; i < k; i++) assert_int_not_equal(ids[i], 50256);
    char *back;
    size_t bn;
    QOK(nl_tokenizer_decode(&tok, ids, k, &back, &bn));
    assert_string_equal(back, s);
    nl_free(back);
    nl_free(ids);
    /* invalid UTF-8 bytes still encode byte-level and decode back */
    const char bad[] = "x\xff\xfe\xc3(y";
    QOK(nl_tokenizer_encode(&tok, bad, sizeof bad - 1, 0, 0, &ids, &k));
    QOK(nl_tokenizer_decode(&tok, ids, k, &back, &bn));
    assert_int_equal(bn, sizeof bad - 1);
    assert_memory_equal(back, bad, bn);
    nl_free(back);
    nl_free(ids);
    nl_tokenizer_free(&tok);
    cJSON_Delete(fx);
    tu_rmdir(dir);
    free(dir);
}

/* Bad tokenizer.json files name the file and the key. */
static void test_bad_files(void **state) {
    (void)state;
    static const struct {
        const char *json, *want;
    } cases[] = {
        {"[1,2]", "not a JSON object"},
        {"{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}", "key \"model.type\" is \"Unigram\""},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a b\"]}}",
         "merge 0 (a b) names a piece missing"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 0}, \"merges\": []}}", "id 0 is given to"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"\"]}}",
         "merge 0 () names a piece missing"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -1}, \"merges\": []}}", "\"a\" has no valid id"},
        {"{\"pre_tokenizer\": {\"type\": \"BertPreTokenizer\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, "
         "\"merges\": []}}",
         "key \"pre_tokenizer\": type \"BertPreTokenizer\" is not supported"},
        {"{\"normalizer\": {\"type\": \"Lowercase\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, "
         "\"merges\": []}}",
         "key \"normalizer\": type \"Lowercase\" is not supported"},
        {"{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(a\"}, \"behavior\": \"Isolated\"}, "
         "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
         "key \"pre_tokenizer\": regex error"},
    };
    char *dir = tu_tmpdir(), path[600];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        FILE *f = fopen(path, "wb");
        fputs(cases[k].json, f);
        fclose(f);
        nl_tokenizer tok;
        nl_status rc = nl_tokenizer_load_json(&tok, path, 0);
        if (rc == NL_OK || !strstr(nl_last_error(), cases[k].want) || !strstr(nl_last_error(), path))
            fail_msg("case %zu: rc %d, \"%s\" (want \"%s\")", k, rc, nl_last_error(), cases[k].want);
    }
    /* a model vocabulary smaller than the tokenizer's */
    FILE *f = fopen(path, "wb");
    fputs("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [\"a b\"]}}", f);
    fclose(f);
    nl_tokenizer tok;
    assert_int_equal(nl_tokenizer_load_json(&tok, path, 2), NL_ERR_FORMAT);
    assert_non_null(strstr(nl_last_error(), "ids up to 2 but the model's vocabulary is 2"));
    QOK(nl_tokenizer_load_json(&tok, path, 8)); /* padded model vocabularies are fine */
    int *ids;
    int64_t k;
    QOK(nl_tokenizer_encode(&tok, "abab", 4, 0, 0, &ids, &k));
    assert_int_equal(k, 2);
    assert_int_equal(ids[0], 2);
    nl_free(ids);
    size_t len;
    assert_non_null(nl_tokenizer_piece(&tok, -1, 7, &len)); /* a padding id decodes to nothing */
    assert_int_equal(len, 0);
    nl_tokenizer_free(&tok);
    tu_rmdir(dir);
    free(dir);
}

/* A GPT-2-vocabulary tokenizer whose pre_tokenizer is `pre` (JSON) followed by ByteLevel without
 * its regex. */
static void gpt2_with(nl_tokenizer *tok, const char *pre, const char *dir, const char *name) {
    char hdr[2048];
    snprintf(hdr, sizeof hdr,
             "{\"version\":\"1.0\",\"added_tokens\":[],\"normalizer\":null,\"pre_tokenizer\":{\"type\":\"Sequence\","
             "\"pretokenizers\":[%s%s{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}]},"
             "\"post_processor\":null,\"decoder\":{\"type\":\"ByteLevel\"},\"model\":{\"type\":\"BPE\"}}",
             pre, pre[0] ? "," : "");
    cJSON *h = cJSON_Parse(hdr);
    assert_non_null(h);
    char *js = gpt2_json(h);
    cJSON_Delete(h);
    assert_non_null(js);
    load_json_text(tok, js, dir, name);
    free(js);
}

/* Split's merged behaviors give the pieces tokenizers documents for them (normalizer.rs; its
 * docstring: Split(" ", "merged_with_previous") cuts "How are  you?" into "How ", "are ", " ",
 * "you?"): the ids equal those of each expected piece encoded alone, without any split. */
static void test_split_behaviors(void **state) {
    (void)state;
    if (!tu_data_path("gpt2/encoder.json") || !tu_data_path("gpt2/vocab.bpe")) {
        print_message("[  SKIP    ] needs ../shared/data/gpt2/encoder.json and vocab.bpe\n");
        skip();
    }
    char *dir = tu_tmpdir();
    nl_tokenizer plain;
    gpt2_with(&plain, "", dir, "plain");
    struct {
        const char *split, *text, *pieces[8];
    } cases[] = {
        {"{\"type\":\"Split\",\"pattern\":{\"String\":\" \"},\"behavior\":\"MergedWithPrevious\"}",
         "How are  you?",
         {"How ", "are ", " ", "you?"}},
        {"{\"type\":\"Split\",\"pattern\":{\"String\":\" \"},\"behavior\":\"MergedWithNext\"}",
         "How are  you?",
         {"How", " are", " ", " you?"}},
        {"{\"type\":\"Split\",\"pattern\":{\"String\":\" \"},\"behavior\":\"Isolated\"}",
         "How are  you?",
         {"How", " ", "are", " ", " ", "you?"}},
        {"{\"type\":\"Split\",\"pattern\":{\"Regex\":\"-\"},\"behavior\":\"Contiguous\"}",
         "a--b-c",
         {"a", "--", "b", "-", "c"}},
        {"{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\s+\"},\"behavior\":\"Removed\"}",
         " two\twords ",
         {"two", "words"}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        nl_tokenizer tok;
        gpt2_with(&tok, cases[c].split, dir, "case");
        int *got, *want = malloc(256 * sizeof(int));
        int64_t ng, nw = 0;
        QOK(nl_tokenizer_encode(&tok, cases[c].text, strlen(cases[c].text), 0, 0, &got, &ng));
        for (int k = 0; cases[c].pieces[k]; k++) {
            int *ids;
            int64_t n;
            QOK(nl_tokenizer_encode(&plain, cases[c].pieces[k], strlen(cases[c].pieces[k]), 0, 0, &ids, &n));
            memcpy(want + nw, ids, (size_t)n * sizeof(int));
            nw += n;
            nl_free(ids);
        }
        if (ng != nw || memcmp(got, want, (size_t)nw * sizeof(int))) fail_msg("case %zu: %s", c, cases[c].split);
        nl_free(got);
        free(want);
        nl_tokenizer_free(&tok);
    }
    /* a merged split is visible in the ids: " are" is one GPT-2 token, "are" after " " two */
    int *a, *b;
    int64_t na, nb;
    nl_tokenizer next, iso;
    gpt2_with(&next, cases[1].split, dir, "next");
    gpt2_with(&iso, cases[2].split, dir, "iso");
    QOK(nl_tokenizer_encode(&next, "How are", 7, 0, 0, &a, &na));
    QOK(nl_tokenizer_encode(&iso, "How are", 7, 0, 0, &b, &nb));
    assert_int_equal(na, 2);
    assert_int_equal(nb, 3);
    nl_free(a);
    nl_free(b);
    nl_tokenizer_free(&next);
    nl_tokenizer_free(&iso);
    /* invert is refused by name */
    char path[600];
    snprintf(path, sizeof path, "%s/inv.json", dir);
    FILE *f = fopen(path, "wb");
    fputs("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},\"pre_tokenizer\":{\"type\":\"Split\","
          "\"pattern\":{\"String\":\"a\"},\"behavior\":\"Isolated\",\"invert\":true}}",
          f);
    fclose(f);
    nl_tokenizer bad;
    assert_int_not_equal(nl_tokenizer_load_json(&bad, path, 0), NL_OK);
    assert_non_null(strstr(nl_last_error(), "invert true is not supported"));
    nl_tokenizer_free(&plain);
    tu_rmdir(dir);
    free(dir);
}

/* A tokenizer.json over the 256 <0xNN> byte pieces plus "a", with the given normalizer. */
static char *byte_json(const char *normalizer) {
    cJSON *root = cJSON_CreateObject(), *model = cJSON_AddObjectToObject(root, "model");
    cJSON_AddItemToObject(root, "normalizer", cJSON_Parse(normalizer));
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddBoolToObject(model, "byte_fallback", 1);
    cJSON *vocab = cJSON_AddObjectToObject(model, "vocab");
    for (int b = 0; b < 256; b++) {
        char piece[8];
        snprintf(piece, sizeof piece, "<0x%02X>", b);
        cJSON_AddNumberToObject(vocab, piece, b);
    }
    cJSON_AddNumberToObject(vocab, "a", 256);
    cJSON_AddArrayToObject(model, "merges");
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

/* Normalizers that lengthen the text: the ids are not bounded by the input's bytes (NFC turns
 * U+1D160's 4 bytes into 12, one id each with byte fallback); chained growth is refused. */
static void test_normalizer_growth(void **state) {
    (void)state;
    char *dir = tu_tmpdir();
    nl_tokenizer tok;
    char *js = byte_json("{\"type\": \"NFC\"}");
    load_json_text(&tok, js, dir, "nfc");
    free(js);
    static const char note[] = "\xf0\x9d\x85\xa0"; /* U+1D160, a composition exclusion */
    int *ids;
    int64_t k1, k;
    QOK(nl_tokenizer_encode(&tok, note, 4, 0, 0, &ids, &k1));
    nl_free(ids);
    assert_true(k1 > 8); /* more ids than 2x its bytes: the old buffer's bound */
    enum { REPS = 20000 };
    char *text = malloc(4 * REPS);
    for (int i = 0; i < REPS; i++) memcpy(text + 4 * i, note, 4);
    QOK(nl_tokenizer_encode(&tok, text, 4 * REPS, 1, 1, &ids, &k));
    assert_int_equal(k, (int64_t)REPS * k1);
    nl_free(ids);
    nl_tokenizer_free(&tok);
    /* a Replace that triples the text still encodes whole */
    js = byte_json("{\"type\": \"Replace\", \"pattern\": {\"String\": \"a\"}, \"content\": \"aaa\"}");
    load_json_text(&tok, js, dir, "replace3");
    free(js);
    memset(text, 'a', 1000);
    QOK(nl_tokenizer_encode(&tok, text, 1000, 0, 0, &ids, &k));
    assert_int_equal(k, 3000);
    for (int64_t i = 0; i < k; i++) assert_int_equal(ids[i], 256);
    nl_free(ids);
    nl_tokenizer_free(&tok);
    /* chained Replace steps (8x each) would grow 16 bytes to 64 KB: refused with a message */
    char chain[600] = "{\"type\": \"Sequence\", \"normalizers\": [";
    for (int s = 0; s < 4; s++)
        strcat(chain, s ? ", {\"type\": \"Replace\", \"pattern\": {\"String\": \"a\"}, \"content\": \"aaaaaaaa\"}"
                        : "{\"type\": \"Replace\", \"pattern\": {\"String\": \"a\"}, \"content\": \"aaaaaaaa\"}");
    strcat(chain, "]}");
    js = byte_json(chain);
    load_json_text(&tok, js, dir, "chain");
    free(js);
    assert_int_equal(nl_tokenizer_encode(&tok, text, 16, 0, 0, &ids, &k), NL_ERR_RANGE);
    assert_null(ids);
    assert_non_null(strstr(nl_last_error(), "normalizer lengthens a text of 16 bytes"));
    nl_tokenizer_free(&tok);
    free(text);
    tu_rmdir(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_references),    cmocka_unit_test(test_split_behaviors),
        cmocka_unit_test(test_special_and_known_ids), cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_normalizer_growth),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
