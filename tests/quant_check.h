/* Shared by the quantization tests: a failed call fails the test with the library's own
 * message (with the course skeleton that message says which function to write). */
#ifndef NANOLM_QUANT_CHECK_H
#define NANOLM_QUANT_CHECK_H

#include "nanolm/base.h"

#define QOK(expr)                                                                                                      \
    do {                                                                                                               \
        nl_status qok_rc_ = (expr);                                                                                    \
        if (qok_rc_ != NL_OK) fail_msg("%s -> %s: %s", #expr, nl_status_name(qok_rc_), nl_last_error());               \
    } while (0)

#endif
