/* Resource limits: files that declare more data than this machine can hold are refused with a
 * message before anything is allocated (sparse files, so the test needs no disk), and writes
 * that hit a full disk (RLIMIT_FSIZE in a forked child, SIGXFSZ ignored: write() fails with
 * EFBIG as it would with ENOSPC) fail with NL_ERR_IO and leave the previous file as it was,
 * with no temporary file behind. */
#include "testutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "nanolm/arch.h"
#include "nanolm/base.h"
#include "nanolm/checkpoint.h"
#include "nanolm/data.h"
#include "nanolm/llama2c.h"
#include "nanolm/model.h"
#include "nanolm/resources.h"
#include "nanolm/safetensors.h"
#include "nanolm/tokenizer.h"

/* Makes `path` a sparse file of `bytes` whose first `head_n` bytes are `head`. 0 on success. */
static int sparse_file(const char *path, const void *head, size_t head_n, uint64_t bytes) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return -1;
    int ok = (head_n == 0 || write(fd, head, head_n) == (ssize_t)head_n) && ftruncate(fd, (off_t)bytes) == 0;
    close(fd);
    return ok ? 0 : -1;
}

/* A size comfortably beyond what this process can allocate, or 0 when unknown. */
static uint64_t beyond_memory(void) {
    uint64_t avail = nl_mem_available();
    if (avail == UINT64_MAX || avail > (UINT64_C(1) << 44)) return 0; /* unknown or > 16 TiB */
    return 2 * avail + (UINT64_C(1) << 30);
}

#define REQUIRE_BEYOND(var)                                                                                            \
    uint64_t var = beyond_memory();                                                                                    \
    if (!var) {                                                                                                        \
        print_message("[  SKIP    ] available memory unknown on this machine\n");                                      \
        skip();                                                                                                        \
        return;                                                                                                        \
    }

static void expect_refused(nl_status rc, const char *file_name) {
    if (rc != NL_ERR_NOMEM) fail_msg("expected NL_ERR_NOMEM, got %d: %s", rc, nl_last_error());
    print_message("refused: %s\n", nl_last_error());
    assert_non_null(strstr(nl_last_error(), file_name));
    assert_non_null(strstr(nl_last_error(), "GiB of memory is available"));
}

/* A llama2.c checkpoint whose header (and exact file size) describe ~2x the available memory. */
static void test_llama2c_larger_than_memory(void **state) {
    (void)state;
    REQUIRE_BEYOND(want);
    nl_arch a = {.dim = 8192,
                 .hidden_dim = 16384,
                 .n_heads = 64,
                 .n_kv_heads = 64,
                 .vocab_size = 32000,
                 .seq_len = 2,
                 .tied_embeddings = 1};
    int64_t per_layer = 4 * a.dim * a.dim + 3 * a.dim * a.hidden_dim + 2 * a.dim; /* floats */
    a.n_layers = (int64_t)(want / 4 / (uint64_t)per_layer) + 1;
    nl_llama2c_tensor t[NL_LLAMA2C_MAX_TENSORS];
    int n = nl_llama2c_layout(&a, t);
    uint64_t floats = 0;
    for (int i = 0; i < n; i++) floats += (uint64_t)t[i].numel;
    floats += (uint64_t)a.seq_len * (uint64_t)(a.dim / a.n_heads); /* RoPE tables */
    uint64_t bytes = NL_LLAMA2C_HEADER_BYTES + 4 * floats;
    int32_t h[7] = {(int32_t)a.dim,        (int32_t)a.hidden_dim, (int32_t)a.n_layers, (int32_t)a.n_heads,
                    (int32_t)a.n_kv_heads, (int32_t)a.vocab_size, (int32_t)a.seq_len};
    char *dir = tu_tmpdir(), path[256];
    snprintf(path, sizeof path, "%s/huge.bin", dir);
    if (sparse_file(path, h, sizeof h, bytes)) {
        tu_rmdir(dir);
        print_message("[  SKIP    ] cannot make a sparse file of %llu bytes here\n", (unsigned long long)bytes);
        skip();
        return;
    }
    print_message("llama2.c file of %.1f GiB (sparse), %.1f GiB available\n", bytes / 1073741824.0,
                  nl_mem_available() / 1073741824.0);
    nl_llama2c m;
    expect_refused(nl_llama2c_read(&m, path), "huge.bin");
    assert_null(m.weights);
    /* The model loader goes through the same reader. */
    nl_model model;
    expect_refused(nl_ckpt_load_model(path, &model, NULL), "huge.bin");
    tu_rmdir(dir);
    free(dir);
}

/* A nanolm safetensors checkpoint whose arch (and data area) is larger than memory: opening the
 * file maps it without reading it; loading the model is refused before allocating. */
static void test_checkpoint_larger_than_memory(void **state) {
    (void)state;
    REQUIRE_BEYOND(want);
    int64_t dim = 8192, hidden = 16384, vocab = 32000;
    int64_t per_layer = 4 * dim * dim + 3 * dim * hidden + 2 * dim;
    int64_t layers = (int64_t)(want / 4 / (uint64_t)per_layer) + 1;
    nl_arch a = {.dim = dim,
                 .hidden_dim = hidden,
                 .n_layers = layers,
                 .n_heads = 64,
                 .n_kv_heads = 64,
                 .vocab_size = vocab,
                 .seq_len = 2,
                 .tied_embeddings = 1};
    nl_arch_params p;
    nl_arch_count_params(&a, &p);
    uint64_t data = (uint64_t)p.total * 4;
    char hdr[1024];
    int hn = snprintf(hdr, sizeof hdr,
                      "{\"__metadata__\":{\"format\":\"pt\",\"nanolm.tokenizer\":\"byte\",\"nanolm.arch\":"
                      "\"{\\\"name\\\":\\\"huge\\\",\\\"vocab_size\\\":%lld,\\\"dim\\\":%lld,\\\"n_layers\\\":%lld,"
                      "\\\"n_heads\\\":64,\\\"n_kv_heads\\\":64,\\\"hidden_dim\\\":%lld,\\\"seq_len\\\":2,"
                      "\\\"tied_embeddings\\\":1}\"},"
                      "\"all\":{\"dtype\":\"F32\",\"shape\":[%lld],\"data_offsets\":[0,%llu]}}",
                      (long long)vocab, (long long)dim, (long long)layers, (long long)hidden, (long long)p.total,
                      (unsigned long long)data);
    while ((8 + hn) % 8) hdr[hn++] = ' ';
    unsigned char head[1100];
    uint64_t n = (uint64_t)hn;
    memcpy(head, &n, 8);
    memcpy(head + 8, hdr, (size_t)hn);
    char *dir = tu_tmpdir(), path[256];
    snprintf(path, sizeof path, "%s/huge.safetensors", dir);
    if (sparse_file(path, head, 8 + (size_t)hn, 8 + n + data)) {
        tu_rmdir(dir);
        print_message("[  SKIP    ] cannot make a sparse file here\n");
        skip();
        return;
    }
    print_message("checkpoint of %.1f GiB (sparse), %lld parameters\n", (8 + n + data) / 1073741824.0,
                  (long long)p.total);
    nl_st_file f;
    assert_int_equal(nl_st_open(&f, path), NL_OK); /* mapped, validated, not read */
    assert_int_equal(f.n_tensors, 1);
    nl_st_close(&f);
    nl_model m;
    expect_refused(nl_ckpt_load_model(path, &m, NULL), "huge.safetensors");
    assert_null(m.params);
    tu_rmdir(dir);
    free(dir);
}

/* A text file larger than memory handed to the data loader (and so to nl_read_file). */
static void test_text_larger_than_memory(void **state) {
    (void)state;
    REQUIRE_BEYOND(want);
    char *dir = tu_tmpdir(), path[256];
    snprintf(path, sizeof path, "%s/huge.txt", dir);
    if (sparse_file(path, "Once upon a time", 16, want)) {
        tu_rmdir(dir);
        print_message("[  SKIP    ] cannot make a sparse file of %llu bytes here\n", (unsigned long long)want);
        skip();
        return;
    }
    nl_tokenizer tok;
    assert_int_equal(nl_tokenizer_init_byte(&tok), NL_OK);
    nl_data d;
    expect_refused(nl_data_open(&d, path, &tok), "huge.txt");
    assert_null(d.tokens);
    nl_tokenizer_free(&tok);
    tu_rmdir(dir);
    free(dir);
}

/* ---- disk full ------------------------------------------------------------------------------ */

typedef nl_status (*writer_fn)(const char *path, int big);

/* Each writer writes a small file (big = 0) or one of ~1 MB (big = 1) to path. */
static nl_status write_safetensors(const char *path, int big) {
    static float data[262144];
    for (int i = 0; i < 262144; i++) data[i] = (float)i;
    nl_st_writer w;
    nl_st_writer_init(&w);
    int64_t shape[1] = {big ? 262144 : 4};
    nl_status rc = nl_st_writer_add(&w, "x", NL_ST_F32, 1, shape, data);
    if (!rc) rc = nl_st_writer_write(&w, path);
    nl_st_writer_free(&w);
    return rc;
}

static nl_status write_llama2c(const char *path, int big) {
    nl_arch a = {.dim = big ? 128 : 8,
                 .hidden_dim = big ? 256 : 16,
                 .n_layers = big ? 2 : 1,
                 .n_heads = 2,
                 .n_kv_heads = 2,
                 .vocab_size = 256,
                 .seq_len = 8,
                 .rope_theta = 10000,
                 .norm_eps = 1e-5,
                 .tied_embeddings = 1};
    nl_llama2c_tensor t[NL_LLAMA2C_MAX_TENSORS];
    int n = nl_llama2c_layout(&a, t);
    int64_t total = 0;
    for (int i = 0; i < n; i++) total += t[i].numel;
    float *w = calloc((size_t)total, sizeof(float));
    const float *arr[NL_LLAMA2C_MAX_TENSORS];
    int64_t off = 0;
    for (int i = 0; i < n; i++) {
        arr[i] = w + off;
        off += t[i].numel;
    }
    nl_status rc = nl_llama2c_write(path, &a, arr);
    free(w);
    return rc;
}

static nl_status write_plain(const char *path, int big) {
    size_t n = big ? (1u << 20) : 100;
    char *b = malloc(n);
    memset(b, big ? 'B' : 's', n);
    nl_status rc = nl_write_file_atomic(path, b, n);
    free(b);
    return rc;
}

static nl_status write_checkpoint(const char *path, int big) {
    nl_arch a;
    assert_int_equal(nl_arch_preset(big ? "shakespeare-char" : "stories260k", &a), NL_OK);
    nl_model m;
    nl_status rc = nl_model_init(&m, &a);
    if (rc) return rc;
    nl_model_init_random(&m, 7);
    rc = nl_ckpt_save(path, &m, "byte", NULL);
    nl_model_free(&m);
    return rc;
}

/* Count of entries in dir other than "." and "..". */
static int dir_entries(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    if (d) closedir(d);
    return n;
}

static void disk_full(const char *what, writer_fn fn) {
    char *dir = tu_tmpdir(), path[256];
    snprintf(path, sizeof path, "%s/out.file", dir);
    assert_int_equal(fn(path, 0), NL_OK);
    size_t old_n;
    char *old = tu_read_file(path, &old_n);
    assert_non_null(old);
    int pipefd[2];
    assert_int_equal(pipe(pipefd), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(pipefd[0]);
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit lim = {.rlim_cur = 64 * 1024, .rlim_max = 64 * 1024}; /* the disk is full at 64 KiB */
        setrlimit(RLIMIT_FSIZE, &lim);
        nl_status rc = fn(path, 1);
        char msg[1024];
        int n = snprintf(msg, sizeof msg, "%d %s", (int)rc, nl_last_error());
        if (write(pipefd[1], msg, (size_t)n) < 0) _exit(3);
        _exit(0);
    }
    close(pipefd[1]);
    char msg[1024] = {0};
    ssize_t got = 0, r;
    while ((r = read(pipefd[0], msg + got, sizeof msg - 1 - (size_t)got)) > 0) got += r;
    close(pipefd[0]);
    int status;
    waitpid(pid, &status, 0);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    print_message("%s, disk full: %s\n", what, msg);
    if (atoi(msg) != NL_ERR_IO) fail_msg("%s: expected NL_ERR_IO (%d), got: %s", what, NL_ERR_IO, msg);
    assert_non_null(strstr(msg, "out.file"));
    size_t now_n;
    char *now = tu_read_file(path, &now_n);
    assert_non_null(now);
    assert_int_equal(now_n, old_n);
    assert_memory_equal(now, old, old_n);  /* the previous file, byte for byte */
    assert_int_equal(dir_entries(dir), 1); /* no temporary file left behind */
    free(old);
    free(now);
    tu_rmdir(dir);
    free(dir);
}

static void test_disk_full_safetensors(void **s) {
    (void)s;
    disk_full("safetensors", write_safetensors);
}
static void test_disk_full_llama2c(void **s) {
    (void)s;
    disk_full("llama2.c", write_llama2c);
}
static void test_disk_full_atomic_file(void **s) {
    (void)s;
    disk_full("nl_write_file_atomic", write_plain);
}
static void test_disk_full_checkpoint(void **s) {
    (void)s;
    disk_full("NanoLM checkpoint", write_checkpoint);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama2c_larger_than_memory), cmocka_unit_test(test_checkpoint_larger_than_memory),
        cmocka_unit_test(test_text_larger_than_memory),    cmocka_unit_test(test_disk_full_safetensors),
        cmocka_unit_test(test_disk_full_llama2c),          cmocka_unit_test(test_disk_full_atomic_file),
        cmocka_unit_test(test_disk_full_checkpoint),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
