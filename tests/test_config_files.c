/* The training configuration from files: config files on disk (paths, sizes, file types),
 * command-line overrides, and Hugging Face config.json through model_name_or_path; errors
 * carried from those files stay one line. test_config.c holds the rest.
 *
 * Expected values are written out here from their sources: the numbers in the text of
 * each test and Hugging Face transformers' config classes (cited where used). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config_cases.h"

/* ---- Files -------------------------------------------------------------------------------- */

static char tmpdir[64];
static char ckpt[128], ckpt_json[160];

/* A fresh directory for the test's files, holding an empty checkpoint directory ckpt. */
static void setup(void) {
    snprintf(tmpdir, sizeof tmpdir, "%s", mxt_tmp_mkdir("config"));
    snprintf(ckpt, sizeof ckpt, "%s", mxt_tmp_mkdir("config/ckpt"));
    snprintf(ckpt_json, sizeof ckpt_json, "%s/config.json", ckpt);
}

static void teardown(void) { (void)mxt_remove_tree(tmpdir); }

/* Settings given over the file's (mxtrain's --SECTION.KEY VALUE). */
static void test_overrides(void) {
    setup();
    char path[128], want[256];
    snprintf(path, sizeof path, "%s/ov.yaml", tmpdir);
    mxt_write_text(path, MINIMAL);
    mx_config c;
    mx_diag diag = {{0}};
    // replaced, added in a section the file does not have, a list, a nullable key's null
    mx_config_override ov[] = {{"training.lr", "3e-4"}, {"parallel.fsdp_plan.param_dtype", "fp32"},
                               {"data.data_path", "[a.bin, b.bin]"}, {"model.rope_scaling", "null"}};
    CHECK_EQ_INT(mx_config_load_with(path, ov, 4, &c, &diag), 0);
    CHECK_EQ_DBL(c.training.lr, 3e-4);
    CHECK_EQ_INT(c.parallel.param_dtype, MX_DTYPE_FP32);
    CHECK_EQ_INT(c.data.n_data_path, 2);
    if (c.data.n_data_path == 2) CHECK_STR_EQ(c.data.data_path[1], "b.bin");
    CHECK_STR_EQ(origin(&c, "training.lr"), "command line");
    CHECK_STR_EQ(origin(&c, "parallel.fsdp_plan.param_dtype"), "command line");
    snprintf(want, sizeof want, "%s:12", path);
    CHECK_STR_EQ(origin(&c, "training.micro_batch_size"), want);   // the file's stay the file's
    mx_config_free(&c);
    // an alias replaces the key the file wrote
    mxt_write_text(path, MODEL_MOE "  num_experts: 8\n  num_experts_per_tok: 2\n" DATA TRAINING);
    mx_config_override alias[] = {{"model.num_local_experts", "16"}};
    CHECK_EQ_INT(mx_config_load_with(path, alias, 1, &c, &diag), 0);
    CHECK_EQ_INT(c.model.num_experts, 16);
    mx_config_free(&c);
    mxt_write_text(path, MINIMAL);
    static const struct { mx_config_override ov; const char *msg; } bad[] = {
        {{"training.lr", "abc"}, "command line: training.lr: 'abc' is not a number (allowed: a number > 0)"},
        {{"training.min_lr", "0.5"}, "command line: training.min_lr: 0.5 is more than lr 0.001 (line 14) (allowed: 0 to lr)"},
        {{"training.lrr", "1"}, "command line: --training.lrr: unknown key 'lrr'; did you mean 'lr'? (allowed: "},
        {{"trainig.lr", "1"}, "command line: --trainig.lr: unknown section 'trainig'; did you mean 'training'? (allowed: "
                              "model, data, parallel, features, training)"},
        {{"training.quantization_plan.recipe_name", "mxfp8"}, "command line: --training.quantization_plan.recipe_name: "
                                                             "the quantization plan is set in the config file only"},
        {{"parallel.fsdp_plan", "1"}, "command line: --parallel.fsdp_plan: is a section (allowed: one of its settings: "
                                      "param_dtype, "},
        {{"training.lr.x", "1"}, "command line: --training.lr.x: training.lr is a setting, not a section"},
        {{"training.lr", ""}, "command line: --training.lr: no value"},
        {{"data.data_path", "[a.bin,"}, "command line: --data.data_path:"},   // then libyaml's message
        {{"model.num_experts", "4"}, "command line: model.num_experts: given for model_type llama, but it applies only "
                                     "to qwen3_moe"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK_EQ_INT(mx_config_load_with(path, &bad[i].ov, 1, &c, &diag), MX_ECONFIG);
        CHECK_STR_CONTAINS(diag.msg, bad[i].msg);
        CHECK(is_empty(&c));
    }
    mx_config_override twice[] = {{"training.lr", "1"}, {"training.lr", "2"}};
    CHECK_EQ_INT(mx_config_load_with(path, twice, 2, &c, &diag), MX_ECONFIG);
    CHECK_STR_EQ(diag.msg, "command line: --training.lr: training.lr is given twice (allowed: once)");
    unlink(path);
}

static void test_load_file(void) {
    setup();
    char path[128];
    snprintf(path, sizeof path, "%s/run.yaml", tmpdir);
    mxt_write_text(path, MINIMAL);
    mx_config c;
    mx_diag diag = {{0}};
    CHECK_EQ_INT(mx_config_load(path, &c, &diag), 0);
    CHECK_STR_EQ(c.source, path);
    char want[256];
    snprintf(want, sizeof want, "%s:14", path);
    CHECK_STR_EQ(origin(&c, "training.lr"), want);
    mx_config_free(&c);

    mxt_write_text(path, MINIMAL "  lr_decay_style: Cosine\n");
    CHECK_EQ_INT(mx_config_load(path, &c, &diag), MX_ECONFIG);
    snprintf(want, sizeof want, "%s:15: training.lr_decay_style: 'Cosine' is not allowed", path);
    CHECK_STR_CONTAINS(diag.msg, want);
    CHECK(is_empty(&c));
    unlink(path);

    CHECK_EQ_INT(mx_config_load(path, &c, &diag), MX_EIO);
    snprintf(want, sizeof want, "%s: cannot open", path);
    CHECK_STR_CONTAINS(diag.msg, want);
    CHECK(is_empty(&c));
    CHECK_EQ_INT(mx_config_load(tmpdir, &c, &diag), MX_EIO);
    snprintf(want, sizeof want, "%s: is a directory (allowed: a YAML config file)", tmpdir);
    CHECK_STR_EQ(diag.msg, want);
    // a FIFO is refused without waiting for a writer (a plain open() blocks forever; the
    // alarm ends the test if it does), /dev/zero without reading it
    alarm(30);
    snprintf(path, sizeof path, "%s/fifo.yaml", tmpdir);
    CHECK_EQ_INT(mkfifo(path, 0600), 0);
    CHECK_EQ_INT(mx_config_load(path, &c, &diag), MX_EIO);
    snprintf(want, sizeof want, "%s: is a FIFO, not a regular file (allowed: a YAML config file)", path);
    CHECK_STR_EQ(diag.msg, want);
    unlink(path);
    alarm(0);
    CHECK_EQ_INT(mx_config_load("/dev/zero", &c, &diag), MX_EIO);
    CHECK_STR_EQ(diag.msg, "/dev/zero: is a character device, not a regular file (allowed: a YAML config file)");
    CHECK(is_empty(&c));
    // at most 16 MiB: one byte more is refused by its size; exactly 16 MiB (of NUL bytes) is
    // read and fails as YAML
    snprintf(path, sizeof path, "%s/big.yaml", tmpdir);
    for (int extra = 1; extra >= 0; extra--) {
        FILE *f = fopen(path, "w");
        CHECK(f != NULL && ftruncate(fileno(f), (16 << 20) + extra) == 0);
        if (f) fclose(f);
        int rc = mx_config_load(path, &c, &diag);
        snprintf(want, sizeof want, "%s: is 16777217 bytes (allowed: a YAML config file of at most 16 MiB)", path);
        if (extra) {
            CHECK_EQ_INT(rc, MX_EIO);
            CHECK_STR_EQ(diag.msg, want);
        } else {
            CHECK(rc != 0 && rc != MX_EIO);
            CHECK(strstr(diag.msg, "at most 16 MiB") == NULL);
        }
        CHECK(is_empty(&c));
    }
    unlink(path);
    teardown();
}

/* ---- model_name_or_path: a Hugging Face config.json ---------------------------------------- */

/* Qwen3-30B-A3B's config.json (Hugging Face Qwen/Qwen3-30B-A3B), key for key. */
static const char qwen3_30b_a3b[] =
    "{\n"
    "  \"architectures\": [\"Qwen3MoeForCausalLM\"],\n"
    "  \"attention_bias\": false,\n"
    "  \"attention_dropout\": 0.0,\n"
    "  \"bos_token_id\": 151643,\n"
    "  \"decoder_sparse_step\": 1,\n"
    "  \"eos_token_id\": 151645,\n"
    "  \"head_dim\": 128,\n"
    "  \"hidden_act\": \"silu\",\n"
    "  \"hidden_size\": 2048,\n"
    "  \"initializer_range\": 0.02,\n"
    "  \"intermediate_size\": 6144,\n"
    "  \"max_position_embeddings\": 40960,\n"
    "  \"max_window_layers\": 48,\n"
    "  \"mlp_only_layers\": [],\n"
    "  \"model_type\": \"qwen3_moe\",\n"
    "  \"moe_intermediate_size\": 768,\n"
    "  \"norm_topk_prob\": true,\n"
    "  \"num_attention_heads\": 32,\n"
    "  \"num_experts\": 128,\n"
    "  \"num_experts_per_tok\": 8,\n"
    "  \"num_hidden_layers\": 48,\n"
    "  \"num_key_value_heads\": 4,\n"
    "  \"output_router_logits\": false,\n"
    "  \"rms_norm_eps\": 1e-06,\n"
    "  \"rope_scaling\": null,\n"
    "  \"rope_theta\": 1000000.0,\n"
    "  \"router_aux_loss_coef\": 0.001,\n"
    "  \"sliding_window\": null,\n"
    "  \"tie_word_embeddings\": false,\n"
    "  \"torch_dtype\": \"bfloat16\",\n"
    "  \"transformers_version\": \"4.51.0\",\n"
    "  \"use_cache\": true,\n"
    "  \"use_sliding_window\": false,\n"
    "  \"vocab_size\": 151936\n"
    "}\n";

/* Llama-3.2-1B's config.json: its llama3 rope_scaling is what mxtrain cannot honour. */
static const char llama32_1b[] =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": 0.0,\n"
    " \"bos_token_id\": 128000, \"eos_token_id\": 128001, \"head_dim\": 64, \"hidden_act\": \"silu\",\n"
    " \"hidden_size\": 2048, \"initializer_range\": 0.02, \"intermediate_size\": 8192,\n"
    " \"max_position_embeddings\": 131072, \"mlp_bias\": false, \"model_type\": \"llama\",\n"
    " \"num_attention_heads\": 32, \"num_hidden_layers\": 16, \"num_key_value_heads\": 8, \"pretraining_tp\": 1,\n"
    " \"rms_norm_eps\": 1e-05, \"rope_scaling\": {\"factor\": 32.0, \"high_freq_factor\": 4.0, \"low_freq_factor\": 1.0,\n"
    " \"original_max_position_embeddings\": 8192, \"rope_type\": \"llama3\"}, \"rope_theta\": 500000.0,\n"
    " \"tie_word_embeddings\": true, \"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.45.0.dev0\",\n"
    " \"use_cache\": true, \"vocab_size\": 128256}\n";

/* Write config.json into the checkpoint directory, load `model:\n  model_name_or_path: CKPT\n`
 * + extra model lines + DATA + TRAINING. */
static int load_hf(const char *json, const char *extra, mx_config *c, mx_diag *diag) {
    if (json) mxt_write_text(ckpt_json, json);
    char yaml[4096];
    snprintf(yaml, sizeof yaml, "model:\n  model_name_or_path: %s\n%s" DATA TRAINING, ckpt, extra);
    return load(yaml, c, diag);
}

static void test_hf_config(void) {
    setup();
    mx_config c;
    mx_diag diag = {{0}};
    char want[512];
    /* The whole file as it is: a 48-layer, 128-expert model. */
    int rc = load_hf(qwen3_30b_a3b, "", &c, &diag);
    CHECK_EQ_INT(rc, 0);
    if (rc) printf("    %s\n", diag.msg);
    const mx_model_config *m = &c.model;
    CHECK_EQ_INT(m->type, MX_MODEL_QWEN3_MOE);
    CHECK_EQ_INT(m->vocab_size, 151936);
    CHECK_EQ_INT(m->hidden_size, 2048);
    CHECK_EQ_INT(m->intermediate_size, 6144);
    CHECK_EQ_INT(m->num_hidden_layers, 48);
    CHECK_EQ_INT(m->num_attention_heads, 32);
    CHECK_EQ_INT(m->num_key_value_heads, 4);
    CHECK_EQ_INT(m->head_dim, 128);
    CHECK_EQ_DBL(m->rms_norm_eps, 1e-6f);
    CHECK_EQ_DBL(m->rope_theta, 1e6f);
    CHECK_EQ_INT(m->max_position_embeddings, 40960);
    CHECK_EQ_INT(m->num_experts, 128);
    CHECK_EQ_INT(m->num_experts_per_tok, 8);
    CHECK_EQ_INT(m->moe_intermediate_size, 768);
    CHECK(m->norm_topk_prob);
    CHECK_EQ_DBL(m->router_aux_loss_coef, 0.001f);
    CHECK(mx_model_layer_is_moe(m, 47));
    CHECK_STR_EQ(c.model_name_or_path, ckpt);
    CHECK_STR_EQ(c.hf_config_path, ckpt_json);
    CHECK_STR_EQ(origin(&c, "model.vocab_size"), ckpt_json);
    CHECK_STR_EQ(origin(&c, "model.model_name_or_path"), "cfg.yaml:2");
    snprintf(want, sizeof want, "'%s'", ckpt);
    CHECK_STR_EQ(value(&c, "model.model_name_or_path"), want);
    mx_config_free(&c);

    /* Inline keys next to model_name_or_path override config.json's: a small model of the
     * same shape of family, and null back to a default. */
    rc = load_hf(qwen3_30b_a3b,
                 "  num_hidden_layers: 2\n"     /* 3 */
                 "  hidden_size: 64\n"          /* 4 */
                 "  head_dim: 16\n"             /* 5 */
                 "  num_experts: 8\n"           /* 6 */
                 "  num_experts_per_tok: 2\n"   /* 7 */
                 "  moe_intermediate_size: 32\n" /* 8 */
                 "  intermediate_size: 128\n"   /* 9 */
                 "  vocab_size: 257\n"          /* 10 */
                 "  max_position_embeddings: 128\n" /* 11 */
                 "  mlp_only_layers: [1]\n",    /* 12 */
                 &c, &diag);
    CHECK_EQ_INT(rc, 0);
    if (rc) printf("    %s\n", diag.msg);
    CHECK_EQ_INT(m->num_hidden_layers, 2);
    CHECK_EQ_INT(m->hidden_size, 64);
    CHECK_EQ_INT(m->head_dim, 16);
    CHECK_EQ_INT(m->num_experts, 8);
    CHECK_EQ_INT(m->num_experts_per_tok, 2);
    CHECK_EQ_INT(m->moe_intermediate_size, 32);
    CHECK_EQ_INT(m->vocab_size, 257);
    CHECK_EQ_INT(m->num_attention_heads, 32); /* from config.json */
    CHECK_EQ_INT(m->num_key_value_heads, 4);
    CHECK(m->norm_topk_prob);
    CHECK(mx_model_layer_is_moe(m, 0) && !mx_model_layer_is_moe(m, 1));
    CHECK_STR_EQ(origin(&c, "model.hidden_size"), "cfg.yaml:4");
    CHECK_STR_EQ(origin(&c, "model.num_attention_heads"), ckpt_json);
    CHECK_STR_EQ(origin(&c, "model.rope_theta"), ckpt_json);
    CHECK_STR_EQ(origin(&c, "model.mlp_only_layers"), "cfg.yaml:12");
    CHECK_STR_EQ(origin(&c, "training.seed"), "default");
    mx_config_free(&c);

    /* A Llama 3.2 config.json: its llama3 RoPE scaling is refused, naming the file, the key
     * and the value; overriding it inline with null makes the rest usable. */
    rc = load_hf(llama32_1b, "", &c, &diag);
    CHECK_EQ_INT(rc, MX_ECONFIG);
    snprintf(want, sizeof want, "%s: rope_scaling.rope_type: 'llama3' cannot be honoured: mxtrain implements plain RoPE "
             "(allowed: 'default')", ckpt_json);
    CHECK_STR_EQ(diag.msg, want);
    CHECK(is_empty(&c));
    rc = load_hf(NULL, "  rope_scaling: null\n", &c, &diag);
    CHECK_EQ_INT(rc, 0);
    if (rc) printf("    %s\n", diag.msg);
    CHECK_EQ_INT(c.model.type, MX_MODEL_LLAMA);
    CHECK_EQ_DBL(c.model.rope_theta, 500000.0f);
    CHECK_EQ_INT(c.model.head_dim, 64);
    CHECK(c.model.tie_word_embeddings);
    CHECK_EQ_DBL(c.model.rms_norm_eps, 1e-5f);
    mx_config_free(&c);

    /* model_name_or_path may name the config.json itself. */
    {
        char yaml[1024];
        snprintf(yaml, sizeof yaml, "model:\n  model_name_or_path: %s\n  rope_scaling: ~\n" DATA TRAINING, ckpt_json);
        CHECK_EQ_INT(load(yaml, &c, &diag), 0);
        CHECK_STR_EQ(c.hf_config_path, ckpt_json);
        mx_config_free(&c);
    }

    /* transformers 5 writes rope_theta inside rope_parameters; num_local_experts is
     * Mixtral's name for num_experts. */
    rc = load_hf("{\"model_type\": \"qwen3_moe\", \"vocab_size\": 300, \"hidden_size\": 64, \"intermediate_size\": 96,"
                 " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_local_experts\": 4,"
                 " \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 32,"
                 " \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 12345.0},"
                 " \"dtype\": \"bfloat16\", \"id2label\": {\"0\": \"LABEL_0\"}, \"layer_types\": [\"full_attention\","
                 " \"full_attention\"]}",
                 "", &c, &diag);
    CHECK_EQ_INT(rc, 0);
    if (rc) printf("    %s\n", diag.msg);
    CHECK_EQ_DBL(c.model.rope_theta, 12345.0f);
    CHECK_STR_EQ(origin(&c, "model.rope_theta"), ckpt_json);
    CHECK_EQ_INT(c.model.num_experts, 4);
    CHECK_EQ_INT(c.model.head_dim, 16);
    CHECK_EQ_INT(c.model.max_position_embeddings, 32768); /* Qwen3MoeConfig's default */
    mx_config_free(&c);
    /* ... and an inline rope_theta overrides it. */
    rc = load_hf(NULL, "  rope_theta: 500.0\n", &c, &diag);
    CHECK_EQ_INT(rc, 0);
    CHECK_EQ_DBL(c.model.rope_theta, 500.0f);
    CHECK_STR_EQ(origin(&c, "model.rope_theta"), "cfg.yaml:3");
    mx_config_free(&c);

    /* Errors inside config.json name the file and the key as written there. */
    static const struct {
        const char *json;
        const char *extra;
        int rc;
        const char *sub; /* after "CKPT/config.json: " */
    } bad[] = {
        {"{\"model_type\": \"llama\", \"hidden_act\": \"gelu\"}", "", MX_ECONFIG,
         "hidden_act: 'gelu' cannot be honoured: mxtrain's MLPs are SwiGLU (allowed: 'silu')"},
        {"{\"model_type\": \"llama\", \"attention_dropout\": 0.1}", "", MX_ECONFIG,
         "attention_dropout: 0.1 (a number) cannot be honoured"},
        {"{\"model_type\": \"qwen3\", \"use_sliding_window\": true}", "", MX_ECONFIG,
         "use_sliding_window: true (a boolean) cannot be honoured"},
        {"{\"model_type\": \"llama\", \"quantization_config\": {\"quant_method\": \"awq\"}}", "", MX_ECONFIG,
         "quantization_config: unknown key (allowed: model_type, vocab_size,"},
        {"{\"model_type\": \"llama\", \"hidden_sise\": 64}", "", MX_ECONFIG,
         "hidden_sise: unknown key; did you mean 'hidden_size'?"},
        {"{\"model_type\": \"llama\", \"hidden_size\": 2048.0}", "", MX_ECONFIG,
         "hidden_size: 2048.0 (a number) is not an integer (allowed: an integer >= 1)"},
        {"{\"model_type\": \"llama\", \"hidden_size\": \"2048\"}", "", MX_ECONFIG,
         "hidden_size: '2048' is not an integer"},
        {"{\"model_type\": \"llama\", \"rms_norm_eps\": -1e-06}", "", MX_ECONFIG,
         "rms_norm_eps: -1e-06 is out of range (allowed: a number > 0)"},
        {"{\"model_type\": \"gpt_neox\"}", "", MX_ECONFIG,
         "model_type: 'gpt_neox' is not allowed (allowed: 'llama', 'qwen3', 'qwen3_moe')"},
        {"{\"model_type\": \"llama\", \"num_experts\": 8}", "", MX_ECONFIG,
         "num_experts: given for model_type llama, but it applies only to qwen3_moe"},
        {"{\"model_type\": \"qwen3_moe\", \"num_experts\": 8, \"num_local_experts\": 16}", "", MX_ECONFIG,
         "num_local_experts: given together with its alias num_experts, with another value"},
        {"{\"model_type\": \"qwen3_moe\", \"rope_theta\": 1000.0, \"rope_parameters\": {\"rope_theta\": 2000.0}}", "",
         MX_ECONFIG, "rope_parameters: its rope_theta 2000 disagrees with rope_theta 1000 (from "},
        {"{\"model_type\": \"qwen3_moe\", \"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": 4}}", "",
         MX_ECONFIG, "rope_parameters.rope_type: 'yarn' cannot be honoured"},
        {"{\"model_type\": \"qwen3_moe\", \"mlp_only_layers\": [0, 300]}", "", MX_ECONFIG,
         "mlp_only_layers[1]: 300 is out of range"},
        {"[1, 2]", "", MX_ECONFIG, "the file holds a list, not a JSON object of model keys"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int before = mxt_current_failures();
        rc = load_hf(bad[i].json, bad[i].extra, &c, &diag);
        CHECK_EQ_INT(rc, bad[i].rc);
        snprintf(want, sizeof want, "%s: %s", ckpt_json, bad[i].sub);
        CHECK_STR_CONTAINS(diag.msg, want);
        CHECK(is_empty(&c));
        if (mxt_current_failures() != before) printf("    (json case %zu: %s)\n", i, diag.msg);
    }

    /* A key missing from both files; a broken file; no file. */
    rc = load_hf("{\"model_type\": \"llama\", \"hidden_size\": 64, \"intermediate_size\": 96, \"num_hidden_layers\": 2,"
                 " \"num_attention_heads\": 4}",
                 "", &c, &diag);
    CHECK_EQ_INT(rc, MX_ECONFIG);
    snprintf(want, sizeof want, "cfg.yaml:1: model.vocab_size: required key missing, both here and in %s (allowed: an "
             "integer >= 1)", ckpt_json);
    CHECK_STR_EQ(diag.msg, want);
    rc = load_hf("{\"model_type\": \"llama\",\n \"hidden_size\": 64,,}", "", &c, &diag);
    CHECK_EQ_INT(rc, MX_ECONFIG);
    snprintf(want, sizeof want, "%s:2:", ckpt_json);
    CHECK_STR_CONTAINS(diag.msg, want);
    CHECK_STR_CONTAINS(diag.msg, "invalid JSON");
    CHECK_STR_CONTAINS(diag.msg, "(read for model.model_name_or_path, cfg.yaml:2)");
    rc = load_hf("{\"model_type\": \"llama\", \"hidden_size\": 64, \"hidden_size\": 65}", "", &c, &diag);
    CHECK_EQ_INT(rc, MX_ECONFIG);
    CHECK_STR_CONTAINS(diag.msg, "duplicate");
    unlink(ckpt_json);
    rc = load_hf(NULL, "", &c, &diag);
    CHECK_EQ_INT(rc, MX_EIO);
    snprintf(want, sizeof want, "cfg.yaml:2: model.model_name_or_path: cannot read %s: No such file or directory "
             "(allowed: a local directory holding a Hugging Face config.json", ckpt_json);
    CHECK_STR_CONTAINS(diag.msg, want);
    CHECK(is_empty(&c));
    rc = load("model:\n  model_name_or_path: Qwen/Qwen3-30B-A3B\n" DATA TRAINING, &c, &diag);
    CHECK_EQ_INT(rc, MX_EIO);
    CHECK_STR_CONTAINS(diag.msg, "model.model_name_or_path: cannot read Qwen/Qwen3-30B-A3B: No such file or directory");
    CHECK_STR_CONTAINS(diag.msg, "nothing is downloaded");
    rc = load("model:\n  model_name_or_path: 5\n" DATA TRAINING, &c, &diag);
    CHECK_EQ_INT(rc, MX_ECONFIG);
    CHECK_STR_CONTAINS(diag.msg, "cfg.yaml:2: model.model_name_or_path: 5 (an integer) is not a path");
    teardown();
}

/* Found by fuzzing (tests/fuzz/regressions/config/, hf_config/): a rope_parameters key with
 * newlines, and jansson's text for a broken config.json (which quotes the input, here a
 * carriage return), went into the message raw. */
static void test_messages_one_line(void) {
    setup();
    mx_config c;
    mx_diag diag = {{0}};
    char want[512];
    int rc = load(MODEL_LLAMA "  rope_parameters: {\"v\\n\\nx\": 1}\n" DATA TRAINING, &c, &diag);
    CHECK_EQ_INT(rc, MX_ECONFIG);
    CHECK_STR_EQ(diag.msg, "cfg.yaml:8: model.rope_parameters.v\\n\\nx: this key cannot be honoured: mxtrain "
                           "implements plain RoPE (allowed: rope_type 'default' and rope_theta)");
    rc = load_hf("{\"m\\\r\": \"q\"}", "", &c, &diag);
    CHECK_EQ_INT(rc, MX_ECONFIG);
    snprintf(want, sizeof want, "%s:1:5: invalid JSON: invalid escape near '\"m\\\\r' (read for "
             "model.model_name_or_path, cfg.yaml:2)", ckpt_json);
    CHECK_STR_EQ(diag.msg, want);
    teardown();
}

static const mxt_test tests[] = {
    {"overrides", test_overrides},
    {"load_file", test_load_file},
    {"hf_config", test_hf_config},
    {"messages_one_line", test_messages_one_line},
};

int main(int argc, char **argv) { return MXT_RUN(tests, argc, argv); }
