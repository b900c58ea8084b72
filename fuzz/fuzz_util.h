/*
 * Helpers shared by the libFuzzer targets and the regression test that replays their findings.
 *
 * The loaders take a path, so a fuzz input is handed over as an in-memory file (memfd) reached
 * through /proc/self/fd/N: the library runs its real open/stat/read code, no disk is touched.
 */
#ifndef NANOLM_FUZZ_UTIL_H
#define NANOLM_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

/* One reusable in-memory file per process. Returns its path with `data` as its whole content,
 * or NULL when the memfd cannot be made or written. */
static inline const char *fz_memfile(const uint8_t *data, size_t size) {
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        fd = memfd_create("nanolm-fuzz", 0);
        if (fd < 0) return NULL;
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    if (ftruncate(fd, 0) != 0) return NULL;
    size_t done = 0;
    while (done < size) {
        ssize_t w = pwrite(fd, data + done, size - done, (off_t)done);
        if (w <= 0) return NULL;
        done += (size_t)w;
    }
    return path;
}

/* Reads a little-endian integer of `bytes` bytes from the front of the input and advances it
 * (missing bytes read as 0). */
static inline uint64_t fz_take(const uint8_t **data, size_t *size, int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++) {
        if (*size) {
            v |= (uint64_t)(**data) << (8 * i);
            (*data)++;
            (*size)--;
        }
    }
    return v;
}

#endif
