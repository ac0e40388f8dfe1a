/* Status codes to names and messages. */
#include "mxtrain/error.h"

typedef struct {
    int code;
    const char *name;
    const char *message;
} status_entry;

static const status_entry status_table[] = {
    {MX_OK, "MX_OK", "success"},
    {MX_ENULL, "MX_ENULL", "a required pointer argument is NULL"},
    {MX_ESIZE, "MX_ESIZE", "a size is negative or the sizes overflow"},
    {MX_EENUM, "MX_EENUM", "an enum argument has no such value"},
    {MX_EINVAL, "MX_EINVAL", "an argument is out of its allowed range"},
    {MX_ENOMEM, "MX_ENOMEM", "out of memory"},
    {MX_EIO, "MX_EIO", "a file could not be opened, read or written"},
    {MX_ECONFIG, "MX_ECONFIG", "invalid configuration"},
    {MX_ERECIPE, "MX_ERECIPE", "malformed quantization recipe"},
    {MX_EUNSUPPORTED, "MX_EUNSUPPORTED", "recognised, but not supported yet"},
    {MX_EPATTERN, "MX_EPATTERN", "malformed module pattern"},
    {MX_EFORMAT, "MX_EFORMAT", "malformed file contents"},
    {MX_ECOMM, "MX_ECOMM", "communication between ranks failed"},
    {MX_ETIMEOUT, "MX_ETIMEOUT", "no progress from the other ranks within the timeout"},
};

static const status_entry *status_find(int code) {
    for (size_t i = 0; i < sizeof status_table / sizeof status_table[0]; i++)
        if (status_table[i].code == code) return &status_table[i];
    return NULL;
}

const char *mx_strerror(int code) {
    const status_entry *e = status_find(code);
    return e ? e->message : "unknown error code";
}

const char *mx_errname(int code) {
    const status_entry *e = status_find(code);
    return e ? e->name : "MX_EUNKNOWN";
}
