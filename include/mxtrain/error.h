/* mxtrain — error codes shared by every layer of the library.
 *
 * Library functions return 0 on success or one of the negative codes below; they never
 * abort on bad input. mx_strerror() turns a code into a one-line message. Functions that
 * can say more (which key, which position) also fill an mx_diag.
 */
#ifndef MXTRAIN_ERROR_H
#define MXTRAIN_ERROR_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    MX_OK = 0,
    MX_ENULL = -1,        /* a required pointer argument is NULL */
    MX_ESIZE = -2,        /* a size is negative, or the sizes overflow */
    MX_EENUM = -3,        /* an enum argument has no such value */
    MX_EINVAL = -4,       /* an argument is out of its allowed range */
    MX_ENOMEM = -5,       /* out of memory */
    MX_EIO = -6,          /* a file could not be opened, read or written */
    MX_ECONFIG = -7,      /* a configuration value is invalid */
    MX_ERECIPE = -8,      /* a recipe string is malformed */
    MX_EUNSUPPORTED = -9, /* recognised, but not supported yet */
    MX_EPATTERN = -10,    /* a module pattern is malformed */
    MX_EFORMAT = -11,     /* a file's contents are malformed */
    MX_ECOMM = -12,       /* an MPI call failed (the job cannot go on) */
    MX_ETIMEOUT = -13,    /* a wait for other ranks saw no progress within the timeout */
} mx_status;

/* A human-readable message for a status code ("unknown error code" for codes not above). */
const char *mx_strerror(int code);

/* The symbolic name of a status code, e.g. "MX_ESIZE". */
const char *mx_errname(int code);

/* Detail for errors that can say more than their code: which key, value, line or position
 * was wrong and what is allowed. One line, no trailing newline. */
typedef struct {
    char msg[1024];
} mx_diag;

#ifdef __cplusplus
}
#endif

#endif
