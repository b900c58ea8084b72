/*
 * nanolm driver: the one loop that drives the serving engine. Every user of the engine runs
 * its steps through it: the HTTP server (colocated and decode role) and the prefill role's KV
 * transfer server on a thread of their own (nl_driver_start), `nanolm generate` on its own thread
 * (nl_driver_run), stopped by a hook that reads its request after each step.
 *
 * One pass of the loop: wait for work (at most idle_ms), run one nl_engine_step if there is any,
 * then call the hook. A failed step (out of memory: its requests stay queued) either ends the loop
 * with its status (stop_on_error, generate) or is reported on stderr under `name` and retried
 * 10 ms later (the servers, which must outlive a transient failure).
 */
#ifndef NANOLM_DRIVER_H
#define NANOLM_DRIVER_H

#include <stdatomic.h>

#include "nanolm/base.h"
#include "nanolm/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nl_drive_opts {
    int idle_ms;       /* while idle, wait for work at most this long between hook calls (<= 0: 100) */
    int stop_on_error; /* 1: a failed step ends the loop with its status; 0: retried after 10 ms */
    const char *name;  /* with stop_on_error 0: "nanolm: NAME: engine step failed: ..." on stderr (NULL: silent) */
    /* After every pass, on the driving thread (stepped: the pass ran a step). Nonzero ends the
     * loop. May be NULL. Runs without the engine's mutex; must not call nl_engine_step. */
    int (*after)(void *user, int stepped);
    void *user;
    const atomic_int *stop; /* nonzero ends the loop at the next pass (may be NULL) */
} nl_drive_opts;

/* Runs the loop on the calling thread until the hook or *stop ends it (NL_OK), or, with
 * stop_on_error, a step fails (its status). */
nl_status nl_driver_run(nl_engine *e, const nl_drive_opts *o);

/* The loop on a thread of its own, until nl_driver_stop (o->stop is ignored). The engine must
 * outlive the driver. NL_ERR_NOMEM when the thread cannot start. */
typedef struct nl_driver nl_driver;
nl_status nl_driver_start(nl_driver **d, nl_engine *e, const nl_drive_opts *o);
/* Ends the loop after its current pass, joins the thread and frees the driver. Safe on NULL. */
void nl_driver_stop(nl_driver *d);

#ifdef __cplusplus
}
#endif
#endif
