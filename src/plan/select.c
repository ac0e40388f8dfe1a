/* Module selection (SPEC §3): which modules the plan converts, why, and which patterns
 * written in the config select nothing (almost always a typo). */
#include "mxtrain/plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/text.h"

const char *mx_converter_name(mx_converter converter) {
    switch (converter) {
    case MX_CONVERTER_LINEAR: return "quantize.linear.mx";
    case MX_CONVERTER_MOE: return "quantize.moe.mx";
    case MX_CONVERTER_COUNT: break;
    }
    return NULL;
}

const char *mx_converter_family_name(mx_converter converter, mx_quant_family family) {
    static const char *const names[MX_CONVERTER_COUNT][MX_FAMILY_COUNT] = {
        [MX_CONVERTER_LINEAR] = {[MX_FAMILY_MX] = "quantize.linear.mx", [MX_FAMILY_FLOAT8] = "quantize.linear.float8",
                                 [MX_FAMILY_HIF8] = "quantize.linear.hif8"},
        [MX_CONVERTER_MOE] = {[MX_FAMILY_MX] = "quantize.moe.mx", [MX_FAMILY_FLOAT8] = "quantize.moe.float8",
                              [MX_FAMILY_HIF8] = "quantize.moe.hif8"},
    };
    if ((unsigned)converter >= MX_CONVERTER_COUNT || (unsigned)family >= MX_FAMILY_COUNT) return NULL;
    return names[converter][family];
}

static bool plan_lists(const mx_plan *plan, mx_converter converter) {
    for (int i = 0; i < plan->n_converters; i++)
        if (plan->converters[i] == converter) return true;
    return false;
}

/* The first pattern of list matching fqn or an ancestor, or -1. */
static int first_match(const mx_plan_pattern *list, int n, const char *fqn, size_t *matched_len) {
    for (int i = 0; i < n; i++)
        if (mx_pattern_match_module(list[i].compiled, fqn, matched_len)) return i;
    return -1;
}

/* One allocated warning line about a pattern; NULL when out of memory. */
static char *pattern_warning(const char *key, const mx_plan_pattern *p, const char *what) {
    char quoted[MXI_QUOTE_SIZE];
    mxi_quote(quoted, sizeof quoted, p->text, strlen(p->text));
    int n = snprintf(NULL, 0, "%s pattern '%s' (line %d) %s", key, quoted, p->line, what);
    char *line = malloc((size_t)n + 1);
    if (line) snprintf(line, (size_t)n + 1, "%s pattern '%s' (line %d) %s", key, quoted, p->line, what);
    return line;
}

int mx_plan_select(const mx_plan *plan, const mx_module *modules, int n_modules, mx_selection *out) {
    if (out) memset(out, 0, sizeof *out);
    if (!plan || !out || (!modules && n_modules > 0)) return MX_ENULL;
    if (n_modules < 0) return MX_ESIZE;
    for (int m = 0; m < n_modules; m++)
        if (!modules[m].fqn) return MX_ENULL;

    mx_selection sel = {0};
    bool *apply_used = calloc((size_t)plan->n_apply + 1, sizeof *apply_used);
    bool *ignore_used = calloc((size_t)plan->n_ignored + 1, sizeof *ignore_used);
    sel.decisions = n_modules ? calloc((size_t)n_modules, sizeof *sel.decisions) : NULL;
    sel.warnings = calloc((size_t)(plan->n_apply + plan->n_ignored) + 1, sizeof *sel.warnings);
    if (!apply_used || !ignore_used || (n_modules && !sel.decisions) || !sel.warnings) goto nomem;
    sel.n_modules = n_modules;

    for (int m = 0; m < n_modules; m++) {
        const mx_module *mod = &modules[m];
        mx_decision *d = &sel.decisions[m];
        d->apply_index = d->ignore_index = -1;
        d->reason = MX_REASON_NOT_HANDLED;

        /* Usage for the warnings: an ignored pattern is used if it names any module at all;
         * an apply pattern only if it reaches a module a listed converter handles. */
        for (int i = 0; i < plan->n_ignored; i++)
            if (!ignore_used[i] && mx_pattern_match_module(plan->ignored[i].compiled, mod->fqn, NULL))
                ignore_used[i] = true;

        if (mod->kind != MX_MODULE_LINEAR && mod->kind != MX_MODULE_EXPERTS) continue;
        d->converter = mod->kind == MX_MODULE_LINEAR ? MX_CONVERTER_LINEAR : MX_CONVERTER_MOE;
        if (!plan_lists(plan, d->converter)) continue;
        for (int i = 0; i < plan->n_apply; i++)
            if (!apply_used[i] && mx_pattern_match_module(plan->apply[i].compiled, mod->fqn, NULL))
                apply_used[i] = true;

        d->apply_index = first_match(plan->apply, plan->n_apply, mod->fqn, &d->apply_matched_len);
        d->ignore_index = first_match(plan->ignored, plan->n_ignored, mod->fqn, &d->ignore_matched_len);
        if (!plan->enabled) d->reason = MX_REASON_QUANT_OFF;
        else if (d->apply_index < 0) d->reason = MX_REASON_NOT_APPLIED;
        else if (d->ignore_index >= 0) d->reason = MX_REASON_EXCLUDED;
        else d->reason = MX_REASON_CONVERTED, d->converted = true;
        if (d->apply_index < 0) d->apply_matched_len = 0;
        if (d->ignore_index < 0) d->ignore_matched_len = 0;
    }

    /* Only patterns written in the config (line > 0) warn: the defaults are not typos. */
    for (int i = 0; i < plan->n_apply; i++) {
        if (apply_used[i] || plan->apply[i].line <= 0) continue;
        if (!(sel.warnings[sel.n_warnings] = pattern_warning("apply_modules", &plan->apply[i], "selects no module")))
            goto nomem;
        sel.n_warnings++;
    }
    for (int i = 0; i < plan->n_ignored; i++) {
        if (ignore_used[i] || plan->ignored[i].line <= 0) continue;
        if (!(sel.warnings[sel.n_warnings] =
                  pattern_warning("ignored_modules", &plan->ignored[i], "matches no module")))
            goto nomem;
        sel.n_warnings++;
    }
    free(apply_used);
    free(ignore_used);
    *out = sel;
    return 0;

nomem:
    free(apply_used);
    free(ignore_used);
    mx_selection_free(&sel);
    return MX_ENOMEM;
}

void mx_selection_free(mx_selection *selection) {
    if (!selection) return;
    for (int i = 0; i < selection->n_warnings; i++) free(selection->warnings[i]);
    free(selection->warnings);
    free(selection->decisions);
    memset(selection, 0, sizeof *selection);
}

int mx_decision_explain(const mx_plan *plan, const mx_module *module, const mx_decision *decision, char *buf,
                        size_t size) {
    if (!plan || !module || !module->fqn || !decision || (!buf && size > 0)) return MX_ENULL;
    const mx_decision *d = decision;
    char quoted[MXI_QUOTE_SIZE], matched[MXI_QUOTE_SIZE];
    switch (d->reason) {
    case MX_REASON_CONVERTED: {
        const char *conv = mx_converter_family_name(d->converter, plan->family);
        if (!conv || d->apply_index < 0 || d->apply_index >= plan->n_apply ||
            d->apply_matched_len > strlen(module->fqn))
            return MX_EINVAL;
        const mx_plan_pattern *p = &plan->apply[d->apply_index];
        return snprintf(buf, size, "converted by %s: applied by '%s' (matched %s)", conv,
                        mxi_quote(quoted, sizeof quoted, p->text, strlen(p->text)),
                        mxi_quote(matched, sizeof matched, module->fqn, d->apply_matched_len));
    }
    case MX_REASON_EXCLUDED: {
        if (d->ignore_index < 0 || d->ignore_index >= plan->n_ignored ||
            d->ignore_matched_len > strlen(module->fqn))
            return MX_EINVAL;
        const mx_plan_pattern *p = &plan->ignored[d->ignore_index];
        return snprintf(buf, size, "not converted: excluded by '%s' (matched %s)",
                        mxi_quote(quoted, sizeof quoted, p->text, strlen(p->text)),
                        mxi_quote(matched, sizeof matched, module->fqn, d->ignore_matched_len));
    }
    case MX_REASON_NOT_APPLIED:
        return snprintf(buf, size, "not converted: not matched by apply_modules");
    case MX_REASON_QUANT_OFF:
        return snprintf(buf, size, "not converted: quantization off (no recipe_name)");
    case MX_REASON_NOT_HANDLED:
        if (module->kind == MX_MODULE_LINEAR)
            return snprintf(buf, size, "not converted: no listed converter handles linear layers");
        if (module->kind == MX_MODULE_EXPERTS)
            return snprintf(buf, size, "not converted: no listed converter handles MoE experts");
        return snprintf(buf, size, "not converted: not a linear layer or MoE experts");
    }
    return MX_EINVAL;
}
