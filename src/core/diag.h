/* Internal: filling an mx_diag. */
#ifndef MXI_DIAG_H
#define MXI_DIAG_H

#include "mxtrain/error.h"

/* printf into diag->msg (if diag is not NULL) and return code, so that error paths read
 * `return mxi_diag(diag, MX_ECONFIG, "...", ...);`. */
int mxi_diag(mx_diag *diag, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
