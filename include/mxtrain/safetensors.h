/* mxtrain — safetensors files (SPEC §8), the Hugging Face weights format:
 *
 *   [8 bytes]  N, little-endian u64: length of the JSON header
 *   [N bytes]  UTF-8 JSON object: name -> {"dtype": "F32", "shape": [2, 3],
 *              "data_offsets": [begin, end]}, plus optional "__metadata__": {str: str}
 *   [rest]     the data section: raw little-endian tensor bytes; offsets are relative to
 *              its start, and the tensors tile it exactly (no hole, no overlap)
 *
 * mx_st_open validates the whole header against the file before any tensor is read, so a
 * model loader never starts on a corrupt file; every error is one line naming the file, the
 * tensor and what is allowed. Tensor data is read with pread on demand, never all at once.
 * See docs/files.md.
 */
#ifndef MXTRAIN_SAFETENSORS_H
#define MXTRAIN_SAFETENSORS_H

#include <stdint.h>

#include "mxtrain/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Every dtype of the Hugging Face format. All are recognised (a file holding any of them
 * opens, and mx_st_read_raw returns their bytes); mx_st_read_f32 converts the floating
 * ones marked (f32). */
typedef enum {
    MX_ST_BOOL = 0,
    MX_ST_U8,
    MX_ST_I8,
    MX_ST_I16,
    MX_ST_U16,
    MX_ST_I32,
    MX_ST_U32,
    MX_ST_I64,
    MX_ST_U64,
    MX_ST_F64,     /* (f32) rounded to nearest */
    MX_ST_F32,     /* (f32) */
    MX_ST_F16,     /* (f32) exact */
    MX_ST_BF16,    /* (f32) exact */
    MX_ST_F8_E4M3, /* (f32) exact, OCP FP8 */
    MX_ST_F8_E5M2, /* (f32) exact, OCP FP8 */
    MX_ST_F8_E8M0, /* (f32) exact: code c is 2^(c-127), 0xFF NaN */
    MX_ST_C64,     /* complex64 */
    MX_ST_F4,      /* 4-bit, two per byte */
    MX_ST_F6_E2M3, /* 6-bit, packed */
    MX_ST_F6_E3M2, /* 6-bit, packed */
    MX_ST_NDTYPES
} mx_st_dtype;

/* Most dimensions a tensor may have here (the format itself sets no limit). */
#define MX_ST_MAX_NDIM 16
/* Largest header accepted (the reference implementation's limit). */
#define MX_ST_MAX_HEADER 100000000ull

/* "F32", "BF16", ...; "?" for a value out of range. */
const char *mx_st_dtype_name(mx_st_dtype dtype);
/* Bits per element (4, 6, 8, 16, 32, 64); 0 for a value out of range. */
int mx_st_dtype_bits(mx_st_dtype dtype);
/* Parse a dtype name (exact, case-sensitive as in the format). Returns 0 or MX_EENUM. */
int mx_st_dtype_parse(const char *name, mx_st_dtype *out);

/* ---- Reading ------------------------------------------------------------------------ */

typedef struct mx_st_file mx_st_file;

/* One tensor of an open file. Pointers stay valid until mx_st_close. */
typedef struct {
    const char *name;
    mx_st_dtype dtype;
    int ndim;                        /* 0 for a scalar */
    int64_t shape[MX_ST_MAX_NDIM];   /* (ndim) */
    int64_t numel;                   /* product of shape (1 for a scalar) */
    uint64_t nbytes;                 /* data_offsets end - begin */
    uint64_t offset;                 /* data_offsets begin, relative to the data section */
} mx_st_tensor;

/* Open and validate a file. Errors (diag names the file, and the tensor when there is one):
 * MX_EIO: cannot open, is a directory, read failure.
 * MX_EFORMAT: too short; header length larger than the file or above MX_ST_MAX_HEADER;
 *   invalid JSON (jansson's message, line, column); not an object; a bad entry (dtype not a
 *   known name, shape not a list of non-negative integers, element count overflowing,
 *   data_offsets not [begin, end] integers with begin <= end, end - begin not the size the
 *   dtype and shape need, past the end of the data section); tensors overlapping, leaving a
 *   hole, or not reaching the end of the data section; duplicate names; a bad __metadata__.
 * MX_EUNSUPPORTED: more than MX_ST_MAX_NDIM dimensions.
 * MX_ENOMEM. On error *out is NULL. */
int mx_st_open(const char *path, mx_st_file **out, mx_diag *diag);
void mx_st_close(mx_st_file *file);

const char *mx_st_path(const mx_st_file *file);
/* Number of tensors; tensors are indexed 0..count-1 in name order (strcmp). */
int mx_st_count(const mx_st_file *file);
/* The tensor at index, or NULL when index is out of range. */
const mx_st_tensor *mx_st_get(const mx_st_file *file, int index);
/* The tensor named name, or NULL. */
const mx_st_tensor *mx_st_find(const mx_st_file *file, const char *name);

/* Read tensor `name` converted to fp32 into dst (numel floats). The tensor's shape must
 * equal expected_shape[0..ndim) (ndim 0 = a scalar; expected_shape may then be NULL).
 * Errors: MX_EINVAL no such tensor (diag lists a few names the file has) or shape mismatch
 * (diag: the tensor, its shape and dtype, the expected shape); MX_EUNSUPPORTED a dtype not
 * readable as fp32; MX_EIO a read failure (the file shrank after opening); MX_ENULL. */
int mx_st_read_f32(mx_st_file *file, const char *name, const int64_t *expected_shape, int ndim, float *dst,
                   mx_diag *diag);

/* As mx_st_read_f32, only elements [start, start + count) of the tensor (row-major order)
 * into dst (count floats): a rank's rows. MX_EINVAL also for a range outside the tensor. */
int mx_st_read_f32_part(mx_st_file *file, const char *name, const int64_t *expected_shape, int ndim, int64_t start,
                        int64_t count, float *dst, mx_diag *diag);

/* Copy tensor `name`'s raw little-endian bytes into dst, which holds dst_bytes; dst_bytes
 * must equal the tensor's nbytes (MX_ESIZE otherwise). Any dtype. */
int mx_st_read_raw(mx_st_file *file, const char *name, void *dst, uint64_t dst_bytes, mx_diag *diag);

/* Metadata ("__metadata__"): the value for key, or NULL. */
const char *mx_st_metadata(const mx_st_file *file, const char *key);
/* Number of metadata entries; entry i (in key order) via mx_st_metadata_at (0, or MX_EINVAL
 * when i is out of range). */
int mx_st_metadata_count(const mx_st_file *file);
int mx_st_metadata_at(const mx_st_file *file, int i, const char **key, const char **value);

/* ---- Writing ------------------------------------------------------------------------ */

/* A list of tensors (and metadata) to write. Names and shapes are copied; tensor data is
 * borrowed and must stay valid until mx_st_write returns. */
typedef struct mx_st_writer mx_st_writer;

int mx_st_writer_new(mx_st_writer **out);
void mx_st_writer_free(mx_st_writer *writer);

/* Add fp32 data (numel floats, row-major) to be stored as dtype MX_ST_F32 (bit-exact) or
 * MX_ST_BF16 (rounded to nearest even; NaN stays NaN). ndim 0 = a scalar (shape may be
 * NULL); zero-sized dimensions are allowed (data may then be NULL).
 * Errors: MX_EINVAL empty name, the name "__metadata__", a name not valid UTF-8, a
 * duplicate name, a negative dimension; MX_EUNSUPPORTED another dtype or more than
 * MX_ST_MAX_NDIM dims; MX_ESIZE overflow; MX_ENULL. */
int mx_st_writer_add_f32(mx_st_writer *writer, const char *name, mx_st_dtype dtype, const int64_t *shape, int ndim,
                         const float *data, mx_diag *diag);

/* Add data already encoded in dtype (any dtype; its little-endian bytes, copied as they
 * are). Same errors as above, and MX_EINVAL for a sub-byte dtype whose elements do not fill
 * whole bytes. */
int mx_st_writer_add_raw(mx_st_writer *writer, const char *name, mx_st_dtype dtype, const int64_t *shape, int ndim,
                         const void *data, mx_diag *diag);

/* Add a tensor whose bytes come later: mx_st_write leaves them as zeros (a hole in the
 * file), to be written into the finished file at its data offset, in pieces and by any
 * process (each rank of a sharded model its own rows). Same errors as above. */
int mx_st_writer_reserve(mx_st_writer *writer, const char *name, mx_st_dtype dtype, const int64_t *shape, int ndim,
                         mx_diag *diag);

/* offsets[i]: the byte offset in the file mx_st_write writes at which the data of the i-th
 * tensor added starts (the same for every writer given the same tensors and metadata).
 * MX_ESIZE, MX_ENOMEM as mx_st_write; MX_ENULL. */
int mx_st_writer_data_offsets(const mx_st_writer *writer, uint64_t *offsets, mx_diag *diag);

/* Set a metadata entry (replacing an earlier value of the same key). Key and value must be
 * valid UTF-8 (MX_EINVAL). */
int mx_st_writer_set_metadata(mx_st_writer *writer, const char *key, const char *value, mx_diag *diag);

/* Write the file atomically: a temporary file in path's directory, fsync, rename over path.
 * Tensors are stored in name order; the header is padded with spaces so the data section
 * starts at a multiple of 8 bytes. On any error (MX_EIO, MX_ENOMEM) no file is left behind
 * and an existing file at path is untouched. The writer can be written again. */
int mx_st_write(const mx_st_writer *writer, const char *path, mx_diag *diag);

/* ---- Conversions (exposed for tests and other layers) -------------------------------- */

/* fp32 -> bf16, round to nearest even; NaN -> quiet NaN of the same sign. */
uint16_t mx_st_f32_to_bf16(float x);
float mx_st_bf16_to_f32(uint16_t bits);
float mx_st_f16_to_f32(uint16_t bits);

#ifdef __cplusplus
}
#endif

#endif
