/* Monotonic time, progress line, atomic file writes, thread count. */
#include "nanolm/base.h"
#include "nanolm/resources.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <omp.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

double nl_time_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- progress ---- */

void nl_progress_begin(nl_progress *p, const char *label, int64_t total) {
    const char *force = getenv("NANOLM_PROGRESS");
    p->label = label;
    p->total = total;
    p->t0 = nl_time_s();
    p->last_draw = 0;
    p->enabled = force ? atoi(force) != 0 : isatty(STDERR_FILENO);
}

static void fmt_duration(char *buf, size_t n, double s) {
    if (!(s >= 0) || s > 1e7) {
        snprintf(buf, n, "?");
        return;
    }
    int h = (int)(s / 3600), m = (int)(s / 60) % 60, sec = (int)s % 60;
    if (h)
        snprintf(buf, n, "%dh%02dm", h, m);
    else
        snprintf(buf, n, "%dm%02ds", m, sec);
}

void nl_progress_update(nl_progress *p, int64_t done, double units_done, const char *unit, const char *extra) {
    if (!p->enabled) return;
    double now = nl_time_s();
    if (now - p->last_draw < 0.2 && done < p->total) return;
    p->last_draw = now;
    double el = now - p->t0;
    double rate = el > 0 ? units_done / el : 0;
    double eta = (done > 0 && p->total > 0) ? el * (double)(p->total - done) / (double)done : -1;
    char etab[32];
    fmt_duration(etab, sizeof etab, eta);
    fprintf(stderr, "\r\033[K%s %lld/%lld  %.4g %s/s  ETA %s  %s", p->label ? p->label : "", (long long)done,
            (long long)p->total, rate, unit ? unit : "it", etab, extra ? extra : "");
    fflush(stderr);
}

void nl_progress_end(nl_progress *p) {
    if (!p->enabled) return;
    fprintf(stderr, "\r\033[K");
    fflush(stderr);
}

/* ---- atomic files ---- */

/* The temp file of the atomic write in progress (one at a time per process is what nanolm does;
 * the last one opened is remembered), for nl_atomic_remove_pending in a signal handler. */
static char pending_tmp[4096];
static volatile sig_atomic_t pending_set;

static void pending_remember(const char *tmp) {
    pending_set = 0;
    if (strlen(tmp) < sizeof pending_tmp) {
        memcpy(pending_tmp, tmp, strlen(tmp) + 1);
        pending_set = 1;
    }
}

void nl_atomic_remove_pending(void) {
    if (pending_set) unlink(pending_tmp);
}

nl_status nl_check_writable(const char *path, const char *what) {
    struct stat st;
    if (!path || !path[0]) return nl_fail(NL_ERR_IO, "%s: empty output path", what);
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
        return nl_fail(NL_ERR_IO, "%s %s is %s, not a file that can be written", what, path,
                       S_ISDIR(st.st_mode)    ? "a directory"
                       : S_ISFIFO(st.st_mode) ? "a FIFO"
                                              : "a special file");
    size_t n = strlen(path) + 32;
    char *probe = malloc(n);
    if (!probe) return nl_fail(NL_ERR_NOMEM, "out of memory checking %s", path);
    snprintf(probe, n, "%s.tmp.%ld", path, (long)getpid());
    int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_NONBLOCK, 0644);
    if (fd < 0 && errno == EEXIST) { /* a stale probe of this pid: replace it */
        unlink(probe);
        fd = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_NONBLOCK, 0644);
    }
    if (fd < 0) {
        int e = errno;
        char *d = strdup(path);
        nl_status rc = nl_fail(NL_ERR_IO, "%s %s cannot be written: cannot create a file in %s: %s", what, path,
                               d ? dirname(d) : "its directory", strerror(e));
        free(d);
        free(probe);
        return rc;
    }
    close(fd);
    unlink(probe);
    free(probe);
    return NL_OK;
}

/* "<path>.lock", malloc'd. */
static char *lock_name(const char *path) {
    size_t n = strlen(path) + 6;
    char *l = malloc(n);
    if (l) snprintf(l, n, "%s.lock", path);
    return l;
}

nl_status nl_output_lock(const char *path, const char *what, int *fd_out) {
    *fd_out = -1;
    char *name = lock_name(path);
    if (!name) return nl_fail(NL_ERR_NOMEM, "out of memory locking %s", path);
    for (int attempt = 0; attempt < 8; attempt++) {
        int fd = open(name, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0) {
            nl_status rc =
                nl_fail(NL_ERR_IO, "%s %s: cannot create its lock file %s: %s", what, path, name, strerror(errno));
            free(name);
            return rc;
        }
        if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            char pid[32] = "";
            ssize_t got = pread(fd, pid, sizeof pid - 1, 0);
            pid[got > 0 ? got : 0] = 0;
            pid[strcspn(pid, "\n")] = 0;
            close(fd);
            nl_status rc = nl_fail(NL_ERR_IO,
                                   "%s %s is being written by another run (PID %s, lock %s); wait for it to end or "
                                   "choose another %s",
                                   what, path, pid[0] ? pid : "unknown", name, what);
            free(name);
            return rc;
        }
        /* the holder before us may have removed the file after we opened it: lock the one in place */
        struct stat a, b;
        if (fstat(fd, &a) == 0 && stat(name, &b) == 0 && a.st_ino == b.st_ino && a.st_dev == b.st_dev) {
            char pid[32];
            int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
            if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)n, 0) != n) {
                nl_status rc =
                    nl_fail(NL_ERR_IO, "%s %s: cannot write its lock file %s: %s", what, path, name, strerror(errno));
                unlink(name);
                close(fd);
                free(name);
                return rc;
            }
            free(name);
            *fd_out = fd;
            return NL_OK;
        }
        close(fd);
    }
    free(name);
    return nl_fail(NL_ERR_IO, "%s %s: its lock file keeps changing under other runs", what, path);
}

void nl_output_unlock(const char *path, int fd) {
    if (fd < 0) return;
    char *name = lock_name(path);
    if (name) unlink(name); /* while still locked: a waiting run sees the file gone and retries */
    free(name);
    close(fd);
}

nl_status nl_atomic_open(nl_atomic_file *af, const char *path) {
    memset(af, 0, sizeof *af);
    af->path = strdup(path);
    size_t n = strlen(path) + 32;
    af->tmp_path = malloc(n);
    if (!af->path || !af->tmp_path) {
        free(af->path);
        free(af->tmp_path);
        return nl_fail(NL_ERR_NOMEM, "out of memory opening %s", path);
    }
    snprintf(af->tmp_path, n, "%s.tmp.%ld", path, (long)getpid());
    pending_remember(af->tmp_path);
    af->f = fopen(af->tmp_path, "wb");
    if (!af->f) {
        pending_set = 0;
        nl_status rc = nl_fail(NL_ERR_IO, "cannot create %s: %s", af->tmp_path, strerror(errno));
        free(af->path);
        free(af->tmp_path);
        memset(af, 0, sizeof *af);
        return rc;
    }
    return NL_OK;
}

nl_status nl_atomic_write(nl_atomic_file *af, const void *data, size_t bytes) {
    if (!af->f) return nl_fail(NL_ERR_IO, "write to a closed file");
    if (bytes && fwrite(data, 1, bytes, af->f) != bytes) {
        int e = errno;
        return nl_fail(NL_ERR_IO, "writing %s failed: %s", af->path, e ? strerror(e) : "short write");
    }
    return NL_OK;
}

void nl_atomic_abort(nl_atomic_file *af) {
    pending_set = 0;
    if (af->f) fclose(af->f);
    if (af->tmp_path) unlink(af->tmp_path);
    free(af->path);
    free(af->tmp_path);
    memset(af, 0, sizeof *af);
}

nl_status nl_atomic_commit(nl_atomic_file *af) {
    nl_status rc = NL_OK;
    if (!af->f) return nl_fail(NL_ERR_IO, "commit of a closed file");
    if (fflush(af->f) != 0 || fsync(fileno(af->f)) != 0) {
        rc = nl_fail(NL_ERR_IO, "writing %s failed: %s (previous file kept)", af->path, strerror(errno));
        nl_atomic_abort(af);
        return rc;
    }
    if (fclose(af->f) != 0) {
        af->f = NULL;
        rc = nl_fail(NL_ERR_IO, "closing %s failed: %s (previous file kept)", af->path, strerror(errno));
        nl_atomic_abort(af);
        return rc;
    }
    af->f = NULL;
    int renamed = rename(af->tmp_path, af->path) == 0;
    pending_set = 0;
    if (!renamed) {
        rc = nl_fail(NL_ERR_IO, "renaming %s to %s failed: %s", af->tmp_path, af->path, strerror(errno));
        nl_atomic_abort(af);
        return rc;
    }
    /* fsync the directory so the rename itself is durable. */
    char *d = strdup(af->path);
    if (d) {
        int fd = open(dirname(d), O_RDONLY | O_DIRECTORY);
        if (fd >= 0) {
            fsync(fd);
            close(fd);
        }
        free(d);
    }
    free(af->path);
    free(af->tmp_path);
    memset(af, 0, sizeof *af);
    return NL_OK;
}

nl_status nl_write_file_atomic(const char *path, const void *data, size_t bytes) {
    nl_atomic_file af;
    NL_TRY(nl_atomic_open(&af, path));
    nl_status rc = nl_atomic_write(&af, data, bytes);
    if (rc) {
        nl_atomic_abort(&af);
        return rc;
    }
    return nl_atomic_commit(&af);
}

/* What a non-regular file is, for the message. */
static const char *file_kind(mode_t m) {
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISDIR(m)) return "a directory";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISSOCK(m)) return "a socket";
    return "not a regular file";
}

/* The descriptor of nl_file_open_read_stdio and nl_file_map (nanolm/base.h), in blocking mode. */
static nl_status file_open_read(const char *path, int *fd) {
    *fd = -1;
    /* O_NONBLOCK: open() of a FIFO with no writer would otherwise wait forever. The type is
     * checked on the descriptor itself (fstat), so nothing can swap the file in between. */
    int d = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (d < 0) return nl_fail(NL_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(d, &st) != 0) {
        int e = errno;
        close(d);
        return nl_fail(NL_ERR_IO, "cannot stat %s: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(d);
        const char *kind = file_kind(st.st_mode);
        if (!strcmp(kind, "not a regular file")) return nl_fail(NL_ERR_IO, "%s is not a regular file", path);
        return nl_fail(NL_ERR_IO, "%s is %s, not a regular file", path, kind);
    }
    int flags = fcntl(d, F_GETFL);
    if (flags < 0 || fcntl(d, F_SETFL, flags & ~O_NONBLOCK) < 0) {
        int e = errno;
        close(d);
        return nl_fail(NL_ERR_IO, "cannot read %s: %s", path, strerror(e));
    }
    *fd = d;
    return NL_OK;
}

nl_status nl_file_map(const char *path, const void **bytes, size_t *n, int *mapped) {
    *bytes = NULL;
    *n = 0;
    *mapped = 0;
    int fd;
    NL_TRY(file_open_read(path, &fd));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return nl_fail(NL_ERR_IO, "cannot stat %s: %s", path, strerror(e));
    }
    const size_t size = (size_t)st.st_size;
    void *p = size ? mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0) : MAP_FAILED;
    if (p == MAP_FAILED) { /* empty file or no mmap here: read it */
        nl_status mem = nl_mem_require((uint64_t)size + 1, path);
        p = mem ? NULL : nl_malloc(size ? size : 1, path);
        if (!p) {
            close(fd);
            return mem ? mem : NL_ERR_NOMEM;
        }
        for (size_t got = 0; got < size;) {
            ssize_t r = read(fd, (char *)p + got, size - got);
            if (r <= 0) {
                nl_free(p);
                close(fd);
                return nl_fail(NL_ERR_IO, "reading %s failed: %s", path, r < 0 ? strerror(errno) : "short read");
            }
            got += (size_t)r;
        }
    } else
        *mapped = 1;
    close(fd);
    *bytes = p;
    *n = size;
    return NL_OK;
}

void nl_file_unmap(const void *bytes, size_t n, int mapped) {
    if (!bytes) return;
    if (mapped)
        munmap((void *)bytes, n);
    else
        nl_free((void *)bytes);
}

nl_status nl_file_open_read_stdio(const char *path, FILE **f) {
    *f = NULL;
    int fd;
    NL_TRY(file_open_read(path, &fd));
    *f = fdopen(fd, "rb");
    if (!*f) {
        int e = errno;
        close(fd);
        return nl_fail(NL_ERR_IO, "cannot read %s: %s", path, strerror(e));
    }
    return NL_OK;
}

nl_status nl_read_file(const char *path, char **data, size_t *bytes) {
    *data = NULL;
    *bytes = 0;
    FILE *f;
    NL_TRY(nl_file_open_read_stdio(path, &f));
    struct stat st;
    if (fstat(fileno(f), &st) != 0) {
        fclose(f);
        return nl_fail(NL_ERR_IO, "cannot stat %s: %s", path, strerror(errno));
    }
    size_t n = (size_t)st.st_size;
    nl_status mem = nl_mem_require((uint64_t)n + 1, path);
    if (mem) {
        fclose(f);
        return mem;
    }
    char *buf = nl_malloc(n + 1, path);
    if (!buf) {
        fclose(f);
        return NL_ERR_NOMEM;
    }
    if (n && fread(buf, 1, n, f) != n) {
        nl_free(buf);
        fclose(f);
        return nl_fail(NL_ERR_IO, "reading %s failed (short read)", path);
    }
    fclose(f);
    buf[n] = '\0';
    *data = buf;
    *bytes = n;
    return NL_OK;
}

/* ---- threads ---- */

extern void openblas_set_num_threads(int);
extern char *openblas_get_corename(void);

const char *nl_blas_core(void) { return openblas_get_corename(); }

void nl_reexec_self(char **argv) {
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0 || n >= (ssize_t)sizeof self - 1) return;
    self[n] = '\0';
    execv(self, argv); /* the binary's own path (not /proc/self/exe): ps and top show its name */
}

/* Measured on that CPU, one thread, a 1024 x 1024 x 1024 sgemm, best of 5: 18.8-23.6 GFLOP/s on
 * the Prescott kernels, 121-134 on Cooperlake's or SkylakeX's (the same sgemm kernel). */
void nl_runtime_reexec(char **argv) {
#ifdef __SANITIZE_ADDRESS__
    /* a sanitized build checks memory, not speed, and keeps what OpenBLAS chose (LeakSanitizer's
     * tracer crash at the exit of `nanolm collectives demo` came back without the re-execution:
     * Open MPI's threads, see test_cli_walk) */
    (void)argv;
    return;
#endif
#if !defined(__x86_64__) && !defined(__i386__)
    (void)argv; /* the Prescott fallback is an x86 matter */
    return;
#else
    if (getenv("NANOLM_NO_REEXEC") || getenv("OPENBLAS_CORETYPE")) return;
    const char *core = openblas_get_corename();
    if (!core || strcmp(core, "Prescott") != 0) return;
    __builtin_cpu_init();
    const char *want = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")
                           ? "SkylakeX"
                       : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? "Haswell"
                                                                                         : NULL;
    if (!want || setenv("OPENBLAS_CORETYPE", want, 1) != 0) return;
    nl_reexec_self(argv);
    unsetenv("OPENBLAS_CORETYPE"); /* not executed: carry on as loaded */
#endif
}

int nl_threads(void) { return omp_get_max_threads(); }

void nl_set_threads(int n) {
    if (n < 1) n = 1;
    int cap = nl_blas_guard_threads(); /* under an address-space limit: see nl_blas_guard */
    if (cap > 0 && n > cap) n = cap;
    omp_set_num_threads(n);
    openblas_set_num_threads(cap > 0 ? 1 : n);
}

int nl_send_all(int fd, const void *p, size_t n) {
    const char *c = p;
    while (n > 0) {
        ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        c += w;
        n -= (size_t)w;
    }
    return 0;
}
