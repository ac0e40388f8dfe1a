/* `mxtrain plot --quant-stats`: a field of the quantization statistics records
 * (training.quant_stats_interval) per tensor and role over the steps, through gnuplot. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/diag.h"
#include "core/text.h"
#include "report/plot.h"

typedef struct {
    char *name;        // "label tensor role"
    long long *step;
    double *value;     // NAN: null (a gap)
    size_t n, cap;
} qs_series;

typedef struct {
    qs_series *s;
    size_t n, cap;
    const char *field;
} qs_plot;

static qs_series *series_of(qs_plot *p, const char *name) {
    for (size_t i = 0; i < p->n; i++)
        if (strcmp(p->s[i].name, name) == 0) return &p->s[i];
    if (p->n == p->cap) {
        size_t cap = p->cap ? 2 * p->cap : 64;
        qs_series *s = realloc(p->s, cap * sizeof *s);
        if (!s) return NULL;
        p->s = s, p->cap = cap;
    }
    char *copy = mxi_strndup(name, strlen(name));
    if (!copy) return NULL;
    p->s[p->n] = (qs_series){.name = copy};
    return &p->s[p->n++];
}

static int push(qs_series *s, long long step, double v) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 32;
        long long *st = realloc(s->step, cap * sizeof *st);
        if (!st) return -1;
        s->step = st;
        double *va = realloc(s->value, cap * sizeof *va);
        if (!va) return -1;
        s->value = va, s->cap = cap;
    }
    s->step[s->n] = step, s->value[s->n++] = v;
    return 0;
}

static int read_file(qs_plot *p, const char *path, const char *label, const char *role, mx_diag *diag) {
    FILE *f = fopen(path, "r");
    if (!f) return mxi_diag(diag, MX_EIO, "%s: cannot open the metrics file: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0, line_no = 0;
    int rc = 0;
    while (rc == 0 && getline(&line, &cap, f) >= 0) {
        line_no++;
        json_error_t jerr;
        json_t *rec = json_loads(line, 0, &jerr);
        if (!rec) {
            if (strspn(line, " \t\r\n") == strlen(line)) continue;
            char text[MXI_QUOTE_SIZE];
            rc = mxi_diag(diag, MX_EFORMAT, "%s:%zu: not a JSON line: %s", path, line_no,
                          mxi_quote(text, sizeof text, jerr.text, strlen(jerr.text)));
            break;
        }
        const char *tensor = json_string_value(json_object_get(rec, "tensor"));
        const char *r = json_string_value(json_object_get(rec, "role"));
        json_t *step = json_object_get(rec, "step"), *v = json_object_get(rec, p->field);
        if (json_object_get(rec, "quant_stats") && tensor && r && json_is_integer(step) && (!role || !strcmp(role, r))) {
            if (v && !json_is_number(v) && !json_is_null(v)) {
                rc = mxi_diag(diag, MX_EFORMAT, "%s:%zu: \"%s\" is not a number (allowed: a number or null)", path,
                              line_no, p->field);
            } else {
                char name[512];
                snprintf(name, sizeof name, "%s %s %s", label, tensor, r);
                qs_series *s = series_of(p, name);
                if (!s || push(s, (long long)json_integer_value(step), v && json_is_number(v) ? json_number_value(v) : NAN))
                    rc = mxi_diag(diag, MX_ENOMEM, "%s: out of memory reading the records", path);
            }
        }
        json_decref(rec);
    }
    free(line);
    fclose(f);
    return rc;
}

static void put_script(FILE *f, const void *arg) {
    const qs_plot *p = arg;
    fputs("set xlabel 'step'\nset ylabel ", f);
    mxi_plot_string(f, p->field);
    fputs("\nset grid\nset key outside right top font ',7'\n", f);
    for (size_t i = 0; i < p->n; i++) {
        fprintf(f, "$q%zu << EOD\n", i);
        for (size_t k = 0; k < p->s[i].n; k++)
            if (isfinite(p->s[i].value[k])) fprintf(f, "%lld %.17g\n", p->s[i].step[k], p->s[i].value[k]);
            else fputc('\n', f);
        fputs("EOD\n", f);
    }
    const char *sep = "plot ";
    for (size_t i = 0; i < p->n; i++) {
        fprintf(f, "%s$q%zu using 1:2 with linespoints pt 7 ps 0.4 lw 1 title ", sep, i);
        mxi_plot_string(f, p->s[i].name);
        sep = ", \\\n     ";
    }
    fputc('\n', f);
}

typedef struct {
    const qs_plot *p;
    const char *title;
} titled;

static void put_titled(FILE *f, const void *arg) {
    const titled *t = arg;
    mxi_plot_terminal(f, 1100, 600, t->title);
    put_script(f, t->p);
}

int mxi_plot_quant_stats(const char *const *jsonl, const char *const *labels, int n, const char *field,
                         const char *role, const char *out, const char *title, mx_diag *diag) {
    if (!jsonl || !out || !field) return mxi_diag(diag, MX_ENULL, "mxi_plot_quant_stats: NULL argument");
    qs_plot p = {.field = field};
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        const char *base = strrchr(jsonl[i], '/');
        char label[256];
        if (labels && labels[i]) snprintf(label, sizeof label, "%s", labels[i]);
        else snprintf(label, sizeof label, "%s", base ? base + 1 : jsonl[i]);
        if (!(labels && labels[i])) {
            char *dot = strrchr(label, '.');
            if (dot && dot != label) *dot = '\0';
        }
        rc = read_file(&p, jsonl[i], label, role, diag);
    }
    size_t finite = 0;
    for (size_t i = 0; i < p.n; i++)
        for (size_t k = 0; k < p.s[i].n; k++) finite += isfinite(p.s[i].value[k]);
    if (rc == 0 && finite == 0)
        rc = mxi_diag(diag, MX_EFORMAT, "%s: no quantization statistics record with a finite \"%s\"%s%s (allowed: a metrics "
                      "file of a run with training.quant_stats_interval)", n == 1 ? jsonl[0] : "the metrics files", field,
                      role ? " for role " : "", role ? role : "");
    titled t = {&p, title};
    if (rc == 0) rc = mxi_plot_draw(out, put_titled, &t, diag);
    for (size_t i = 0; i < p.n; i++) free(p.s[i].name), free(p.s[i].step), free(p.s[i].value);
    free(p.s);
    return rc;
}
