/* prepare with a tokenizer: documents encoded on every thread, in dynamic chunks (their
 * sizes vary by orders of magnitude), each into its own array, so the order of the output
 * is the documents' whatever thread encodes which. */
#include <stdlib.h>

#include "core/clock.h"
#include "core/diag.h"
#include "io/prepare_internal.h"

int mxi_prepare_encode(const mxi_tokenizer *tok, const mxi_doc *docs, int64_t n, uint32_t eod,
                       const mx_prepare_opts *o, mxi_tok_ids *out, double *seconds, mx_diag *diag) {
    int64_t total = 0, done = 0;
    for (int64_t i = 0; i < n; i++) total += (int64_t)docs[i].len;
    double t0 = mxi_now_seconds(), last = t0;
    int rc = 0;
    int64_t failed = -1;
    mx_diag first = {{0}};
#pragma omp parallel for schedule(dynamic, 16)
    for (int64_t i = 0; i < n; i++) {
        int r;
#pragma omp atomic read
        r = rc;
        if (r) continue;
        mx_diag d = {{0}};
        mxi_tok_ids ids = {0};
        ids.cap = 1 + (int64_t)docs[i].len / 3; /* about 4 bytes a token: one growth at most, usually */
        ids.ids = malloc((size_t)ids.cap * sizeof *ids.ids);
        r = ids.ids ? 0 : mxi_diag(&d, MX_ENOMEM, "prepare: out of memory (%zu bytes of token ids)",
                                   (size_t)ids.cap * sizeof *ids.ids);
        if (r == 0) {
            ids.ids[ids.n++] = eod;
            r = mxi_tokenizer_encode(tok, (const char *)docs[i].text, docs[i].len, MXI_TOK_ENCODE_ADD_SPECIAL, &ids, &d);
        }
        out[i] = ids;
#pragma omp critical
        {
            if (r && (failed < 0 || i < failed)) { /* the first document's error, on any thread count */
                failed = i;
                first = d;
#pragma omp atomic write
                rc = r;
            }
            done += (int64_t)docs[i].len;
            double now = mxi_now_seconds();
            if (o->progress && now - last >= 2.0) {
                last = now;
                o->progress(done, total, now - t0, o->progress_arg);
            }
        }
    }
    *seconds = mxi_now_seconds() - t0;
    if (rc && diag) *diag = first;
    return rc;
}
