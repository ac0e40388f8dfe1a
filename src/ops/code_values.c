/* The values of each 8-bit element format's 256 codes, built once per process: what every
 * dequantizer and decoder of the ops layer reads instead of calling a format's decoder. */
#include <math.h>
#include <pthread.h>

#include "core/bits.h"
#include "mxtrain/scaled.h"
#include "numerics/mx_internal.h"   // mxi_fp8_values16_range
#include "ops/ops_kernels.h"

enum { N_FORMATS = MX_HIF8 + 1 };
static mxi_code_values tables[N_FORMATS];
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void fill(void) {
    for (int e = 0; e < N_FORMATS; e++) {
        const mx_elem_traits *t = e == MX_HIF8 ? NULL : mx_elem_traits_of((mx_elem)e);
        if (e != MX_HIF8 && !t) continue;
        mxi_code_values *v = &tables[e];
        for (int c = 0; c < 256; c++) {
            float x = e == MX_HIF8 ? mx_hif8_to_f32((uint8_t)c) : t->to_f32((uint8_t)c);
            v->f32[c] = x != x ? MXI_CANONICAL_NAN : mxi_f32_bits(x);   // one NaN, so kernels agree bit for bit
            v->bf16[c] = v->f32[c] >> 16;   // exact: no 8-bit format has more than 3 mantissa bits
            if (c < 128) v->lo[c] = (uint8_t)v->bf16[c], v->hi[c] = (uint8_t)(v->bf16[c] >> 8);
        }
        v->special = v->nan = 128;
        for (int c = 127; c >= 0; c--) {
            float x = mxi_bits_f32(v->f32[c]);
            if (isnan(x) || isinf(x)) v->special = (uint8_t)c;
            if (isnan(x)) v->nan = (uint8_t)c;
        }
        // the quantizers' bf16 values (mxi_fp8_quantize_*_values16) take the same range, so
        // a product that takes them would have made the same bf16 of the codes; HiF8: none
        if (t) mxi_fp8_values16_range(t, &v->pow2_lo, &v->pow2_hi);
        else v->pow2_lo = 1, v->pow2_hi = 0;
    }
}

const mxi_code_values *mxi_code_values_of(mx_elem elem) {
    if ((unsigned)elem >= N_FORMATS || (elem != MX_HIF8 && !mx_elem_traits_of(elem))) return NULL;
    pthread_once(&once, fill);
    return &tables[elem];
}
