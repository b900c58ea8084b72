/*
 * Resource checks made before large allocations, so that a file that declares more data than
 * this machine can hold is refused with a message instead of the process being OOM-killed
 * halfway through reading it.
 */
#ifndef NANOLM_RESOURCES_H
#define NANOLM_RESOURCES_H

#include <stdint.h>

#include "nanolm/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of memory this process can still obtain: the smallest of MemAvailable + SwapFree
 * (/proc/meminfo), the cgroup v2 limit minus current usage (memory.max - memory.current) and
 * RLIMIT_AS / RLIMIT_DATA. UINT64_MAX when none of these can be read. */
uint64_t nl_mem_available(void);

/* NL_OK when `bytes` fit in nl_mem_available(); otherwise NL_ERR_NOMEM with the message
 * "WHAT: N.N GiB required, only M.M GiB of memory is available". */
nl_status nl_mem_require(uint64_t bytes, const char *what);

/* Makes OpenBLAS safe under an address-space limit (ulimit -v: RLIMIT_AS, or RLIMIT_DATA).
 * OpenBLAS 0.3 takes a 128 MiB GEMM buffer per calling thread with mmap and, when that fails,
 * retries forever at 100% CPU. Without a limit this returns NL_OK at once (*threads = 0).
 * Under one it sets OpenBLAS to one thread (its own pool would need a buffer per thread),
 * lowers the OpenMP thread count to what the limit leaves room for (each thread: a buffer and a
 * stack), has OpenBLAS allocate those buffers now, while the room is known to be there (later
 * GEMMs reuse them), and sets *threads to the count kept. When not even one buffer fits it
 * returns NL_ERR_NOMEM naming the limit and the size it needs. Call it before the first BLAS
 * call, with OpenBLAS started single-threaded (OPENBLAS_NUM_THREADS=1 in the environment when
 * the process starts: the CLI does this itself); calling it again returns the first result. */
nl_status nl_blas_guard(int *threads);
/* Threads nl_blas_guard kept under a limit, or 0 when it found none (or was not called). */
int nl_blas_guard_threads(void);

#ifdef __cplusplus
}
#endif
#endif
