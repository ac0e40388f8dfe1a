/* Internal: CRC-32 (zlib's: the polynomial of gzip, PNG and Python's zlib.crc32) of tensor
 * bytes, and its combination, so that a tensor written in pieces by several ranks has the
 * checksum of its whole bytes whatever the pieces. */
#ifndef MXI_CHECKSUM_H
#define MXI_CHECKSUM_H

#include <stddef.h>
#include <stdint.h>

#include "mxtrain/error.h"
#include "mxtrain/safetensors.h"

/* The CRC-32 of data[0, n) continuing crc (0 to start), any n. */
uint32_t mxi_crc32(uint32_t crc, const void *data, size_t n);

/* The CRC-32 of A followed by B, from crc_a, crc_b and B's length in bytes. */
uint32_t mxi_crc32_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

/* The CRC-32 of tensor `name`'s data bytes in file (read in pieces, never whole). MX_EINVAL
 * when the file has no such tensor, MX_EIO on a read failure. */
int mxi_st_tensor_crc32(mx_st_file *file, const char *name, uint32_t *crc, mx_diag *diag);

#endif
