/* The config loader's errors: one line in diag, "FILE:LINE: section.key: VALUE <problem>
 * (allowed: ...)", pointing at where the user wrote the value (the YAML line, the
 * config.json, or the command line) or, for a default, at its section. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "config/config_internal.h"
#include "core/diag.h"

/* The path of a key as the user sees it: config.json keys have no "model." prefix. */
static const char *shown(const char *path, bool json) {
    return (json && strncmp(path, "model.", 6) == 0) ? path + 6 : path;
}

#define ON_COMMAND_LINE (-1)   /* failv's line for an override */

/* Fill diag with "SOURCE:LINE: PATH: message" ("HFCONFIG: PATH: ..." for config.json
 * values, "command line: PATH: ..." for overrides, "SOURCE: PATH: ..." when there is no
 * line) and return code. */
static int failv(const mxi_loader *ld, int code, int line, bool json, const char *path, const char *fmt, va_list ap) {
    char msg[sizeof ld->diag->msg];
    vsnprintf(msg, sizeof msg, fmt, ap);
    if (json) return mxi_diag(ld->diag, code, "%s: %s: %s", ld->cfg->hf_config_path, shown(path, true), msg);
    if (line == ON_COMMAND_LINE) return mxi_diag(ld->diag, code, "command line: %s: %s", path, msg);
    if (line > 0) return mxi_diag(ld->diag, code, "%s:%d: %s: %s", ld->source, line, path, msg);
    return mxi_diag(ld->diag, code, "%s: %s: %s", ld->source, path, msg);
}

int mxi_fail_value(const mxi_loader *ld, int code, mxi_value v, const char *path, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int line = v.y && v.doc != ld->doc ? ON_COMMAND_LINE : mxi_value_line(v);
    int rc = failv(ld, code, line, v.y == NULL, path, fmt, ap);
    va_end(ap);
    return rc;
}

int mxi_fail_node(const mxi_loader *ld, int code, const yaml_node_t *node, const char *path, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int rc = failv(ld, code, node ? mxi_yaml_line(node) : 0, false, path, fmt, ap);
    va_end(ap);
    return rc;
}

/* The line of the nearest section of key id written in the YAML file, 0 if none. */
static int section_line(const mxi_loader *ld, int id) {
    for (int s = mxi_key_parent(id); s >= 0; s = mxi_key_parent(s))
        if (ld->slots[s].set && ld->slots[s].key) return mxi_yaml_line(ld->slots[s].key);
    return 0;
}

int mxi_fail_key(const mxi_loader *ld, int code, int id, const char *fmt, ...) {
    const mxi_slot *s = &ld->slots[id];
    int line = s->cli ? ON_COMMAND_LINE : s->set && s->key ? mxi_yaml_line(s->key) : s->set ? 0 : section_line(ld, id);
    va_list ap;
    va_start(ap, fmt);
    int rc = failv(ld, code, line, s->set && !s->key && !s->cli, mxi_keys[id].path, fmt, ap);
    va_end(ap);
    return rc;
}

int mxi_fail_oom(const mxi_loader *ld, size_t bytes, const char *what) {
    if (bytes == 0) return mxi_diag(ld->diag, MX_ENOMEM, "%s: out of memory loading the config (%s)", ld->source, what);
    return mxi_diag(ld->diag, MX_ENOMEM, "%s: out of memory loading the config (%zu bytes for %s)", ld->source, bytes,
                    what);
}

const char *mxi_origin_note(const mxi_loader *ld, int id, char *buf, size_t size) {
    const mxi_slot *s = &ld->slots[id];
    if (s->cli) snprintf(buf, size, " (command line)");
    else if (s->set && s->key) snprintf(buf, size, " (line %d)", mxi_yaml_line(s->key));
    else if (s->set) snprintf(buf, size, " (from %s)", ld->cfg->hf_config_path);
    else if (mxi_key_parent(id) == mxi_key_find("model") && ld->slots[mxi_key_find("model.model_type")].set)
        snprintf(buf, size, " (default for %s)", mxi_key_model_type(ld->cfg->model.type));
    else snprintf(buf, size, " (default)");
    return buf;
}
