/* Phase 1 of loading the config: collect each key's value, unconverted, into its slot: the
 * YAML file's mappings walked against the key table (unknown keys, duplicates, a key given
 * with its alias), then the keys of model.model_name_or_path's config.json that the YAML
 * model section does not give. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "config/config_internal.h"
#include "core/diag.h"
#include "core/file.h"
#include "core/text.h"

static void add_slot(mxi_loader *ld, int id, mxi_value v, const yaml_node_t *key, const char *written) {
    ld->slots[id] = (mxi_slot){.set = true, .v = v, .key = key, .written = written};
    ld->order[ld->n_order++] = id;
}

/* Walk a YAML mapping (the root when section is -1) against the table. */
int mxi_config_collect_yaml(mxi_loader *ld, int section, const yaml_node_t *map) {
    char desc[MXI_DESC_SIZE], key[MXI_QUOTE_SIZE], path[MXI_PATH_SIZE], hint[MXI_PATH_SIZE], list[MXI_LIST_SIZE];
    const char *where = section >= 0 ? mxi_keys[section].path : "the config";
    mxi_value mv = {.doc = ld->doc, .y = map};
    for (size_t i = 0; i < mxi_value_count(mv); i++) {
        mxi_value v;
        const yaml_node_t *k;
        const char *text = mxi_value_pair(mv, i, &v, &k);
        if (!text)
            return mxi_fail_node(ld, MX_ECONFIG, k, where, "%s is not a key (allowed: %s)",
                                 mxi_yaml_describe(k, desc, sizeof desc),
                                 mxi_key_list(section, false, list, sizeof list));
        size_t len = k->data.scalar.length;
        mxi_quote(key, sizeof key, text, len);
        snprintf(path, sizeof path, "%s%s%s", section >= 0 ? mxi_keys[section].path : "", section >= 0 ? "." : "", key);
        int id = mxi_key_child(section, text, len, false);
        if (id < 0) {
            if (!strcmp(text, "<<"))
                return mxi_fail_node(ld, MX_ECONFIG, k, path, "YAML merge keys are not supported; write the keys out "
                                                              "(allowed: %s)",
                                     mxi_key_list(section, false, list, sizeof list));
            return mxi_fail_node(ld, MX_ECONFIG, k, path, "unknown key%s (allowed: %s)",
                                 mxi_key_suggest(section, text, len, false, hint, sizeof hint),
                                 mxi_key_list(section, false, list, sizeof list));
        }
        mxi_slot *s = &ld->slots[id];
        if (s->set) {
            if (!strcmp(s->written, text))
                return mxi_fail_node(ld, MX_ECONFIG, k, path, "duplicate key (first given at line %d)",
                                     mxi_yaml_line(s->key));
            return mxi_fail_node(ld, MX_ECONFIG, k, path, "given together with its alias %s (line %d); keep one of "
                                 "them", s->written, mxi_yaml_line(s->key));
        }
        add_slot(ld, id, v, k, text);
        if (mxi_keys[id].type == MXI_KEY_SECTION) {
            if (v.y->type != YAML_MAPPING_NODE)
                return mxi_fail_value(ld, MX_ECONFIG, v, mxi_keys[id].path, "%s is not a mapping (allowed: %s)",
                                      mxi_value_describe(v, desc, sizeof desc), mxi_keys[id].allowed);
            int rc = mxi_config_collect_yaml(ld, id, v.y);
            if (rc) return rc;
        }
    }
    return 0;
}

/* config.json's keys, for every model key the YAML model section does not give. */
static int collect_json(mxi_loader *ld, int model) {
    char desc[MXI_DESC_SIZE], key[MXI_QUOTE_SIZE], hint[MXI_PATH_SIZE], list[MXI_LIST_SIZE];
    mxi_value root = {.j = ld->json};
    if (!json_is_object(ld->json))
        return mxi_diag(ld->diag, MX_ECONFIG, "%s: the file holds %s, not a JSON object of model keys",
                        ld->cfg->hf_config_path, mxi_value_describe(root, desc, sizeof desc));
    const char *name;
    json_t *value;
    json_object_foreach(ld->json, name, value) {
        if (mxi_key_hf_ignored(name)) continue;
        mxi_quote(key, sizeof key, name, strlen(name));
        int id = mxi_key_child(model, name, strlen(name), true);
        if (id < 0)
            return mxi_diag(ld->diag, MX_ECONFIG, "%s: %s: unknown key%s (allowed: %s; and Hugging Face bookkeeping "
                            "keys such as architectures, torch_dtype, bos_token_id, which are ignored)",
                            ld->cfg->hf_config_path, key,
                            mxi_key_suggest(model, name, strlen(name), true, hint, sizeof hint),
                            mxi_key_list(model, true, list, sizeof list));
        mxi_slot *s = &ld->slots[id];
        if (s->set && s->key) continue; /* the YAML model section overrides config.json */
        if (s->set) {
            if (json_equal(s->v.j, value)) continue;
            return mxi_diag(ld->diag, MX_ECONFIG, "%s: %s: given together with its alias %s, with another value; "
                                                  "keep one of them",
                            ld->cfg->hf_config_path, key, s->written);
        }
        add_slot(ld, id, (mxi_value){.j = value}, NULL, name);
    }
    return 0;
}

/* model.model_name_or_path: find and read the config.json. */
int mxi_config_hf(mxi_loader *ld) {
    char desc[MXI_DESC_SIZE];
    int id = mxi_key_find("model.model_name_or_path");
    const mxi_slot *s = &ld->slots[id];
    if (!s->set) return 0;
    const char *path = mxi_value_str(s->v);
    if (!path || !*path)
        return mxi_fail_value(ld, MX_ECONFIG, s->v, mxi_keys[id].path, "%s is not a path (allowed: %s)",
                              mxi_value_describe(s->v, desc, sizeof desc), mxi_keys[id].allowed);
    mx_config *cfg = ld->cfg;
    cfg->model_name_or_path = mxi_strndup(path, strlen(path));
    if (!cfg->model_name_or_path) return mxi_fail_oom(ld, strlen(path) + 1, mxi_keys[id].path);
    ld->cfg->origins[id] = s->cli ? (mx_origin){.kind = MX_ORIGIN_COMMAND_LINE}
                          : (mx_origin){.kind = MX_ORIGIN_YAML, .line = mxi_yaml_line(s->key)};
    struct stat st;
    bool dir = stat(path, &st) == 0 && S_ISDIR(st.st_mode);
    size_t n = strlen(path);
    cfg->hf_config_path = malloc(n + sizeof "/config.json");
    if (!cfg->hf_config_path) return mxi_fail_oom(ld, n + sizeof "/config.json", mxi_keys[id].path);
    if (dir) snprintf(cfg->hf_config_path, n + sizeof "/config.json", "%s%sconfig.json", path,
                      path[n - 1] != '/' ? "/" : "");
    else snprintf(cfg->hf_config_path, n + sizeof "/config.json", "%s", path);
    char *text;
    size_t len;
    mx_diag sub;
    if (stat(cfg->hf_config_path, &st) != 0) {
        int err = errno;
        return mxi_fail_value(ld, MX_EIO, s->v, mxi_keys[id].path, "cannot read %s: %s (allowed: %s)",
                              cfg->hf_config_path, strerror(err), mxi_keys[id].allowed);
    }
    int rc = mxi_read_input(cfg->hf_config_path, NULL, MXI_MAX_CONFIG_BYTES, &text, &len, &sub);
    if (rc)
        return mxi_fail_value(ld, rc, s->v, mxi_keys[id].path, "cannot read %s (allowed: %s)", sub.msg,
                              mxi_keys[id].allowed);
    json_error_t jerr;
    ld->json = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    free(text);
    char qe[MXI_QUOTE_SIZE]; /* jansson's text quotes the input, control characters included */
    char from[MXI_PATH_SIZE + 16] = "command line";
    if (!s->cli) snprintf(from, sizeof from, "%s:%d", ld->source, mxi_yaml_line(s->key));
    if (!ld->json && json_error_code(&jerr) == json_error_out_of_memory)
        return mxi_diag(ld->diag, MX_ENOMEM, "%s: out of memory parsing its %zu bytes of JSON (jansson; read for "
                        "model.model_name_or_path, %s)", cfg->hf_config_path, len, from);
    if (!ld->json)
        return mxi_diag(ld->diag, MX_ECONFIG, "%s:%d:%d: invalid JSON: %s (read for model.model_name_or_path, %s)",
                        cfg->hf_config_path, jerr.line, jerr.column,
                        mxi_quote(qe, sizeof qe, jerr.text, strlen(jerr.text)), from);
    return collect_json(ld, mxi_key_parent(id));
}
