/* Internal: text helpers for one-line messages that echo user input. */
#ifndef MXI_TEXT_H
#define MXI_TEXT_H

#include <stdbool.h>
#include <stddef.h>

#include "mxtrain/error.h"

/* Buffer size for mxi_quote: user text echoed in a message is cut to about this much, so
 * one absurd value cannot crowd the rest of the message out of an mx_diag. */
#define MXI_QUOTE_SIZE 128

/* Copy text[0..len) into buf for a one-line message: control characters become \n, \t, \r
 * or \xNN escapes, and so does every byte of 0x80 and above that does not start a complete
 * UTF-8 sequence (its continuation bytes could be control characters); text that does not
 * fit is cut at a UTF-8 character boundary and ends in "...". buf is always NUL-terminated
 * (size must be at least 8). Returns buf. */
const char *mxi_quote(char *buf, size_t size, const char *text, size_t len);

/* ASCII-only helpers, independent of the C locale. */
static inline bool mxi_is_digit(char c) { return c >= '0' && c <= '9'; }
static inline char mxi_lower(char c) { return (c >= 'A' && c <= 'Z') ? (char)(c - 'A' + 'a') : c; }

/* A malloc'ed copy of text[0..len), NUL-terminated; NULL when out of memory. */
char *mxi_strndup(const char *text, size_t len);

/* Length of the UTF-8 sequence a lead byte starts (1 for ASCII and stray bytes). */
size_t mxi_utf8_len(unsigned char lead);

/* Levenshtein distance between a[0..na) and the string b, ASCII case-insensitive; (size_t)-1
 * when either is longer than 64 characters (for "did you mean" suggestions). */
size_t mxi_edit_distance(const char *a, size_t na, const char *b);

#endif
