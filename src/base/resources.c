/* Memory available to this process, checked before large allocations. */
#include "nanolm/resources.h"

#include <omp.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>

/* The value of "Key:   N kB" in /proc/meminfo in bytes, or -1. */
static int64_t meminfo_bytes(const char *text, const char *key) {
    const char *p = strstr(text, key);
    if (!p) return -1;
    long long kb;
    if (sscanf(p + strlen(key), " %lld", &kb) != 1) return -1;
    return (int64_t)kb * 1024;
}

/* Reads a small text file into buf (NUL-terminated); 0 on success. */
static int read_small(const char *path, char *buf, size_t n) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t got = fread(buf, 1, n - 1, f);
    fclose(f);
    buf[got] = '\0';
    return got > 0 ? 0 : -1;
}

/* The cgroup v2 directory of this process under /sys/fs/cgroup, from /proc/self/cgroup
 * ("0::/path"). */
static int cgroup_dir(char *out, size_t n) {
    char buf[4096];
    if (read_small("/proc/self/cgroup", buf, sizeof buf)) return -1;
    char *p = strstr(buf, "0::");
    if (!p) return -1;
    p += 3;
    p[strcspn(p, "\n")] = '\0';
    snprintf(out, n, "/sys/fs/cgroup%s", strcmp(p, "/") == 0 ? "" : p);
    return 0;
}

uint64_t nl_mem_available(void) {
    uint64_t avail = UINT64_MAX;
    char buf[8192];
    if (read_small("/proc/meminfo", buf, sizeof buf) == 0) {
        int64_t a = meminfo_bytes(buf, "MemAvailable:"), s = meminfo_bytes(buf, "SwapFree:");
        if (a >= 0) avail = (uint64_t)a + (s > 0 ? (uint64_t)s : 0);
    }
    char dir[4096], path[4200];
    if (cgroup_dir(dir, sizeof dir) == 0) {
        char max[64], cur[64];
        snprintf(path, sizeof path, "%s/memory.max", dir);
        if (read_small(path, max, sizeof max) == 0 && strncmp(max, "max", 3) != 0) {
            unsigned long long lim = 0, used = 0;
            snprintf(path, sizeof path, "%s/memory.current", dir);
            if (sscanf(max, "%llu", &lim) == 1 && read_small(path, cur, sizeof cur) == 0 &&
                sscanf(cur, "%llu", &used) == 1) {
                uint64_t left = lim > used ? lim - used : 0;
                if (left < avail) avail = left;
            }
        }
    }
    int res[2] = {RLIMIT_AS, RLIMIT_DATA};
    for (int i = 0; i < 2; i++) {
        struct rlimit rl;
        if (getrlimit(res[i], &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && (uint64_t)rl.rlim_cur < avail)
            avail = (uint64_t)rl.rlim_cur;
    }
    return avail;
}

nl_status nl_mem_require(uint64_t bytes, const char *what) {
    uint64_t avail = nl_mem_available();
    if (bytes <= avail) return NL_OK;
    return nl_fail(NL_ERR_NOMEM, "%s: %.1f GiB required, only %.1f GiB of memory is available", what,
                   (double)bytes / 1073741824.0, (double)avail / 1073741824.0);
}

/* ---- OpenBLAS under an address-space limit ------------------------------------------------- */

/* OpenBLAS's own allocator (exported by libopenblas, not declared in cblas.h). */
extern void *blas_memory_alloc(int procpos);
extern void blas_memory_free(void *buffer);
extern void openblas_set_num_threads(int);

/* OpenBLAS 0.3's GEMM buffer (BUFFER_SIZE, 128 MiB on x86-64) with 1 MiB of slack. */
#define BLAS_BUFFER_BYTES ((uint64_t)129 << 20)
/* Room kept for the work itself after the buffers (the model, data and activations are
 * checked and refused with a message of their own when they do not fit). */
#define WORK_RESERVE_BYTES ((uint64_t)16 << 20)

static int guard_done, guard_threads;
static nl_status guard_status;
static char guard_message[512];

/* "Key:   N kB" of /proc/self/status in bytes, or 0. */
static uint64_t self_status_bytes(const char *key) {
    char buf[8192];
    if (read_small("/proc/self/status", buf, sizeof buf)) return 0;
    int64_t v = meminfo_bytes(buf, key);
    return v > 0 ? (uint64_t)v : 0;
}

/* Address space left under RLIMIT_AS (against VmSize) and RLIMIT_DATA (against VmData);
 * UINT64_MAX when neither is limited. *limit_kib is the binding limit in KiB. */
static uint64_t address_room(uint64_t *limit_kib) {
    uint64_t room = UINT64_MAX;
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
        uint64_t used = self_status_bytes("VmSize:");
        room = rl.rlim_cur > used ? rl.rlim_cur - used : 0;
        *limit_kib = rl.rlim_cur / 1024;
    }
    if (getrlimit(RLIMIT_DATA, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
        uint64_t used = self_status_bytes("VmData:");
        uint64_t r = rl.rlim_cur > used ? rl.rlim_cur - used : 0;
        if (r < room) {
            room = r;
            *limit_kib = rl.rlim_cur / 1024;
        }
    }
    return room;
}

/* Stack bytes of one more OpenMP thread (libgomp uses OMP_STACKSIZE, else the pthread default,
 * which is RLIMIT_STACK). */
static uint64_t thread_stack_bytes(void) {
    struct rlimit rl;
    uint64_t s = 8u << 20;
    if (getrlimit(RLIMIT_STACK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur > 0) s = rl.rlim_cur;
    return s + (1u << 20);
}

/* 1 when `t` threads can each map a GEMM buffer at the same time (mapped, then unmapped). */
static int buffers_fit(int t) {
    int failed = 0;
#pragma omp parallel num_threads(t) reduction(+ : failed)
    {
        void *p = mmap(NULL, (size_t)BLAS_BUFFER_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) failed++;
#pragma omp barrier
        if (p != MAP_FAILED) munmap(p, (size_t)BLAS_BUFFER_BYTES);
        if (omp_get_num_threads() != t) failed++;
    }
    return failed == 0;
}

nl_status nl_blas_guard(int *threads) {
    if (guard_done) {
        if (threads) *threads = guard_threads;
        return guard_status ? nl_fail(guard_status, "%s", guard_message) : NL_OK;
    }
    guard_done = 1;
    if (threads) *threads = 0;
    uint64_t limit_kib = 0, room = address_room(&limit_kib);
    if (room == UINT64_MAX) return NL_OK;
    openblas_set_num_threads(1);
    /* Threads that fit: the first (this one) needs a buffer, each further one a stack too. */
    uint64_t per = BLAS_BUFFER_BYTES + thread_stack_bytes();
    int want = omp_get_max_threads(), t = 0;
    if (room >= BLAS_BUFFER_BYTES + WORK_RESERVE_BYTES)
        t = 1 + (int)((room - BLAS_BUFFER_BYTES - WORK_RESERVE_BYTES) / per);
    if (t > want) t = want;
    while (t > 0 && !buffers_fit(t)) t--;
    if (t == 0) {
        uint64_t used_kib = (self_status_bytes("VmSize:") + 1023) / 1024;
        uint64_t need_kib = used_kib + (BLAS_BUFFER_BYTES + WORK_RESERVE_BYTES) / 1024;
        guard_status = NL_ERR_NOMEM;
        snprintf(guard_message, sizeof guard_message,
                 "the address-space limit (ulimit -v %llu KiB) leaves %.0f MiB free, and OpenBLAS needs %.0f MiB "
                 "of address space per thread for its GEMM buffer: raise the limit to at least %llu KiB",
                 (unsigned long long)limit_kib, (double)room / 1048576.0, (double)(BLAS_BUFFER_BYTES >> 20),
                 (unsigned long long)need_kib);
        return nl_fail(guard_status, "%s", guard_message);
    }
    omp_set_num_threads(t);
    /* OpenBLAS keeps freed buffers for reuse: after this no GEMM on these threads maps more. */
#pragma omp parallel num_threads(t)
    {
        void *b = blas_memory_alloc(0);
#pragma omp barrier
        blas_memory_free(b);
    }
    guard_threads = t;
    if (threads) *threads = t;
    return NL_OK;
}

int nl_blas_guard_threads(void) { return guard_threads; }
