/* The settings by name, for printing a loaded config: the list of settings, each one's
 * value as YAML and where it came from. */
#include <stdarg.h>
#include <stdio.h>

#include "config/config_internal.h"

static bool is_setting(int id) {
    const mxi_key_def *k = &mxi_keys[id];
    return k->type != MXI_KEY_SECTION && k->type != MXI_KEY_QPLAN && !(k->flags & MXI_FLAG_HIDDEN);
}

int mx_config_key_count(void) {
    int n = 0;
    for (int i = 0; i < mxi_n_keys; i++) n += is_setting(i);
    return n;
}

const char *mx_config_key_name(int index) {
    for (int i = 0; i < mxi_n_keys && index >= 0; i++)
        if (is_setting(i) && index-- == 0) return mxi_keys[i].path;
    return NULL;
}

int mx_config_origin(const mx_config *config, const char *key, mx_origin *out) {
    if (!config || !key || !out) return MX_ENULL;
    int id = mxi_key_find(key);
    if (id < 0) return MX_EINVAL;
    *out = config->origins[id];
    return 0;
}

int mx_config_format_origin(const mx_config *config, const char *key, char *buf, size_t size) {
    mx_origin o;
    int rc = mx_config_origin(config, key, &o);
    if (rc) return rc;
    if (!buf && size) return MX_ENULL;
    if (o.kind == MX_ORIGIN_YAML) return snprintf(buf, size, "%s:%d", config->source ? config->source : "", o.line);
    if (o.kind == MX_ORIGIN_HF_CONFIG)
        return snprintf(buf, size, "%s", config->hf_config_path ? config->hf_config_path : "");
    if (o.kind == MX_ORIGIN_COMMAND_LINE) return snprintf(buf, size, "command line");
    return snprintf(buf, size, "default");
}

/* Append to buf at *o, snprintf-style (the total length keeps counting past the end). */
static void append(char *buf, size_t size, size_t *o, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void append(char *buf, size_t size, size_t *o, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(*o < size ? buf + *o : NULL, *o < size ? size - *o : 0, fmt, ap);
    va_end(ap);
    if (n > 0) *o += (size_t)n;
}

/* A YAML single-quoted string ('' for a quote). */
static void append_quoted(char *buf, size_t size, size_t *o, const char *text) {
    append(buf, size, o, "'");
    for (const char *p = text; *p; p++) {
        if (*p == '\'') append(buf, size, o, "''");
        else append(buf, size, o, "%c", *p);
    }
    append(buf, size, o, "'");
}

int mx_config_format_value(const mx_config *config, const char *key, char *buf, size_t size) {
    if (!config || !key || (!buf && size)) return MX_ENULL;
    int id = mxi_key_find(key);
    if (id < 0 || !is_setting(id)) return MX_EINVAL;
    if (size) buf[0] = '\0';
    const void *p = (const char *)config + mxi_keys[id].off;
    char num[64];
    size_t o = 0;
    switch (mxi_keys[id].type) {
    case MXI_KEY_INT: append(buf, size, &o, "%d", *(const int *)p); break;
    case MXI_KEY_SEED: append(buf, size, &o, "%llu", (unsigned long long)*(const uint64_t *)p); break;
    case MXI_KEY_F32: append(buf, size, &o, "%s", mxi_format_float(*(const float *)p, num, sizeof num)); break;
    case MXI_KEY_F64: append(buf, size, &o, "%s", mxi_format_double(*(const double *)p, num, sizeof num)); break;
    case MXI_KEY_BOOL: append(buf, size, &o, "%s", *(const bool *)p ? "true" : "false"); break;
    case MXI_KEY_STR:
    case MXI_KEY_HFDIR: {
        const char *s = *(char *const *)p;
        if (s) append_quoted(buf, size, &o, s);
        else append(buf, size, &o, "null");
        break;
    }
    case MXI_KEY_PATHS: {
        char *const *list = *(char **const *)p;
        int n = *(const int *)((const char *)config + mxi_keys[id].count_off);
        const double *w = *(double *const *)((const char *)config + mxi_keys[id].weights_off);
        if (!n) {
            append(buf, size, &o, "null");
            break;
        }
        append(buf, size, &o, "[");
        for (int i = 0; i < n; i++) {
            char weight[32];
            if (i) append(buf, size, &o, ", ");
            if (w) append(buf, size, &o, "%s, ", mxi_format_double(w[i], weight, sizeof weight));
            append_quoted(buf, size, &o, list[i]);
        }
        append(buf, size, &o, "]");
        break;
    }
    case MXI_KEY_CHOICE: {
        int v = *(const int *)p;
        for (const mxi_key_choice *c = mxi_keys[id].choices; c->text; c++) {
            if (c->value == v) {
                append(buf, size, &o, "%s", c->text);
                break;
            }
        }
        break;
    }
    case MXI_KEY_PATTERNS: {
        const mx_plan_pattern *list = *(mx_plan_pattern *const *)p;
        int n = *(const int *)((const char *)config + mxi_keys[id].count_off);
        append(buf, size, &o, "[");
        for (int i = 0; i < n; i++) {
            if (i) append(buf, size, &o, ", ");
            append_quoted(buf, size, &o, list[i].text);
        }
        append(buf, size, &o, "]");
        break;
    }
    case MXI_KEY_LAYERS: {
        const bool *layers = (const bool *)p;
        bool first = true;
        append(buf, size, &o, "[");
        for (int i = 0; i < MX_MAX_LAYERS; i++) {
            if (!layers[i]) continue;
            append(buf, size, &o, first ? "%d" : ", %d", i);
            first = false;
        }
        append(buf, size, &o, "]");
        break;
    }
    case MXI_KEY_FSDP_SIZE:
        if (*(const int *)p) append(buf, size, &o, "%d", *(const int *)p);
        else append(buf, size, &o, "auto");
        break;
    default: return MX_EINVAL;
    }
    return o > INT_MAX ? INT_MAX : (int)o;
}
