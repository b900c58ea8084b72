/*
 * nanolm base: status codes and the last error, checked allocation, a seedable RNG,
 * a monotonic timer, a progress line, and atomic file writes.
 *
 * Every library function that can fail returns nl_status (0 = NL_OK) and leaves a
 * human-readable message in a thread-local buffer, read with nl_last_error().
 * The library never calls exit() or abort().
 */
#ifndef NANOLM_BASE_H
#define NANOLM_BASE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum nl_status {
    NL_OK = 0,
    NL_ERR_INVALID = 1,         /* bad argument or bad input value (NaN, unknown name, bad shape) */
    NL_ERR_NOMEM = 2,           /* allocation failed or request too large */
    NL_ERR_IO = 3,              /* open/read/write/fsync/rename failed */
    NL_ERR_FORMAT = 4,          /* a file is malformed (truncated, bad header, wrong dtype) */
    NL_ERR_RANGE = 5,           /* a value is outside what the target can represent */
    NL_ERR_UNSUPPORTED = 6,     /* valid request this build or format cannot do */
    NL_ERR_NUMERIC = 7,         /* a computation produced NaN/inf where it must not */
    NL_ERR_COMM = 8,            /* a collective or peer failed */
    NL_ERR_NOT_IMPLEMENTED = 9, /* used only by the course skeletons in exercises/ */
    NL_ERR_BUSY = 10,           /* a bounded queue is full: try again later (HTTP 429) */
    NL_DONE = 11                /* nothing left to do: a resumed run's checkpoint already holds its last step */
} nl_status;

/* Sets the thread's last error message (printf-style) and returns `code`, so that
 * `return nl_fail(NL_ERR_INVALID, "bits must be 2..8, got %d", bits);` reads well. */
nl_status nl_fail(nl_status code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The message of the last failure on this thread ("" if none). */
const char *nl_last_error(void);
/* Clears the last error. */
void nl_clear_error(void);
/* Short name of a status code ("invalid argument", ...). */
const char *nl_status_name(nl_status s);

#define NL_TRY(expr)                                                                                                   \
    do {                                                                                                               \
        nl_status nl__rc = (expr);                                                                                     \
        if (nl__rc != NL_OK) return nl__rc;                                                                            \
    } while (0)

/* ---- allocation ---------------------------------------------------------------------------
 * Checked allocation: on failure (or a size overflow) returns NULL and sets the last error
 * naming `what` and the byte count. Memory is 64-byte aligned; free with nl_free. */
void *nl_malloc(size_t bytes, const char *what);
void *nl_calloc(size_t count, size_t size, const char *what);
/* nl_malloc for a large buffer read or written all over (a weight copy, the KV pool): from 4 MiB
 * on, 2 MiB aligned and marked for transparent huge pages, so that walking it misses the TLB
 * once per 2 MiB rather than once per 4 KiB (on this project's VM the KV cache's row stores ran
 * ~2x faster). Free with nl_free. */
void *nl_malloc_huge(size_t bytes, const char *what);
void nl_free(void *p);
/* Gives the whole pages inside [p, p + bytes) of an allocation back to the system (madvise
 * MADV_DONTNEED): for data that will not be read again (a model's fp32 matrices once an engine
 * holds its own copies). The allocation stays valid and is freed as usual; a later read of those
 * pages sees zeros. Bytes at either end that share a page with other data are kept. */
void nl_release_pages(void *p, size_t bytes);
/* count*size with overflow check; returns 0 on success. */
int nl_mul_overflows(size_t count, size_t size, size_t *out);

/* ---- random numbers -----------------------------------------------------------------------
 * xoshiro256** seeded through splitmix64: deterministic for a seed on every platform. */
typedef struct nl_rng {
    uint64_t s[4];
} nl_rng;
void nl_rng_seed(nl_rng *r, uint64_t seed);
uint64_t nl_rng_u64(nl_rng *r);
uint32_t nl_rng_u32(nl_rng *r);
/* Uniform in [0, 1) with 24 bits (float) or 53 bits (double). */
float nl_rng_float(nl_rng *r);
double nl_rng_double(nl_rng *r);
/* Uniform integer in [0, n). */
uint64_t nl_rng_below(nl_rng *r, uint64_t n);
/* Standard normal (Box-Muller, deterministic). */
double nl_rng_normal(nl_rng *r);

/* ---- sorting -------------------------------------------------------------------------------- */
/* Sorts v ascending (qsort; the one comparator of doubles). */
void nl_sort_doubles(double *v, size_t n);
/* The median of v's n values (the mean of the middle two when n is even), sorting v in place;
 * NaN when n is 0. */
double nl_median(double *v, size_t n);

/* ---- time ---------------------------------------------------------------------------------- */
/* Monotonic seconds since an arbitrary origin. */
double nl_time_s(void);

/* ---- progress ------------------------------------------------------------------------------
 * A one-line progress report on stderr, redrawn in place, shown only when stderr is a
 * terminal (or NANOLM_PROGRESS=1). Prints step/total, rate, ETA and a caller's text. */
typedef struct nl_progress {
    const char *label;
    int64_t total;
    double t0, last_draw;
    int enabled;
} nl_progress;
void nl_progress_begin(nl_progress *p, const char *label, int64_t total);
/* `extra` may be NULL; `units_per_step` feeds the rate (e.g. tokens per step). */
void nl_progress_update(nl_progress *p, int64_t done, double units_done, const char *unit, const char *extra);
void nl_progress_end(nl_progress *p);

/* ---- files ---------------------------------------------------------------------------------
 * Atomic write: data goes to "<path>.tmp.<pid>", is fsynced, then renamed over `path`, and the
 * directory is fsynced. On any failure the temp file is removed and `path` is untouched. */
typedef struct nl_atomic_file {
    FILE *f;
    char *path;
    char *tmp_path;
} nl_atomic_file;
nl_status nl_atomic_open(nl_atomic_file *af, const char *path);
/* Writes all bytes or fails (NL_ERR_IO, message names the file and errno). */
nl_status nl_atomic_write(nl_atomic_file *af, const void *data, size_t bytes);
nl_status nl_atomic_commit(nl_atomic_file *af);
void nl_atomic_abort(nl_atomic_file *af);
/* Opens `path` for reading without ever blocking in open(): a FIFO, a device, a socket or a
 * directory is refused (NL_ERR_IO, "PATH is a FIFO, not a regular file") before anything is
 * read. Every loader of a file named by the user opens it through here or nl_file_map. On
 * success *f is a FILE* opened "rb". */
nl_status nl_file_open_read_stdio(const char *path, FILE **f);
/* The whole file `path` (opened as nl_file_open_read_stdio opens one), read-only: memory-mapped
 * (*mapped 1), or, for an empty file or where mmap fails, read into memory (*mapped 0; the
 * address-space limit checked first). Release with nl_file_unmap. */
nl_status nl_file_map(const char *path, const void **bytes, size_t *n, int *mapped);
void nl_file_unmap(const void *bytes, size_t n, int mapped);
/* Async-signal-safe: removes the temporary file of an atomic write in progress in this process
 * (if any), for a signal handler that is about to end the process in the middle of a save. */
void nl_atomic_remove_pending(void);
/* Checks, before any work, that `path` can be written as an output: it is not a directory or a
 * special file (FIFO, device), and a file can be created in its directory (a probe file
 * "<path>.tmp.<pid>" is created and removed; an existing `path` is not touched). `what` names
 * the output in the message (e.g. "--out"). Errors: NL_ERR_IO naming the path and the reason. */
nl_status nl_check_writable(const char *path, const char *what);
/* Sends all n bytes of p on socket fd (send with MSG_NOSIGNAL, retried on EINTR): 0, or -1 when
 * the connection failed or closed (errno says why). */
int nl_send_all(int fd, const void *p, size_t n);
/* Advisory lock of an output that a long run rewrites (a training checkpoint): an flock on
 * "<path>.lock", which holds the owner's PID. A second run locking the same path gets NL_ERR_IO
 * naming `what`, the path and the first run's PID. *fd receives the lock's descriptor (-1 on
 * failure); nl_output_unlock removes the lock file and closes it (the kernel drops the lock of a
 * killed process; its stale file is taken over). */
nl_status nl_output_lock(const char *path, const char *what, int *fd);
void nl_output_unlock(const char *path, int fd);
/* Whole-file helpers. nl_read_file returns a NUL-terminated buffer (free with nl_free). */
nl_status nl_read_file(const char *path, char **data, size_t *bytes);
nl_status nl_write_file_atomic(const char *path, const void *data, size_t bytes);

/* ---- threads --------------------------------------------------------------------------------
 * Number of OpenMP threads nanolm uses (OMP_NUM_THREADS or cores); set both OpenMP and BLAS. */
int nl_threads(void);
void nl_set_threads(int n);

/* The name of the kernels OpenBLAS runs on this CPU ("SkylakeX", "Haswell", ...). */
const char *nl_blas_core(void);
/* Settings that the libraries read from the environment as they load, before main, where their
 * defaults are slow here: when one applies and is unset, this sets it and executes the program
 * again with argv (nl_reexec_self); otherwise, or if that fails, it returns. Call it first thing
 * in main, before any thread or MPI starts. NANOLM_NO_REEXEC=1 turns it off (a run under
 * valgrind, which exec would leave behind); an AddressSanitizer build never does it. Today one setting: OpenBLAS 0.3.21 (Debian 12) does
 * not know CPUs newer than it (Emerald Rapids, family 6 model 207, among them) and runs its
 * Prescott (SSE3) kernels, about 5x slower than its AVX-512 ones; where it chose Prescott on a CPU
 * with AVX-512 (or AVX2 and FMA), OPENBLAS_CORETYPE=SkylakeX (Haswell). */
void nl_runtime_reexec(char **argv);
/* Executes this program's own binary (the path /proc/self/exe links to, so that ps shows its
 * name) with argv and the current environment; returns only if that fails. */
void nl_reexec_self(char **argv);

#ifdef __cplusplus
}
#endif
#endif
