/* Tile scales spread over block layouts (numerics/tiles.h). */
#include "numerics/tiles.h"

#include <string.h>

void mxi_tiles_spread(uint8_t *s, const uint8_t *tiles, int64_t rows, int64_t cols, mx_axis axis) {
    int64_t tr = (rows + MX_BLOCK - 1) / MX_BLOCK, tc = (cols + MX_BLOCK - 1) / MX_BLOCK;
    if (axis == MX_ROWWISE) {
        for (int64_t r = 0; r < rows; r++) memcpy(s + r * tc, tiles + (r / MX_BLOCK) * tc, (size_t)tc);
    } else {
        for (int64_t i = 0; i < tr; i++)
            for (int64_t k = 0; k < cols; k++) s[i * cols + k] = tiles[i * tc + k / MX_BLOCK];
    }
}
