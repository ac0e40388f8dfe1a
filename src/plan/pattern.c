/* Module patterns (SPEC §3): compiled to tokens, matched whole-string.
 *
 * Matching uses the classic two-pointer wildcard algorithm (remember the last `*` and, on a
 * mismatch, let it swallow one more character), extended to the brace tokens. That stays
 * correct because every other token, started at a given position, either fails or ends at a
 * position determined by that start, and a later start never ends earlier; so placing each
 * segment between stars as early as possible is never worse. Cost is O(tokens * length). */
#include "mxtrain/plan.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/diag.h"
#include "core/text.h"

typedef enum { TOK_LITERAL, TOK_STAR, TOK_ONE, TOK_NUMBER } tok_kind;

typedef struct {
    tok_kind kind;
    char c;               /* TOK_LITERAL */
    bool ranged;          /* TOK_NUMBER: {a-b} rather than {*} */
    uint64_t lo, hi;      /* TOK_NUMBER with ranged */
} token;

struct mx_pattern {
    token *tokens;
    size_t n;
};

/* Bounds have at most this many digits, so they and the comparisons stay within uint64_t. */
enum { MAX_BOUND_DIGITS = 18 };

#define PATTERN_ALLOWED "{*}, {a-b} with a <= b, *, ?, literal characters"

static int pattern_error(mx_diag *diag, const char *text, size_t pos, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int pattern_error(mx_diag *diag, const char *text, size_t pos, const char *fmt, ...) {
    char what[256], quoted[MXI_QUOTE_SIZE];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return mxi_diag(diag, MX_EPATTERN, "pattern '%s': %s at position %zu (allowed: " PATTERN_ALLOWED ")",
                    mxi_quote(quoted, sizeof quoted, text, strlen(text)), what, pos + 1);
}

/* "'x'" for a printable character, else an escape; for messages. */
static const char *char_desc(char *buf, size_t size, char c) {
    char q[8];
    snprintf(buf, size, "'%s'", mxi_quote(q, sizeof q, &c, 1));
    return buf;
}

/* Parse a decimal bound at text[*p]; the caller has checked there is a digit there. */
static int parse_bound(const char *text, size_t *p, uint64_t *value, mx_diag *diag) {
    size_t start = *p;
    uint64_t v = 0;
    while (mxi_is_digit(text[*p])) {
        if (*p - start >= MAX_BOUND_DIGITS)
            return pattern_error(diag, text, start, "number with more than %d digits", MAX_BOUND_DIGITS);
        v = v * 10 + (uint64_t)(text[*p] - '0');
        (*p)++;
    }
    *value = v;
    return 0;
}

/* Parse the brace group starting at text[open] == '{' into tok; *end receives the offset
 * just past its '}'. */
static int parse_brace(const char *text, size_t open, token *tok, size_t *end, mx_diag *diag) {
    char d[16];
    size_t p = open + 1;
    tok->kind = TOK_NUMBER;
    if (text[p] == '\0') return pattern_error(diag, text, open, "unclosed '{'");
    if (text[p] == '}') return pattern_error(diag, text, open, "empty braces '{}'");
    if (text[p] == '*') {
        p++;
        if (text[p] == '\0') return pattern_error(diag, text, open, "unclosed '{'");
        if (text[p] != '}')
            return pattern_error(diag, text, p, "expected '}' after '{*', found %s", char_desc(d, sizeof d, text[p]));
        tok->ranged = false;
        *end = p + 1;
        return 0;
    }
    if (text[p] == '-') return pattern_error(diag, text, p, "missing lower bound in '{a-b}'");
    if (!mxi_is_digit(text[p]))
        return pattern_error(diag, text, p, "unexpected %s in braces", char_desc(d, sizeof d, text[p]));
    int rc = parse_bound(text, &p, &tok->lo, diag);
    if (rc) return rc;
    if (text[p] == '\0') return pattern_error(diag, text, open, "unclosed '{'");
    if (text[p] == '}') return pattern_error(diag, text, p, "a single number in braces; write {a-b} or {*}");
    if (text[p] != '-')
        return pattern_error(diag, text, p, "unexpected %s in braces", char_desc(d, sizeof d, text[p]));
    p++;
    if (text[p] == '\0') return pattern_error(diag, text, open, "unclosed '{'");
    if (text[p] == '}') return pattern_error(diag, text, p, "missing upper bound in '{a-b}'");
    if (!mxi_is_digit(text[p]))
        return pattern_error(diag, text, p, "unexpected %s in braces", char_desc(d, sizeof d, text[p]));
    rc = parse_bound(text, &p, &tok->hi, diag);
    if (rc) return rc;
    if (text[p] == '\0') return pattern_error(diag, text, open, "unclosed '{'");
    if (text[p] != '}')
        return pattern_error(diag, text, p, "unexpected %s in braces", char_desc(d, sizeof d, text[p]));
    if (tok->lo > tok->hi)
        return pattern_error(diag, text, open, "range {%llu-%llu} has its lower bound above its upper bound",
                             (unsigned long long)tok->lo, (unsigned long long)tok->hi);
    tok->ranged = true;
    *end = p + 1;
    return 0;
}

int mx_pattern_compile(const char *text, mx_pattern **out, mx_diag *diag) {
    if (!text || !out) return mxi_diag(diag, MX_ENULL, "mx_pattern_compile: NULL argument");
    *out = NULL;
    size_t len = strlen(text);
    if (len == 0) return pattern_error(diag, text, 0, "empty pattern");

    mx_pattern *pat = calloc(1, sizeof *pat);
    token *tokens = calloc(len, sizeof *tokens); /* never more tokens than characters */
    if (!pat || !tokens) {
        free(pat);
        free(tokens);
        return mxi_diag(diag, MX_ENOMEM, "out of memory compiling a module pattern (%zu bytes)",
                        sizeof *pat + len * sizeof *tokens);
    }
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        token *tok = &tokens[n];
        char c = text[i];
        if (c == '{') {
            size_t end = i + 1;
            int rc = parse_brace(text, i, tok, &end, diag);
            if (rc) {
                free(tokens);
                free(pat);
                return rc;
            }
            i = end;
        } else if (c == '}') {
            free(tokens);
            free(pat);
            return pattern_error(diag, text, i, "unmatched '}'");
        } else if (c == '*') {
            tok->kind = TOK_STAR;
            i++;
            if (n > 0 && tokens[n - 1].kind == TOK_STAR) continue; /* `**` is `*` */
        } else if (c == '?') {
            tok->kind = TOK_ONE;
            i++;
        } else {
            tok->kind = TOK_LITERAL;
            tok->c = c;
            i++;
        }
        n++;
    }
    pat->tokens = tokens;
    pat->n = n;
    *out = pat;
    return 0;
}

void mx_pattern_free(mx_pattern *pattern) {
    if (!pattern) return;
    free(pattern->tokens);
    free(pattern);
}

/* Match one non-star token at name[i] (name has length len); returns the offset just past
 * what it consumed, or -1. */
static long step(const token *tok, const char *name, size_t len, size_t i) {
    switch (tok->kind) {
    case TOK_LITERAL:
        return (i < len && name[i] == tok->c) ? (long)i + 1 : -1;
    case TOK_ONE:
        return i < len ? (long)i + 1 : -1;
    case TOK_NUMBER: {
        /* A whole number: not inside a longer digit run on either side. Its value ignores
         * leading zeros (`07` is 7); runs too long for uint64_t exceed every bound. */
        if (i >= len || !mxi_is_digit(name[i])) return -1;
        if (i > 0 && mxi_is_digit(name[i - 1])) return -1;
        size_t j = i;
        uint64_t v = 0;
        bool huge = false;
        for (; j < len && mxi_is_digit(name[j]); j++) {
            if (v > (UINT64_MAX - 9) / 10) huge = true; /* beyond any bound */
            else v = v * 10 + (uint64_t)(name[j] - '0');
        }
        if (tok->ranged && (huge || v < tok->lo || v > tok->hi)) return -1;
        return (long)j;
    }
    case TOK_STAR:
        break;
    }
    return -1;
}

/* Whether the pattern matches all of name[0..len). */
static bool match_span(const mx_pattern *pat, const char *name, size_t len) {
    const size_t none = (size_t)-1;
    size_t t = 0, i = 0;
    size_t star_t = none, star_i = 0;
    for (;;) {
        if (t < pat->n && pat->tokens[t].kind == TOK_STAR) {
            star_t = t++;
            star_i = i;
            continue;
        }
        if (t == pat->n && i == len) return true;
        if (t < pat->n) {
            long j = step(&pat->tokens[t], name, len, i);
            if (j >= 0) {
                i = (size_t)j;
                t++;
                continue;
            }
        }
        /* Mismatch: let the last star swallow one more character and retry after it. */
        if (star_t == none || star_i >= len) return false;
        i = ++star_i;
        t = star_t + 1;
    }
}

bool mx_pattern_match(const mx_pattern *pattern, const char *name) {
    if (!pattern || !name) return false;
    return match_span(pattern, name, strlen(name));
}

bool mx_pattern_match_module(const mx_pattern *pattern, const char *fqn, size_t *matched_len) {
    if (!pattern || !fqn) return false;
    /* Ancestors from the shortest: each prefix ending right before a '.', then fqn itself.
     * An empty prefix (a leading '.') names no module and is skipped. */
    for (size_t i = 0;; i++) {
        if ((fqn[i] == '.' && i > 0) || fqn[i] == '\0') {
            if (match_span(pattern, fqn, i)) {
                if (matched_len) *matched_len = i;
                return true;
            }
        }
        if (fqn[i] == '\0') return false;
    }
}
