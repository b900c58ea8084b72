/* Memory available to this process, checked before large allocations. */
#include "nanolm/resources.h"

#include <stdio.h>
#include <string.h>
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
            if (sscanf(max, "%llu", &lim) == 1 && read_small(path, cur, sizeof cur) == 0 && sscanf(cur, "%llu", &used) == 1) {
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
