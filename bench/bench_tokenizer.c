/* bench_tokenizer: encoding speed of nanolm's tokenizer.json BPE (GPT-2's vocabulary, byte-level,
 * GPT-2's pre-tokenizer regex) on tinyshakespeare (1.1 MB) against JavaScript implementations
 * timed in the same run on the same text: js-tiktoken, @huggingface/tokenizers (tokenizers.js)
 * and gpt-tokenizer (tests/ref/bench_tok.mjs; skipped, saying so, when node or the npm packages
 * are missing). Medians of 5 runs after a warm-up; token counts must agree. Target: >= 3x the
 * JavaScript implementation. Run from the project root (make bench); data from NANOLM_DATA or
 * ../shared/data. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nanolm/base.h"
#include "nanolm/tokenizer.h"
#include "bench_util.h"

#define REPS 5

static char *slurp(const char *path, size_t *n) {
    char *buf;
    if (nl_read_file(path, &buf, n)) return NULL;
    return buf;
}

/* GPT-2's tokenizer.json from encoder.json + vocab.bpe, written to `out`. */
static int write_gpt2_json(const char *data, const char *out) {
    char p[1024];
    size_t n;
    snprintf(p, sizeof p, "%s/gpt2/encoder.json", data);
    char *enc = slurp(p, &n);
    snprintf(p, sizeof p, "%s/gpt2/vocab.bpe", data);
    char *bpe = slurp(p, &n);
    if (!enc || !bpe) return 1;
    cJSON *root = cJSON_Parse(
        "{\"version\":\"1.0\",\"added_tokens\":[{\"id\":50256,\"content\":\"<|endoftext|>\",\"special\":true}],"
        "\"normalizer\":null,\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":"
        "true,"
        "\"use_regex\":true},\"post_processor\":null,\"decoder\":{\"type\":\"ByteLevel\"},"
        "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":null,\"fuse_unk\":false,\"byte_fallback\":false}}");
    cJSON *model = cJSON_GetObjectItem(root, "model"), *merges = cJSON_CreateArray();
    cJSON_AddItemToObject(model, "vocab", cJSON_Parse(enc));
    for (char *line = strchr(bpe, '\n') + 1; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        if (*line) cJSON_AddItemToArray(merges, cJSON_CreateString(line));
        line = nl ? nl + 1 : NULL;
    }
    cJSON_AddItemToObject(model, "merges", merges);
    char *s = cJSON_PrintUnformatted(root);
    nl_status rc = nl_write_file_atomic(out, s, strlen(s));
    free(s);
    cJSON_Delete(root);
    nl_free(enc);
    nl_free(bpe);
    return rc != NL_OK;
}

int main(void) {
    const char *data = getenv("NANOLM_DATA") ? getenv("NANOLM_DATA") : "../shared/data";
    char text_path[1024], json[64];
    snprintf(text_path, sizeof text_path, "%s/tinyshakespeare/input.txt", data);
    snprintf(json, sizeof json, "/tmp/nanolm-bench-gpt2-%d.json", (int)getpid());
    size_t n;
    char *text = slurp(text_path, &n);
    if (!text || write_gpt2_json(data, json)) {
        printf("bench_tokenizer: skipped (needs %s/tinyshakespeare/input.txt and %s/gpt2)\n", data, data);
        nl_free(text);
        return 0;
    }
    nl_tokenizer tok;
    if (nl_tokenizer_load_json(&tok, json, 0)) {
        fprintf(stderr, "bench_tokenizer: %s\n", nl_last_error());
        return 1;
    }
    double t[REPS];
    int64_t ntok = 0;
    for (int r = -1; r < REPS; r++) {
        int *ids;
        double t0 = nl_time_s();
        if (nl_tokenizer_encode_special(&tok, text, n, 0, 0, 1, &ids, &ntok)) return 1;
        if (r >= 0) t[r] = nl_time_s() - t0;
        nl_free(ids);
    }
    qsort(t, REPS, sizeof t[0], cmp_double);
    double c_s = t[REPS / 2];
    printf("tokenizer.json BPE encode, GPT-2 vocabulary, tinyshakespeare %zu bytes (median of %d)\n", n, REPS);
    printf("  %-26s %8lld tokens %9.1f ms %7.2f MB/s\n", "nanolm (C)", (long long)ntok, 1e3 * c_s, n / c_s / 1e6);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "node tests/ref/bench_tok.mjs '%s' '%s' %d 2>&1", json, text_path, REPS);
    int ok =
        access("tests/ref/tok/node_modules/js-tiktoken", F_OK) == 0 && system("node --version >/dev/null 2>&1") == 0;
    FILE *p = ok ? popen(cmd, "r") : NULL;
    int rc = 0, lines = 0;
    char line[512];
    while (p && fgets(line, sizeof line, p)) {
        char name[128];
        long long jt;
        double js_s;
        if (sscanf(line, "%127s %lld %lf", name, &jt, &js_s) != 3) {
            printf("  node: %s", line);
            continue;
        }
        lines++;
        printf("  %-26s %8lld tokens %9.1f ms %7.2f MB/s   nanolm is %.1fx faster%s\n", name, jt, 1e3 * js_s,
               n / js_s / 1e6, js_s / c_s, jt == ntok ? "" : "  (TOKEN COUNT DIFFERS)");
        if (jt != ntok) rc = 1;
    }
    if (p) pclose(p);
    if (!lines) printf("  JavaScript comparison skipped: needs node and `npm install` in tests/ref/tok\n");
    printf("  target: >= 3x the JavaScript implementations\n");
    unlink(json);
    nl_tokenizer_free(&tok);
    nl_free(text);
    return rc;
}
