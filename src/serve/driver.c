/* The one driver loop of the serving engine, on the caller's thread or a thread of its own. See
 * include/nanolm/driver.h. */
#include "nanolm/driver.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

nl_status nl_driver_run(nl_engine *e, const nl_drive_opts *o) {
    const int idle_ms = o->idle_ms > 0 ? o->idle_ms : 100;
    while (!(o->stop && atomic_load(o->stop))) {
        int stepped = 0;
        if (nl_engine_wait_work(e, idle_ms)) {
            nl_status rc = nl_engine_step(e, NULL);
            if (rc && o->stop_on_error) return rc;
            if (rc) {
                if (o->name) fprintf(stderr, "nanolm: %s: engine step failed: %s\n", o->name, nl_last_error());
                struct timespec ts = {0, 10 * 1000 * 1000};
                nanosleep(&ts, NULL);
            }
            stepped = !rc;
        }
        if (o->after && o->after(o->user, stepped)) break;
    }
    return NL_OK;
}

struct nl_driver {
    nl_engine *e;
    nl_drive_opts o;
    atomic_int stop;
    pthread_t thread;
};

static void *driver_main(void *arg) {
    nl_driver *d = arg;
    nl_driver_run(d->e, &d->o);
    return NULL;
}

nl_status nl_driver_start(nl_driver **out, nl_engine *e, const nl_drive_opts *o) {
    *out = NULL;
    nl_driver *d = calloc(1, sizeof *d);
    if (!d) return nl_fail(NL_ERR_NOMEM, "driver: out of memory");
    d->e = e;
    d->o = *o;
    d->o.stop_on_error = 0; /* a thread that ended on an error would leave its requests stranded */
    atomic_init(&d->stop, 0);
    d->o.stop = &d->stop;
    if (pthread_create(&d->thread, NULL, driver_main, d)) {
        free(d);
        return nl_fail(NL_ERR_NOMEM, "driver: cannot start the engine thread");
    }
    *out = d;
    return NL_OK;
}

void nl_driver_stop(nl_driver *d) {
    if (!d) return;
    atomic_store(&d->stop, 1);
    pthread_join(d->thread, NULL);
    free(d);
}
