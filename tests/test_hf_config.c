/* Hugging Face config.json out and back: mx_hf_config_dumps writes every hyper-parameter, and
 * reading it back (as model.model_name_or_path would) gives the same model config, for each
 * model type with non-default values; floats are written in their shortest form. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "mxtrain/config.h"

static const char *const models[] = {
    "model: {model_type: llama, vocab_size: 300, hidden_size: 64, intermediate_size: 96, num_hidden_layers: 2,\n"
    "        num_attention_heads: 4, num_key_value_heads: 2, head_dim: 32, tie_word_embeddings: true,\n"
    "        attention_bias: true, rms_norm_eps: 1.0e-6, rope_theta: 500000.0, initializer_range: 0.01,\n"
    "        max_position_embeddings: 64}\n",
    "model: {model_type: qwen3, vocab_size: 100, hidden_size: 48, intermediate_size: 80, num_hidden_layers: 3,\n"
    "        num_attention_heads: 3, num_key_value_heads: 1, rms_norm_eps: 3.0e-7, max_position_embeddings: 32}\n",
    "model: {model_type: qwen3_moe, vocab_size: 257, hidden_size: 64, intermediate_size: 192, num_hidden_layers: 5,\n"
    "        num_attention_heads: 4, num_key_value_heads: 2, head_dim: 16, max_position_embeddings: 256,\n"
    "        rope_theta: 1000000.0, num_experts: 8, num_experts_per_tok: 3, moe_intermediate_size: 40,\n"
    "        norm_topk_prob: true, decoder_sparse_step: 2, mlp_only_layers: [0, 3], output_router_logits: true,\n"
    "        router_aux_loss_coef: 0.001}\n",
};

static void check_same(const mx_model_config *a, const mx_model_config *b) {
    CHECK_EQ_INT(a->type, b->type);
    CHECK_EQ_INT(a->vocab_size, b->vocab_size);
    CHECK_EQ_INT(a->hidden_size, b->hidden_size);
    CHECK_EQ_INT(a->intermediate_size, b->intermediate_size);
    CHECK_EQ_INT(a->num_hidden_layers, b->num_hidden_layers);
    CHECK_EQ_INT(a->num_attention_heads, b->num_attention_heads);
    CHECK_EQ_INT(a->num_key_value_heads, b->num_key_value_heads);
    CHECK_EQ_INT(a->head_dim, b->head_dim);
    CHECK_EQ_DBL(a->rms_norm_eps, b->rms_norm_eps);
    CHECK_EQ_DBL(a->rope_theta, b->rope_theta);
    CHECK_EQ_INT(a->max_position_embeddings, b->max_position_embeddings);
    CHECK_EQ_INT(a->tie_word_embeddings, b->tie_word_embeddings);
    CHECK_EQ_INT(a->attention_bias, b->attention_bias);
    CHECK_EQ_DBL(a->initializer_range, b->initializer_range);
    CHECK_EQ_INT(a->num_experts, b->num_experts);
    CHECK_EQ_INT(a->num_experts_per_tok, b->num_experts_per_tok);
    CHECK_EQ_INT(a->moe_intermediate_size, b->moe_intermediate_size);
    CHECK_EQ_INT(a->norm_topk_prob, b->norm_topk_prob);
    CHECK_EQ_INT(a->decoder_sparse_step, b->decoder_sparse_step);
    CHECK(memcmp(a->mlp_only_layers, b->mlp_only_layers, sizeof a->mlp_only_layers) == 0);
    CHECK_EQ_INT(a->output_router_logits, b->output_router_logits);
    CHECK_EQ_DBL(a->router_aux_loss_coef, b->router_aux_loss_coef);
}

static void test_round_trip(void) {
    const char *dir = mxt_tmp_mkdir("hf");
    char path[600];
    snprintf(path, sizeof path, "%s/config.json", dir);
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        char yaml[2048];
        snprintf(yaml, sizeof yaml, "%sdata: {data_path: x, seq_length: 8}\ntraining: {micro_batch_size: 1, lr: 1, "
                 "train_iters: 1}\n", models[i]);
        mx_config cfg;
        mx_diag diag = {{0}};
        int rc = mx_config_load_string(yaml, "model.yaml", &cfg, &diag);
        CHECK_EQ_INT(rc, 0);
        if (rc) {
            mxt_fail(__FILE__, __LINE__, "%s", diag.msg);
            continue;
        }
        CHECK_EQ_INT(mx_hf_config_save(&cfg.model, "float32", path, &diag), 0);
        mx_model_config back;
        memset(&back, 0xAB, sizeof back);
        rc = mx_hf_config_load(dir, &back, &diag);
        CHECK_EQ_INT(rc, 0);
        if (rc) mxt_fail(__FILE__, __LINE__, "%s", diag.msg);
        else check_same(&cfg.model, &back);
        mx_config_free(&cfg);
    }
    // shortest forms, as transformers writes them
    char *text = NULL;
    mx_config cfg;
    mx_diag diag = {{0}};
    char yaml[2048];
    snprintf(yaml, sizeof yaml, "%sdata: {data_path: x, seq_length: 8}\ntraining: {micro_batch_size: 1, lr: 1, "
             "train_iters: 1}\n", models[2]);
    CHECK_EQ_INT(mx_config_load_string(yaml, "model.yaml", &cfg, &diag), 0);
    CHECK_EQ_INT(mx_hf_config_dumps(&cfg.model, "bfloat16", &text, &diag), 0);
    CHECK_STR_CONTAINS(text, "\"rms_norm_eps\": 1e-06,");
    CHECK_STR_CONTAINS(text, "\"rope_theta\": 1000000.0,");
    CHECK_STR_CONTAINS(text, "\"router_aux_loss_coef\": 0.001,");
    CHECK_STR_CONTAINS(text, "\"mlp_only_layers\": [0, 3],");
    CHECK_STR_CONTAINS(text, "\"architectures\": [\n    \"Qwen3MoeForCausalLM\"\n  ],");
    CHECK_STR_CONTAINS(text, "\"torch_dtype\": \"bfloat16\",");
    free(text);
    mx_config_free(&cfg);
    // a directory without one: the loader's message, naming the file
    unlink(path);
    mx_model_config back;
    CHECK_EQ_INT(mx_hf_config_load(dir, &back, &diag), MX_EIO);
    CHECK_STR_CONTAINS(diag.msg, "config.json");
}

static const mxt_test tests[] = {
    {"round_trip", test_round_trip},
};

int main(int argc, char **argv) { return MXT_RUN(tests, argc, argv); }
