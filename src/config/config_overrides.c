/* Phase 1 of loading the config: the command line's settings (mx_config_load_with), each
 * `--section.key VALUE`, put over the file's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config_internal.h"
#include "core/diag.h"
#include "core/text.h"

/* The command line's settings over the file's: each key resolved through its sections (an
 * alias too), its value parsed as YAML, the slot taken over whether the file gave it or not. */
int mxi_config_overrides(mxi_loader *ld) {
    char list[MXI_LIST_SIZE], hint[MXI_PATH_SIZE], part[MXI_PATH_SIZE];
    char key[MXI_QUOTE_SIZE], shown_part[MXI_QUOTE_SIZE];
    ld->override_docs = ld->n_overrides ? calloc((size_t)ld->n_overrides, sizeof *ld->override_docs) : NULL;
    if (ld->n_overrides && !ld->override_docs)
        return mxi_fail_oom(ld, (size_t)ld->n_overrides * sizeof *ld->override_docs, "the command line's settings");
    for (int i = 0; i < ld->n_overrides; i++) {
        const char *name = ld->overrides[i].key ? ld->overrides[i].key : "", *value = ld->overrides[i].value;
        mxi_quote(key, sizeof key, name, strlen(name));   // as messages show it: escaped
        int id = -1, section = -1;
        for (const char *p = name;;) {   // walk the dotted name: sections, then the setting
            size_t len = strcspn(p, ".");
            snprintf(part, sizeof part, "%.*s", (int)len, p);
            id = mxi_key_child(section, part, len, false);
            if (id < 0)
                return mxi_diag(ld->diag, MX_ECONFIG, "command line: --%s: unknown %s '%s'%s (allowed: %s)", key,
                                section < 0 ? "section" : "key", mxi_quote(shown_part, sizeof shown_part, part,
                                strlen(part)), mxi_key_suggest(section, part, len, false, hint, sizeof hint),
                                mxi_key_list(section, false, list, sizeof list));
            if (mxi_keys[id].type == MXI_KEY_QPLAN)
                return mxi_diag(ld->diag, MX_ECONFIG, "command line: --%s: the quantization plan is set in the config "
                                "file only (allowed: the settings of docs/config.md outside "
                                "training.quantization_plan)", key);
            if (!p[len]) break;
            if (mxi_keys[id].type != MXI_KEY_SECTION)
                return mxi_diag(ld->diag, MX_ECONFIG, "command line: --%s: %s is a setting, not a section (allowed: "
                                "--%s VALUE)", key, mxi_keys[id].path, mxi_keys[id].path);
            section = id;
            p += len + 1;
        }
        if (mxi_keys[id].type == MXI_KEY_SECTION)
            return mxi_diag(ld->diag, MX_ECONFIG, "command line: --%s: is a section (allowed: one of its settings: %s)",
                            key, mxi_key_list(id, false, list, sizeof list));
        mxi_slot *s = &ld->slots[id];
        if (s->cli)
            return mxi_diag(ld->diag, MX_ECONFIG, "command line: --%s: %s is given twice (allowed: once)", key,
                            mxi_keys[id].path);
        if (!value || !*value)
            return mxi_diag(ld->diag, MX_ECONFIG, "command line: --%s: no value (allowed: --%s VALUE, or --%s=VALUE; "
                            "null for the default where docs/config.md allows it)", key, key, key);
        yaml_document_t *doc = &ld->override_docs[i];
        char source[MXI_PATH_SIZE];
        snprintf(source, sizeof source, "command line: --%s", key);
        int rc = mxi_yaml_load_one(value, strlen(value), source, doc, ld->diag);
        if (rc) return rc;
        ld->n_override_docs = i + 1;
        bool was_set = s->set;
        *s = (mxi_slot){.set = true, .v = {.doc = doc, .y = yaml_document_get_root_node(doc)},
                        .written = mxi_key_name(id), .cli = true};
        if (!was_set) ld->order[ld->n_order++] = id;
    }
    return MX_OK;
}
