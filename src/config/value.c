/* A config value from YAML (PyYAML's typing) or from JSON (jansson), behind one interface. */
#include "config/value.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/text.h"

static const char *ytext(const yaml_node_t *node) { return (const char *)node->data.scalar.value; }

mxi_yaml_kind mxi_value_kind(mxi_value v) {
    if (v.y) return mxi_yaml_kind_of(v.y);
    switch (json_typeof(v.j)) {
    case JSON_OBJECT: return MXI_YAML_MAP;
    case JSON_ARRAY: return MXI_YAML_SEQ;
    case JSON_STRING: return MXI_YAML_STR;
    case JSON_INTEGER: return MXI_YAML_INT;
    case JSON_REAL: return MXI_YAML_FLOAT;
    case JSON_TRUE:
    case JSON_FALSE: return MXI_YAML_BOOL;
    case JSON_NULL: break;
    }
    return MXI_YAML_NULL;
}

int mxi_value_line(mxi_value v) { return v.y ? mxi_yaml_line(v.y) : 0; }

const char *mxi_format_double(double x, char *buf, size_t size) {
    for (int digits = 6; digits <= 17; digits++) {
        snprintf(buf, size, "%.*g", digits, x);
        if (strtod(buf, NULL) == x || isnan(x)) break;
    }
    return buf;
}

const char *mxi_format_float(float x, char *buf, size_t size) {
    for (int digits = 6; digits <= 9; digits++) {
        snprintf(buf, size, "%.*g", digits, (double)x);
        if (strtof(buf, NULL) == x || isnan(x)) break;
    }
    return buf;
}

/* A JSON real as written by Python's json: with a ".0" when it is integral (2048.0). */
static const char *json_real_text(double x, char *buf, size_t size) {
    mxi_format_double(x, buf, size);
    if (isfinite(x) && !strpbrk(buf, ".e") && strlen(buf) + 3 <= size) strcat(buf, ".0");
    return buf;
}

const char *mxi_value_text(mxi_value v, char *buf, size_t size) {
    if (v.y) {
        if (v.y->type == YAML_SCALAR_NODE) return mxi_quote(buf, size, ytext(v.y), v.y->data.scalar.length);
        return mxi_yaml_describe(v.y, buf, size);
    }
    switch (json_typeof(v.j)) {
    case JSON_INTEGER: snprintf(buf, size, "%lld", (long long)json_integer_value(v.j)); break;
    case JSON_REAL: json_real_text(json_real_value(v.j), buf, size); break;
    default: mxi_value_describe(v, buf, size); break;
    }
    return buf;
}

const char *mxi_value_describe(mxi_value v, char *buf, size_t size) {
    if (v.y) return mxi_yaml_describe(v.y, buf, size);
    char num[64], q[MXI_QUOTE_SIZE];
    switch (json_typeof(v.j)) {
    case JSON_OBJECT: snprintf(buf, size, "a mapping"); break;
    case JSON_ARRAY: snprintf(buf, size, "a list"); break;
    case JSON_STRING:
        snprintf(buf, size, "'%s'", mxi_quote(q, sizeof q, json_string_value(v.j), json_string_length(v.j)));
        break;
    case JSON_INTEGER: snprintf(buf, size, "%lld (an integer)", (long long)json_integer_value(v.j)); break;
    case JSON_REAL: snprintf(buf, size, "%s (a number)", json_real_text(json_real_value(v.j), num, sizeof num)); break;
    case JSON_TRUE: snprintf(buf, size, "true (a boolean)"); break;
    case JSON_FALSE: snprintf(buf, size, "false (a boolean)"); break;
    case JSON_NULL: snprintf(buf, size, "null"); break;
    }
    return buf;
}

const char *mxi_value_str(mxi_value v) {
    if (mxi_value_kind(v) != MXI_YAML_STR) return NULL;
    if (v.y) return strlen(ytext(v.y)) == v.y->data.scalar.length ? ytext(v.y) : NULL;
    return strlen(json_string_value(v.j)) == json_string_length(v.j) ? json_string_value(v.j) : NULL;
}

bool mxi_value_quoted(mxi_value v) {
    return v.y && v.y->type == YAML_SCALAR_NODE && mxi_value_kind(v) == MXI_YAML_STR &&
           v.y->data.scalar.style != YAML_PLAIN_SCALAR_STYLE;
}

/* The kind a quoted YAML scalar's text would have had unquoted. */
static mxi_yaml_kind unquoted_kind(mxi_value v) {
    if (!mxi_value_quoted(v)) return MXI_YAML_STR;
    yaml_node_t plain = *v.y;
    plain.tag = NULL;
    plain.data.scalar.style = YAML_PLAIN_SCALAR_STYLE;
    return mxi_yaml_kind_of(&plain);
}

bool mxi_value_quoted_int(mxi_value v) { return unquoted_kind(v) == MXI_YAML_INT; }

bool mxi_value_quoted_number(mxi_value v) {
    mxi_yaml_kind k = unquoted_kind(v);
    return k == MXI_YAML_INT || k == MXI_YAML_FLOAT || (mxi_value_quoted(v) && mxi_is_decimal_number(ytext(v.y)));
}

bool mxi_value_quoted_bool(mxi_value v) { return unquoted_kind(v) == MXI_YAML_BOOL; }

bool mxi_value_bool(mxi_value v) { return v.y ? mxi_yaml_bool_value(v.y) : json_is_true(v.j); }

/* ---- YAML 1.1 numbers ----------------------------------------------------------------- */

/* text without '_' into buf; false if it does not fit. */
static bool strip_underscores(const char *text, char *buf, size_t size) {
    size_t o = 0;
    for (const char *p = text; *p; p++) {
        if (*p == '_') continue;
        if (o + 1 >= size) return false;
        buf[o++] = *p;
    }
    buf[o] = '\0';
    return true;
}

/* Accumulate digits of base into *acc; -2 on overflow, -1 on a bad digit. */
static int accumulate(const char *p, int base, unsigned long long *acc) {
    for (; *p; p++) {
        int d;
        if (*p >= '0' && *p <= '9') d = *p - '0';
        else if (*p >= 'a' && *p <= 'f') d = *p - 'a' + 10;
        else if (*p >= 'A' && *p <= 'F') d = *p - 'A' + 10;
        else return -1;
        if (d >= base) return -1;
        if (*acc > (ULLONG_MAX - (unsigned)d) / (unsigned)base) return -2;
        *acc = *acc * (unsigned)base + (unsigned)d;
    }
    return 0;
}

int mxi_yaml_parse_int(const char *text, long long *out) {
    char buf[128];
    if (!strip_underscores(text, buf, sizeof buf)) return -2;
    const char *p = buf;
    bool neg = false;
    if (*p == '-' || *p == '+') neg = (*p++ == '-');
    if (!*p) return -1;
    unsigned long long acc = 0;
    int rc;
    if (p[0] == '0' && p[1] == 'b') rc = p[2] ? accumulate(p + 2, 2, &acc) : -1;
    else if (p[0] == '0' && p[1] == 'x') rc = p[2] ? accumulate(p + 2, 16, &acc) : -1;
    else if (p[0] == '0') rc = accumulate(p, 8, &acc);
    else if (strchr(p, ':')) {
        /* base 60: "1:30" is 90 */
        rc = 0;
        for (const char *q = p; *q && rc == 0;) {
            const char *colon = strchr(q, ':');
            size_t n = colon ? (size_t)(colon - q) : strlen(q);
            char part[32];
            if (n == 0 || n >= sizeof part) return -1;
            memcpy(part, q, n);
            part[n] = '\0';
            unsigned long long d = 0;
            rc = accumulate(part, 10, &d);
            if (rc == 0 && acc > (ULLONG_MAX - d) / 60) rc = -2;
            if (rc == 0) acc = acc * 60 + d;
            q += n + (colon ? 1 : 0);
        }
    } else rc = accumulate(p, 10, &acc);
    if (rc) return rc;
    if (neg ? acc > (unsigned long long)LLONG_MAX + 1 : acc > (unsigned long long)LLONG_MAX) return -2;
    *out = neg ? (long long)(0 - acc) : (long long)acc;
    return 0;
}

int mxi_yaml_parse_float(const char *text, double *out) {
    char buf[128];
    if (!strip_underscores(text, buf, sizeof buf)) return -1;
    char *p = buf;
    double sign = 1.0;
    if (*p == '-' || *p == '+') sign = (*p++ == '-') ? -1.0 : 1.0;
    for (char *c = p; *c; c++) *c = mxi_lower(*c);
    if (!strcmp(p, ".inf")) return (*out = sign * INFINITY, 0);
    if (!strcmp(p, ".nan")) return (*out = NAN, 0);
    double value = 0;
    char *end;
    if (strchr(p, ':')) {
        /* base 60: "1:30.5" is 90.5; every part but the last is an integer */
        for (char *q = p;;) {
            char *colon = strchr(q, ':');
            if (colon) *colon = '\0';
            errno = 0;
            double part = strtod(q, &end);
            if (end == q || *end || errno) return -1;
            value = value * 60 + part;
            if (!colon) break;
            q = colon + 1;
        }
    } else {
        errno = 0;
        value = strtod(p, &end);
        if (end == p || *end) return -1;
        /* ERANGE on underflow still gives the nearest value; overflow gives HUGE_VAL, which
         * is what Python's float() gives (inf) too. */
    }
    *out = sign * value;
    return 0;
}

bool mxi_is_decimal_number(const char *s) {
    const char *p = s;
    if (*p == '-' || *p == '+') p++;
    size_t int_digits = strspn(p, "0123456789");
    p += int_digits;
    size_t frac_digits = 0;
    if (*p == '.') {
        p++;
        frac_digits = strspn(p, "0123456789");
        p += frac_digits;
    }
    if (int_digits + frac_digits == 0) return false;
    if (*p == 'e' || *p == 'E') {
        p++;
        if (*p == '-' || *p == '+') p++;
        size_t exp_digits = strspn(p, "0123456789");
        if (exp_digits == 0) return false;
        p += exp_digits;
    }
    return *p == '\0';
}

int mxi_value_int(mxi_value v, long long *out) {
    if (mxi_value_kind(v) != MXI_YAML_INT) return -1;
    if (!v.y) {
        *out = (long long)json_integer_value(v.j);
        return 0;
    }
    return mxi_yaml_parse_int(ytext(v.y), out);
}

int mxi_value_number(mxi_value v, bool lenient, double *out) {
    mxi_yaml_kind kind = mxi_value_kind(v);
    if (!v.y) {
        if (kind == MXI_YAML_INT) return (*out = (double)json_integer_value(v.j), 0);
        if (kind == MXI_YAML_FLOAT) return (*out = json_real_value(v.j), 0);
        return -1;
    }
    if (kind == MXI_YAML_INT) {
        long long i;
        int rc = mxi_yaml_parse_int(ytext(v.y), &i);
        if (rc == 0) return (*out = (double)i, 0);
        /* An integer too large for 64 bits is still a number. */
        return mxi_yaml_parse_float(ytext(v.y), out);
    }
    if (kind == MXI_YAML_FLOAT) return mxi_yaml_parse_float(ytext(v.y), out);
    if (kind == MXI_YAML_STR && lenient && !mxi_value_quoted(v) && mxi_value_str(v) &&
        mxi_is_decimal_number(ytext(v.y)))
        return mxi_yaml_parse_float(ytext(v.y), out);
    return -1;
}

/* ---- Lists and mappings ----------------------------------------------------------------- */

size_t mxi_value_count(mxi_value v) {
    if (v.y) {
        if (v.y->type == YAML_SEQUENCE_NODE)
            return (size_t)(v.y->data.sequence.items.top - v.y->data.sequence.items.start);
        if (v.y->type == YAML_MAPPING_NODE)
            return (size_t)(v.y->data.mapping.pairs.top - v.y->data.mapping.pairs.start);
        return 0;
    }
    if (json_is_array(v.j)) return json_array_size(v.j);
    if (json_is_object(v.j)) return json_object_size(v.j);
    return 0;
}

mxi_value mxi_value_item(mxi_value v, size_t i) {
    mxi_value item = {v.doc, NULL, NULL};
    if (v.y) item.y = yaml_document_get_node(v.doc, v.y->data.sequence.items.start[i]);
    else item.j = json_array_get(v.j, i);
    return item;
}

const char *mxi_value_pair(mxi_value v, size_t i, mxi_value *value, const yaml_node_t **key_node) {
    *value = (mxi_value){v.doc, NULL, NULL};
    if (key_node) *key_node = NULL;
    if (v.y) {
        const yaml_node_pair_t *pair = v.y->data.mapping.pairs.start + i;
        const yaml_node_t *k = yaml_document_get_node(v.doc, pair->key);
        value->y = yaml_document_get_node(v.doc, pair->value);
        if (key_node) *key_node = k;
        return k->type == YAML_SCALAR_NODE ? ytext(k) : NULL;
    }
    /* jansson keeps insertion order; objects here are small, so stepping is fine. */
    void *it = json_object_iter((json_t *)v.j);
    for (size_t k = 0; k < i && it; k++) it = json_object_iter_next((json_t *)v.j, it);
    if (!it) return NULL;
    value->j = json_object_iter_value(it);
    return json_object_iter_key(it);
}
