/* The one driver loop (nanolm/driver.h): on the caller's thread with a hook that ends it, the same
 * tokens as stepping the engine by hand (greedy and seeded); on a thread of its own, requests
 * submitted from other threads finish with those tokens and the driver stops whether busy or idle;
 * the stop flag and the hook's return end nl_driver_run. */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

#include "nanolm/driver.h"
#include "nanolm/engine.h"
#include "nanolm/model.h"

enum { N_REQ = 6, PROMPT = 11, GEN = 24 };

static void make_model(nl_model *m) {
    nl_arch a = tu_arch("driver-test", 256, 64, 2, 4, 2, 96, 128);
    tu_model(m, &a, 7);
}

static nl_engine *open_engine(const nl_model *m) {
    nl_engine_opts o;
    nl_engine_opts_default(&o);
    o.threads = 2;
    o.chunk = 8; /* several steps per prompt */
    nl_engine *e = NULL;
    assert_int_equal(nl_engine_open_model(&e, m, NULL, &o), NL_OK);
    return e;
}

/* Request i: greedy for even i, seeded sampling for odd i. */
static void submit(nl_engine *e, int i, uint64_t *id) {
    int32_t p[PROMPT];
    for (int j = 0; j < PROMPT; j++) p[j] = (int32_t)((31 * i + 7 * j + 3) % 256);
    nl_sampling s;
    nl_sampling_default(&s);
    s.temperature = i % 2 ? 0.8f : 0.0f;
    s.seed = 100 + (uint64_t)i;
    s.max_tokens = GEN;
    s.ignore_eos = 1;
    assert_int_equal(nl_engine_submit(e, p, PROMPT, &s, id), NL_OK);
}

static void read_tokens(nl_engine *e, uint64_t id, int32_t *out) {
    nl_engine_output o;
    assert_int_equal(nl_engine_read(e, id, 1, &o), NL_OK);
    assert_int_equal(o.finish, NL_FINISH_LENGTH);
    assert_int_equal(o.n_tokens, GEN);
    memcpy(out, o.tokens, GEN * sizeof *out);
    nl_engine_output_free(&o);
    nl_engine_release(e, id);
}

/* The reference: every request submitted, then nl_engine_step by hand until idle. */
static void by_hand(const nl_model *m, int32_t want[N_REQ][GEN]) {
    nl_engine *e = open_engine(m);
    uint64_t id[N_REQ];
    for (int i = 0; i < N_REQ; i++) submit(e, i, &id[i]);
    while (nl_engine_busy(e)) assert_int_equal(nl_engine_step(e, NULL), NL_OK);
    for (int i = 0; i < N_REQ; i++) read_tokens(e, id[i], want[i]);
    nl_engine_close(e);
}

/* Each test: the model, the reference tokens, and a fresh engine. */
typedef struct fixture {
    nl_model m;
    int32_t want[N_REQ][GEN];
    nl_engine *e;
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    make_model(&f->m);
    by_hand(&f->m, f->want);
    f->e = open_engine(&f->m);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    nl_engine_close(f->e);
    nl_model_free(&f->m);
    free(f);
    return 0;
}

/* Reads every request and compares its tokens with the reference. */
static void check_all(fixture *f, const uint64_t *id) {
    int32_t got[GEN];
    for (int i = 0; i < N_REQ; i++) {
        read_tokens(f->e, id[i], got);
        assert_memory_equal(got, f->want[i], sizeof got);
    }
}

typedef struct hook_state {
    nl_engine *e;
    int steps, idle_passes;
} hook_state;

/* Ends the loop when the engine has nothing left to do. */
static int until_idle(void *user, int stepped) {
    hook_state *h = user;
    if (stepped)
        h->steps++;
    else
        h->idle_passes++;
    return !nl_engine_busy(h->e);
}

static void test_run_on_caller_thread(void **state) {
    fixture *f = *state;
    nl_engine *e = f->e;
    uint64_t id[N_REQ];
    for (int i = 0; i < N_REQ; i++) submit(e, i, &id[i]);
    hook_state h = {e, 0, 0};
    nl_drive_opts o = {.stop_on_error = 1, .after = until_idle, .user = &h};
    assert_int_equal(nl_driver_run(e, &o), NL_OK);
    nl_engine_stats st;
    nl_engine_stats_get(e, &st);
    assert_int_equal(h.steps, st.steps); /* the hook saw every step, and no pass idled */
    assert_int_equal(h.idle_passes, 0);
    check_all(f, id);
}

static void test_stop_flag_ends_run(void **state) {
    fixture *f = *state;
    nl_engine *e = f->e;
    atomic_int stop;
    atomic_init(&stop, 1);
    nl_drive_opts o = {.idle_ms = 1, .stop = &stop};
    assert_int_equal(nl_driver_run(e, &o), NL_OK); /* returns at once, nothing run */
    atomic_store(&stop, 0);
    hook_state h = {e, 0, 0};
    o.after = until_idle; /* idle: one pass that waits 1 ms, then the hook ends it */
    o.user = &h;
    assert_int_equal(nl_driver_run(e, &o), NL_OK);
    assert_int_equal(h.steps, 0);
    assert_int_equal(h.idle_passes, 1);
}

static void test_thread_serves_requests(void **state) {
    fixture *f = *state;
    nl_engine *e = f->e;
    int32_t got[GEN];
    nl_driver *d = NULL;
    nl_drive_opts o = {.idle_ms = 5};
    assert_int_equal(nl_driver_start(&d, e, &o), NL_OK);
    uint64_t id[N_REQ];
    for (int i = 0; i < N_REQ; i++) {
        submit(e, i, &id[i]);
        for (;;) { /* the request finishes: the driver steps without being asked */
            nl_engine_output o2;
            assert_int_equal(nl_engine_wait(e, id[i], 1000) >= 0, 1);
            assert_int_equal(nl_engine_read(e, id[i], 1, &o2), NL_OK);
            nl_finish f = o2.finish;
            nl_engine_output_free(&o2);
            if (f != NL_FINISH_NONE) break;
        }
        read_tokens(e, id[i], got);
        /* alone in the engine, each request has the tokens it had among the others (batch
         * invariance, and each request's generator is its own) */
        assert_memory_equal(got, f->want[i], sizeof got);
    }
    nl_driver_stop(d); /* idle */
    assert_int_equal(nl_driver_start(&d, e, &o), NL_OK);
    for (int i = 0; i < N_REQ; i++) submit(e, i, &id[i]);
    nl_driver_stop(d); /* busy: stops after its pass; what is left stays queued */
    while (nl_engine_busy(e)) assert_int_equal(nl_engine_step(e, NULL), NL_OK);
    check_all(f, id);
    nl_driver_stop(NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_run_on_caller_thread, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stop_flag_ends_run, setup, teardown),
        cmocka_unit_test_setup_teardown(test_thread_serves_requests, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
