/* What the config tests share (test_config*.c): loading a config from text, reading a key's
 * value and origin back as text, and the lines of a minimal valid config. */
#ifndef MXT_CONFIG_CASES_H
#define MXT_CONFIG_CASES_H

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "harness.h"
#include "mxtrain/config.h"

static inline int load(const char *yaml, mx_config *cfg, mx_diag *diag) {
    return mx_config_load_string(yaml, "cfg.yaml", cfg, diag);
}

static inline bool is_empty(const mx_config *cfg) {
    static const mx_config zero;
    return memcmp(cfg, &zero, sizeof zero) == 0;
}

/* The origin of a key as text ("cfg.yaml:4", ".../config.json", "default"). */
static inline const char *origin(const mx_config *cfg, const char *key) {
    static char buf[512];
    if (mx_config_format_origin(cfg, key, buf, sizeof buf) < 0) snprintf(buf, sizeof buf, "(error)");
    return buf;
}

static inline const char *value(const mx_config *cfg, const char *key) {
    static char buf[512];
    if (mx_config_format_value(cfg, key, buf, sizeof buf) < 0) snprintf(buf, sizeof buf, "(error)");
    return buf;
}

/* A minimal valid config: model lines 1-7, data 8-10, training 11-14. */
#define MODEL_LLAMA                  \
    "model:\n"                       \
    "  model_type: llama\n"          \
    "  vocab_size: 257\n"            \
    "  hidden_size: 64\n"            \
    "  intermediate_size: 192\n"     \
    "  num_hidden_layers: 2\n"       \
    "  num_attention_heads: 4\n"
#define DATA                         \
    "data:\n"                        \
    "  data_path: data/train_*.bin\n" \
    "  seq_length: 64\n"
#define TRAINING                     \
    "training:\n"                    \
    "  micro_batch_size: 2\n"        \
    "  train_iters: 10\n"            \
    "  lr: 0.001\n"
#define MINIMAL MODEL_LLAMA DATA TRAINING

/* The same model lines for qwen3_moe (lines 1-7). */
#define MODEL_MOE                    \
    "model:\n"                       \
    "  model_type: qwen3_moe\n"      \
    "  vocab_size: 257\n"            \
    "  hidden_size: 64\n"            \
    "  intermediate_size: 192\n"     \
    "  num_hidden_layers: 2\n"       \
    "  num_attention_heads: 4\n"

/* The seed's block, verbatim. */
#define SEED_BLOCK                                                      \
    "  quantization_plan:\n"                                            \
    "    recipe_name: mxfp8\n"                                          \
    "    apply_modules: ['model.layers.{*}']\n"                         \
    "    ignored_modules: ['*lm_head', '*gate']\n"                      \
    "    quant_converters: ['quantize.linear.mx', 'quantize.moe.mx']\n" \
    "    enable_fsdp_low_precision_all_gather: True\n"                  \
    "    fsdp_low_precision_all_gather_mode: 'on-demand'\n"

#endif
