/* Hugging Face config.json files (see mx_hf_config_load / mx_hf_config_save in config.h):
 * read through the config loader, so that a model directory is judged exactly as
 * model.model_name_or_path is; written with every hyper-parameter the model uses, under
 * the names of transformers' LlamaConfig, Qwen3Config and Qwen3MoeConfig. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/diag.h"
#include "io/io_internal.h"
#include "mxtrain/config.h"

/* A YAML double-quoted scalar of s. */
static void yaml_quote(char *out, size_t size, const char *s) {
    size_t o = 0;
    if (size < 3) return;
    out[o++] = '"';
    for (; *s && o + 3 < size; s++) {
        if (*s == '"' || *s == '\\') out[o++] = '\\';
        out[o++] = *s;
    }
    out[o++] = '"';
    out[o] = '\0';
}

int mx_hf_config_load(const char *path, mx_model_config *out, mx_diag *diag) {
    if (!path || !out) return mxi_diag(diag, MX_ENULL, "mx_hf_config_load: NULL argument");
    // the smallest training config around model_name_or_path: the model keys all come from
    // the config.json, checked as a training config would check them
    char quoted[4200], yaml[4600], file[4200];
    if (strlen(path) > 4000) return mxi_diag(diag, MX_EINVAL, "path too long: %s", path);
    struct stat st;
    bool dir = stat(path, &st) == 0 && S_ISDIR(st.st_mode);
    snprintf(file, sizeof file, "%s%s", path, dir ? "/config.json" : "");
    FILE *f = fopen(file, "rb");   // said here: the loader's message would name the YAML around it
    if (!f) return mxi_diag(diag, MX_EIO, "%s: cannot read (%s)", file, strerror(errno));
    fclose(f);
    yaml_quote(quoted, sizeof quoted, path);
    snprintf(yaml, sizeof yaml,
             "model: {model_name_or_path: %s}\n"
             "data: {data_path: unused, seq_length: 1}\n"
             "training: {micro_batch_size: 1, lr: 1, train_iters: 1}\n", quoted);
    mx_config cfg;
    int rc = mx_config_load_string(yaml, path, &cfg, diag);
    if (rc) return rc;
    *out = cfg.model;
    mx_config_free(&cfg);
    return MX_OK;
}

/* ---- writing ---- */

typedef struct {
    char text[16384];
    size_t used;
    bool overflow;
} json_buf;

static void put(json_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(json_buf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b->text + b->used, sizeof b->text - b->used, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof b->text - b->used) b->overflow = true;
    else b->used += (size_t)n;
}

/* The shortest decimal that reads back as the same float ("1e-06", "1000000.0", "0.02"). */
static void float_text(char *out, size_t size, float x) {
    if (x == floorf(x) && fabsf(x) < 1e15f) {
        snprintf(out, size, "%.1f", (double)x);
        return;
    }
    for (int p = 1; p <= 9; p++) {
        snprintf(out, size, "%.*g", p, (double)x);
        if (strtof(out, NULL) == x) return;
    }
}

static const char *const type_names[] = {"llama", "qwen3", "qwen3_moe"};
static const char *const architectures[] = {"LlamaForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM"};

int mx_hf_config_dumps(const mx_model_config *c, const char *torch_dtype, char **out, mx_diag *diag) {
    if (!c || !torch_dtype || !out) return mxi_diag(diag, MX_ENULL, "mx_hf_config_dumps: NULL argument");
    *out = NULL;
    if ((int)c->type < 0 || (int)c->type > 2) return mxi_diag(diag, MX_EENUM, "model_type %d is unknown", (int)c->type);
    json_buf *b = calloc(1, sizeof *b);
    if (!b) return mxi_diag(diag, MX_ENOMEM, "out of memory (%zu bytes for config.json)", sizeof *b);
    char eps[32], theta[32], init[32], coef[32];
    float_text(eps, sizeof eps, c->rms_norm_eps);
    float_text(theta, sizeof theta, c->rope_theta);
    float_text(init, sizeof init, c->initializer_range);
    float_text(coef, sizeof coef, c->router_aux_loss_coef);
    const char *tf[] = {"false", "true"};
    bool moe = c->type == MX_MODEL_QWEN3_MOE, qwen = c->type != MX_MODEL_LLAMA;
    // keys in sorted order, as transformers writes them
    put(b, "{\n  \"architectures\": [\n    \"%s\"\n  ],\n", architectures[c->type]);
    put(b, "  \"attention_bias\": %s,\n  \"attention_dropout\": 0.0,\n", tf[c->attention_bias]);
    if (moe) put(b, "  \"decoder_sparse_step\": %d,\n", c->decoder_sparse_step);
    put(b, "  \"head_dim\": %d,\n  \"hidden_act\": \"silu\",\n  \"hidden_size\": %d,\n", c->head_dim, c->hidden_size);
    put(b, "  \"initializer_range\": %s,\n  \"intermediate_size\": %d,\n", init, c->intermediate_size);
    put(b, "  \"max_position_embeddings\": %d,\n", c->max_position_embeddings);
    if (qwen) put(b, "  \"max_window_layers\": %d,\n", c->num_hidden_layers);
    if (c->type == MX_MODEL_LLAMA) put(b, "  \"mlp_bias\": false,\n");
    if (moe) {
        put(b, "  \"mlp_only_layers\": [");
        int n = 0;
        for (int l = 0; l < c->num_hidden_layers; l++)
            if (c->mlp_only_layers[l]) put(b, "%s%d", n++ ? ", " : "", l);
        put(b, "],\n  \"moe_intermediate_size\": %d,\n", c->moe_intermediate_size);
    }
    put(b, "  \"model_type\": \"%s\",\n", type_names[c->type]);
    if (moe) put(b, "  \"norm_topk_prob\": %s,\n", tf[c->norm_topk_prob]);
    put(b, "  \"num_attention_heads\": %d,\n", c->num_attention_heads);
    if (moe) put(b, "  \"num_experts\": %d,\n  \"num_experts_per_tok\": %d,\n", c->num_experts, c->num_experts_per_tok);
    put(b, "  \"num_hidden_layers\": %d,\n  \"num_key_value_heads\": %d,\n", c->num_hidden_layers,
        c->num_key_value_heads);
    if (moe) put(b, "  \"output_router_logits\": %s,\n", tf[c->output_router_logits]);
    if (c->type == MX_MODEL_LLAMA) put(b, "  \"pretraining_tp\": 1,\n");
    put(b, "  \"rms_norm_eps\": %s,\n  \"rope_scaling\": null,\n  \"rope_theta\": %s,\n", eps, theta);
    if (moe) put(b, "  \"router_aux_loss_coef\": %s,\n", coef);
    if (qwen) put(b, "  \"sliding_window\": null,\n");
    put(b, "  \"tie_word_embeddings\": %s,\n  \"torch_dtype\": \"%s\",\n  \"use_cache\": true,\n",
        tf[c->tie_word_embeddings], torch_dtype);
    if (qwen) put(b, "  \"use_sliding_window\": false,\n");
    put(b, "  \"vocab_size\": %d\n}\n", c->vocab_size);
    if (b->overflow) {
        free(b);
        return mxi_diag(diag, MX_ESIZE, "config.json: more than %zu bytes", sizeof b->text);
    }
    size_t len = strlen(b->text) + 1;
    *out = strdup(b->text);
    free(b);
    return *out ? MX_OK : mxi_diag(diag, MX_ENOMEM, "out of memory (%zu bytes for config.json)", len);
}

int mx_hf_config_save(const mx_model_config *c, const char *torch_dtype, const char *path, mx_diag *diag) {
    char *text = NULL;
    int rc = mx_hf_config_dumps(c, torch_dtype, &text, diag);
    if (rc) return rc;
    mxi_atomic a;
    rc = mxi_atomic_begin(&a, path, diag);
    if (!rc) rc = mxi_atomic_write(&a, text, strlen(text), diag);
    if (!rc) rc = mxi_atomic_commit(&a, diag);
    else mxi_atomic_abort(&a);
    free(text);
    return rc;
}
