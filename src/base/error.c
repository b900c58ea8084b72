/* Status codes and the thread's last error message. */
#include "nanolm/base.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char nl_errbuf[1024];

nl_status nl_fail(nl_status code, const char *fmt, ...) {
    /* Format into a scratch buffer first: the arguments may include nl_last_error() itself
     * (wrapping an inner error with context), which must not be overwritten while read. */
    char tmp[sizeof nl_errbuf];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    memcpy(nl_errbuf, tmp, sizeof nl_errbuf);
    return code;
}

const char *nl_last_error(void) { return nl_errbuf; }

void nl_clear_error(void) { nl_errbuf[0] = '\0'; }

const char *nl_status_name(nl_status s) {
    switch (s) {
    case NL_OK: return "ok";
    case NL_ERR_INVALID: return "invalid argument";
    case NL_ERR_NOMEM: return "out of memory";
    case NL_ERR_IO: return "I/O error";
    case NL_ERR_FORMAT: return "malformed file";
    case NL_ERR_RANGE: return "out of range";
    case NL_ERR_UNSUPPORTED: return "unsupported";
    case NL_ERR_NUMERIC: return "numeric error";
    case NL_ERR_COMM: return "communication error";
    case NL_ERR_NOT_IMPLEMENTED: return "not implemented (exercise)";
    case NL_ERR_BUSY: return "busy";
    case NL_DONE: return "done";
    }
    return "unknown status";
}
