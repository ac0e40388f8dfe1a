/* Status codes to names and messages, from MX_STATUS_LIST. */
#include "mxtrain/error.h"

const char *mx_strerror(int code) {
#define MESSAGE_CASE(name, value, message) \
    case name: return message;
    switch (code) { MX_STATUS_LIST(MESSAGE_CASE) }
#undef MESSAGE_CASE
    return "unknown error code";
}

const char *mx_errname(int code) {
#define NAME_CASE(name, value, message) \
    case name: return #name;
    switch (code) { MX_STATUS_LIST(NAME_CASE) }
#undef NAME_CASE
    return "MX_EUNKNOWN";
}
