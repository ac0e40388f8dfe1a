/* The MX library's contract around its numerics: bad arguments answered with a status and
 * nothing written, and the kernel choice (the best kernel the CPU runs by default, the
 * CPUID checks against /proc/cpuinfo, MXTRAIN_KERNEL and its older name). The numerics
 * themselves are test_mx.c's. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "mx_kernels.h"

static void test_tiles_bad_arguments(void) {
    float x[4] = {0}, y[4];
    uint16_t xb[4] = {0};
    uint8_t q[4] = {0xAA, 0xAA, 0xAA, 0xAA}, s[4] = {0xAA, 0xAA, 0xAA, 0xAA};
    int rc = mx_quantize_tiles_f32(NULL, 2, 2, MX_E4M3, MX_SCALE_FLOOR, q, s);
    CHECK_EQ_INT(rc, MX_ENULL);
    CHECK_STR_CONTAINS(mx_strerror(rc), "NULL");
    CHECK_EQ_INT(mx_quantize_tiles_f32(x, 2, 2, MX_E4M3, MX_SCALE_FLOOR, NULL, s), MX_ENULL);
    CHECK_EQ_INT(mx_quantize_tiles_f32(x, 2, 2, MX_E4M3, MX_SCALE_FLOOR, q, NULL), MX_ENULL);
    CHECK_EQ_INT(mx_quantize_tiles_bf16(NULL, 2, 2, MX_E5M2, MX_SCALE_RCEIL, q, s), MX_ENULL);
    rc = mx_quantize_tiles_f32(x, -1, 2, MX_E4M3, MX_SCALE_FLOOR, q, s);
    CHECK_EQ_INT(rc, MX_ESIZE);
    CHECK_STR_CONTAINS(mx_strerror(rc), "size");
    CHECK_EQ_INT(mx_quantize_tiles_bf16(xb, 2, -7, MX_E4M3, MX_SCALE_FLOOR, q, s), MX_ESIZE);
    CHECK_EQ_INT(mx_quantize_tiles_f32(x, INT64_MAX, 3, MX_E4M3, MX_SCALE_FLOOR, q, s), MX_ESIZE);
    rc = mx_quantize_tiles_f32(x, 2, 2, (mx_elem)2, MX_SCALE_FLOOR, q, s);
    CHECK_EQ_INT(rc, MX_EENUM);
    CHECK_STR_CONTAINS(mx_strerror(rc), "enum");
    CHECK_EQ_INT(mx_quantize_tiles_bf16(xb, 2, 2, MX_E4M3, (mx_scale_mode)5, q, s), MX_EENUM);
    CHECK_EQ_INT(mx_dequantize_tiles_f32(NULL, s, 2, 2, MX_E4M3, y), MX_ENULL);
    CHECK_EQ_INT(mx_dequantize_tiles_f32(q, NULL, 2, 2, MX_E4M3, y), MX_ENULL);
    CHECK_EQ_INT(mx_dequantize_tiles_f32(q, s, 2, 2, MX_E4M3, NULL), MX_ENULL);
    CHECK_EQ_INT(mx_dequantize_tiles_f32(q, s, 2, -2, MX_E4M3, y), MX_ESIZE);
    CHECK_EQ_INT(mx_dequantize_tiles_f32(q, s, 2, 2, (mx_elem)-1, y), MX_EENUM);
    CHECK_EQ_INT(mx_tile_scale_count(65, 33), 6);
    CHECK_EQ_INT(mx_tile_scale_count(32, 32), 1);
    CHECK_EQ_INT(mx_tile_scale_count(0, 5), 0);
    CHECK_EQ_INT(mx_tile_scale_count(-1, 5), MX_ESIZE);
    CHECK_EQ_INT(mx_tile_scale_count(INT64_MAX, 2), MX_ESIZE);
    // nothing was written by the failed calls, and empty matrices write nothing
    CHECK_EQ_INT(mx_quantize_tiles_f32(x, 0, 5, MX_E4M3, MX_SCALE_FLOOR, q, s), 0);
    CHECK_EQ_INT(mx_quantize_tiles_bf16(xb, 3, 0, MX_E5M2, MX_SCALE_RCEIL, q, s), 0);
    CHECK_EQ_INT(mx_dequantize_tiles_f32(q, s, 0, 0, MX_E5M2, y), 0);
    for (int i = 0; i < 4; i++) {
        CHECK_EQ_HEX(q[i], 0xAA);
        CHECK_EQ_HEX(s[i], 0xAA);
    }
}

static void test_bad_arguments(void) {
    float x[4] = {0};
    uint16_t xb[4] = {0};
    uint8_t q[4], s[4];
    float y[4];
    CHECK_EQ_INT(mx_quantize_f32(NULL, 2, 2, MX_ROWWISE, MX_E4M3, MX_SCALE_FLOOR, q, s), MX_ENULL);
    CHECK_EQ_INT(mx_quantize_f32(x, 2, 2, MX_ROWWISE, MX_E4M3, MX_SCALE_FLOOR, NULL, s), MX_ENULL);
    CHECK_EQ_INT(mx_quantize_f32(x, 2, 2, MX_ROWWISE, MX_E4M3, MX_SCALE_FLOOR, q, NULL), MX_ENULL);
    CHECK_EQ_INT(mx_quantize_f32(x, -1, 2, MX_ROWWISE, MX_E4M3, MX_SCALE_FLOOR, q, s), MX_ESIZE);
    CHECK_EQ_INT(mx_quantize_f32(x, 2, -5, MX_ROWWISE, MX_E4M3, MX_SCALE_FLOOR, q, s), MX_ESIZE);
    CHECK_EQ_INT(mx_quantize_f32(x, INT64_MAX, 3, MX_ROWWISE, MX_E4M3, MX_SCALE_FLOOR, q, s), MX_ESIZE);
    CHECK_EQ_INT(mx_quantize_f32(x, 2, 2, (mx_axis)2, MX_E4M3, MX_SCALE_FLOOR, q, s), MX_EENUM);
    CHECK_EQ_INT(mx_quantize_f32(x, 2, 2, MX_ROWWISE, (mx_elem)2, MX_SCALE_FLOOR, q, s), MX_EENUM);
    CHECK_EQ_INT(mx_quantize_f32(x, 2, 2, MX_ROWWISE, MX_E4M3, (mx_scale_mode)-1, q, s), MX_EENUM);
    CHECK_EQ_INT(mx_quantize_bf16(xb, 2, 2, MX_COLWISE, (mx_elem)9, MX_SCALE_FLOOR, q, s), MX_EENUM);
    CHECK_EQ_INT(mx_quantize_bf16(NULL, 2, 2, MX_COLWISE, MX_E5M2, MX_SCALE_FLOOR, q, s), MX_ENULL);
    CHECK_EQ_INT(mx_quantize_dual_f32(x, 2, 2, MX_E4M3, MX_SCALE_FLOOR, q, s, NULL, s), MX_ENULL);
    CHECK_EQ_INT(mx_quantize_dual_bf16(xb, 2, -2, MX_E4M3, MX_SCALE_FLOOR, q, s, q, s), MX_ESIZE);
    CHECK_EQ_INT(mx_dequantize_f32(q, s, 2, 2, (mx_axis)5, MX_E4M3, y), MX_EENUM);
    CHECK_EQ_INT(mx_dequantize_f32(q, NULL, 2, 2, MX_ROWWISE, MX_E4M3, y), MX_ENULL);
    CHECK_EQ_INT(mx_dequantize_f32(q, s, -2, 2, MX_ROWWISE, MX_E4M3, y), MX_ESIZE);
    CHECK_EQ_INT(mx_scale_count(3, 65, MX_ROWWISE), 9);
    CHECK_EQ_INT(mx_scale_count(65, 3, MX_COLWISE), 9);
    CHECK_EQ_INT(mx_scale_count(3, 3, (mx_axis)3), MX_EENUM);
    CHECK_EQ_INT(mx_scale_count(-3, 3, MX_ROWWISE), MX_ESIZE);
    // empty matrices are fine and write nothing
    CHECK_EQ_INT(mx_quantize_f32(x, 0, 5, MX_COLWISE, MX_E4M3, MX_SCALE_FLOOR, q, s), 0);
    CHECK_EQ_INT(mx_quantize_dual_bf16(xb, 7, 0, MX_E5M2, MX_SCALE_RCEIL, q, s, q, s), 0);
    CHECK_EQ_INT(mx_kernel_select((mx_kernel)77), MX_EENUM);
    CHECK(mx_kernel_name((mx_kernel)77) == NULL);
    CHECK_STR_EQ(mx_kernel_name(MX_KERNEL_REF), "ref");
}

/* ---- kernel choice ---- */

static mx_kernel initial_kernel;   // mx_kernel_active() before any test selected one

/* Whether /proc/cpuinfo's flags line (the kernel's view of CPUID, less what the OS does not
 * enable) lists every flag of want; -1 when it cannot be read. */
static int cpuinfo_has(const char *const *want, int n) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return -1;
    static char line[16384];
    int found = -1;
    while (found < 0 && fgets(line, sizeof line, f)) {
        if (strncmp(line, "flags", 5) != 0) continue;
        found = 1;
        for (int i = 0; i < n; i++) {
            char key[64];
            snprintf(key, sizeof key, " %s", want[i]);
            const char *p = line;
            bool hit = false;
            while ((p = strstr(p, key)) != NULL) {
                char end = p[strlen(key)];
                if (end == ' ' || end == '\n' || end == '\0') {
                    hit = true;
                    break;
                }
                p += strlen(key);
            }
            if (!hit) found = 0;
        }
    }
    fclose(f);
    return found;
}

/* The default is the best kernel the CPU runs; availability agrees with /proc/cpuinfo; a
 * kernel the CPU lacks cannot be selected and is named with its reason. */
static void test_kernel_choice(void) {
    mx_kernel best = MX_KERNEL_REF;
    char runs[128] = "";
    for (int k = MX_KERNEL_REF; mx_kernel_name((mx_kernel)k); k++) {
        bool avail = mx_kernel_available((mx_kernel)k);
        CHECK_EQ_INT(avail, mx_kernel_missing((mx_kernel)k) == NULL);
        if (avail) {
            best = (mx_kernel)k;
            strcat(runs, " ");
            strcat(runs, kernel_label((mx_kernel)k));
        } else {
            mx_kernel before = mx_kernel_active();
            CHECK_EQ_INT(mx_kernel_select((mx_kernel)k), MX_EUNSUPPORTED);
            CHECK_EQ_INT(mx_kernel_active(), before);
        }
    }
    CHECK(mx_kernel_available(MX_KERNEL_REF));
    const char *env = getenv("MXTRAIN_KERNEL"), *var = "MXTRAIN_KERNEL";
    if (!env || !*env) env = getenv(var = "MXTRAIN_MX_KERNEL");
    if (env && *env && strcmp(env, "auto") != 0) {
        printf("    %s=%s is set: the default is not checked\n", var, env);
    } else {
        CHECK_EQ_INT(initial_kernel, best);
        printf("    kernels this CPU runs:%s; the default is %s\n", runs, mx_kernel_name(initial_kernel));
    }
    report_unavailable();
    // the CPU's own flags, as Linux reports them, say the same
    static const char *const avx2_flags[] = {"avx2", "fma", "bmi2"};
    static const char *const avx512_flags[] = {"avx2", "fma", "bmi2", "avx512f", "avx512bw", "avx512dq", "avx512vl"};
    int has2 = cpuinfo_has(avx2_flags, 3), has512 = cpuinfo_has(avx512_flags, 7);
    if (has2 < 0) {
        printf("    /proc/cpuinfo unreadable: availability not cross-checked\n");
    } else {
        CHECK_EQ_INT(mx_kernel_available(MX_KERNEL_AVX2), has2);
        // the SIMDe build runs the AVX-512 kernels on AVX2
        CHECK_EQ_INT(mx_kernel_available(MX_KERNEL_AVX512), mxi_kernel_emulated(MX_KERNEL_AVX512) ? has2 : has512);
        printf("    /proc/cpuinfo: avx2+fma+bmi2 %s, avx512f+bw+dq+vl %s\n", has2 ? "yes" : "no", has512 ? "yes" : "no");
    }
    CHECK_EQ_INT(mx_kernel_available((mx_kernel)99), false);
    CHECK(mx_kernel_missing((mx_kernel)99) != NULL);
    CHECK_STR_EQ(mx_kernel_name(MX_KERNEL_AVX512), "avx512");
    CHECK(mx_kernel_name((mx_kernel)(MX_KERNEL_AVX512 + 1)) == NULL);
    mx_kernel_select(MX_KERNEL_AUTO);
    CHECK_EQ_INT(mx_kernel_active(), best);
}

/* The kernel variables' values as mx_kernel_check_env() judges them: MXTRAIN_KERNEL and its
 * older name MXTRAIN_MX_KERNEL alike, each message naming the variable that holds the value;
 * with both set, MXTRAIN_KERNEL decides (an empty one counts as unset). */
static void test_kernel_env(void) {
    static const char *const vars[] = {"MXTRAIN_KERNEL", "MXTRAIN_MX_KERNEL"};
    char *keep[2];
    for (int v = 0; v < 2; v++) {
        const char *saved = getenv(vars[v]);
        keep[v] = saved ? strdup(saved) : NULL;
        unsetenv(vars[v]);
    }
    mx_diag d;
    CHECK_EQ_INT(mx_kernel_check_env(&d), 0);
    char want[128];
    for (int v = 0; v < 2; v++) {
        const char *var = vars[v];
        const char *fine[] = {"", "auto", "ref"};
        for (int i = 0; i < 3; i++) {
            setenv(var, fine[i], 1);
            CHECK_EQ_INT(mx_kernel_check_env(&d), 0);
        }
        setenv(var, "avx3", 1);
        CHECK_EQ_INT(mx_kernel_check_env(&d), MX_EINVAL);
        snprintf(want, sizeof want, "%s: 'avx3' is not a kernel (allowed: auto, ref, avx2, avx512", var);
        CHECK_STR_CONTAINS(d.msg, want);
        setenv(var, "AVX2", 1);   // names are lower case
        CHECK_EQ_INT(mx_kernel_check_env(NULL), MX_EINVAL);
        for (int k = MX_KERNEL_REF; mx_kernel_name((mx_kernel)k); k++) {
            setenv(var, mx_kernel_name((mx_kernel)k), 1);
            if (mx_kernel_available((mx_kernel)k)) {
                CHECK_EQ_INT(mx_kernel_check_env(&d), 0);
            } else {
                CHECK_EQ_INT(mx_kernel_check_env(&d), MX_EUNSUPPORTED);
                snprintf(want, sizeof want, "%s: '%s' cannot run here", var, mx_kernel_name((mx_kernel)k));
                CHECK_STR_CONTAINS(d.msg, want);
                CHECK_STR_CONTAINS(d.msg, mx_kernel_missing((mx_kernel)k));
                CHECK_STR_CONTAINS(d.msg, "allowed here: auto, ref");
                printf("    %s=%s: %s\n", var, mx_kernel_name((mx_kernel)k), d.msg);
            }
        }
        unsetenv(var);
    }
    // both set: MXTRAIN_KERNEL's value is the one judged
    setenv("MXTRAIN_KERNEL", "ref", 1);
    setenv("MXTRAIN_MX_KERNEL", "avx3", 1);
    CHECK_EQ_INT(mx_kernel_check_env(&d), 0);
    setenv("MXTRAIN_KERNEL", "avx3", 1);
    setenv("MXTRAIN_MX_KERNEL", "ref", 1);
    CHECK_EQ_INT(mx_kernel_check_env(&d), MX_EINVAL);
    CHECK_STR_CONTAINS(d.msg, "MXTRAIN_KERNEL: 'avx3' is not a kernel");
    setenv("MXTRAIN_KERNEL", "", 1);
    setenv("MXTRAIN_MX_KERNEL", "avx3", 1);
    CHECK_EQ_INT(mx_kernel_check_env(&d), MX_EINVAL);
    CHECK_STR_CONTAINS(d.msg, "MXTRAIN_MX_KERNEL: 'avx3' is not a kernel");
    for (int v = 0; v < 2; v++) {
        if (keep[v]) setenv(vars[v], keep[v], 1);
        else unsetenv(vars[v]);
        free(keep[v]);
    }
}

static const mxt_test tests[] = {
    {"kernel_choice", test_kernel_choice},
    {"kernel_env", test_kernel_env},
    {"tiles_bad_arguments", test_tiles_bad_arguments},
    {"bad_arguments", test_bad_arguments},
};

int main(int argc, char **argv) {
    initial_kernel = mx_kernel_active();
    printf("# kernel in use: %s\n", kernel_label(initial_kernel));
    return MXT_RUN(tests, argc, argv);
}
