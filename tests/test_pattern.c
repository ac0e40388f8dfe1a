/* Module patterns (SPEC §3): compile errors, whole-string matching, ancestors. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"
#include "mxtrain/plan.h"

#define PATTERN_ALLOWED "(allowed: {*}, {a-b} with a <= b, *, ?, literal characters)"

typedef struct {
    const char *pattern;
    int pos;
    const char *sub;
} bad_case;

static const bad_case bad[] = {
    {"", 1, "empty pattern"},
    {"{x}", 2, "unexpected 'x' in braces"},
    {"{3-1}", 1, "range {3-1} has its lower bound above its upper bound"},
    {"{", 1, "unclosed '{'"},
    {"{1-}", 4, "missing upper bound"},
    {"{-1}", 2, "missing lower bound"},
    {"}", 1, "unmatched '}'"},
    {"{}", 1, "empty braces"},
    {"model.layers.{*", 14, "unclosed '{'"},
    {"model.layers.{1-2", 14, "unclosed '{'"},
    {"model.layers.{1-", 14, "unclosed '{'"},
    {"model.layers.{12", 14, "unclosed '{'"},
    {"model.layers.{*}}", 17, "unmatched '}'"},
    {"a}b", 2, "unmatched '}'"},
    {"{5}", 3, "a single number in braces"},
    {"{**}", 3, "expected '}' after '{*', found '*'"},
    {"{1-2-3}", 5, "unexpected '-' in braces"},
    {"{ 1-2}", 2, "unexpected ' ' in braces"},
    {"{1-x}", 4, "unexpected 'x' in braces"},
    {"{1x-2}", 3, "unexpected 'x' in braces"},
    {"{{*}}", 2, "unexpected '{' in braces"},
    {"{1-1234567890123456789}", 4, "more than 18 digits"},
    {"layers.{\n}", 9, "unexpected '\\n' in braces"},
};

static void test_compile_errors(void) {
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        static int sentinel;
        mx_pattern *p = (mx_pattern *)&sentinel; /* must be reset to NULL on failure */
        mx_diag diag = {{0}};
        int rc = mx_pattern_compile(bad[i].pattern, &p, &diag);
        CHECK_EQ_INT(rc, MX_EPATTERN);
        CHECK(p == NULL);
        char want[160];
        snprintf(want, sizeof want, " at position %d " PATTERN_ALLOWED, bad[i].pos);
        CHECK_STR_CONTAINS(diag.msg, want);
        CHECK_STR_CONTAINS(diag.msg, bad[i].sub);
        CHECK(strncmp(diag.msg, "pattern '", 9) == 0);
        CHECK(strchr(diag.msg, '\n') == NULL);
        if (mxt_current_failures()) {
            printf("    (pattern '%s': %s)\n", bad[i].pattern, diag.msg);
            return;
        }
    }
}

static void test_exact_message(void) {
    mx_pattern *p;
    mx_diag diag;
    CHECK_EQ_INT(mx_pattern_compile("model.layers.{3-1}", &p, &diag), MX_EPATTERN);
    CHECK_STR_EQ(diag.msg, "pattern 'model.layers.{3-1}': range {3-1} has its lower bound above its upper bound "
                           "at position 14 " PATTERN_ALLOWED);
}

/* Found by fuzzing (tests/fuzz/regressions/pattern/): the byte after a UTF-8 lead byte was
 * copied into the message unchecked, here a carriage return. */
static void test_message_is_one_line(void) {
    mx_pattern *p;
    mx_diag diag;
    CHECK_EQ_INT(mx_pattern_compile("{\t\r\xcd\r", &p, &diag), MX_EPATTERN);
    CHECK_STR_EQ(diag.msg, "pattern '{\\t\\r\\xCD\\r': unexpected '\\t' in braces at position 2 " PATTERN_ALLOWED);
}

typedef struct {
    const char *pattern, *name;
    bool match;
} match_case;

static const match_case matches[] = {
    {"model.layers.{*}", "model.layers.3", true},
    {"model.layers.{*}", "model.layers.12", true},
    {"model.layers.{*}", "model.layers.", false},
    {"model.layers.{*}", "model.layers.3.self_attn", false}, /* whole string only */
    {"model.layers.{*}", "model.layers.x", false},
    {"model.layers.{*}", "model.layers.3a", false},
    {"model.layers.{*}", "model.layers.-1", false},
    {"model.layers.{*}", "xmodel.layers.3", false},
    {"{*}", "0", true},
    {"{*}", "007", true},
    {"{*}", "12345678901234567890123456789", true},
    {"{*}", "", false},
    {"layer{*}", "layer12", true},
    {"layer{*}2", "layer12", false}, /* {*} takes the whole digit run */
    {"layer1{*}", "layer12", false}, /* ... and is not preceded by a digit */
    {"*{*}", "layer12", true},
    {"*2", "layer12", true},
    {"?{*}", "x12", true},
    {"?{*}", "112", false},
    {"{*}.{*}", "1.2", true},
    {"{*}.{*}", "1.x", false},
    {"{1-2}", "1", true},
    {"{1-2}", "2", true},
    {"{1-2}", "0", false},
    {"{1-2}", "3", false},
    {"{1-2}", "12", false},
    {"{1-2}", "21", false},
    {"{10-20}", "15", true},
    {"{10-20}", "10", true},
    {"{10-20}", "20", true},
    {"{10-20}", "9", false},
    {"{10-20}", "21", false},
    {"{10-20}", "150", false},
    {"{0-0}", "0", true},
    {"{1-2}", "01", true}, /* a number's value: leading zeros do not count */
    {"{0-5}", "12345678901234567890123456789", false},
    {"{0-999999999999999999}", "999999999999999999", true},
    {"{0-999999999999999999}", "1000000000000000000", false},
    {"model.layers.{1-2}.mlp", "model.layers.2.mlp", true},
    {"model.layers.{1-2}.mlp", "model.layers.10.mlp", false},
    {"*gate", "model.layers.1.mlp.gate", true},
    {"*gate", "model.layers.1.mlp.gate_proj", false},
    {"*gate", "model.layers.1.mlp.experts", false},
    {"*lm_head", "lm_head", true},
    {"*lm_head", "model.lm_head", true},
    {"?", "a", true},
    {"?", "", false},
    {"?", "ab", false},
    {"m?del", "model", true},
    {"m?del", "mdel", false},
    {"*", "", true},
    {"*", "anything.at.all", true},
    {"**", "x", true},
    {"a**b", "ab", true},
    {"a*b*c", "aXXbYYc", true},
    {"a*b*c", "abc", true},
    {"a*b*c", "acb", false},
    {"a*b*c", "abcc", true},
    {"*.q_proj", "model.layers.0.self_attn.q_proj", true},
    {"model.layers.{*}.self_attn.?_proj", "model.layers.3.self_attn.k_proj", true},
    {"model.layers.{*}.self_attn.?_proj", "model.layers.3.self_attn.qk_proj", false},
    {"*.{*}.*", "model.layers.7.mlp", true},
    {"*{*}*", "abc", false},
    {"model-1.x", "model-1.x", true}, /* '-' outside braces is literal */
};

static void test_match_table(void) {
    for (size_t i = 0; i < sizeof matches / sizeof matches[0]; i++) {
        mx_pattern *p = NULL;
        mx_diag diag;
        int rc = mx_pattern_compile(matches[i].pattern, &p, &diag);
        if (rc) {
            mxt_fail(__FILE__, __LINE__, "compile '%s': %s", matches[i].pattern, diag.msg);
            continue;
        }
        bool got = mx_pattern_match(p, matches[i].name);
        if (got != matches[i].match)
            mxt_fail(__FILE__, __LINE__, "'%s' vs '%s': got %d, expected %d", matches[i].pattern, matches[i].name,
                     got, matches[i].match);
        mx_pattern_free(p);
    }
}

typedef struct {
    const char *pattern, *fqn;
    bool match;
    size_t matched_len;
} module_case;

static const module_case module_cases[] = {
    {"model.layers.{*}", "model.layers.3.self_attn.q_proj", true, 14},
    {"model.layers.{*}", "model.layers.12.mlp.experts", true, 15},
    {"model.layers.{*}", "model.embed_tokens", false, 0},
    {"model.layers.{*}", "lm_head", false, 0},
    {"model.layers.{*}", "model.layers", false, 0},
    {"model.layers.0.self_attn", "model.layers.0.self_attn.q_proj", true, 24},
    {"model.layers.0.self_attn", "model.layers.0.self_attn.o_proj", true, 24},
    {"model.layers.0.self_attn", "model.layers.0.self_attn", true, 24},
    {"model.layers.0.self_attn", "model.layers.10.self_attn.q_proj", false, 0},
    {"model.layers.0.self_attn", "model.layers.0.mlp.gate_proj", false, 0},
    {"model.layers.0.self_attn", "model.layers.0.self_attn_extra.q_proj", false, 0},
    {"*gate", "model.layers.1.mlp.gate", true, 23},
    {"*gate", "model.layers.1.mlp.gate_proj", false, 0},
    {"*gate", "model.layers.1.mlp.experts", false, 0},
    {"*lm_head", "lm_head", true, 7},
    {"*", "a.b.c", true, 1},          /* the shortest matching ancestor */
    {"model", "model.layers.0.x", true, 5},
    {"*.mlp", "model.layers.1.mlp.gate", true, 18},
    {"model.lay", "model.layers.0", false, 0}, /* ancestors end at a '.' */
    {"model.layers.{1-2}", "model.layers.1.mlp.gate", true, 14},
    {"model.layers.{1-2}", "model.layers.2.self_attn.v_proj", true, 14},
    {"model.layers.{1-2}", "model.layers.0.self_attn.v_proj", false, 0},
    {"model.layers.{1-2}", "model.layers.3.self_attn.v_proj", false, 0},
    {"model.layers.{1-2}", "model.layers.12.self_attn.v_proj", false, 0},
    {"*.{*}", "model.layers.3.mlp", true, 14},
    {"?*", "", false, 0},
};

static void test_match_module(void) {
    for (size_t i = 0; i < sizeof module_cases / sizeof module_cases[0]; i++) {
        const module_case *c = &module_cases[i];
        mx_pattern *p = NULL;
        CHECK_EQ_INT(mx_pattern_compile(c->pattern, &p, NULL), 0);
        size_t len = 12345;
        bool got = mx_pattern_match_module(p, c->fqn, &len);
        if (got != c->match || (got && len != c->matched_len))
            mxt_fail(__FILE__, __LINE__, "'%s' vs module '%s': got %d (len %zu), expected %d (len %zu)", c->pattern,
                     c->fqn, got, got ? len : 0, c->match, c->matched_len);
        CHECK(mx_pattern_match_module(p, c->fqn, NULL) == c->match);
        mx_pattern_free(p);
    }
}

/* ---- Against a naive reference matcher ---------------------------------------------- */

static bool digit(char c) { return c >= '0' && c <= '9'; }

/* Interprets the pattern text directly, trying every split: exponential, fine when short. */
static bool ref_match(const char *p, const char *name, size_t i) {
    if (*p == '\0') return name[i] == '\0';
    if (*p == '*') {
        for (size_t k = i;; k++) {
            if (ref_match(p + 1, name, k)) return true;
            if (name[k] == '\0') return false;
        }
    }
    if (*p == '?') return name[i] != '\0' && ref_match(p + 1, name, i + 1);
    if (*p == '{') {
        const char *close = strchr(p, '}');
        bool any = p[1] == '*';
        unsigned long lo = 0, hi = 0;
        if (!any) sscanf(p + 1, "%lu-%lu", &lo, &hi);
        if (i > 0 && digit(name[i - 1])) return false;
        size_t j = i;
        unsigned long v = 0;
        while (digit(name[j])) v = v * 10 + (unsigned long)(name[j++] - '0');
        if (j == i || (!any && (v < lo || v > hi))) return false;
        return ref_match(close + 1, name, j);
    }
    return name[i] == *p && ref_match(p + 1, name, i + 1);
}

static uint32_t next_rand(uint32_t *state) {
    *state = *state * 1664525u + 1013904223u;
    return *state >> 8;
}

static void test_against_reference(void) {
    static const char *const pieces[] = {"a", "b", ".", "1", "2", "*", "?", "{*}", "{1-2}", "{0-12}", "{10-20}"};
    static const char alphabet[] = "ab.1203";
    uint32_t state = 12345;
    for (int iter = 0; iter < 20000 && !mxt_current_failures(); iter++) {
        char pat[64] = "", name[16];
        int np = 1 + (int)(next_rand(&state) % 6);
        for (int k = 0; k < np; k++) strcat(pat, pieces[next_rand(&state) % (sizeof pieces / sizeof pieces[0])]);
        int nn = (int)(next_rand(&state) % 9);
        for (int k = 0; k < nn; k++) name[k] = alphabet[next_rand(&state) % (sizeof alphabet - 1)];
        name[nn] = '\0';
        mx_pattern *p = NULL;
        CHECK_EQ_INT(mx_pattern_compile(pat, &p, NULL), 0);
        bool got = mx_pattern_match(p, name), want = ref_match(pat, name, 0);
        if (got != want)
            mxt_fail(__FILE__, __LINE__, "'%s' vs '%s': got %d, reference %d", pat, name, got, want);
        mx_pattern_free(p);
    }
}

/* Many stars against a long non-matching name stay polynomial. */
static void test_no_exponential_blowup(void) {
    char name[2001];
    memset(name, 'a', 2000);
    name[2000] = '\0';
    mx_pattern *p = NULL;
    CHECK_EQ_INT(mx_pattern_compile("*a*a*a*a*a*a*a*a*a*a*a*a*b", &p, NULL), 0);
    clock_t t0 = clock();
    CHECK(!mx_pattern_match(p, name));
    CHECK(!mx_pattern_match_module(p, name, NULL));
    CHECK((double)(clock() - t0) / CLOCKS_PER_SEC < 1.0);
    mx_pattern_free(p);
}

static void test_null_arguments(void) {
    mx_pattern *p = NULL;
    mx_diag diag;
    CHECK_EQ_INT(mx_pattern_compile(NULL, &p, &diag), MX_ENULL);
    CHECK_EQ_INT(mx_pattern_compile("a", NULL, &diag), MX_ENULL);
    CHECK(!mx_pattern_match(NULL, "a"));
    CHECK_EQ_INT(mx_pattern_compile("a", &p, NULL), 0);
    CHECK(!mx_pattern_match(p, NULL));
    CHECK(!mx_pattern_match_module(p, NULL, NULL));
    mx_pattern_free(p);
    mx_pattern_free(NULL);
}

static const mxt_test tests[] = {
    {"pattern_compile_errors", test_compile_errors},
    {"pattern_exact_message", test_exact_message},
    {"pattern_message_is_one_line", test_message_is_one_line},
    {"pattern_match_table", test_match_table},
    {"pattern_match_module", test_match_module},
    {"pattern_against_reference", test_against_reference},
    {"pattern_no_exponential_blowup", test_no_exponential_blowup},
    {"pattern_null_arguments", test_null_arguments},
};

int main(int argc, char **argv) { return MXT_RUN(tests, argc, argv); }
