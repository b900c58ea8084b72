/* nanolm prefill_child: the prefill process of `serve --role disagg`, run as a child of the
 * decode process (the same command again, as `--role prefill` on an ephemeral loopback port). */
#ifndef NANOLM_PREFILL_CHILD_H
#define NANOLM_PREFILL_CHILD_H

#include <stddef.h>
#include <sys/types.h>

#include "nanolm/base.h"

/* Runs this program again with "nanolm", argv[0..argc) and `--role prefill --host 127.0.0.1
 * --port 0 --port-file F` in a child process that dies with this one, and waits (up to 120 s)
 * until it listens. Fills *pid and addr ("127.0.0.1:PORT"); on failure *pid is -1 or the
 * child that is already reaped, and the error says why. */
nl_status nl_prefill_child_start(int argc, char **argv, pid_t *pid, char *addr, size_t addr_len);

/* Stops the child (SIGTERM, then SIGKILL after 60 s); returns its exit status (128 + signal
 * when a signal ended it). */
int nl_prefill_child_stop(pid_t pid);

#endif
