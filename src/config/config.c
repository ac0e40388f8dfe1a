/* The training configuration (SPEC §1): the whole YAML file, in MindSpeed MM's section layout,
 * with the model given inline under Hugging Face key names and/or read from a checkpoint's
 * config.json (model.model_name_or_path).
 *
 * Every key of the file is described once, in the key table (config_keys.c): its dotted
 * path, type, range and where it is stored. Loading runs in phases so that a value is judged
 * only once it is known which value wins and for which model type:
 *   1. collect: walk the YAML mappings against the table (unknown keys, duplicates, key +
 *      alias), put the command line's settings over them, then config.json's keys for those
 *      the YAML model section does not give (config_collect.c, config_overrides.c);
 *   2. model_type, then the per-type defaults (Hugging Face's) (config_defaults.c);
 *   3. convert every collected value, in file order (types and ranges) (config_convert.c);
 *   4. required keys, derived defaults, and checks across keys (config_check.c).
 * The first error stops the load with one line in diag (config_errors.c), and nothing is
 * returned. This file runs the phases over a document and holds the public entry points. */
#include "mxtrain/config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "config/config_internal.h"
#include "core/diag.h"
#include "core/file.h"
#include "core/text.h"
#include "plan/plan_yaml.h"

static int load_document(mxi_loader *ld) {
    char desc[MXI_DESC_SIZE];
    mx_config *cfg = ld->cfg;
    if (mxi_config_defaults(cfg)) return mxi_fail_oom(ld, 0, "the default module patterns");
    yaml_node_t *root = yaml_document_get_root_node(ld->doc);
    /* An empty file (only comments or `---`) is a config with nothing in it. */
    if (root && mxi_yaml_kind_of(root) != MXI_YAML_NULL) {
        if (root->type != YAML_MAPPING_NODE)
            return mxi_diag(ld->diag, MX_ECONFIG, "%s:%d: the config is %s, not a mapping of sections (allowed: model, "
                                                  "data, parallel, features, training)",
                            ld->source, mxi_yaml_line(root), mxi_yaml_describe(root, desc, sizeof desc));
        int rc = mxi_config_collect_yaml(ld, -1, root);
        if (rc) return rc;
    }
    int rc = mxi_config_overrides(ld);
    if (rc) return rc;
    rc = mxi_config_hf(ld);
    if (rc) return rc;
    /* Values are judged for a model type: without one, say what is missing. */
    int type_id = mxi_key_find("model.model_type");
    if (!ld->slots[type_id].set) return mxi_config_check_required(ld);
    int type;
    if ((rc = mxi_config_choice(ld, type_id, ld->slots[type_id].v, &type))) return rc;
    mxi_config_model_defaults(&cfg->model, (mx_model_type)type);
    for (int i = 0; i < ld->n_order; i++)
        if ((rc = mxi_config_convert(ld, ld->order[i]))) return rc;
    /* No quantization_plan block: the plan's defaults, quantization off. */
    if (!ld->slots[mxi_key_find("training.quantization_plan")].set &&
        (rc = mxi_plan_from_node(ld->doc, NULL, ld->source, &cfg->training.quantization_plan, ld->diag)))
        return rc;
    return mxi_config_check(ld);
}

void mx_config_free(mx_config *config) {
    if (!config) return;
    free(config->source);
    free(config->model_name_or_path);
    free(config->hf_config_path);
    mxi_config_free_strings(config->data.data_path, config->data.n_data_path);
    mxi_config_free_strings(config->data.val_data_path, config->data.n_val_data_path);
    free(config->data.data_weights);
    free(config->data.val_data_weights);
    mxi_plan_patterns_free(config->features.recompute_modules, config->features.n_recompute_modules);
    mxi_plan_patterns_free(config->parallel.ep_modules, config->parallel.n_ep_modules);
    free(config->training.save);
    free(config->data.tokenizer);
    free(config->training.load);
    free(config->training.metrics_path);
    free(config->training.plot_path);
    free(config->training.sample_prompt);
    mx_plan_free(&config->training.quantization_plan);
    memset(config, 0, sizeof *config);
}

static int load_buffer(const char *data, size_t len, const char *source, const mx_config_override *overrides,
                       int n_overrides, mx_config *out, mx_diag *diag) {
    yaml_document_t doc;
    int rc = mxi_yaml_load_one(data, len, source, &doc, diag);
    if (rc) return rc;
    mxi_loader *ld = rc ? NULL : calloc(1, sizeof *ld);
    mx_config *cfg = rc ? NULL : calloc(1, sizeof *cfg);
    if (!rc && (!ld || !cfg))
        rc = mxi_diag(diag, MX_ENOMEM, "%s: out of memory loading the config (%zu bytes)", source,
                      sizeof *ld + sizeof *cfg);
    if (!rc) {
        cfg->source = mxi_strndup(source, strlen(source));
        *ld = (mxi_loader){.source = source, .diag = diag, .doc = &doc, .cfg = cfg, .rope_params_theta = NAN,
                       .overrides = overrides, .n_overrides = n_overrides};
        rc = cfg->source ? load_document(ld) : mxi_fail_oom(ld, strlen(source) + 1, "its name");
        json_decref(ld->json);
        for (int i = 0; i < ld->n_override_docs; i++) yaml_document_delete(&ld->override_docs[i]);
        free(ld->override_docs);
        if (rc) mx_config_free(cfg);
        else *out = *cfg;
    }
    free(ld);
    free(cfg);
    yaml_document_delete(&doc);
    return rc;
}

int mx_config_load_string(const char *yaml, const char *source_name, mx_config *out, mx_diag *diag) {
    if (out) memset(out, 0, sizeof *out);
    if (!yaml || !out) return mxi_diag(diag, MX_ENULL, "mx_config_load_string: NULL argument");
    return load_buffer(yaml, strlen(yaml), source_name ? source_name : "<string>", NULL, 0, out, diag);
}

int mx_config_load(const char *path, mx_config *out, mx_diag *diag) {
    return mx_config_load_with(path, NULL, 0, out, diag);
}

int mx_config_load_with(const char *path, const mx_config_override *overrides, int n, mx_config *out, mx_diag *diag) {
    if (out) memset(out, 0, sizeof *out);
    if (!path || !out || (n > 0 && !overrides) || n < 0)
        return mxi_diag(diag, MX_ENULL, "mx_config_load: NULL argument");
    char *data;
    size_t len;
    int rc = mxi_read_input(path, "a YAML config file", MXI_MAX_CONFIG_BYTES, &data, &len, diag);
    if (rc) return rc;
    rc = load_buffer(data, len, path, overrides, n, out, diag);
    free(data);
    return rc;
}
