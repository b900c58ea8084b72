/* Checked, 64-byte aligned allocation. */
#include "nanolm/base.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int nl_mul_overflows(size_t count, size_t size, size_t *out) {
    if (size != 0 && count > SIZE_MAX / size) return 1;
    *out = count * size;
    return 0;
}

void *nl_malloc(size_t bytes, const char *what) {
    void *p = NULL;
    size_t n = bytes ? bytes : 1;
    n = (n + 63) & ~(size_t)63;
    if (n < bytes || posix_memalign(&p, 64, n) != 0) {
        nl_fail(NL_ERR_NOMEM, "out of memory allocating %zu bytes for %s", bytes, what ? what : "a buffer");
        return NULL;
    }
    return p;
}

void *nl_malloc_huge(size_t bytes, const char *what) {
    enum { HUGE_PAGE = 2 << 20 };
    if (bytes < 2 * (size_t)HUGE_PAGE) return nl_malloc(bytes, what);
    void *p = NULL;
    size_t n = (bytes + HUGE_PAGE - 1) & ~(size_t)(HUGE_PAGE - 1);
    if (n < bytes || posix_memalign(&p, HUGE_PAGE, n) != 0) {
        nl_fail(NL_ERR_NOMEM, "out of memory allocating %zu bytes for %s", bytes, what ? what : "a buffer");
        return NULL;
    }
#ifdef MADV_HUGEPAGE
    (void)madvise(p, n, MADV_HUGEPAGE); /* a hint: where the kernel declines, 4 KiB pages serve */
#endif
    return p;
}

void *nl_calloc(size_t count, size_t size, const char *what) {
    size_t bytes;
    if (nl_mul_overflows(count, size, &bytes)) {
        nl_fail(NL_ERR_NOMEM, "size overflow allocating %zu x %zu bytes for %s", count, size, what ? what : "a buffer");
        return NULL;
    }
    void *p = nl_malloc(bytes, what);
    if (p) memset(p, 0, bytes);
    return p;
}

void nl_free(void *p) { free(p); }

void nl_release_pages(void *p, size_t bytes) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), a = (uintptr_t)p, e = a + bytes;
    const uintptr_t lo = (a + page - 1) & ~(page - 1), hi = e & ~(page - 1);
    if (!p || hi <= lo) return;
    (void)madvise((void *)lo, hi - lo, MADV_DONTNEED); /* advice: where it fails, the pages stay */
}
