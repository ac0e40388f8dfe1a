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

/* Every status code, once: X(NAME, VALUE, MESSAGE). The enum below and mx_strerror /
 * mx_errname are generated from it, so a code's message cannot drift from its entry. */
#define MX_STATUS_LIST(X)                                                                  \
    X(MX_OK, 0, "success")                                                                 \
    X(MX_ENULL, -1, "a required pointer argument is NULL")                                 \
    X(MX_ESIZE, -2, "a size is negative or the sizes overflow")                            \
    X(MX_EENUM, -3, "an enum argument has no such value")                                  \
    X(MX_EINVAL, -4, "an argument is out of its allowed range")                            \
    X(MX_ENOMEM, -5, "out of memory")                                                      \
    X(MX_EIO, -6, "a file could not be opened, read or written")                           \
    X(MX_ECONFIG, -7, "invalid configuration")                                             \
    X(MX_ERECIPE, -8, "malformed quantization recipe")                                     \
    X(MX_EUNSUPPORTED, -9, "recognised, but not supported yet")                            \
    X(MX_EPATTERN, -10, "malformed module pattern")                                        \
    X(MX_EFORMAT, -11, "malformed file contents")                                          \
    X(MX_ECOMM, -12, "communication between ranks failed") /* MPI: the job cannot go on */ \
    X(MX_ETIMEOUT, -13, "no progress from the other ranks within the timeout")

#define MX_STATUS_ENUM_ENTRY(name, value, message) name = value,
typedef enum { MX_STATUS_LIST(MX_STATUS_ENUM_ENTRY) } mx_status;
#undef MX_STATUS_ENUM_ENTRY

/* A human-readable message for a status code ("unknown error code" for codes not listed). */
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
