/* Ring attention with the load-balanced causal split (see nanolm/cp.h). */
#include <math.h>
#include <string.h>

#include "nanolm/cp.h"

int64_t nl_cp_position(int P, int r, int64_t T, int64_t t) {
    int64_t c = T / (2 * P);
    return t < c ? r * c + t : (2 * P - 1 - r) * c + (t - c);
}

nl_status nl_cp_attn_init(nl_cp_attn *a, nl_comm *cp, int64_t B, int64_t T, int64_t NH, int64_t KVH, int64_t hd) {
    memset(a, 0, sizeof *a);
    a->cp = cp;
    a->P = nl_comm_size(cp);
    a->r = nl_comm_rank(cp);
    if (B < 1 || T < 2 * a->P || T % (2 * a->P))
        return nl_fail(NL_ERR_INVALID,
                       "context parallel: sequence length %lld must be a positive multiple of 2 x %d ranks",
                       (long long)T, a->P);
    a->B = B, a->T = T, a->Tl = T / a->P, a->c = T / (2 * a->P), a->NH = NH, a->KVH = KVH, a->hd = hd;
    size_t o = (size_t)(B * a->Tl * NH * hd), s = (size_t)(B * NH * a->Tl), k = (size_t)(B * a->Tl * 2 * KVH * hd);
    a->out = nl_malloc(o * sizeof(float), "cp attention output");
    a->lse = nl_malloc(3 * s * sizeof(float), "cp softmax statistics");
    a->ring[0] = nl_malloc(4 * k * sizeof(float), "cp ring buffers");
    if (!a->out || !a->lse || !a->ring[0]) {
        nl_cp_attn_free(a);
        return NL_ERR_NOMEM;
    }
    a->m = a->lse + s;
    a->l = a->m + s;
    a->ring[1] = a->ring[0] + 2 * k;
    a->bytes = (o + 3 * s + 4 * k) * sizeof(float);
    return NL_OK;
}

void nl_cp_attn_free(nl_cp_attn *a) {
    nl_free(a->out);
    nl_free(a->lse);
    nl_free(a->ring[0]);
    memset(a, 0, sizeof *a);
}

/* passes n floats of ring[cur] to the next rank and receives the previous rank's into ring[1-cur] */
static nl_status ring_pass(nl_cp_attn *a, int cur, size_t n) {
    int next = (a->r + 1) % a->P, prev = (a->r + a->P - 1) % a->P;
    nl_comm_request *req;
    NL_TRY(nl_comm_send_start(a->cp, a->ring[cur], n, NL_COMM_F32, next, 71, &req));
    nl_status st = nl_comm_recv(a->cp, a->ring[1 - cur], n, NL_COMM_F32, prev, 71);
    nl_status st2 = nl_comm_wait(req);
    return st ? st : st2;
}

/* K/V of local rows into a block (B, Tl, 2*KVH*hd) */
static void pack_kv(const nl_cp_attn *a, const float *qkv, float *blk) {
    int64_t QKV = (a->NH + 2 * a->KVH) * a->hd, W = 2 * a->KVH * a->hd;
    for (int64_t i = 0; i < a->B * a->Tl; i++)
        memcpy(blk + i * W, qkv + i * QKV + a->NH * a->hd, (size_t)W * sizeof(float));
}

nl_status nl_cp_attn_forward(nl_cp_attn *a, const float *qkv) {
    int64_t B = a->B, Tl = a->Tl, NH = a->NH, KVH = a->KVH, hd = a->hd, QKV = (NH + 2 * KVH) * hd, W = 2 * KVH * hd;
    int64_t group = NH / KVH;
    size_t n = (size_t)(B * Tl * W);
    float scale = 1.0f / sqrtf((float)hd);
    for (size_t i = 0; i < (size_t)(B * NH * Tl); i++) a->m[i] = -INFINITY, a->l[i] = 0;
    memset(a->out, 0, (size_t)(B * Tl * NH * hd) * sizeof(float));
    int cur = 0;
    pack_kv(a, qkv, a->ring[0]);
    for (int s = 0; s < a->P; s++) {
        int src = (a->r - s + a->P) % a->P;
        const float *blk = a->ring[cur];
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < NH; h++)
                for (int64_t i = 0; i < Tl; i++) {
                    int64_t pi = nl_cp_position(a->P, a->r, a->T, i), si = (b * NH + h) * Tl + i;
                    const float *q = qkv + (b * Tl + i) * QKV + h * hd;
                    float *acc = a->out + (b * Tl + i) * NH * hd + h * hd, mx = a->m[si], sum = a->l[si];
                    for (int64_t j = 0; j < Tl; j++) {
                        if (nl_cp_position(a->P, src, a->T, j) > pi) continue;
                        const float *k = blk + (b * Tl + j) * W + (h / group) * hd, *v = k + KVH * hd;
                        float sc = 0;
                        for (int64_t d = 0; d < hd; d++) sc += q[d] * k[d];
                        sc *= scale;
                        if (sc > mx) {
                            float f = expf(mx - sc);
                            for (int64_t d = 0; d < hd; d++) acc[d] *= f;
                            sum *= f;
                            mx = sc;
                        }
                        float p = expf(sc - mx);
                        sum += p;
                        for (int64_t d = 0; d < hd; d++) acc[d] += p * v[d];
                    }
                    a->m[si] = mx, a->l[si] = sum;
                }
        if (s + 1 < a->P) {
            NL_TRY(ring_pass(a, cur, n));
            cur = 1 - cur;
        }
    }
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < NH; h++)
            for (int64_t i = 0; i < Tl; i++) {
                int64_t si = (b * NH + h) * Tl + i;
                float inv = 1.0f / a->l[si], *acc = a->out + (b * Tl + i) * NH * hd + h * hd;
                for (int64_t d = 0; d < hd; d++) acc[d] *= inv;
                a->lse[si] = a->m[si] + logf(a->l[si]);
            }
    return NL_OK;
}

nl_status nl_cp_attn_backward(nl_cp_attn *a, float *dqkv, const float *dout, const float *qkv) {
    int64_t B = a->B, Tl = a->Tl, NH = a->NH, KVH = a->KVH, hd = a->hd, QKV = (NH + 2 * KVH) * hd, W = 2 * KVH * hd;
    int64_t group = NH / KVH, OD = NH * hd;
    size_t n = (size_t)(B * Tl * W);
    float scale = 1.0f / sqrtf((float)hd);
    memset(dqkv, 0, (size_t)(B * Tl * QKV) * sizeof(float));
    /* Drow = rowsum(dO * O) per query row and head, kept in a->m (free after forward) */
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < NH; h++)
            for (int64_t i = 0; i < Tl; i++) {
                const float *o = a->out + (b * Tl + i) * OD + h * hd, *g = dout + (b * Tl + i) * OD + h * hd;
                float s = 0;
                for (int64_t d = 0; d < hd; d++) s += o[d] * g[d];
                a->m[(b * NH + h) * Tl + i] = s;
            }
    int cur = 0;
    pack_kv(a, qkv, a->ring[0]);
    memset(a->ring[0] + n, 0, n * sizeof(float));
    for (int s = 0; s < a->P; s++) {
        int src = (a->r - s + a->P) % a->P;
        const float *blk = a->ring[cur];
        float *dblk = a->ring[cur] + n;
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < NH; h++)
                for (int64_t i = 0; i < Tl; i++) {
                    int64_t pi = nl_cp_position(a->P, a->r, a->T, i), si = (b * NH + h) * Tl + i;
                    const float *q = qkv + (b * Tl + i) * QKV + h * hd, *g = dout + (b * Tl + i) * OD + h * hd;
                    float *dq = dqkv + (b * Tl + i) * QKV + h * hd, lse = a->lse[si], D = a->m[si];
                    for (int64_t j = 0; j < Tl; j++) {
                        if (nl_cp_position(a->P, src, a->T, j) > pi) continue;
                        const float *k = blk + (b * Tl + j) * W + (h / group) * hd, *v = k + KVH * hd;
                        float *dk = dblk + (b * Tl + j) * W + (h / group) * hd, *dv = dk + KVH * hd;
                        float sc = 0, dp = 0;
                        for (int64_t d = 0; d < hd; d++) sc += q[d] * k[d], dp += g[d] * v[d];
                        float p = expf(sc * scale - lse), ds = p * (dp - D) * scale;
                        for (int64_t d = 0; d < hd; d++) {
                            dv[d] += p * g[d];
                            dq[d] += ds * k[d];
                            dk[d] += ds * q[d];
                        }
                    }
                }
        NL_TRY(a->P > 1 ? ring_pass(a, cur, 2 * n) : NL_OK);
        if (a->P > 1) cur = 1 - cur;
    }
    /* after P hops the own block is home with every rank's contributions */
    const float *dblk = a->ring[cur] + n;
    for (int64_t i = 0; i < B * Tl; i++) memcpy(dqkv + i * QKV + NH * hd, dblk + i * W, (size_t)W * sizeof(float));
    return NL_OK;
}
