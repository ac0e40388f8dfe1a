/* Internal: the `training.quantization_plan` block from an already-parsed libyaml document,
 * for the whole-config loader, and the YAML 1.1 scalar typing it shares with that loader. */
#ifndef MXI_PLAN_YAML_H
#define MXI_PLAN_YAML_H

#include <stddef.h>
#include <yaml.h>

#include "mxtrain/plan.h"

/* Validate a `quantization_plan` mapping node and fill plan from it (SPEC §1): defaults for
 * absent keys, aliases accepted, every error one line "SOURCE:LINE: training.
 * quantization_plan.KEY: ..." in diag. block may be NULL (no block: the defaults with
 * quantization off). plan need not be initialised; it is overwritten, and left empty on
 * error. Returns 0, MX_ECONFIG, MX_ERECIPE, MX_EUNSUPPORTED, MX_EPATTERN or MX_ENOMEM. */
int mxi_plan_from_node(yaml_document_t *doc, yaml_node_t *block, const char *source_name, mx_plan *plan,
                       mx_diag *diag);

/* What a node holds, with plain scalars typed as PyYAML (YAML 1.1) types them: `true`, `on`,
 * `No` are booleans, `12` and `0x1F` integers, `1.5` and `.inf` floats, `~`, `null` and
 * nothing are null. Quoted and block scalars are always strings. */
typedef enum {
    MXI_YAML_STR,
    MXI_YAML_NULL,
    MXI_YAML_BOOL,
    MXI_YAML_INT,
    MXI_YAML_FLOAT,
    MXI_YAML_SEQ,
    MXI_YAML_MAP,
} mxi_yaml_kind;

mxi_yaml_kind mxi_yaml_kind_of(const yaml_node_t *node);

/* For a MXI_YAML_BOOL node, its value. */
bool mxi_yaml_bool_value(const yaml_node_t *node);

/* A node for messages: "'text'" for a string, "12 (an integer)", "True (a boolean)",
 * "null", "an empty value", "a list", "a mapping". Returns buf. */
const char *mxi_yaml_describe(const yaml_node_t *node, char *buf, size_t size);

/* The one-line message for a libyaml parser failure: "SOURCE:LINE:COL: YAML syntax error: ..."
 * (input/len: the text parsed, to place reader errors); returns MX_ECONFIG or MX_ENOMEM. */
int mxi_yaml_failure(const yaml_parser_t *parser, const char *source, const char *input, size_t len, mx_diag *diag);

/* Parse data (len bytes, named source in messages) as exactly one YAML document into doc,
 * which the caller then deletes with yaml_document_delete. Syntax errors and a second
 * document are one-line MX_ECONFIG errors; doc is left deleted on error. */
int mxi_yaml_load_one(const char *data, size_t len, const char *source, yaml_document_t *doc, mx_diag *diag);

/* Free a list of plan patterns (their text and compiled form) and the list. */
void mxi_plan_patterns_free(mx_plan_pattern *list, int n);

/* 1-based line of a node. */
static inline int mxi_yaml_line(const yaml_node_t *node) { return (int)node->start_mark.line + 1; }

#endif
