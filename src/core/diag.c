#include "core/diag.h"

#include <stdarg.h>
#include <stdio.h>

int mxi_diag(mx_diag *diag, int code, const char *fmt, ...) {
    if (diag) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(diag->msg, sizeof diag->msg, fmt, ap);
        va_end(ap);
    }
    return code;
}
