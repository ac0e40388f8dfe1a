/* Fuzz target: the module pattern compiler and matcher. Input: a pattern on the first line,
 * module names on the following lines. Checked against an independent reference written
 * here from the documented grammar (docs/quantization-plan.md): compile succeeds exactly
 * for well-formed patterns, and mx_pattern_match / mx_pattern_match_module agree with a
 * memoised backtracking matcher that compares numbers as decimal strings. */
#include "fuzz.h"

#include <stdbool.h>

#include "mxtrain/plan.h"

enum { MAX_DIGITS = 18, ORACLE_MAX = 400 };

typedef struct {
    char kind; /* 'l' literal, '*', '?', 'n' number */
    char c;
    bool ranged;
    const char *lo, *hi; /* digits, leading zeros stripped */
    size_t lo_len, hi_len;
} otok;

static bool digit(char c) { return c >= '0' && c <= '9'; }

/* Compare the decimal numbers a[0..na) and b[0..nb), both without leading zeros. */
static int cmp_dec(const char *a, size_t na, const char *b, size_t nb) {
    if (na != nb) return na < nb ? -1 : 1;
    int c = memcmp(a, b, na);
    return c < 0 ? -1 : c > 0;
}

static void strip(const char **s, size_t *n) {
    while (*n > 1 && **s == '0') (*s)++, (*n)--;
}

/* A bound: 1 to MAX_DIGITS digits at text[*p]. */
static bool bound(const char *text, size_t *p, const char **s, size_t *n) {
    size_t start = *p;
    while (digit(text[*p])) (*p)++;
    *s = text + start;
    *n = *p - start;
    if (*n == 0 || *n > MAX_DIGITS) return false;
    strip(s, n);
    return true;
}

static int ocompile(const char *text, otok *t) {
    size_t n = 0, i = 0;
    if (!text[0]) return -1;
    while (text[i]) {
        char c = text[i];
        if (c == '}') return -1;
        if (c == '{') {
            i++;
            if (text[i] == '*' && text[i + 1] == '}') {
                t[n++] = (otok){.kind = 'n'};
                i += 2;
                continue;
            }
            otok k = {.kind = 'n', .ranged = true};
            if (!bound(text, &i, &k.lo, &k.lo_len) || text[i] != '-') return -1;
            i++;
            if (!bound(text, &i, &k.hi, &k.hi_len) || text[i] != '}') return -1;
            i++;
            if (cmp_dec(k.lo, k.lo_len, k.hi, k.hi_len) > 0) return -1;
            t[n++] = k;
        } else if (c == '*') {
            t[n++] = (otok){.kind = '*'};
            i++;
        } else if (c == '?') {
            t[n++] = (otok){.kind = '?'};
            i++;
        } else {
            t[n++] = (otok){.kind = 'l', .c = c};
            i++;
        }
    }
    return (int)n;
}

/* memo: 0 unknown, 1 no, 2 yes; over (token, position). */
static bool omatch(const otok *t, int nt, int k, const char *s, size_t len, size_t i, unsigned char *memo) {
    unsigned char *m = &memo[(size_t)k * (len + 1) + i];
    if (*m) return *m == 2;
    bool r = false;
    if (k == nt) {
        r = i == len;
    } else if (t[k].kind == '*') {
        /* The star matches nothing, or one character and is still there: O(tokens * length). */
        r = omatch(t, nt, k + 1, s, len, i, memo) || (i < len && omatch(t, nt, k, s, len, i + 1, memo));
    } else if (t[k].kind == '?') {
        r = i < len && omatch(t, nt, k + 1, s, len, i + 1, memo);
    } else if (t[k].kind == 'l') {
        r = i < len && s[i] == t[k].c && omatch(t, nt, k + 1, s, len, i + 1, memo);
    } else if (i < len && digit(s[i]) && !(i > 0 && digit(s[i - 1]))) {
        size_t j = i;
        while (j < len && digit(s[j])) j++;
        const char *v = s + i;
        size_t vn = j - i;
        strip(&v, &vn);
        bool in = !t[k].ranged ||
                  (cmp_dec(v, vn, t[k].lo, t[k].lo_len) >= 0 && cmp_dec(v, vn, t[k].hi, t[k].hi_len) <= 0);
        r = in && omatch(t, nt, k + 1, s, len, j, memo);
    }
    *m = r ? 2 : 1;
    return r;
}

static bool oracle_match(const otok *t, int nt, const char *s, size_t len) {
    unsigned char *memo = calloc((size_t)(nt + 1) * (len + 1), 1);
    FUZZ_REQUIRE(memo != NULL);
    bool r = omatch(t, nt, 0, s, len, 0, memo);
    free(memo);
    return r;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = fuzz_cstr(data, size);
    char *names = strchr(text, '\n');
    if (names) *names++ = '\0';
    mx_pattern *p = NULL;
    mx_diag diag = {{0}};
    int rc = mx_pattern_compile(text, &p, &diag);
    fuzz_check_status(rc, &diag);
    FUZZ_REQUIRE(rc == 0 || rc == MX_EPATTERN);
    FUZZ_REQUIRE((rc == 0) == (p != NULL));
    size_t plen = strlen(text);
    otok *t = calloc(plen + 1, sizeof *t);
    FUZZ_REQUIRE(t != NULL);
    int nt = ocompile(text, t);
    if ((rc == 0) != (nt >= 0)) fprintf(stderr, "pattern '%s': compile %d, reference %d\n", text, rc, nt);
    FUZZ_REQUIRE((rc == 0) == (nt >= 0));
    while (p && names) {
        char *name = names;
        names = strchr(names, '\n');
        if (names) *names++ = '\0';
        size_t len = strlen(name);
        bool got = mx_pattern_match(p, name);
        size_t matched = 0;
        bool got_mod = mx_pattern_match_module(p, name, &matched);
        if (len > ORACLE_MAX || plen > ORACLE_MAX) continue;
        bool want = oracle_match(t, nt, name, len);
        if (got != want) fprintf(stderr, "pattern '%s' on '%s': %d, reference %d\n", text, name, got, want);
        FUZZ_REQUIRE(got == want);
        /* The module form: the shortest of the ancestors (prefixes before a '.', not
         * empty) and the name itself that matches. */
        size_t prefixes = 1;
        for (size_t i = 0; i < len; i++) prefixes += name[i] == '.';
        if (prefixes * (size_t)(nt + 1) * (len + 1) > 4000000) continue; /* keep every input fast */
        bool want_mod = false;
        size_t want_len = 0;
        for (size_t i = 0; i <= len && !want_mod; i++)
            if ((i == len || (name[i] == '.' && i > 0)) && oracle_match(t, nt, name, i)) want_mod = true, want_len = i;
        FUZZ_REQUIRE(got_mod == want_mod);
        if (want_mod) FUZZ_REQUIRE(matched == want_len);
    }
    free(t);
    mx_pattern_free(p);
    free(text);
    return 0;
}
