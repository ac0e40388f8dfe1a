/* Loss curves through gnuplot (see plot.h). The metrics files are read with jansson into
 * sorted point lists; the script, with the points as inline data blocks, goes to gnuplot's
 * standard input over a pipe, and gnuplot's standard output (the PNG) goes straight into the
 * temporary output file, so no path is ever quoted into the script. */
#include "report/plot.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/diag.h"
#include "core/text.h"
#include "io/io_internal.h"

extern char **environ;

/* Metrics files are a few hundred bytes per step; anything near this is not one. */
#define PLOT_MAX_FILE_BYTES (1ll << 30)
#define PLOT_WIDTH 800
#define PLOT_HEIGHT 500

typedef struct {
    long long step;
    double value; /* NAN for a null (the run wrote a non-finite loss): a gap in the line */
    size_t line;  /* file order, so that the last record of a step wins */
} point;

typedef struct {
    point *p;
    size_t n, cap;
} series;

typedef struct {
    series train, val;
    char *label;
    dev_t dev;
    ino_t ino;
} run;

static int push(series *s, long long step, double value, size_t line) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 256;
        point *p = realloc(s->p, cap * sizeof *p);
        if (!p) return -1;
        s->p = p;
        s->cap = cap;
    }
    s->p[s->n++] = (point){step, value, line};
    return 0;
}

static int cmp_point(const void *a, const void *b) {
    const point *x = a, *y = b;
    if (x->step != y->step) return x->step < y->step ? -1 : 1;
    return x->line < y->line ? -1 : x->line > y->line;
}

/* Sort by step; of equal steps keep the last written. */
static void sort_unique(series *s) {
    if (s->n < 2) return;
    qsort(s->p, s->n, sizeof *s->p, cmp_point);
    size_t o = 0;
    for (size_t i = 0; i < s->n; i++) {
        if (o > 0 && s->p[o - 1].step == s->p[i].step) s->p[o - 1] = s->p[i];
        else s->p[o++] = s->p[i];
    }
    s->n = o;
}

static const char *kind_of(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

static bool blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n') return false;
    return true;
}

/* One line of a metrics file: a train point, a validation point, both or neither. */
static int read_record(const char *path, size_t line_no, const char *line, size_t len, run *r, mx_diag *diag) {
    json_error_t jerr;
    json_t *rec = json_loadb(line, len, JSON_REJECT_DUPLICATES, &jerr);
    char text[MXI_QUOTE_SIZE]; /* jansson's text quotes the line, control characters included */
    if (!rec)
        return mxi_diag(diag, MX_EFORMAT, "%s:%zu: not a JSON line: %s", path, line_no,
                        mxi_quote(text, sizeof text, jerr.text, strlen(jerr.text)));
    int rc = 0;
    if (!json_is_object(rec)) {
        rc = mxi_diag(diag, MX_EFORMAT, "%s:%zu: the line holds %s, not a JSON object (a metrics record)", path,
                      line_no, kind_of(rec));
        goto done;
    }
    json_t *loss = json_object_get(rec, "loss"), *val = json_object_get(rec, "val_loss");
    if (!loss && !val) goto done; /* another kind of record */
    json_t *step = json_object_get(rec, "step");
    if (!step || !json_is_integer(step) || json_integer_value(step) < 0) {
        char what[48];
        if (step && json_is_integer(step)) snprintf(what, sizeof what, "%lld", (long long)json_integer_value(step));
        else snprintf(what, sizeof what, "%s", step ? kind_of(step) : "missing");
        rc = mxi_diag(diag, MX_EFORMAT, "%s:%zu: a loss record whose \"step\" is %s (allowed: an integer >= 0)", path,
                      line_no, what);
        goto done;
    }
    const char *names[2] = {"loss", "val_loss"};
    json_t *values[2] = {loss, val};
    series *dst[2] = {&r->train, &r->val};
    for (int k = 0; k < 2; k++) {
        if (!values[k]) continue;
        if (!json_is_number(values[k]) && !json_is_null(values[k])) {
            rc = mxi_diag(diag, MX_EFORMAT, "%s:%zu: \"%s\" is %s (allowed: a number or null)", path, line_no,
                          names[k], kind_of(values[k]));
            goto done;
        }
        double v = json_is_null(values[k]) ? NAN : json_number_value(values[k]);
        if (push(dst[k], (long long)json_integer_value(step), v, line_no)) {
            rc = mxi_diag(diag, MX_ENOMEM, "%s: out of memory reading the records (%zu bytes for %zu of them)", path,
                          2 * dst[k]->cap * sizeof(point), 2 * dst[k]->cap);
            goto done;
        }
    }
done:
    json_decref(rec);
    return rc;
}

static int read_run(const char *path, run *r, mx_diag *diag) {
    /* O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused below. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return mxi_diag(diag, MX_EIO, "%s: cannot open the metrics file: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int err = errno;
        close(fd);
        return mxi_diag(diag, MX_EIO, "%s: cannot read the metrics file: %s", path, strerror(err));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return mxi_diag(diag, MX_EIO, "%s: not a regular file (allowed: a JSON Lines metrics file, "
                                      "training.metrics_path)", path);
    }
    if (st.st_size > PLOT_MAX_FILE_BYTES) {
        close(fd);
        return mxi_diag(diag, MX_EFORMAT, "%s: %lld bytes, too large for a metrics file (allowed: up to %lld)", path,
                        (long long)st.st_size, PLOT_MAX_FILE_BYTES);
    }
    if (st.st_size == 0) {
        close(fd);
        return mxi_diag(diag, MX_EFORMAT, "%s: empty file, no loss records to plot", path);
    }
    r->dev = st.st_dev;
    r->ino = st.st_ino;
    FILE *f = fdopen(fd, "r");
    if (!f) {
        close(fd);
        return mxi_diag(diag, MX_ENOMEM, "%s: out of memory (a stream's %d-byte buffer)", path, BUFSIZ);
    }
    char *line = NULL;
    size_t cap = 0, line_no = 0;
    ssize_t len;
    int rc = 0;
    errno = 0;
    while (rc == 0 && (len = getline(&line, &cap, f)) >= 0) {
        line_no++;
        if (!blank(line, (size_t)len)) rc = read_record(path, line_no, line, (size_t)len, r, diag);
        errno = 0;
    }
    if (rc == 0 && ferror(f))
        rc = mxi_diag(diag, MX_EIO, "%s: read failed after line %zu: %s", path, line_no,
                      strerror(errno ? errno : EIO));
    free(line);
    fclose(f);
    if (rc == 0 && r->train.n == 0 && r->val.n == 0)
        rc = mxi_diag(diag, MX_EFORMAT, "%s: no loss records (allowed: JSON lines with an integer \"step\" and a "
                                        "\"loss\" or \"val_loss\", as training.metrics_path holds)", path);
    sort_unique(&r->train);
    sort_unique(&r->val);
    return rc;
}

/* "runs/bf16.jsonl" -> "bf16". */
static char *default_label(const char *path) {
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    const char *dot = strrchr(base, '.');
    size_t n = dot && dot != base ? (size_t)(dot - base) : strlen(base);
    return mxi_strndup(base, n);
}

/* A gnuplot single-quoted string: '' is a quote; control characters would end the command. */
static void put_string(FILE *f, const char *s) {
    fputc('\'', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '\'') fputs("''", f);
        else fputc(c < 0x20 || c == 0x7f ? ' ' : c, f);
    }
    fputc('\'', f);
}

/* The points drawn (the finite ones), and whether a null lies between two of them: a gap
 * in the line, when each point is marked too so that a finite point between nulls shows. */
static size_t finite_points(const series *s, bool *gaps) {
    size_t n = 0, first = 0, last = 0;
    for (size_t k = 0; k < s->n; k++)
        if (isfinite(s->p[k].value)) {
            if (n++ == 0) first = k;
            last = k;
        }
    *gaps = n > 0 && last - first + 1 > n;
    return n;
}

/* A blank line in gnuplot data ends a line segment: a null's step is a gap. */
static void put_block(FILE *f, const char *name, int i, const series *s) {
    fprintf(f, "$%s%d << EOD\n", name, i);
    bool in_line = false;
    for (size_t k = 0; k < s->n; k++) {
        if (isfinite(s->p[k].value)) {
            fprintf(f, "%lld %.17g\n", s->p[k].step, s->p[k].value);
            in_line = true;
        } else if (in_line) {
            fputc('\n', f);
            in_line = false;
        }
    }
    fputs("EOD\n", f);
}

void mxi_plot_string(FILE *f, const char *s) { put_string(f, s); }

void mxi_plot_terminal(FILE *f, int width, int height, const char *title) {
    fprintf(f, "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {\n"
               "    set terminal pngcairo size %d,%d noenhanced font 'sans,10'\n"
               "} else {\n"
               "    set terminal png size %d,%d noenhanced\n"
               "}\n",
            width, height, width, height);
    if (title) {
        fputs("set title ", f);
        put_string(f, title);
        fputc('\n', f);
    }
}

typedef struct {
    const run *runs;
    int n;
    const char *title;
} loss_plot;

static void put_script(FILE *f, const void *arg) {
    const loss_plot *lp = arg;
    const run *runs = lp->runs;
    int n = lp->n;
    mxi_plot_terminal(f, PLOT_WIDTH, PLOT_HEIGHT, lp->title);
    fputs("set xlabel 'step'\nset ylabel 'loss (nats per token)'\nset grid\nset key top right\n", f);
    for (int i = 0; i < n; i++) {
        bool gaps;
        if (finite_points(&runs[i].train, &gaps)) put_block(f, "train", i, &runs[i].train);
        if (finite_points(&runs[i].val, &gaps)) put_block(f, "val", i, &runs[i].val);
    }
    const char *sep = "plot ";
    for (int i = 0; i < n; i++) {
        int color = i % 8 + 1;
        bool gaps;
        size_t points = finite_points(&runs[i].train, &gaps);
        if (points) {
            fprintf(f, "%s$train%d using 1:2 with %s lw 2 lc %d title ", sep, i,
                    gaps ? "linespoints pt 7 ps 0.5" : points > 1 ? "lines" : "points pt 7", color);
            put_string(f, runs[i].label);
            fputs(" . ' train'", f);
            sep = ", \\\n     ";
        }
        if (finite_points(&runs[i].val, &gaps)) {
            fprintf(f, "%s$val%d using 1:2 with linespoints dt 2 pt 7 ps 0.8 lw 1.5 lc %d title ", sep, i, color);
            put_string(f, runs[i].label);
            fputs(" . ' val'", f);
            sep = ", \\\n     ";
        }
    }
    fputs("\n", f);
}

/* The last non-empty line of gnuplot's stderr, for the error message. */
static void last_line(FILE *err, char *buf, size_t size) {
    char text[4096];
    buf[0] = '\0';
    if (fseek(err, 0, SEEK_END) != 0) return;
    long end = ftell(err);
    long start = end > (long)sizeof text - 1 ? end - (long)sizeof text + 1 : 0;
    if (end <= 0 || fseek(err, start, SEEK_SET) != 0) return;
    size_t n = fread(text, 1, sizeof text - 1, err);
    while (n > 0 && (text[n - 1] == '\n' || text[n - 1] == '\r' || text[n - 1] == ' ')) n--;
    size_t b = n;
    while (b > 0 && text[b - 1] != '\n') b--;
    while (b < n && text[b] == ' ') b++;
    mxi_quote(buf, size, text + b, n - b);
}

static void set_cloexec(int fd) { fcntl(fd, F_SETFD, fcntl(fd, F_GETFD) | FD_CLOEXEC); }

/* Run gnuplot with the script on its stdin and its stdout into out_fd. */
static int run_gnuplot(mxi_plot_writer put, const void *arg, int out_fd, const char *out, mx_diag *diag) {
    int p[2];
    if (pipe(p) != 0) return mxi_diag(diag, MX_EIO, "%s: cannot make a pipe to gnuplot: %s", out, strerror(errno));
    set_cloexec(p[0]);
    set_cloexec(p[1]);
    FILE *err = tmpfile();
    if (!err) {
        int e = errno;
        close(p[0]);
        close(p[1]);
        return mxi_diag(diag, MX_EIO, "%s: cannot make a temporary file for gnuplot's messages: %s", out, strerror(e));
    }
    set_cloexec(fileno(err));
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, p[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out_fd, 1);
    posix_spawn_file_actions_adddup2(&fa, fileno(err), 2);
    char *argv[] = {"gnuplot", NULL};
    pid_t pid;
    int sp = posix_spawnp(&pid, "gnuplot", &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(p[0]);
    if (sp != 0) {
        close(p[1]);
        fclose(err);
        if (sp == ENOENT)
            return mxi_diag(diag, MX_EIO, "%s: cannot draw the plot: gnuplot is not installed (not found on PATH; "
                                          "Debian's gnuplot-nox has it, scripts/setup installs it)", out);
        return mxi_diag(diag, MX_EIO, "%s: cannot run gnuplot: %s", out, strerror(sp));
    }

    /* gnuplot may stop reading early (an error): the write then fails with EPIPE, which
     * must not kill the caller by SIGPIPE. */
    sigset_t pipe_set, old_mask, pending;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    sigpending(&pending);
    bool was_pending = sigismember(&pending, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, &old_mask);
    FILE *script = fdopen(p[1], "w");
    bool write_failed = !script;
    if (script) {
        put(script, arg);
        write_failed = fclose(script) != 0;
    } else {
        close(p[1]);
    }
    sigpending(&pending);
    if (!was_pending && sigismember(&pending, SIGPIPE)) {
        struct timespec zero = {0, 0};
        (void)sigtimedwait(&pipe_set, NULL, &zero);
    }
    pthread_sigmask(SIG_SETMASK, &old_mask, NULL);

    int status;
    while (waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR) {
            int e = errno;
            fclose(err);
            return mxi_diag(diag, MX_EIO, "%s: waiting for gnuplot failed: %s", out, strerror(e));
        }
    }
    char msg[MXI_QUOTE_SIZE * 2];
    last_line(err, msg, sizeof msg);
    fclose(err);
    if (WIFSIGNALED(status))
        return mxi_diag(diag, MX_EIO, "%s: gnuplot was killed by signal %d", out, WTERMSIG(status));
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return mxi_diag(diag, MX_EIO, "%s: gnuplot failed (exit status %d)%s%s", out,
                        WIFEXITED(status) ? WEXITSTATUS(status) : -1, msg[0] ? ": " : "", msg);
    if (write_failed) return mxi_diag(diag, MX_EIO, "%s: gnuplot did not read the whole plot script", out);
    return 0;
}

/* Whether the finished temporary file starts with the PNG signature. */
static bool is_png(const char *path) {
    static const unsigned char sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    unsigned char head[8];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    bool ok = mxi_pread_full(fd, head, sizeof head, 0) == 0 && memcmp(head, sig, sizeof sig) == 0;
    close(fd);
    return ok;
}

int mxi_plot_draw(const char *out, mxi_plot_writer put, const void *arg, mx_diag *diag) {
    mxi_atomic a = {.fd = -1};
    int rc = mxi_atomic_begin(&a, out, diag);
    if (rc) return rc;
    rc = run_gnuplot(put, arg, a.fd, out, diag);
    if (rc == 0 && !is_png(a.tmp_path)) rc = mxi_diag(diag, MX_EIO, "%s: gnuplot wrote no PNG image", out);
    if (rc == 0) return mxi_atomic_commit(&a, diag);
    mxi_atomic_abort(&a);
    return rc;
}

int mxi_plot_metrics(const char *const *jsonl, const char *const *labels, int n, const char *out, const char *title,
                     mx_diag *diag) {
    if (!jsonl || !out) return mxi_diag(diag, MX_ENULL, "mxi_plot_metrics: NULL argument");
    if (n < 1) return mxi_diag(diag, MX_EINVAL, "mxi_plot_metrics: %d metrics files (allowed: at least 1)", n);
    run *runs = calloc((size_t)n, sizeof *runs);
    if (!runs) return mxi_diag(diag, MX_ENOMEM, "%s: out of memory (%zu bytes for %d runs)", out, (size_t)n * sizeof *runs, n);
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        if (!jsonl[i]) {
            rc = mxi_diag(diag, MX_ENULL, "mxi_plot_metrics: metrics file %d is NULL", i);
            break;
        }
        const char *label = labels && labels[i] ? labels[i] : NULL;
        runs[i].label = label ? mxi_strndup(label, strlen(label)) : default_label(jsonl[i]);
        if (!runs[i].label)
            rc = mxi_diag(diag, MX_ENOMEM, "%s: out of memory (%zu bytes for a label)", out,
                          strlen(label ? label : jsonl[i]) + 1);
        else rc = read_run(jsonl[i], &runs[i], diag);
    }
    size_t drawn = 0;
    bool gaps;
    for (int i = 0; i < n && rc == 0; i++) drawn += finite_points(&runs[i].train, &gaps) + finite_points(&runs[i].val, &gaps);
    if (rc == 0 && drawn == 0)
        rc = mxi_diag(diag, MX_EFORMAT, "%s: every loss is null (no finite \"loss\" or \"val_loss\" to draw)",
                      n == 1 ? jsonl[0] : "the metrics files");
    struct stat st;
    if (rc == 0 && stat(out, &st) == 0)
        for (int i = 0; i < n && rc == 0; i++)
            if (runs[i].dev == st.st_dev && runs[i].ino == st.st_ino)
                rc = mxi_diag(diag, MX_EINVAL, "%s: is the metrics file being plotted (allowed: another path for the "
                                               "PNG)", out);
    loss_plot lp = {runs, n, title};
    if (rc == 0) rc = mxi_plot_draw(out, put_script, &lp, diag);
    for (int i = 0; i < n; i++) {
        free(runs[i].train.p);
        free(runs[i].val.p);
        free(runs[i].label);
    }
    free(runs);
    return rc;
}
