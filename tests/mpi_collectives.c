/* Collectives under mpirun (2, 3 and 4 ranks): every collective, ours and native, fp32 and
 * bf16, sizes that do and do not divide by the rank count, against a serial reference computed
 * on every rank from the data all ranks would hold; and the byte counters against the formulas.
 * Every check is agreed on by all ranks before it is asserted, so a failure on one rank fails the
 * test on all of them instead of leaving the others waiting in a collective. */
#include <math.h>
#include <string.h>

#include "nanolm/comm.h"
#include "nanolm/formats.h"
#include "testutil.h"

static nl_comm *W;
static int P, R;

/* min over ranks of ok: every rank sees the same verdict. */
static int agree(int ok) {
    double v = ok ? 0.0 : 1.0;
    if (nl_comm_max_double(W, &v)) return 0;
    return v == 0.0;
}
#define CHECK_ALL(ok) assert_true(agree(ok))

/* ---- data and reference ------------------------------------------------------------------- */

static uint16_t to_bf16(float f) { /* test's own rounding, round to nearest even */
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Element i of rank r's array in test pattern `seed`. Integers in [-8, 8], so that every sum
 * over <= 4 ranks is exact in fp32 and in bf16 and the result does not depend on the order. */
static float val(int seed, int r, size_t i) { return (float)((int)((r * 7 + (long)i * 3 + seed * 5) % 17) - 8); }

static void fill(void *buf, nl_comm_dtype dt, int seed, int r, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (dt == NL_COMM_F32)
            ((float *)buf)[i] = val(seed, r, i);
        else
            ((uint16_t *)buf)[i] = to_bf16(val(seed, r, i));
    }
}
static float get(const void *buf, nl_comm_dtype dt, size_t i) {
    return dt == NL_COMM_F32 ? ((const float *)buf)[i] : from_bf16(((const uint16_t *)buf)[i]);
}
static float sum_ref(int seed, size_t i) {
    float s = 0;
    for (int r = 0; r < P; r++) s += val(seed, r, i);
    return s;
}

/* Test's own partition: the first n % p chunks get one extra element. */
static size_t cnt(size_t n, int i) { return n / (size_t)P + ((size_t)i < n % (size_t)P); }
static size_t off(size_t n, int i) {
    size_t o = 0;
    for (int j = 0; j < i; j++) o += cnt(n, j);
    return o;
}

static const size_t sizes[] = {1, 2, 3, 7, 12, 1000, 1001, 65537, 200003};
#define NSIZES (sizeof sizes / sizeof sizes[0])
static const nl_comm_impl impls[] = {NL_COMM_OURS, NL_COMM_NATIVE};
static const nl_comm_dtype dts[] = {NL_COMM_F32, NL_COMM_BF16};

/* Sent/received bytes of collective k since `before`. */
static void delta(nl_comm_op k, const nl_comm_stats *before, uint64_t *sent, uint64_t *recvd) {
    nl_comm_stats now;
    nl_comm_get_stats(W, &now);
    *sent = now.coll[k].sent_bytes - before->coll[k].sent_bytes;
    *recvd = now.coll[k].recv_bytes - before->coll[k].recv_bytes;
}

/* ---- tests -------------------------------------------------------------------------------- */

static void test_all_reduce(void **state) {
    (void)state;
    for (int ii = 0; ii < 2; ii++)
        for (int di = 0; di < 2; di++)
            for (size_t si = 0; si < NSIZES; si++) {
                size_t n = sizes[si], es = nl_comm_dtype_bytes(dts[di]);
                void *buf = nl_malloc(n * es, "buf");
                fill(buf, dts[di], 1, R, n);
                nl_comm_stats before;
                nl_comm_get_stats(W, &before);
                int ok = nl_comm_all_reduce(W, buf, n, dts[di], impls[ii]) == NL_OK;
                for (size_t i = 0; ok && i < n; i++) ok = get(buf, dts[di], i) == sum_ref(1, i);
                uint64_t s, v;
                delta(NL_COMM_OP_ALL_REDUCE, &before, &s, &v);
                /* ring: reduce-scatter sends every chunk but its own, all-gather every chunk but
                 * the next rank's: 2(p-1)/p of the array when p divides n. */
                uint64_t want_s = (2 * n - cnt(n, R) - cnt(n, (R + 1) % P)) * es;
                uint64_t want_v = (2 * n - cnt(n, (R + P - 1) % P) - cnt(n, R)) * es;
                if (ok && (s != want_s || v != want_v)) {
                    print_message("rank %d all-reduce %s %s n=%zu: bytes sent %llu recv %llu, want %llu %llu\n", R,
                                  nl_comm_impl_name(impls[ii]), nl_comm_dtype_name(dts[di]), n, (unsigned long long)s,
                                  (unsigned long long)v, (unsigned long long)want_s, (unsigned long long)want_v);
                    ok = 0;
                }
                if (n % (size_t)P == 0) ok = ok && s == 2 * (uint64_t)(P - 1) * (n / (size_t)P) * es;
                if (!ok)
                    print_message("rank %d: all-reduce %s %s n=%zu failed\n", R, nl_comm_impl_name(impls[ii]),
                                  nl_comm_dtype_name(dts[di]), n);
                nl_free(buf);
                CHECK_ALL(ok);
            }
}

/* A NaN in a bf16 sum comes out as formats.h encodes NaN (sign | 0x7FC0), whatever payload it
 * carried in: the collectives round through nl_bf16_from_f32, the one bf16 rounding. */
static void test_bf16_nan(void **state) {
    (void)state;
    for (int ii = 0; ii < 2; ii++) {
        uint16_t buf[2 * 4];
        for (int i = 0; i < 8; i++) buf[i] = to_bf16(1.0f);
        if (R == 0) buf[0] = 0xFF81; /* -NaN with a payload */
        int ok = nl_comm_all_reduce(W, buf, 8, NL_COMM_BF16, impls[ii]) == NL_OK;
        ok = ok && buf[0] == nl_bf16_from_f32(from_bf16(0xFF81)) && buf[0] == 0xFFC0;
        for (int i = 1; ok && i < 8; i++) ok = from_bf16(buf[i]) == (float)P;
        if (!ok)
            print_message("rank %d: bf16 NaN all-reduce (%s) gave 0x%04X\n", R, nl_comm_impl_name(impls[ii]), buf[0]);
        CHECK_ALL(ok);
    }
}

static void test_reduce_scatter_all_gather(void **state) {
    (void)state;
    for (int ii = 0; ii < 2; ii++)
        for (int di = 0; di < 2; di++)
            for (size_t si = 0; si < NSIZES; si++)
                for (int inplace = 0; inplace < 2; inplace++) {
                    nl_comm_dtype dt = dts[di];
                    size_t n = sizes[si], es = nl_comm_dtype_bytes(dt), c = cnt(n, R), o = off(n, R);
                    char *send = nl_malloc(n * es + 64, "send");
                    char *full = nl_malloc(n * es + 64, "full");
                    fill(send, dt, 2, R, n);
                    char *mine = inplace ? send + o * es : nl_malloc(c * es + 64, "chunk");
                    nl_comm_stats before;
                    nl_comm_get_stats(W, &before);
                    int ok = nl_comm_reduce_scatter(W, send, mine, n, dt, impls[ii]) == NL_OK;
                    for (size_t i = 0; ok && i < c; i++) ok = get(mine, dt, i) == sum_ref(2, o + i);
                    uint64_t s, v;
                    delta(NL_COMM_OP_REDUCE_SCATTER, &before, &s, &v);
                    ok = ok && s == (n - c) * es && v == (n - cnt(n, (R + P - 1) % P)) * es;
                    if (n % (size_t)P == 0) ok = ok && s == (uint64_t)(P - 1) * (n / (size_t)P) * es;
                    if (!ok)
                        print_message("rank %d: reduce-scatter %s %s n=%zu inplace=%d failed (sent %llu)\n", R,
                                      nl_comm_impl_name(impls[ii]), nl_comm_dtype_name(dt), n, inplace,
                                      (unsigned long long)s);
                    CHECK_ALL(ok);
                    /* all-gather the reduced chunks back into a full array */
                    nl_comm_get_stats(W, &before);
                    if (inplace) {
                        memcpy(full + o * es, mine, c * es);
                        ok = nl_comm_all_gather(W, full + o * es, full, n, dt, impls[ii]) == NL_OK;
                    } else {
                        ok = nl_comm_all_gather(W, mine, full, n, dt, impls[ii]) == NL_OK;
                    }
                    for (size_t i = 0; ok && i < n; i++) ok = get(full, dt, i) == sum_ref(2, i);
                    delta(NL_COMM_OP_ALL_GATHER, &before, &s, &v);
                    ok = ok && s == (n - cnt(n, (R + 1) % P)) * es && v == (n - c) * es;
                    if (!ok)
                        print_message("rank %d: all-gather %s %s n=%zu inplace=%d failed\n", R,
                                      nl_comm_impl_name(impls[ii]), nl_comm_dtype_name(dt), n, inplace);
                    if (!inplace) nl_free(mine);
                    nl_free(send);
                    nl_free(full);
                    CHECK_ALL(ok);
                }
}

static void test_broadcast_reduce(void **state) {
    (void)state;
    for (int ii = 0; ii < 2; ii++)
        for (int di = 0; di < 2; di++)
            for (size_t si = 0; si < NSIZES; si++)
                for (int root = 0; root < P; root++) {
                    nl_comm_dtype dt = dts[di];
                    size_t n = sizes[si], es = nl_comm_dtype_bytes(dt);
                    char *buf = nl_malloc(n * es + 64, "buf"), *want = nl_malloc(n * es + 64, "want");
                    fill(buf, dt, 3, R, n);
                    fill(want, dt, 3, root, n);
                    int pos = (R - root + P) % P;
                    nl_comm_stats before;
                    nl_comm_get_stats(W, &before);
                    int ok = nl_comm_broadcast(W, buf, n, dt, root, impls[ii]) == NL_OK;
                    ok = ok && memcmp(buf, want, n * es) == 0;
                    uint64_t s, v;
                    delta(NL_COMM_OP_BROADCAST, &before, &s, &v);
                    /* chain: everyone but the last sends n, everyone but the root receives n */
                    ok = ok && s == (pos < P - 1 ? n * es : 0) && v == (pos > 0 ? n * es : 0);
                    if (!ok)
                        print_message("rank %d: broadcast %s %s n=%zu root=%d failed\n", R,
                                      nl_comm_impl_name(impls[ii]), nl_comm_dtype_name(dt), n, root);
                    CHECK_ALL(ok);
                    /* reduce, out of place and (at the root) in place */
                    for (int inplace = 0; inplace < 2; inplace++) {
                        fill(buf, dt, 4, R, n);
                        memset(want, 0x7f, n * es);
                        nl_comm_get_stats(W, &before);
                        char *out = (inplace && R == root) ? buf : want;
                        ok = nl_comm_reduce(W, buf, out, n, dt, root, impls[ii]) == NL_OK;
                        if (R == root)
                            for (size_t i = 0; ok && i < n; i++) ok = get(out, dt, i) == sum_ref(4, i);
                        for (size_t i = 0; ok && R != root && i < n; i++) ok = get(buf, dt, i) == val(4, R, i);
                        delta(NL_COMM_OP_REDUCE, &before, &s, &v);
                        ok = ok && s == (pos > 0 ? n * es : 0) && v == (pos < P - 1 ? n * es : 0);
                        if (!ok)
                            print_message("rank %d: reduce %s %s n=%zu root=%d inplace=%d failed\n", R,
                                          nl_comm_impl_name(impls[ii]), nl_comm_dtype_name(dt), n, root, inplace);
                        CHECK_ALL(ok);
                    }
                    nl_free(buf);
                    nl_free(want);
                }
}

/* Element i of the block rank `from` sends to rank `to`. */
static float a2a_val(int from, int to, size_t i) { return (float)((from * 31 + to * 7 + (int)(i % 13)) % 50); }

static void test_all_to_all(void **state) {
    (void)state;
    for (int ii = 0; ii < 2; ii++)
        for (int di = 0; di < 2; di++)
            for (size_t k = 0; k < 4; k++) {
                nl_comm_dtype dt = dts[di];
                size_t es = nl_comm_dtype_bytes(dt);
                /* regular: k * 333 + 1 elements per pair */
                size_t m = k * 333 + 1;
                char *send = nl_malloc(P * m * es + 64, "send"), *recv = nl_malloc(P * m * es + 64, "recv");
                for (int to = 0; to < P; to++)
                    for (size_t i = 0; i < m; i++) {
                        float f = a2a_val(R, to, i);
                        if (dt == NL_COMM_F32)
                            ((float *)send)[to * m + i] = f;
                        else
                            ((uint16_t *)send)[to * m + i] = to_bf16(f);
                    }
                nl_comm_stats before;
                nl_comm_get_stats(W, &before);
                int ok = nl_comm_all_to_all(W, send, recv, m, dt, impls[ii]) == NL_OK;
                for (int from = 0; ok && from < P; from++)
                    for (size_t i = 0; ok && i < m; i++) ok = get(recv, dt, from * m + i) == a2a_val(from, R, i);
                uint64_t s, v;
                delta(NL_COMM_OP_ALL_TO_ALL, &before, &s, &v);
                ok = ok && s == (uint64_t)(P - 1) * m * es && v == s;
                nl_free(send);
                nl_free(recv);
                if (!ok) print_message("rank %d: all-to-all %s m=%zu failed\n", R, nl_comm_impl_name(impls[ii]), m);
                CHECK_ALL(ok);

                /* irregular: rank `from` sends (from + 2*to + k) % 5 elements to `to` */
                size_t sc[8], so[8], rc[8], ro[8], st = 0, rt = 0;
                for (int j = 0; j < P; j++) {
                    sc[j] = (size_t)((R + 2 * j + (int)k) % 5);
                    rc[j] = (size_t)((j + 2 * R + (int)k) % 5);
                }
                for (int j = P - 1; j >= 0; j--) { /* send blocks stored in reverse rank order */
                    so[j] = st;
                    st += sc[j];
                }
                for (int j = 0; j < P; j++) {
                    ro[j] = rt;
                    rt += rc[j];
                }
                send = nl_malloc(st * es + 64, "sendv");
                recv = nl_malloc(rt * es + 64, "recvv");
                for (int to = 0; to < P; to++)
                    for (size_t i = 0; i < sc[to]; i++) {
                        float f = a2a_val(R, to, i);
                        if (dt == NL_COMM_F32)
                            ((float *)send)[so[to] + i] = f;
                        else
                            ((uint16_t *)send)[so[to] + i] = to_bf16(f);
                    }
                nl_comm_get_stats(W, &before);
                ok = nl_comm_all_to_allv(W, send, sc, so, recv, rc, ro, dt, impls[ii]) == NL_OK;
                for (int from = 0; ok && from < P; from++)
                    for (size_t i = 0; ok && i < rc[from]; i++) ok = get(recv, dt, ro[from] + i) == a2a_val(from, R, i);
                delta(NL_COMM_OP_ALL_TO_ALL, &before, &s, &v);
                ok = ok && s == (st - sc[R]) * es && v == (rt - rc[R]) * es;
                nl_free(send);
                nl_free(recv);
                if (!ok) print_message("rank %d: all-to-allv %s k=%zu failed\n", R, nl_comm_impl_name(impls[ii]), k);
                CHECK_ALL(ok);
            }
}

/* Random fp32 values: ours and native agree with a float64 serial sum within rounding. */
static void test_random_values(void **state) {
    (void)state;
    size_t n = 4099;
    float *all = nl_malloc((size_t)P * n * sizeof(float), "all");
    nl_rng rng;
    nl_rng_seed(&rng, 42);
    for (size_t i = 0; i < (size_t)P * n; i++) all[i] = (float)nl_rng_normal(&rng) * 1e3f;
    for (int di = 0; di < 2; di++)
        for (int ii = 0; ii < 2; ii++) {
            nl_comm_dtype dt = dts[di];
            char *buf = nl_malloc(n * 4, "buf");
            for (size_t i = 0; i < n; i++) {
                if (dt == NL_COMM_F32)
                    ((float *)buf)[i] = all[(size_t)R * n + i];
                else
                    ((uint16_t *)buf)[i] = to_bf16(all[(size_t)R * n + i]);
            }
            int ok = nl_comm_all_reduce(W, buf, n, dt, impls[ii]) == NL_OK;
            double worst = 0;
            for (size_t i = 0; ok && i < n; i++) {
                double ref = 0, mag = 0;
                for (int r = 0; r < P; r++) {
                    double x = dt == NL_COMM_F32 ? all[(size_t)r * n + i] : from_bf16(to_bf16(all[(size_t)r * n + i]));
                    ref += x;
                    mag += fabs(x);
                }
                /* p-1 additions, each rounded once: fp32 eps 2^-24, bf16 2^-8 (relative to the
                 * magnitude of the partial sums) */
                double eps = dt == NL_COMM_F32 ? 0x1p-24 : 0x1p-8;
                double err = fabs(get(buf, dt, i) - ref) / (mag * eps * P);
                if (err > worst) worst = err;
                ok = err <= 1.0;
            }
            if (!ok)
                print_message("rank %d: random all-reduce %s %s: error %.3g of the bound\n", R,
                              nl_comm_impl_name(impls[ii]), nl_comm_dtype_name(dt), worst);
            nl_free(buf);
            CHECK_ALL(ok);
        }
    nl_free(all);
}

/* Non-blocking all-reduces, several in flight at once, polled between other work. */
static void test_nonblocking(void **state) {
    (void)state;
    for (int ii = 0; ii < 2; ii++)
        for (int di = 0; di < 2; di++) {
            nl_comm_dtype dt = dts[di];
            size_t es = nl_comm_dtype_bytes(dt);
            enum { NB = 5 };
            size_t ns[NB] = {1, 17, 1000, 4096, 70001};
            char *bufs[NB];
            nl_comm_request *rq[NB];
            int ok = 1;
            nl_comm_stats before;
            nl_comm_get_stats(W, &before);
            for (int b = 0; b < NB; b++) {
                bufs[b] = nl_malloc(ns[b] * es + 64, "bucket");
                fill(bufs[b], dt, 10 + b, R, ns[b]);
                ok = ok && nl_comm_all_reduce_start(W, bufs[b], ns[b], dt, impls[ii], &rq[b]) == NL_OK;
                for (int j = 0; ok && j <= b; j++) {
                    int done;
                    ok = nl_comm_progress(rq[j], &done) == NL_OK;
                }
            }
            for (int b = 0; b < NB; b++) ok = nl_comm_wait(rq[b]) == NL_OK && ok;
            uint64_t want = 0;
            for (int b = 0; b < NB; b++) {
                for (size_t i = 0; ok && i < ns[b]; i++) ok = get(bufs[b], dt, i) == sum_ref(10 + b, i);
                want += (2 * ns[b] - cnt(ns[b], R) - cnt(ns[b], (R + 1) % P)) * es;
                nl_free(bufs[b]);
            }
            uint64_t s, v;
            delta(NL_COMM_OP_ALL_REDUCE, &before, &s, &v);
            ok = ok && s == want;
            if (!ok)
                print_message("rank %d: non-blocking all-reduce %s %s failed\n", R, nl_comm_impl_name(impls[ii]),
                              nl_comm_dtype_name(dt));
            CHECK_ALL(ok);
        }
}

/* Split into groups: the layouts dp x tp x pp of this world, an all-reduce in each group. */
static void test_layout_groups(void **state) {
    (void)state;
    int shapes[][3] = {{P, 1, 1}, {1, P, 1}, {1, 1, P}, {2, 2, 1}, {2, 1, 2}, {1, 2, 2}};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        int dp = shapes[k][0], tp = shapes[k][1], pp = shapes[k][2];
        nl_layout L;
        nl_status st = nl_layout_init(W, dp, tp, pp, &L);
        if (dp * tp * pp != P) {
            assert_int_equal(st, NL_ERR_INVALID);
            assert_non_null(strstr(nl_last_error(), "number of ranks"));
            continue;
        }
        int ok = st == NL_OK;
        ok = ok && R == (L.pp_rank * dp + L.dp_rank) * tp + L.tp_rank;
        ok = ok && nl_comm_size(L.dp_comm) == dp && nl_comm_size(L.tp_comm) == tp && nl_comm_size(L.pp_comm) == pp;
        ok = ok && nl_comm_rank(L.dp_comm) == L.dp_rank && nl_comm_rank(L.tp_comm) == L.tp_rank &&
             nl_comm_rank(L.pp_comm) == L.pp_rank;
        nl_comm *groups[3] = {L.dp_comm, L.tp_comm, L.pp_comm};
        for (int g = 0; ok && g < 3; g++) {
            /* sum of world ranks over the group, computed from the layout formula */
            double want = 0;
            for (int q = 0; q < P; q++) {
                int t = q % tp, d = (q / tp) % dp, s = q / (tp * dp);
                int same = g == 0   ? (t == L.tp_rank && s == L.pp_rank)
                           : g == 1 ? (d == L.dp_rank && s == L.pp_rank)
                                    : (d == L.dp_rank && t == L.tp_rank);
                if (same) want += q;
            }
            for (int ii = 0; ii < 2 && ok; ii++) {
                float x[3] = {(float)R, 1.0f, (float)R};
                ok = nl_comm_all_reduce(groups[g], x, 3, NL_COMM_F32, impls[ii]) == NL_OK;
                ok = ok && x[0] == want && x[1] == nl_comm_size(groups[g]);
            }
        }
        if (!ok) print_message("rank %d: layout dp=%d tp=%d pp=%d failed\n", R, dp, tp, pp);
        nl_layout_free(&L);
        CHECK_ALL(ok);
    }
}

static void test_bad_input(void **state) {
    (void)state;
    float x = 1;
    assert_int_equal(nl_comm_broadcast(W, &x, 1, NL_COMM_F32, P, NL_COMM_OURS), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "root"));
    assert_int_equal(nl_comm_reduce(W, &x, &x, 1, NL_COMM_F32, -1, NL_COMM_NATIVE), NL_ERR_INVALID);
    assert_int_equal(nl_comm_send(W, &x, 1, NL_COMM_F32, P, 0), NL_ERR_INVALID);
    assert_int_equal(nl_comm_all_reduce(NULL, &x, 1, NL_COMM_F32, NL_COMM_OURS), NL_ERR_INVALID);
}

int main(int argc, char **argv) {
    if (nl_comm_init(&argc, &argv)) {
        fprintf(stderr, "nl_comm_init: %s\n", nl_last_error());
        return 1;
    }
    W = nl_comm_world();
    P = nl_comm_size(W);
    R = nl_comm_rank(W);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_all_reduce),       cmocka_unit_test(test_reduce_scatter_all_gather),
        cmocka_unit_test(test_broadcast_reduce), cmocka_unit_test(test_all_to_all),
        cmocka_unit_test(test_random_values),    cmocka_unit_test(test_nonblocking),
        cmocka_unit_test(test_layout_groups),    cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_bf16_nan),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    nl_comm_finalize();
    return rc;
}
