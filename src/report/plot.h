/* Internal: loss curves of training runs as a PNG, drawn by gnuplot (Debian's gnuplot-nox),
 * which is fed a script with the points over a pipe. Used by `mxtrain plot`; the trainer can
 * call it at the end of a run. */
#ifndef MXI_PLOT_H
#define MXI_PLOT_H

#include <stdio.h>

#include "mxtrain/error.h"

/* Draw the train loss ("loss") and validation loss ("val_loss") of the JSON Lines metrics
 * files jsonl[0..n) against "step", one colour per file, into the PNG out. labels[i] names
 * file i in the key (labels, or any labels[i], may be NULL: then the file name without its
 * directory and extension). title may be NULL (no title).
 *
 * Records are the JSON objects of the lines; an object with "loss" gives a train point, one
 * with "val_loss" a validation point (both need an integer "step" >= 0); other objects and
 * blank lines are skipped. Points are sorted by step, and of several records of one step
 * (a resumed run appends to its metrics file) the last one counts. A null loss (the trainer
 * writes NaN and infinity so) is a gap: the line is broken at its step, the finite points
 * drawn; a run with nothing but nulls is an error.
 *
 * The PNG is written to a temporary file beside out and renamed over out only when gnuplot
 * finished and wrote a PNG, so a failure leaves no partial file. Errors: MX_EIO (a file
 * cannot be read, out cannot be written, gnuplot cannot be run or fails), MX_EFORMAT (a line
 * is not JSON or a record has wrong types, a file has no loss records, every loss is null), MX_EINVAL (bad
 * arguments), MX_ENOMEM; diag names the file, line and what is wrong. */
int mxi_plot_metrics(const char *const *jsonl, const char *const *labels, int n, const char *out, const char *title,
                     mx_diag *diag);

/* A gnuplot script's writer: the whole script into f, from arg. */
typedef void (*mxi_plot_writer)(FILE *f, const void *arg);

/* Run gnuplot on put's script and put its PNG at out, replaced only once complete (errors
 * as mxi_plot_metrics'). */
int mxi_plot_draw(const char *out, mxi_plot_writer put, const void *arg, mx_diag *diag);
/* Script pieces: the PNG terminal of width x height with title (NULL: none); s as a gnuplot
 * single-quoted string. */
void mxi_plot_terminal(FILE *f, int width, int height, const char *title);
void mxi_plot_string(FILE *f, const char *s);

/* Draw field (a number of the "quant_stats" records: "sqnr_db", "underflows_pct", ...) of
 * the metrics files jsonl[0..n) against "step", one line per file, tensor and role (role
 * NULL: every role, else that one only), into the PNG out. labels and title as
 * mxi_plot_metrics'. MX_EFORMAT when no record has a finite value of field. */
int mxi_plot_quant_stats(const char *const *jsonl, const char *const *labels, int n, const char *field,
                         const char *role, const char *out, const char *title, mx_diag *diag);

#endif
