/* Internal: the scale layouts of a matrix quantized in 32x32 tiles (1-32-32 recipes). One
 * tile quantization serves both GEMM axes: the elements are the same, and each tile's scale
 * is spread over the block layout the axis needs. Used where weights are quantized: the
 * linear layers and the FSDP engine's MX shards. */
#ifndef MXI_TILES_H
#define MXI_TILES_H

#include <stdint.h>

#include "mxtrain/mx.h"

/* Spread tile scales (ceil(rows/32), ceil(cols/32)) of a (rows, cols) matrix over the block
 * layout of axis: scales (rows, ceil(cols/32)) rowwise, (ceil(rows/32), cols) colwise. */
void mxi_tiles_spread(uint8_t *scales, const uint8_t *tiles, int64_t rows, int64_t cols, mx_axis axis);

#endif
