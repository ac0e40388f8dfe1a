/* Status codes: every code of MX_STATUS_LIST has its own name and a message, and the enum,
 * mx_errname and mx_strerror agree with the list; codes not in it are answered too. */
#include <stdio.h>

#include "harness.h"
#include "mxtrain/error.h"

typedef struct {
    int code;
    const char *name;
    const char *message;
} status_entry;

#define ENTRY(n, v, m) {.code = v, .name = #n, .message = m},
static const status_entry statuses[] = {MX_STATUS_LIST(ENTRY)};
#undef ENTRY
enum { N_STATUSES = (int)(sizeof statuses / sizeof statuses[0]) };

static void test_every_code(void) {
    CHECK_EQ_INT(statuses[0].code, MX_OK);
    CHECK_STR_EQ(statuses[0].name, "MX_OK");
    for (int i = 0; i < N_STATUSES; i++) {
        const status_entry *s = &statuses[i];
        CHECK_STR_EQ(mx_errname(s->code), s->name);
        CHECK_STR_EQ(mx_strerror(s->code), s->message);
        CHECK(s->message[0] != '\0');
        CHECK(strcmp(s->name, "MX_EUNKNOWN") != 0);
        CHECK(strcmp(s->message, "unknown error code") != 0);
        CHECK(s->code <= 0);   // library functions return 0 or a negative code
        for (int j = 0; j < i; j++) {
            CHECK(statuses[j].code != s->code);
            CHECK(strcmp(statuses[j].name, s->name) != 0);
            CHECK(strcmp(statuses[j].message, s->message) != 0);
        }
    }
    // the codes run 0, -1, -2, ... without gaps, as callers loop over them
    for (int c = 0; c >= MX_ETIMEOUT; c--) {
        CHECK(strcmp(mx_errname(c), "MX_EUNKNOWN") != 0);
        CHECK(strcmp(mx_strerror(c), "unknown error code") != 0);
    }
    CHECK_EQ_INT(MX_ETIMEOUT, -(N_STATUSES - 1));
}

static void test_unknown_codes(void) {
    const int unknown[] = {1, 42, MX_ETIMEOUT - 1, -999, -2147483647 - 1, 2147483647};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        CHECK_STR_EQ(mx_errname(unknown[i]), "MX_EUNKNOWN");
        CHECK_STR_EQ(mx_strerror(unknown[i]), "unknown error code");
    }
}

/* The messages as callers have printed them: a change here is a change users see. */
static void test_messages(void) {
    CHECK_STR_EQ(mx_strerror(MX_OK), "success");
    CHECK_STR_EQ(mx_strerror(MX_ENULL), "a required pointer argument is NULL");
    CHECK_STR_EQ(mx_strerror(MX_ESIZE), "a size is negative or the sizes overflow");
    CHECK_STR_EQ(mx_strerror(MX_EENUM), "an enum argument has no such value");
    CHECK_STR_EQ(mx_strerror(MX_EINVAL), "an argument is out of its allowed range");
    CHECK_STR_EQ(mx_strerror(MX_ENOMEM), "out of memory");
    CHECK_STR_EQ(mx_strerror(MX_EIO), "a file could not be opened, read or written");
    CHECK_STR_EQ(mx_strerror(MX_ECONFIG), "invalid configuration");
    CHECK_STR_EQ(mx_strerror(MX_ERECIPE), "malformed quantization recipe");
    CHECK_STR_EQ(mx_strerror(MX_EUNSUPPORTED), "recognised, but not supported yet");
    CHECK_STR_EQ(mx_strerror(MX_EPATTERN), "malformed module pattern");
    CHECK_STR_EQ(mx_strerror(MX_EFORMAT), "malformed file contents");
    CHECK_STR_EQ(mx_strerror(MX_ECOMM), "communication between ranks failed");
    CHECK_STR_EQ(mx_strerror(MX_ETIMEOUT), "no progress from the other ranks within the timeout");
    CHECK_STR_EQ(mx_errname(MX_ESIZE), "MX_ESIZE");
    CHECK_STR_EQ(mx_errname(MX_ETIMEOUT), "MX_ETIMEOUT");
}

static const mxt_test tests[] = {
    {"every_code", test_every_code},
    {"unknown_codes", test_unknown_codes},
    {"messages", test_messages},
};

int main(int argc, char **argv) { return MXT_RUN(tests, argc, argv); }
