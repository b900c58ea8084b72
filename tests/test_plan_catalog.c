/* plan/ catalog: published parameter counts, lookups, JSON overrides and their errors. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/plan.h"

static double params(const nl_catalog *c, const char *name, double *active) {
    nl_arch a;
    assert_int_equal(nl_catalog_find_model(c, name, &a), NL_OK);
    assert_int_equal(nl_arch_validate(&a), NL_OK);
    nl_arch_params p;
    nl_arch_count_params(&a, &p);
    if (active) *active = (double)p.active;
    return (double)p.total;
}

static void test_published_counts(void **state) {
    (void)state;
    nl_catalog c;
    nl_catalog_init(&c);
    double act;
    /* Counts published with the models (model cards / papers). */
    assert_true(fabs(params(&c, "llama-2-7b", NULL) - 6738415616.0) < 1); /* HF: 6,738,415,616 */
    assert_true(fabs(params(&c, "llama-3-8b", NULL) - 8030261248.0) < 1); /* HF: 8,030,261,248 */
    assert_true(fabs(params(&c, "llama-3-70b", NULL) / 70.55e9 - 1) < 0.001);
    assert_true(fabs(params(&c, "llama-3-405b", NULL) / 405.85e9 - 1) < 0.002);
    assert_true(fabs(params(&c, "gpt-3-175b", NULL) / 175e9 - 1) < 0.01);
    assert_true(fabs(params(&c, "mixtral-8x7b", &act) / 46.7e9 - 1) < 0.005); /* Mistral: 46.7B, 12.9B active */
    assert_true(fabs(act / 12.9e9 - 1) < 0.01);
    assert_true(fabs(params(&c, "deepseek-v3", &act) / 671e9 - 1) < 0.005); /* DeepSeek-V3: 671B, 37B active */
    assert_true(fabs(act / 37e9 - 1) < 0.03);
    params(&c, "stories260k", NULL);
    nl_hw h;
    assert_int_equal(nl_catalog_find_hw(&c, "H100", &h), NL_OK); /* case-insensitive */
    assert_true(h.flops_bf16 == 989e12 && h.mem_bytes == 81559.0 * 1024 * 1024 && h.intra_bw == 450e9 &&
                h.inter_bw == 50e9);
    assert_int_equal(nl_catalog_find_hw(&c, "h200", &h), NL_OK);
    assert_true(h.mem_bytes == 141e9 && h.hbm_bw == 4.8e12);
    assert_int_equal(nl_catalog_find_hw(&c, "a100", &h), NL_OK);
    assert_true(h.flops_bf16 == 312e12 && h.intra_bw == 300e9);
    /* Unknown names list the known ones. */
    assert_int_equal(nl_catalog_find_hw(&c, "v100", &h), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "b200"));
    nl_arch a;
    assert_int_equal(nl_catalog_find_model(&c, "llama-4", &a), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "deepseek-v3"));
}

/* The GPT-style families counted with their own MLP (GeLU/ReLU, 2 matrices), biases, LayerNorm
 * and positions, against the counts their authors publish; the catalog listing prints the same
 * counts (before, a 4d MLP was counted as a 3-matrix SwiGLU: OPT-175B showed 233B). */
static void test_family_counts(void **state) {
    (void)state;
    nl_catalog c;
    nl_catalog_init(&c);
    struct {
        const char *name;
        double published;
    } m[] = {
        {"bloom-176b", 176247271424.0}, /* bigscience/bloom model card: 176,247,271,424 */
        {"opt-175b", 175e9},            /* Zhang et al. 2022 Table 1 */
        {"mpt-7b", 6.7e9},              /* mosaicml/mpt-7b model card: 6.7B */
        {"mpt-30b", 29.95e9},           /* mosaicml/mpt-30b model card: 29.95B */
    };
    for (size_t i = 0; i < sizeof m / sizeof m[0]; i++) {
        nl_arch a;
        nl_family f;
        nl_arch_params p;
        assert_int_equal(nl_catalog_find_model(&c, m[i].name, &a), NL_OK);
        nl_catalog_family(&c, a.name, &f);
        nl_plan_count_params(&a, &f, &p);
        assert_true(fabs((double)p.total / m[i].published - 1) < 0.01);
    }
    char *out = NULL;
    assert_int_equal(tu_run_cli("plan catalog", &out), 0);
    assert_non_null(strstr(out, "opt-175b          175B"));
    free(out);
}

/* Nodes: DGX H100 has 8 ConnectX-7 NICs of 400 Gb/s for 8 GPUs (50 GB/s per GPU); a JSON node
 * described by its NICs gets the per-GPU network bandwidth from them. */
static void test_nodes(void **state) {
    (void)state;
    nl_catalog c;
    nl_catalog_init(&c);
    nl_hw h;
    assert_int_equal(nl_catalog_find_hw(&c, "h100", &h), NL_OK);
    assert_true(h.nics_per_node == 8 && h.nic_bw == 50e9 && h.inter_bw == h.nics_per_node * h.nic_bw / h.gpus_per_node);
    char *dir = tu_tmpdir();
    char path[4096];
    snprintf(path, sizeof path, "%s/node.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"name\": \"h100-4nic\", \"base\": \"h100\", \"nics_per_node\": 4}", f);
    fclose(f);
    assert_int_equal(nl_catalog_load_hw(&c, path), NL_OK);
    assert_int_equal(nl_catalog_find_hw(&c, "h100-4nic", &h), NL_OK);
    assert_true(h.inter_bw == 4 * 50e9 / 8);
    f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"name\": \"x\", \"nics_per_node\": 0}", f);
    fclose(f);
    assert_int_not_equal(nl_catalog_load_hw(&c, path), NL_OK);
    assert_non_null(strstr(nl_last_error(), "nics_per_node >= 1"));
    char *out = NULL;
    assert_int_equal(tu_run_cli("plan catalog", &out), 0);
    assert_non_null(strstr(out, "8x400 Gb/s"));
    free(out);
    tu_rmdir(dir);
    free(dir);
}

static void write(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_json_overrides(void **state) {
    (void)state;
    char *dir = tu_tmpdir();
    char p[256];
    nl_catalog c;
    nl_catalog_init(&c);
    snprintf(p, sizeof p, "%s/hw.json", dir);
    write(p, "[{\"name\": \"h100-pcie\", \"base\": \"h100\", \"flops_bf16\": 756e12, \"intra_bw\": 64e9},"
             " {\"name\": \"h100\", \"price_per_hour\": 1.99}]");
    assert_int_equal(nl_catalog_load_hw(&c, p), NL_OK);
    nl_hw h;
    assert_int_equal(nl_catalog_find_hw(&c, "h100-pcie", &h), NL_OK);
    assert_true(h.flops_bf16 == 756e12 && h.intra_bw == 64e9 && h.mem_bytes == 81559.0 * 1024 * 1024);
    assert_int_equal(nl_catalog_find_hw(&c, "h100", &h), NL_OK);
    assert_true(h.price_per_hour == 1.99 && h.flops_bf16 == 989e12);
    /* Unknown field, bad value, missing name: refused, naming file and field. */
    write(p, "{\"name\": \"x\", \"flops\": 1}");
    assert_int_equal(nl_catalog_load_hw(&c, p), NL_ERR_FORMAT);
    assert_non_null(strstr(nl_last_error(), "'flops'"));
    write(p, "{\"name\": \"x\", \"mem_bytes\": -5}");
    assert_int_equal(nl_catalog_load_hw(&c, p), NL_ERR_FORMAT);
    assert_non_null(strstr(nl_last_error(), "mem_bytes"));
    write(p, "{\"gpus_per_node\": 8}");
    assert_int_equal(nl_catalog_load_hw(&c, p), NL_ERR_FORMAT);
    write(p, "{\"name\": \"x\", \"gpus_per_node\": 2.5}");
    assert_int_equal(nl_catalog_load_hw(&c, p), NL_ERR_FORMAT);
    write(p, "not json");
    assert_int_equal(nl_catalog_load_hw(&c, p), NL_ERR_FORMAT);
    assert_non_null(strstr(nl_last_error(), "hw.json"));
    /* Models: a new one with the required fields; an inconsistent shape is refused. */
    snprintf(p, sizeof p, "%s/m.json", dir);
    write(p, "{\"name\": \"tiny\", \"vocab_size\": 1000, \"dim\": 256, \"n_layers\": 4, \"n_heads\": 4, "
             "\"hidden_dim\": 688}");
    assert_int_equal(nl_catalog_load_model(&c, p), NL_OK);
    nl_arch a;
    assert_int_equal(nl_catalog_find_model(&c, "tiny", &a), NL_OK);
    assert_true(a.n_kv_heads == 4 && a.seq_len == 4096);
    write(p, "{\"name\": \"bad\", \"vocab_size\": 1000, \"dim\": 250, \"n_layers\": 4, \"n_heads\": 3, \"hidden_dim\": "
             "688}");
    assert_int_equal(nl_catalog_load_model(&c, p), NL_ERR_FORMAT);
    write(p, "{\"name\": \"half\", \"dim\": 256}");
    assert_int_equal(nl_catalog_load_model(&c, p), NL_ERR_FORMAT);
    assert_non_null(strstr(nl_last_error(), "vocab_size"));
    write(p, "{\"name\": \"llama-3-8b-32k\", \"base\": \"llama-3-8b\", \"seq_len\": 32768}");
    assert_int_equal(nl_catalog_load_model(&c, p), NL_OK);
    assert_int_equal(nl_catalog_find_model(&c, "llama-3-8b-32k", &a), NL_OK);
    assert_true(a.seq_len == 32768 && a.n_kv_heads == 8);
    /* Through the CLI. */
    char args[512], *out = NULL;
    snprintf(args, sizeof args, "plan catalog --model-file %s --json", p);
    assert_int_equal(tu_run_cli(args, &out), 0);
    assert_non_null(strstr(out, "llama-3-8b-32k"));
    free(out);
    /* --model FILE.json prices the file's model directly. */
    snprintf(args, sizeof args, "budget --model %s --params 7B --gpus 8 --zero 3 --json", p);
    assert_int_equal(tu_run_cli(args, &out), 0);
    assert_non_null(strstr(out, "\"bytes_per_gpu\":\t14000000000"));
    free(out);
    assert_int_equal(tu_run_cli("plan catalog", &out), 0);
    assert_non_null(strstr(out, "mi300x"));
    assert_non_null(strstr(out, "course-moe"));
    free(out);
    snprintf(args, sizeof args, "plan catalog --hw %s/missing.json", dir);
    assert_int_equal(tu_run_cli(args, &out), 1);
    assert_non_null(strstr(out, "missing.json"));
    free(out);
    tu_rmdir(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_published_counts),
        cmocka_unit_test(test_family_counts),
        cmocka_unit_test(test_nodes),
        cmocka_unit_test(test_json_overrides),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
