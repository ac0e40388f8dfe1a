/* Text helpers for one-line messages. */
#include "core/text.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/diag.h"

size_t mxi_utf8_len(unsigned char lead) {
    if (lead >= 0xF0 && lead <= 0xF4) return 4;
    if (lead >= 0xE0) return (lead <= 0xEF) ? 3 : 1;
    if (lead >= 0xC2) return 2;
    return 1;
}

const char *mxi_quote(char *buf, size_t size, const char *text, size_t len) {
    /* Invariant: after each unit that is not the last, "..." and the NUL still fit. */
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        unsigned char ch = (unsigned char)text[i];
        char unit[8];
        size_t n, consumed = 1;
        if (ch == '\n') n = (size_t)snprintf(unit, sizeof unit, "\\n");
        else if (ch == '\t') n = (size_t)snprintf(unit, sizeof unit, "\\t");
        else if (ch == '\r') n = (size_t)snprintf(unit, sizeof unit, "\\r");
        else if (ch < 0x20 || ch == 0x7F) n = (size_t)snprintf(unit, sizeof unit, "\\x%02X", ch);
        else {
            /* A UTF-8 sequence is copied whole only when it is complete and valid: the bytes
             * after a lead byte could be control characters (a newline). Other bytes of 0x80
             * and above (stray, cut short) are escaped like control characters. */
            consumed = mxi_utf8_len(ch);
            bool valid = ch < 0x80 || (consumed > 1 && consumed <= len - i);
            for (size_t k = 1; valid && k < consumed; k++)
                valid = ((unsigned char)text[i + k] & 0xC0) == 0x80;
            if (valid) {
                memcpy(unit, text + i, consumed);
                n = consumed;
            } else {
                consumed = 1;
                n = (size_t)snprintf(unit, sizeof unit, "\\x%02X", ch);
            }
        }
        bool last = i + consumed >= len;
        if (o + n + (last ? 0 : 3) + 1 > size) {
            memcpy(buf + o, "...", 3);
            o += 3;
            break;
        }
        memcpy(buf + o, unit, n);
        o += n;
        i += consumed;
    }
    buf[o] = '\0';
    return buf;
}

char *mxi_strndup(const char *text, size_t len) {
    char *copy = malloc(len + 1);
    if (!copy) return NULL;
    memcpy(copy, text, len);
    copy[len] = '\0';
    return copy;
}

size_t mxi_edit_distance(const char *a, size_t na, const char *b) {
    enum { MAXLEN = 64 };
    size_t nb = strlen(b), row[MAXLEN + 1];
    if (na > MAXLEN || nb > MAXLEN) return (size_t)-1;
    for (size_t j = 0; j <= nb; j++) row[j] = j;
    for (size_t i = 1; i <= na; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= nb; j++) {
            size_t up = row[j];
            size_t best = diag + (mxi_lower(a[i - 1]) != mxi_lower(b[j - 1]));
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[nb];
}
