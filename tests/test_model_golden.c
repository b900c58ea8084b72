/* NanoLM against PyTorch: logits, loss, every gradient and 10 AdamW steps from the fixture
 * tests/ref/model_golden.bin written by tests/ref/make_model_fixture.py. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/checkpoint.h"
#include "nanolm/model.h"
#include "nanolm/train.h"

typedef struct fx_tensor {
    char name[128];
    int dtype, ndim, dims[4];
    size_t numel;
    void *data;
} fx_tensor;

typedef struct fixture {
    int n;
    fx_tensor t[128];
    char *buf;
} fixture;

static int rd_i32(const char **p, const char *end, int *out) {
    if (end - *p < 4) return -1;
    memcpy(out, *p, 4);
    *p += 4;
    return 0;
}

static void fixture_load(fixture *f, const char *path) {
    size_t bytes;
    f->buf = tu_read_file(path, &bytes);
    assert_non_null(f->buf);
    const char *p = f->buf + 4, *end = f->buf + bytes;
    assert_memory_equal(f->buf, "NLFX", 4);
    assert_int_equal(rd_i32(&p, end, &f->n), 0);
    assert_true(f->n > 0 && f->n <= 128);
    for (int i = 0; i < f->n; i++) {
        fx_tensor *t = &f->t[i];
        int len = 0;
        assert_int_equal(rd_i32(&p, end, &len), 0);
        assert_true(len > 0 && len < 127 && end - p >= len);
        memcpy(t->name, p, (size_t)len);
        t->name[len] = 0;
        p += len;
        assert_int_equal(rd_i32(&p, end, &t->dtype), 0);
        assert_int_equal(rd_i32(&p, end, &t->ndim), 0);
        t->numel = 1;
        for (int d = 0; d < t->ndim; d++) {
            assert_int_equal(rd_i32(&p, end, &t->dims[d]), 0);
            t->numel *= (size_t)t->dims[d];
        }
        assert_true((size_t)(end - p) >= 4 * t->numel);
        t->data = malloc(4 * t->numel + 4); /* aligned copy: records are packed at any offset */
        assert_non_null(t->data);
        memcpy(t->data, p, 4 * t->numel);
        p += 4 * t->numel;
    }
}

static void fixture_free(fixture *f) {
    for (int i = 0; i < f->n; i++) free(f->t[i].data);
    free(f->buf);
}

static fx_tensor *fx_get(fixture *f, const char *name) {
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->t[i].name, name)) return &f->t[i];
    fail_msg("fixture has no tensor %s", name);
    return NULL;
}

/* max |a - b| / max |b| over a tensor */
static double rel_err(const float *a, const float *b, size_t n) {
    double md = 0, mb = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d > md) md = d;
        if (fabs(b[i]) > mb) mb = fabs(b[i]);
    }
    return mb > 0 ? md / mb : md;
}

static void setup_model(fixture *f, nl_model *m) {
    fixture_load(f, tu_src_path("tests/ref/model_golden.bin"));
    const int32_t *cfg = fx_get(f, "config")->data;
    const float *hy = fx_get(f, "hyper")->data;
    nl_arch a = {.name = "golden",
                 .vocab_size = cfg[0],
                 .dim = cfg[1],
                 .n_layers = cfg[2],
                 .n_heads = cfg[3],
                 .n_kv_heads = cfg[4],
                 .hidden_dim = cfg[5],
                 .seq_len = cfg[6],
                 .rope_theta = hy[0],
                 .norm_eps = hy[1],
                 .tied_embeddings = 0};
    assert_int_equal(nl_model_init(m, &a), NL_OK);
    assert_int_equal(nl_model_alloc_grads(m), NL_OK);
    assert_int_equal(nl_model_alloc_acts(m, cfg[7], cfg[8]), NL_OK);
    const nl_param_info *tab;
    int nt = nl_model_params_table(m, &tab);
    for (int i = 0; i < nt; i++) {
        char nm[128];
        snprintf(nm, sizeof nm, "param:%s", tab[i].name);
        fx_tensor *t = fx_get(f, nm);
        assert_int_equal(t->numel, tab[i].numel);
        assert_int_equal(t->dims[0], tab[i].shape[0]);
        memcpy(m->params + tab[i].offset, t->data, tab[i].numel * sizeof(float));
    }
}

static void test_forward_backward(void **state) {
    (void)state;
    fixture f;
    nl_model m;
    setup_model(&f, &m);
    const int32_t *cfg = fx_get(&f, "config")->data;
    int64_t B = cfg[7], T = cfg[8];
    float loss;
    assert_int_equal(nl_model_forward(&m, fx_get(&f, "tokens")->data, fx_get(&f, "targets")->data, B, T, &loss), NL_OK);
    fx_tensor *lg = fx_get(&f, "logits");
    assert_int_equal(lg->numel, (size_t)(B * T * m.V));
    double e = rel_err(m.train->a.logits, lg->data, lg->numel);
    print_message("logits rel err %.3g\n", e);
    assert_true(e < 1e-4);
    float ref_loss = *(float *)fx_get(&f, "loss")->data;
    print_message("loss %.7f torch %.7f\n", loss, ref_loss);
    assert_true(fabs(loss - ref_loss) <= 1e-4 * fabs(ref_loss));
    nl_model_zero_grad(&m);
    assert_int_equal(nl_model_backward(&m), NL_OK);
    const nl_param_info *tab;
    int nt = nl_model_params_table(&m, &tab);
    double worst = 0;
    for (int i = 0; i < nt; i++) {
        char nm[128];
        snprintf(nm, sizeof nm, "grad:%s", tab[i].name);
        fx_tensor *t = fx_get(&f, nm);
        double ge = rel_err(m.train->grads + tab[i].offset, t->data, tab[i].numel);
        if (ge > worst) worst = ge;
        if (ge >= 1e-4) fail_msg("gradient of %s: rel err %.3g", tab[i].name, ge);
    }
    print_message("worst gradient rel err %.3g over %d tensors\n", worst, nt);
    nl_model_free(&m);
    fixture_free(&f);
}

static void test_adamw_trajectory(void **state) {
    (void)state;
    fixture f;
    nl_model m;
    setup_model(&f, &m);
    const int32_t *cfg = fx_get(&f, "config")->data;
    const float *hy = fx_get(&f, "hyper")->data;
    fx_tensor *ref = fx_get(&f, "adamw_losses");
    nl_adamw opt;
    assert_int_equal(nl_adamw_init(&opt, &m, 0.9f, 0.95f, 1e-8f, hy[3]), NL_OK);
    for (size_t s = 0; s < ref->numel; s++) {
        float loss;
        assert_int_equal(
            nl_model_forward(&m, fx_get(&f, "tokens")->data, fx_get(&f, "targets")->data, cfg[7], cfg[8], &loss),
            NL_OK);
        nl_model_zero_grad(&m);
        assert_int_equal(nl_model_backward(&m), NL_OK);
        nl_grad_clip(&m, hy[4]);
        nl_adamw_step(&opt, &m, hy[2]);
        float r = ((float *)ref->data)[s];
        print_message("step %zu loss %.6f torch %.6f\n", s, loss, r);
        assert_true(fabs(loss - r) <= 1e-4);
    }
    nl_adamw_free(&opt);
    nl_model_free(&m);
    fixture_free(&f);
}

/* Safetensors interop: tests/ref/interop.safetensors was written by nl_ckpt_save from this
 * model (NANOLM_WRITE_FIXTURES=1 rewrites it) and loaded by PyTorch in
 * tests/ref/make_interop_fixture.py, whose logits are in interop_logits.bin. Checks that today's
 * writer produces the same bytes and that nanolm reading the file reproduces PyTorch's logits. */
static void test_safetensors_interop(void **state) {
    (void)state;
    fixture f, fl;
    nl_model m;
    setup_model(&f, &m);
    const char *path = tu_src_path("tests/ref/interop.safetensors");
    if (getenv("NANOLM_WRITE_FIXTURES")) assert_int_equal(nl_ckpt_save(path, &m, "none", NULL), NL_OK);
    char *dir = tu_tmpdir(), fresh[512];
    snprintf(fresh, sizeof fresh, "%s/fresh.safetensors", dir);
    assert_int_equal(nl_ckpt_save(fresh, &m, "none", NULL), NL_OK);
    size_t na, nb;
    char *a = tu_read_file(path, &na), *b = tu_read_file(fresh, &nb);
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, na);
    free(a);
    free(b);
    tu_rmdir(dir);
    free(dir);
    nl_model m2;
    char kind[64];
    assert_int_equal(nl_ckpt_load_model(path, &m2, kind), NL_OK);
    assert_string_equal(kind, "none");
    const int32_t *cfg = fx_get(&f, "config")->data;
    assert_int_equal(nl_model_alloc_acts(&m2, cfg[7], cfg[8]), NL_OK);
    assert_int_equal(nl_model_forward(&m2, fx_get(&f, "tokens")->data, NULL, cfg[7], cfg[8], NULL), NL_OK);
    fixture_load(&fl, tu_src_path("tests/ref/interop_logits.bin"));
    fx_tensor *lg = fx_get(&fl, "logits");
    assert_int_equal(lg->numel, (size_t)(cfg[7] * cfg[8] * m2.V));
    double e = rel_err(m2.train->a.logits, lg->data, lg->numel);
    print_message("PyTorch on nanolm's file vs nanolm: logits rel err %.3g\n", e);
    assert_true(e < 1e-5);
    nl_model_free(&m2);
    nl_model_free(&m);
    fixture_free(&f);
    fixture_free(&fl);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_backward),
        cmocka_unit_test(test_adamw_trajectory),
        cmocka_unit_test(test_safetensors_interop),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
