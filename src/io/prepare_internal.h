/* Internal to prepare: documents and their encoding with a Hugging Face tokenizer. */
#ifndef MXI_PREPARE_INTERNAL_H
#define MXI_PREPARE_INTERNAL_H

#include "io/tokenizer.h"
#include "mxtrain/tokens.h"

typedef struct {
    const unsigned char *text;
    size_t len;
} mxi_doc;

/* Encode each document into out[i] (n of them, zeroed by the caller; free with
 * mxi_tokenizer_ids_free): the end-of-document token eod, then the document's ids. Threads
 * share the documents (OpenMP); each result depends on its document only, so the output is
 * the same on any number of threads. Reports to o->progress; *seconds the time taken. */
int mxi_prepare_encode(const mxi_tokenizer *tok, const mxi_doc *docs, int64_t n, uint32_t eod,
                       const mx_prepare_opts *o, mxi_tok_ids *out /* (n) */, double *seconds, mx_diag *diag);

#endif
