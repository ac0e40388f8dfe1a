/* Internal: what the files of the config loader share (see config.c for the phases).
 *   config_keys.c      the key table: every key's path, type, range and field; lookups
 *   config_errors.c    how an error reads and where it points
 *   config_collect.c   phase 1: the YAML file's keys, then config.json's
 *   config_overrides.c phase 1: the command line's settings over the file's
 *   config_defaults.c  phase 2: the defaults, the model's per model_type
 *   config_convert.c   phase 3: each collected value, typed and range-checked
 *   config_check.c     phase 4: required keys, derived values, checks across keys
 *   config_settings.c  settings by name: values and origins, for printing */
#ifndef MXI_CONFIG_INTERNAL_H
#define MXI_CONFIG_INTERNAL_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>

#include "config/value.h"
#include "core/text.h"
#include "mxtrain/config.h"

/* ---- The keys (config_keys.c) ------------------------------------------------------------ */

typedef enum {
    MXI_KEY_SECTION,      /* a mapping of further keys */
    MXI_KEY_QPLAN,        /* training.quantization_plan: handed to the plan loader */
    MXI_KEY_HFDIR,        /* model.model_name_or_path */
    MXI_KEY_INT,          /* int, lo..hi */
    MXI_KEY_SEED,         /* uint64_t, 0..2^63-1 */
    MXI_KEY_F32,          /* float, lo..hi (open ends by flags) */
    MXI_KEY_F64,          /* double, lo..hi */
    MXI_KEY_BOOL,         /* bool */
    MXI_KEY_STR,          /* char *: a non-empty path */
    MXI_KEY_PATHS,        /* char ** + int count: a path or glob, or a list of them */
    MXI_KEY_CHOICE,       /* an enum stored as int, from choices */
    MXI_KEY_PATTERNS,     /* mx_plan_pattern * + int count */
    MXI_KEY_LAYERS,       /* model.mlp_only_layers: bool[MX_MAX_LAYERS] */
    MXI_KEY_FSDP_SIZE,    /* a group size: a positive int, or `auto` (stored as 0) */
    /* Hugging Face keys that only have one value mxtrain can honour; nothing is stored. */
    MXI_KEY_MUST_SILU,    /* hidden_act */
    MXI_KEY_MUST_ZERO,    /* attention_dropout */
    MXI_KEY_MUST_FALSE,   /* use_sliding_window, mlp_bias */
    MXI_KEY_ROPE_SCALING, /* null, or {rope_type: default} */
    MXI_KEY_ROPE_PARAMS,  /* {rope_type: default, rope_theta: X}: transformers 5's spelling of rope_theta */
    MXI_KEY_LAYER_TYPES,  /* a list of 'full_attention' */
} mxi_key_type;

/* mxi_key_def.flags */
enum {
    MXI_FLAG_REQUIRED = 1 << 0,  /* no default: missing is an error */
    MXI_FLAG_NULLABLE = 1 << 1,  /* null means "the default" */
    MXI_FLAG_MOE = 1 << 2,       /* only for model_type qwen3_moe */
    MXI_FLAG_LO_OPEN = 1 << 3,   /* value > lo rather than >= lo */
    MXI_FLAG_HI_OPEN = 1 << 4,   /* value < hi rather than <= hi */
    MXI_FLAG_HIDDEN = 1 << 5,    /* accepted but not a setting: not listed, no value to print */
    MXI_FLAG_YAML_ONLY = 1 << 6, /* not a config.json key */
};

/* An MXI_KEY_INT's hi when it has no upper bound but the int's. */
#define MXI_KEY_NO_MAX ((double)INT_MAX)

typedef struct {
    const char *text;
    int value;
} mxi_key_choice;

typedef struct {
    const char *path;      /* dotted path; the last component is the key */
    const char *alias;     /* another accepted spelling of the key, or NULL */
    mxi_key_type type;
    size_t off;            /* offset of the field in mx_config */
    size_t count_off;      /* MXI_KEY_PATHS, MXI_KEY_PATTERNS: offset of the int holding the count */
    size_t weights_off;    /* MXI_KEY_PATHS: offset of the double * of a blend's weights */
    double lo, hi;         /* range of MXI_KEY_INT, MXI_KEY_F32, MXI_KEY_F64 */
    unsigned flags;
    const mxi_key_choice *choices; /* MXI_KEY_CHOICE, NULL-terminated; aliases map to the same value */
    const char *allowed;   /* the "(allowed: ...)" text, when not derived from the type */
} mxi_key_def;

/* Every key, sections before their keys; a key's id is its index, which also indexes
 * mx_config.origins. */
extern const mxi_key_def mxi_keys[];
extern const int mxi_n_keys;

/* The last component of key id's path. */
const char *mxi_key_name(int id);
/* The section holding key id, -1 for a top-level key. */
int mxi_key_parent(int id);
/* The id of a dotted path, or -1. */
int mxi_key_find(const char *path);
/* The child of section named text[0..len) (its name or alias), or -1; json: among the keys
 * a config.json may give. */
int mxi_key_child(int section, const char *text, size_t len, bool json);
/* "a, b (alias c), ..." for the keys of a section that are settings. Returns buf. */
const char *mxi_key_list(int section, bool json, char *buf, size_t size);
/* The "(allowed: ...)" text of a key. Returns buf, or the key's own text. */
const char *mxi_key_allowed(int id, char *buf, size_t size);
/* "; did you mean 'X'?" for an unknown key of section, or "". Returns buf. */
const char *mxi_key_suggest(int section, const char *key, size_t len, bool json, char *buf, size_t size);
/* Whether a config.json key is one mxtrain ignores (bookkeeping, generation settings). */
bool mxi_key_hf_ignored(const char *name);
/* model.model_type's text for a type. */
const char *mxi_key_model_type(mx_model_type type);

/* ---- The loader -------------------------------------------------------------------------- */

/* One key's value as collected, before conversion. */
typedef struct {
    bool set;
    mxi_value v;
    const yaml_node_t *key; /* the YAML key node; NULL for a config.json value or an override */
    const char *written;    /* the key as written: its name or its alias */
    bool cli;               /* given on the command line (mx_config_load_with) */
} mxi_slot;

typedef struct {
    const char *source;
    mx_diag *diag;
    yaml_document_t *doc;
    json_t *json;           /* model_name_or_path's config.json */
    mx_config *cfg;
    mxi_slot slots[MX_CONFIG_MAX_KEYS];   /* by key id */
    int order[MX_CONFIG_MAX_KEYS];        /* collected keys, in file order (YAML first, then config.json) */
    int n_order;
    double rope_params_theta; /* rope_parameters.rope_theta, NAN when not given */
    const mx_config_override *overrides;
    int n_overrides;
    yaml_document_t *override_docs; /* (n_overrides): each value, parsed */
    int n_override_docs;
} mxi_loader;

/* Message buffers: a described value, a key path, a list of keys or allowed values. */
#define MXI_DESC_SIZE (MXI_QUOTE_SIZE + 32)
#define MXI_PATH_SIZE 256
#define MXI_LIST_SIZE 900

/* ---- Errors (config_errors.c): each fills ld->diag with one line and returns code ------- */

/* An error about a value, at the value. */
int mxi_fail_value(const mxi_loader *ld, int code, mxi_value v, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* An error at a YAML node (a key). */
int mxi_fail_node(const mxi_loader *ld, int code, const yaml_node_t *node, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* An error about the final value of key id, wherever it came from: the key's line, the
 * config.json, or (for a default) the line of its section. */
int mxi_fail_key(const mxi_loader *ld, int code, int id, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* MX_ENOMEM: "SOURCE: out of memory loading the config (BYTES bytes for WHAT)"; bytes 0
 * where the size is not known (the parenthesis then says what was being made). */
int mxi_fail_oom(const mxi_loader *ld, size_t bytes, const char *what);
/* " (line 7)", " (from DIR/config.json)", " (default for qwen3_moe)" or " (default)": where
 * a value quoted in a message about another key came from. Returns buf. */
const char *mxi_origin_note(const mxi_loader *ld, int id, char *buf, size_t size);

/* ---- The phases -------------------------------------------------------------------------- */

/* 1. Walk a YAML mapping (the root when section is -1) against the table. */
int mxi_config_collect_yaml(mxi_loader *ld, int section, const yaml_node_t *map);
/* 1. The command line's settings (ld->overrides) over the file's. */
int mxi_config_overrides(mxi_loader *ld);
/* 1. model.model_name_or_path: find and read the config.json, and collect its keys. */
int mxi_config_hf(mxi_loader *ld);

/* 2. Everything but the model (whose defaults depend on model_type). MX_ENOMEM or 0. */
int mxi_config_defaults(mx_config *cfg);
/* 2. Hugging Face's defaults for a model type. */
void mxi_config_model_defaults(mx_model_config *m, mx_model_type type);

/* 3. Convert the collected value of key id into its field. */
int mxi_config_convert(mxi_loader *ld, int id);
/* 3. A choice key's value, as its stored int. */
int mxi_config_choice(mxi_loader *ld, int id, mxi_value v, int *out);
void mxi_config_free_strings(char **list, int n);

/* 4. The first required key missing, as an error. */
int mxi_config_check_required(mxi_loader *ld);
/* 4. Once every value is converted: derived values, required keys, checks across keys. */
int mxi_config_check(mxi_loader *ld);

#endif
