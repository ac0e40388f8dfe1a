/* Internal: one view over a config value that came either from the YAML config (a libyaml
 * node, typed as PyYAML types it) or from a Hugging Face config.json (a jansson value), so
 * that each setting is checked by one piece of code whatever file it came from. */
#ifndef MXI_CONFIG_VALUE_H
#define MXI_CONFIG_VALUE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <yaml.h>

#include "plan/plan_yaml.h"

typedef struct {
    yaml_document_t *doc;   /* the document of y */
    const yaml_node_t *y;   /* a YAML node, or NULL */
    const json_t *j;        /* a JSON value (when y is NULL) */
} mxi_value;

/* What the value holds (JSON: string, null, true/false, integer, real, array, object). */
mxi_yaml_kind mxi_value_kind(mxi_value v);

/* 1-based YAML line, 0 for JSON. */
int mxi_value_line(mxi_value v);

/* For messages, as mxi_yaml_describe: "'text'", "12 (an integer)", "1e-06 (a number)",
 * "true (a boolean)", "null", "an empty value", "a list", "a mapping". Returns buf. */
const char *mxi_value_describe(mxi_value v, char *buf, size_t size);

/* The value as written, for "X is out of range" messages: the scalar text (YAML) or the
 * number (JSON). Returns buf. */
const char *mxi_value_text(mxi_value v, char *buf, size_t size);

/* A string holding no NUL byte (the only kind a name or a path can be); NULL otherwise. */
const char *mxi_value_str(mxi_value v);

/* A YAML scalar written in quotes (or as a block scalar): always a string. */
bool mxi_value_quoted(mxi_value v);

/* Whether a quoted string's text would have been an integer / a number / a boolean
 * unquoted: for "is a quoted string, not a number" messages. */
bool mxi_value_quoted_int(mxi_value v);
bool mxi_value_quoted_number(mxi_value v);
bool mxi_value_quoted_bool(mxi_value v);

/* An integer value. Returns 0, -1 if it is not an integer, -2 if it does not fit. */
int mxi_value_int(mxi_value v, long long *out);

/* A number: an integer or a float; with lenient, also a plain (unquoted) YAML string that
 * reads as a decimal number such as `3e-4`, which PyYAML leaves a string because YAML 1.1
 * floats need a dot. Returns 0 or -1. Infinities and NaNs come through (range checks
 * refuse them). */
int mxi_value_number(mxi_value v, bool lenient, double *out);

/* A boolean value (the caller has checked the kind). */
bool mxi_value_bool(mxi_value v);

/* Items of a list, pairs of a mapping. */
size_t mxi_value_count(mxi_value v);
mxi_value mxi_value_item(mxi_value v, size_t i);
/* The i-th pair of a mapping: its key text (NULL for a non-scalar YAML key) and value. For
 * YAML the key node is also returned (for its line). */
const char *mxi_value_pair(mxi_value v, size_t i, mxi_value *value, const yaml_node_t **key_node);

/* Exact parsers for YAML 1.1 plain scalars already typed int / float by mxi_yaml_kind_of
 * (underscores, 0x / 0b / 0 octal / base-60 forms, .inf, .nan), as PyYAML constructs them. */
int mxi_yaml_parse_int(const char *text, long long *out);     /* 0, -1 malformed, -2 overflow */
int mxi_yaml_parse_float(const char *text, double *out);      /* 0 or -1 */

/* Whether text reads as a decimal number the way Python's float() reads it, without
 * underscores, infinities or NaNs: [-+]?(digits[.digits?] | .digits)([eE][-+]?digits)?. */
bool mxi_is_decimal_number(const char *text);

/* A double as the shortest "%.*g" text that reads back to the same value. Returns buf. */
const char *mxi_format_double(double x, char *buf, size_t size);
/* The same for a float: 1e-06 for 1e-6f, not 9.99999997e-07. */
const char *mxi_format_float(float x, char *buf, size_t size);

#endif
