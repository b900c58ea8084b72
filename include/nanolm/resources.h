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

#ifdef __cplusplus
}
#endif
#endif
