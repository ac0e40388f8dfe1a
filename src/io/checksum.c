/* CRC-32 through zlib (see checksum.h). zlib's crc32 runs at several GB/s on one core
 * (docs/benchmarks.md: a checkpoint's checksums), and crc32_combine joins the pieces of a
 * tensor that different ranks hashed. */
#include "io/checksum.h"

#include <stdlib.h>
#include <zlib.h>

#include "core/diag.h"

uint32_t mxi_crc32(uint32_t crc, const void *data, size_t n) {
    const unsigned char *p = data;
    uLong c = crc;
    while (n > 0) {   // zlib takes at most a uInt at a time
        uInt k = n > (1u << 30) ? (1u << 30) : (uInt)n;
        c = crc32(c, p, k);
        p += k, n -= k;
    }
    return (uint32_t)c;
}

uint32_t mxi_crc32_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) {
    return (uint32_t)crc32_combine(crc_a, crc_b, (z_off_t)len_b);
}

int mxi_st_tensor_crc32(mx_st_file *file, const char *name, uint32_t *crc, mx_diag *diag) {
    const mx_st_tensor *t = mx_st_find(file, name);
    if (!t) return mxi_diag(diag, MX_EINVAL, "%s: no tensor named '%s'", mx_st_path(file), name);
    *crc = 0;
    if (t->dtype != MX_ST_F32) {   // not a checkpoint's: read whole
        void *all = malloc(t->nbytes ? t->nbytes : 1);
        if (!all)
            return mxi_diag(diag, MX_ENOMEM, "%s: out of memory reading '%s' (%llu bytes)", mx_st_path(file), name,
                            (unsigned long long)t->nbytes);
        int rc = mx_st_read_raw(file, name, all, t->nbytes, diag);
        if (!rc) *crc = mxi_crc32(0, all, t->nbytes);
        free(all);
        return rc;
    }
    // fp32 as read is the file's bytes (the formats are little-endian, io_internal.h)
    enum { CHUNK = 1 << 20 };   // floats
    float *buf = malloc(CHUNK * sizeof *buf);
    if (!buf)
        return mxi_diag(diag, MX_ENOMEM, "%s: out of memory reading '%s' (%zu bytes)", mx_st_path(file), name,
                        CHUNK * sizeof *buf);
    int rc = MX_OK;
    for (int64_t i = 0; i < t->numel && !rc; i += CHUNK) {
        int64_t n = t->numel - i < CHUNK ? t->numel - i : CHUNK;
        rc = mx_st_read_f32_part(file, name, t->shape, t->ndim, i, n, buf, diag);
        if (!rc) *crc = mxi_crc32(*crc, buf, (size_t)n * sizeof *buf);
    }
    free(buf);
    return rc;
}
