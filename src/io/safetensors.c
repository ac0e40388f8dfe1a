/* safetensors reader and writer (see include/mxtrain/safetensors.h, docs/files.md).
 *
 * Reading: the header is parsed with jansson and checked in full against the file size at
 * open time; tensor bytes are read later with pread, converted in 64 KiB chunks. Writing:
 * jansson builds the header, tensors follow in name order, and the file appears atomically
 * (io_internal.h). */
#include "mxtrain/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/bits.h"
#include "core/diag.h"
#include "core/file.h"
#include "core/text.h"
#include "io/io_internal.h"
#include "mxtrain/mx.h"

/* ---- dtypes --------------------------------------------------------------------------- */

static const struct {
    const char *name;
    int bits;
} dtype_table[MX_ST_NDTYPES] = {
    [MX_ST_BOOL] = {"BOOL", 8},       [MX_ST_U8] = {"U8", 8},           [MX_ST_I8] = {"I8", 8},
    [MX_ST_I16] = {"I16", 16},        [MX_ST_U16] = {"U16", 16},        [MX_ST_I32] = {"I32", 32},
    [MX_ST_U32] = {"U32", 32},        [MX_ST_I64] = {"I64", 64},        [MX_ST_U64] = {"U64", 64},
    [MX_ST_F64] = {"F64", 64},        [MX_ST_F32] = {"F32", 32},        [MX_ST_F16] = {"F16", 16},
    [MX_ST_BF16] = {"BF16", 16},      [MX_ST_F8_E4M3] = {"F8_E4M3", 8}, [MX_ST_F8_E5M2] = {"F8_E5M2", 8},
    [MX_ST_F8_E8M0] = {"F8_E8M0", 8}, [MX_ST_C64] = {"C64", 64},       [MX_ST_F4] = {"F4", 4},
    [MX_ST_F6_E2M3] = {"F6_E2M3", 6}, [MX_ST_F6_E3M2] = {"F6_E3M2", 6},
};

#define DTYPE_LIST \
    "BOOL, U8, I8, I16, U16, I32, U32, I64, U64, F64, F32, F16, BF16, F8_E4M3, F8_E5M2, F8_E8M0, C64, F4, F6_E2M3, F6_E3M2"
#define F32_READABLE "F64, F32, F16, BF16, F8_E4M3, F8_E5M2, F8_E8M0"

const char *mx_st_dtype_name(mx_st_dtype dtype) {
    return (unsigned)dtype < MX_ST_NDTYPES ? dtype_table[dtype].name : "?";
}

int mx_st_dtype_bits(mx_st_dtype dtype) { return (unsigned)dtype < MX_ST_NDTYPES ? dtype_table[dtype].bits : 0; }

int mx_st_dtype_parse(const char *name, mx_st_dtype *out) {
    if (!name || !out) return MX_ENULL;
    for (int i = 0; i < MX_ST_NDTYPES; i++)
        if (strcmp(name, dtype_table[i].name) == 0) {
            *out = (mx_st_dtype)i;
            return 0;
        }
    return MX_EENUM;
}

static bool f32_readable(mx_st_dtype d) {
    return d == MX_ST_F64 || d == MX_ST_F32 || d == MX_ST_F16 || d == MX_ST_BF16 || d == MX_ST_F8_E4M3 ||
           d == MX_ST_F8_E5M2 || d == MX_ST_F8_E8M0;
}

/* ---- conversions ---------------------------------------------------------------------- */

uint16_t mx_st_f32_to_bf16(float x) { return mxi_f32_to_bf16(x); }

float mx_st_bf16_to_f32(uint16_t bits) { return mxi_bf16_to_f32(bits); }

float mx_st_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
    if (exp == 0) { /* zero or subnormal: man * 2^-24, exact in fp32 */
        float v = (float)man * 0x1p-24f;
        return mxi_bits_f32(mxi_f32_bits(v) | sign);
    }
    if (exp == 31) return mxi_bits_f32(sign | 0x7F800000u | (man << 13));
    return mxi_bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

/* ---- formatting helpers --------------------------------------------------------------- */

static const char *fmt_shape(char *buf, size_t size, const int64_t *shape, int ndim) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, size - o, "[");
    for (int i = 0; i < ndim && o < size; i++)
        o += (size_t)snprintf(buf + o, size - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (o < size) snprintf(buf + o, size - o, "]");
    return buf;
}

#define QNAME(buf, s) mxi_quote(buf, sizeof buf, s, strlen(s))

static const char *json_kind(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "object";
    case JSON_ARRAY: return "list";
    case JSON_STRING: return "string";
    case JSON_INTEGER: return "integer";
    case JSON_REAL: return "real number";
    case JSON_TRUE:
    case JSON_FALSE: return "boolean";
    default: return "null";
    }
}

/* A JSON value as compact text, quoted for a message. */
static const char *json_text(char *buf, size_t size, const json_t *v) {
    char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    if (!s) return json_kind(v);
    mxi_quote(buf, size, s, strlen(s));
    free(s);
    return buf;
}

/* ---- reading -------------------------------------------------------------------------- */

struct mx_st_file {
    char *path;
    int fd;
    uint64_t data_start; /* 8 + header length */
    uint64_t data_size;  /* bytes of the data section */
    int count;
    mx_st_tensor *tensors; /* (count) in name order; names malloc'ed */
    int n_meta;
    char **meta_keys;   /* (n_meta) in key order */
    char **meta_values; /* (n_meta) */
};

void mx_st_close(mx_st_file *f) {
    if (!f) return;
    if (f->fd >= 0) close(f->fd);
    for (int i = 0; i < f->count; i++) free((char *)f->tensors[i].name);
    free(f->tensors);
    for (int i = 0; i < f->n_meta; i++) {
        free(f->meta_keys[i]);
        free(f->meta_values[i]);
    }
    free(f->meta_keys);
    free(f->meta_values);
    free(f->path);
    free(f);
}

/* Parse one header entry into t (name already set). */
static int parse_entry(const mx_st_file *f, const char *name, json_t *v, mx_st_tensor *t, mx_diag *diag) {
    char qn[MXI_QUOTE_SIZE], qv[MXI_QUOTE_SIZE], sh[256];
    QNAME(qn, name);
    const char *want = "allowed: {\"dtype\": NAME, \"shape\": [non-negative integers], \"data_offsets\": [begin, end]}";
    if (!json_is_object(v))
        return mxi_diag(diag, MX_EFORMAT, "%s: header entry is a %s, not an object (tensor '%s'; %s)", f->path,
                        json_kind(v), qn, want);
    json_t *dt = json_object_get(v, "dtype"), *shape = json_object_get(v, "shape"),
           *offs = json_object_get(v, "data_offsets");
    if (!dt || !json_is_string(dt))
        return mxi_diag(diag, MX_EFORMAT, "%s: %s \"dtype\" (tensor '%s'; %s)", f->path,
                        dt ? "non-string" : "missing", qn, want);
    if (mx_st_dtype_parse(json_string_value(dt), &t->dtype) != 0)
        return mxi_diag(diag, MX_EFORMAT, "%s: unknown dtype '%s' (tensor '%s'; allowed: " DTYPE_LIST ")", f->path,
                        mxi_quote(qv, sizeof qv, json_string_value(dt), json_string_length(dt)), qn);
    if (!shape || !json_is_array(shape))
        return mxi_diag(diag, MX_EFORMAT, "%s: %s \"shape\" (tensor '%s'; allowed: a list of non-negative integers)",
                        f->path, shape ? "non-list" : "missing", qn);
    size_t ndim = json_array_size(shape);
    if (ndim > MX_ST_MAX_NDIM)
        return mxi_diag(diag, MX_EUNSUPPORTED, "%s: shape has %zu dimensions (tensor '%s'; allowed: at most %d)",
                        f->path, ndim, qn, MX_ST_MAX_NDIM);
    t->ndim = (int)ndim;
    uint64_t numel = 1;
    bool overflow = false;
    for (size_t i = 0; i < ndim; i++) {
        json_t *d = json_array_get(shape, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return mxi_diag(diag, MX_EFORMAT,
                            "%s: bad shape entry (tensor '%s': shape[%zu] is %s; allowed: non-negative integers)",
                            f->path, qn, i, json_text(qv, sizeof qv, d));
        t->shape[i] = (int64_t)json_integer_value(d);
        if (__builtin_mul_overflow(numel, (uint64_t)t->shape[i], &numel)) overflow = true;
    }
    int bits = dtype_table[t->dtype].bits;
    uint64_t total_bits;
    if (overflow || numel > (uint64_t)INT64_MAX || __builtin_mul_overflow(numel, (uint64_t)bits, &total_bits))
        return mxi_diag(diag, MX_EFORMAT, "%s: shape too large (tensor '%s': %s %s has more than 2^63 bytes)",
                        f->path, qn, dtype_table[t->dtype].name, fmt_shape(sh, sizeof sh, t->shape, t->ndim));
    if (total_bits % 8 != 0)
        return mxi_diag(diag, MX_EFORMAT,
                        "%s: tensor does not fill whole bytes (tensor '%s': %s %s is %llu bits; allowed: a multiple of 8)",
                        f->path, qn, dtype_table[t->dtype].name, fmt_shape(sh, sizeof sh, t->shape, t->ndim),
                        (unsigned long long)total_bits);
    t->numel = (int64_t)numel;
    uint64_t need = total_bits / 8;
    const char *owant = "allowed: [begin, end], non-negative integers relative to the data section, begin <= end";
    if (!offs || !json_is_array(offs) || json_array_size(offs) != 2 || !json_is_integer(json_array_get(offs, 0)) ||
        !json_is_integer(json_array_get(offs, 1)) || json_integer_value(json_array_get(offs, 0)) < 0 ||
        json_integer_value(json_array_get(offs, 1)) < 0)
        return mxi_diag(diag, MX_EFORMAT, "%s: bad data_offsets (tensor '%s': data_offsets is %s; %s)", f->path, qn,
                        offs ? json_text(qv, sizeof qv, offs) : "missing", owant);
    uint64_t begin = (uint64_t)json_integer_value(json_array_get(offs, 0));
    uint64_t end = (uint64_t)json_integer_value(json_array_get(offs, 1));
    if (end < begin)
        return mxi_diag(diag, MX_EFORMAT, "%s: bad data_offsets (tensor '%s': data_offsets [%llu, %llu] end before they begin; %s)",
                        f->path, qn, (unsigned long long)begin, (unsigned long long)end, owant);
    if (end - begin != need)
        return mxi_diag(diag, MX_EFORMAT,
                        "%s: data_offsets do not match dtype and shape (tensor '%s': %s %s needs %llu bytes, "
                        "data_offsets [%llu, %llu] hold %llu)",
                        f->path, qn, dtype_table[t->dtype].name, fmt_shape(sh, sizeof sh, t->shape, t->ndim),
                        (unsigned long long)need, (unsigned long long)begin, (unsigned long long)end,
                        (unsigned long long)(end - begin));
    if (end > f->data_size)
        return mxi_diag(diag, MX_EFORMAT,
                        "%s: data_offsets run past the end of the file (tensor '%s': data_offsets [%llu, %llu], but the "
                        "data section holds %llu bytes; the file is truncated or the offsets are wrong)",
                        f->path, qn, (unsigned long long)begin, (unsigned long long)end,
                        (unsigned long long)f->data_size);
    t->offset = begin;
    t->nbytes = need;
    return 0;
}

static int cmp_tensor_name(const void *a, const void *b) {
    return strcmp(((const mx_st_tensor *)a)->name, ((const mx_st_tensor *)b)->name);
}

/* Order of tensors in the data section: by begin, then end (zero-sized ones first). */
static int cmp_tensor_offset(const void *a, const void *b) {
    const mx_st_tensor *x = *(const mx_st_tensor *const *)a, *y = *(const mx_st_tensor *const *)b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    if (x->nbytes != y->nbytes) return x->nbytes < y->nbytes ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* The tensors must tile the data section exactly, as the reference implementation requires:
 * no byte in two tensors, no byte in none. */
static int check_tiling(const mx_st_file *f, mx_diag *diag) {
    if (f->count == 0) {
        if (f->data_size == 0) return 0;
        return mxi_diag(diag, MX_EFORMAT,
                        "%s: the header lists no tensors but %llu bytes of data follow it (allowed: tensors that "
                        "cover the data section exactly)",
                        f->path, (unsigned long long)f->data_size);
    }
    const mx_st_tensor **order = malloc((size_t)f->count * sizeof *order);
    if (!order)
        return mxi_diag(diag, MX_ENOMEM, "%s: out of memory (%zu bytes to order %d tensors)", f->path,
                        (size_t)f->count * sizeof *order, f->count);
    for (int i = 0; i < f->count; i++) order[i] = &f->tensors[i];
    qsort(order, (size_t)f->count, sizeof *order, cmp_tensor_offset);
    uint64_t pos = 0;
    const mx_st_tensor *prev = NULL;
    char qa[MXI_QUOTE_SIZE], qb[MXI_QUOTE_SIZE];
    int rc = 0;
    for (int i = 0; i < f->count && rc == 0; i++) {
        const mx_st_tensor *t = order[i];
        if (t->offset < pos)
            rc = mxi_diag(diag, MX_EFORMAT,
                          "%s: tensors overlap (tensor '%s' data_offsets [%llu, %llu] and tensor '%s' data_offsets "
                          "[%llu, %llu]; allowed: tensors that cover the data section exactly, each byte once)",
                          f->path, QNAME(qa, prev->name), (unsigned long long)prev->offset,
                          (unsigned long long)(prev->offset + prev->nbytes), QNAME(qb, t->name),
                          (unsigned long long)t->offset, (unsigned long long)(t->offset + t->nbytes));
        else if (t->offset > pos)
            rc = mxi_diag(diag, MX_EFORMAT,
                          "%s: hole in the data section (bytes [%llu, %llu) belong to no tensor, before tensor '%s'%s%s%s; "
                          "allowed: tensors that cover the data section exactly)",
                          f->path, (unsigned long long)pos, (unsigned long long)t->offset, QNAME(qa, t->name),
                          prev ? " and after tensor '" : "", prev ? QNAME(qb, prev->name) : "", prev ? "'" : "");
        pos = t->offset + t->nbytes;
        prev = t;
    }
    if (rc == 0 && pos != f->data_size)
        rc = mxi_diag(diag, MX_EFORMAT,
                      "%s: hole in the data section (bytes [%llu, %llu) after the last tensor '%s' belong to no tensor; "
                      "allowed: tensors that cover the data section exactly)",
                      f->path, (unsigned long long)pos, (unsigned long long)f->data_size, QNAME(qa, prev->name));
    free(order);
    return rc;
}

static int cmp_str_ptr(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int parse_metadata(mx_st_file *f, json_t *meta, mx_diag *diag) {
    char qk[MXI_QUOTE_SIZE], qv[MXI_QUOTE_SIZE];
    if (!json_is_object(meta))
        return mxi_diag(diag, MX_EFORMAT, "%s: __metadata__ is a %s (allowed: an object of string values)", f->path,
                        json_kind(meta));
    size_t n = json_object_size(meta);
    f->meta_keys = calloc(n ? n : 1, sizeof *f->meta_keys);
    f->meta_values = calloc(n ? n : 1, sizeof *f->meta_values);
    if (!f->meta_keys || !f->meta_values)
        return mxi_diag(diag, MX_ENOMEM, "%s: out of memory (2 x %zu bytes for %zu metadata entries)", f->path,
                        (n ? n : 1) * sizeof *f->meta_keys, n);
    const char *key;
    json_t *v;
    json_object_foreach(meta, key, v) {
        if (!json_is_string(v))
            return mxi_diag(diag, MX_EFORMAT, "%s: __metadata__ value is not a string (key '%s' is %s; allowed: strings)",
                            f->path, QNAME(qk, key), json_text(qv, sizeof qv, v));
        f->meta_keys[f->n_meta] = strdup(key);
        f->meta_values[f->n_meta] = mxi_strndup(json_string_value(v), json_string_length(v));
        f->n_meta++;
        if (!f->meta_keys[f->n_meta - 1] || !f->meta_values[f->n_meta - 1])
            return mxi_diag(diag, MX_ENOMEM, "%s: out of memory (%zu bytes for metadata '%s')", f->path,
                            strlen(key) + json_string_length(v) + 2, QNAME(qk, key));
    }
    /* Sort keys and values together: sort an index of key pointers, then permute values. */
    char **pairs = malloc(2 * (n ? n : 1) * sizeof *pairs);
    if (!pairs)
        return mxi_diag(diag, MX_ENOMEM, "%s: out of memory (%zu bytes to sort %zu metadata entries)", f->path,
                        2 * (n ? n : 1) * sizeof *pairs, n);
    for (int i = 0; i < f->n_meta; i++) {
        pairs[2 * i] = f->meta_keys[i];
        pairs[2 * i + 1] = f->meta_values[i];
    }
    qsort(pairs, (size_t)f->n_meta, 2 * sizeof *pairs, cmp_str_ptr);
    for (int i = 0; i < f->n_meta; i++) {
        f->meta_keys[i] = pairs[2 * i];
        f->meta_values[i] = pairs[2 * i + 1];
    }
    free(pairs);
    return 0;
}

static int parse_header(mx_st_file *f, const char *text, size_t n, mx_diag *diag) {
    json_error_t err;
    json_t *root = json_loadb(text, n, JSON_REJECT_DUPLICATES, &err);
    char qe[MXI_QUOTE_SIZE];
    if (!root) {
        mxi_quote(qe, sizeof qe, err.text, strlen(err.text));
        if (json_error_code(&err) == json_error_out_of_memory)
            return mxi_diag(diag, MX_ENOMEM, "%s: out of memory parsing the %zu-byte JSON header (jansson)", f->path,
                            n);
        if (json_error_code(&err) == json_error_duplicate_key)
            return mxi_diag(diag, MX_EFORMAT, "%s: duplicate name in the header: %s (line %d, column %d; allowed: each tensor name once)",
                            f->path, qe, err.line, err.column);
        return mxi_diag(diag, MX_EFORMAT, "%s: header is not valid JSON: %s (line %d, column %d of the %zu-byte header)",
                        f->path, qe, err.line, err.column, n);
    }
    int rc = 0;
    if (!json_is_object(root)) {
        rc = mxi_diag(diag, MX_EFORMAT,
                      "%s: header is a JSON %s, not an object (allowed: {NAME: {\"dtype\", \"shape\", \"data_offsets\"}, ..., "
                      "\"__metadata__\": {...}})",
                      f->path, json_kind(root));
        json_decref(root);
        return rc;
    }
    size_t n_keys = json_object_size(root);
    f->tensors = calloc(n_keys ? n_keys : 1, sizeof *f->tensors);
    if (!f->tensors)
        rc = mxi_diag(diag, MX_ENOMEM, "%s: out of memory (%zu bytes for %zu tensors' entries)", f->path,
                      (n_keys ? n_keys : 1) * sizeof *f->tensors, n_keys);
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (rc) break;
        if (strcmp(key, "__metadata__") == 0) {
            rc = parse_metadata(f, v, diag);
            continue;
        }
        mx_st_tensor *t = &f->tensors[f->count];
        t->name = strdup(key);
        if (!t->name) {
            rc = mxi_diag(diag, MX_ENOMEM, "%s: out of memory (%zu bytes for a tensor's name)", f->path,
                          strlen(key) + 1);
            break;
        }
        f->count++;
        rc = parse_entry(f, key, v, t, diag);
    }
    json_decref(root);
    if (rc) return rc;
    if (n_keys > (size_t)0x7FFFFFFF) return mxi_diag(diag, MX_EUNSUPPORTED, "%s: too many tensors", f->path);
    qsort(f->tensors, (size_t)f->count, sizeof *f->tensors, cmp_tensor_name);
    return check_tiling(f, diag);
}

int mx_st_open(const char *path, mx_st_file **out, mx_diag *diag) {
    if (!out) return mxi_diag(diag, MX_ENULL, "mx_st_open: out is NULL");
    *out = NULL;
    if (!path) return mxi_diag(diag, MX_ENULL, "mx_st_open: path is NULL");
    mx_st_file *f = calloc(1, sizeof *f);
    if (!f) return mxi_diag(diag, MX_ENOMEM, "%s: out of memory (%zu bytes)", path, sizeof *f);
    f->fd = -1;
    f->path = strdup(path);
    if (!f->path) {
        mx_st_close(f);
        return mxi_diag(diag, MX_ENOMEM, "%s: out of memory (%zu bytes)", path, strlen(path) + 1);
    }
    int rc = 0;
    char *header = NULL;
    uint64_t size;
    if ((rc = mxi_open_input(path, "a safetensors file", 0, &f->fd, &size, diag))) goto done;
    if (size < 8) {
        rc = mxi_diag(diag, MX_EFORMAT,
                      "%s: file is %llu bytes, too short for a safetensors file (allowed: an 8-byte little-endian "
                      "header length, the JSON header, then the tensor data)",
                      path, (unsigned long long)size);
        goto done;
    }
    uint64_t n;
    if (mxi_pread_full(f->fd, &n, 8, 0) != 0) {
        rc = mxi_diag(diag, MX_EIO, "%s: cannot read the header length (%s)", path,
                      errno ? strerror(errno) : "the file ended");
        goto done;
    }
    if (n > MX_ST_MAX_HEADER) {
        rc = mxi_diag(diag, MX_EFORMAT,
                      "%s: header length %llu is absurd (allowed: at most %llu bytes; this is not a safetensors file)",
                      path, (unsigned long long)n, MX_ST_MAX_HEADER);
        goto done;
    }
    if (n > size - 8) {
        rc = mxi_diag(diag, MX_EFORMAT,
                      "%s: header length is %llu bytes but only %llu bytes follow the 8-byte length (the file is "
                      "truncated)",
                      path, (unsigned long long)n, (unsigned long long)(size - 8));
        goto done;
    }
    f->data_start = 8 + n;
    f->data_size = size - 8 - n;
    header = malloc(n ? n : 1);
    if (!header) {
        rc = mxi_diag(diag, MX_ENOMEM, "%s: out of memory for a %llu-byte header", path, (unsigned long long)n);
        goto done;
    }
    if (mxi_pread_full(f->fd, header, n, 8) != 0) {
        rc = mxi_diag(diag, MX_EIO, "%s: cannot read the header (%s)", path, errno ? strerror(errno) : "the file ended");
        goto done;
    }
    rc = parse_header(f, header, n, diag);
done:
    free(header);
    if (rc) {
        mx_st_close(f);
        return rc;
    }
    *out = f;
    return 0;
}

const char *mx_st_path(const mx_st_file *f) { return f ? f->path : NULL; }
int mx_st_count(const mx_st_file *f) { return f ? f->count : 0; }

const mx_st_tensor *mx_st_get(const mx_st_file *f, int index) {
    return (f && index >= 0 && index < f->count) ? &f->tensors[index] : NULL;
}

const mx_st_tensor *mx_st_find(const mx_st_file *f, const char *name) {
    if (!f || !name) return NULL;
    mx_st_tensor key = {.name = name};
    return bsearch(&key, f->tensors, (size_t)f->count, sizeof key, cmp_tensor_name);
}

/* "'a', 'b', 'c', ..." : a few names the file has, for a "no such tensor" message. */
static void some_names(const mx_st_file *f, char *buf, size_t size) {
    size_t o = 0;
    buf[0] = '\0';
    char q[64];
    for (int i = 0; i < f->count && i < 3 && o < size; i++)
        o += (size_t)snprintf(buf + o, size - o, "%s'%s'", i ? ", " : "", mxi_quote(q, sizeof q, f->tensors[i].name,
                                                                                 strlen(f->tensors[i].name)));
    if (f->count > 3 && o < size) snprintf(buf + o, size - o, ", ...");
}

static int lookup(const mx_st_file *f, const char *name, const mx_st_tensor **t, mx_diag *diag) {
    *t = mx_st_find(f, name);
    if (*t) return 0;
    char qn[MXI_QUOTE_SIZE], names[256];
    some_names(f, names, sizeof names);
    return mxi_diag(diag, MX_EINVAL, "%s: no tensor named '%s' (the file has %d tensor%s%s%s)", f->path,
                    QNAME(qn, name), f->count, f->count == 1 ? "" : "s", f->count ? ": " : "", names);
}

static int read_at(const mx_st_file *f, const mx_st_tensor *t, void *dst, uint64_t off, size_t n, mx_diag *diag) {
    if (mxi_pread_full(f->fd, dst, n, f->data_start + t->offset + off) == 0) return 0;
    char qn[MXI_QUOTE_SIZE];
    return mxi_diag(diag, MX_EIO, "%s: cannot read tensor '%s' (%s)", f->path, QNAME(qn, t->name),
                    errno ? strerror(errno) : "the file ended early: it changed after it was opened");
}

/* Elements [start, start + count) of tensor t (row-major) as fp32 into dst. */
static int read_f32_part(const mx_st_file *f, const mx_st_tensor *t, int64_t start, int64_t count, float *dst,
                         mx_diag *diag) {
    if (count == 0) return 0;
    if (!dst) return mxi_diag(diag, MX_ENULL, "mx_st_read_f32: dst is NULL");
    size_t esize = (size_t)dtype_table[t->dtype].bits / 8;
    if (t->dtype == MX_ST_F32) return read_at(f, t, dst, (uint64_t)start * 4, (size_t)count * 4, diag);

    /* Other dtypes: read a chunk of raw elements, convert, repeat. */
    enum { CHUNK = 1 << 16 };
    unsigned char *raw = malloc(CHUNK);
    if (!raw) return mxi_diag(diag, MX_ENOMEM, "%s: out of memory (%d bytes to convert a tensor)", f->path, CHUNK);
    size_t per = CHUNK / esize;
    int rc = 0;
    for (int64_t i0 = 0; i0 < count && rc == 0; i0 += (int64_t)per) {
        size_t m = (size_t)(count - i0) < per ? (size_t)(count - i0) : per;
        rc = read_at(f, t, raw, (uint64_t)(start + i0) * esize, m * esize, diag);
        if (rc) break;
        float *y = dst + i0;
        for (size_t i = 0; i < m; i++) {
            switch (t->dtype) {
            case MX_ST_F64: {
                double d;
                memcpy(&d, raw + 8 * i, 8);
                y[i] = (float)d;
                break;
            }
            case MX_ST_F16: {
                uint16_t h;
                memcpy(&h, raw + 2 * i, 2);
                y[i] = mx_st_f16_to_f32(h);
                break;
            }
            case MX_ST_BF16: {
                uint16_t h;
                memcpy(&h, raw + 2 * i, 2);
                y[i] = mx_st_bf16_to_f32(h);
                break;
            }
            case MX_ST_F8_E4M3: y[i] = mx_fp8_to_f32(raw[i], MX_E4M3); break;
            case MX_ST_F8_E5M2: y[i] = mx_fp8_to_f32(raw[i], MX_E5M2); break;
            default: y[i] = mx_e8m0_to_f32(raw[i]); break; /* MX_ST_F8_E8M0 */
            }
        }
    }
    free(raw);
    return rc;
}

/* The tensor `name` of the shape expected, as fp32 readable. */
static int find_f32(const mx_st_file *f, const char *name, const int64_t *expected_shape, int ndim,
                    const mx_st_tensor **out, mx_diag *diag) {
    if (!f || !name) return mxi_diag(diag, MX_ENULL, "mx_st_read_f32: file or name is NULL");
    if (ndim < 0 || (ndim > 0 && !expected_shape))
        return mxi_diag(diag, MX_ENULL, "mx_st_read_f32: expected shape is NULL with ndim %d", ndim);
    const mx_st_tensor *t;
    int rc = lookup(f, name, &t, diag);
    if (rc) return rc;
    char qn[MXI_QUOTE_SIZE], sa[256], sb[256];
    bool same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = t->shape[i] == expected_shape[i];
    if (!same)
        return mxi_diag(diag, MX_EINVAL, "%s: tensor '%s' has shape %s (%s), expected %s", f->path, QNAME(qn, name),
                        fmt_shape(sa, sizeof sa, t->shape, t->ndim), dtype_table[t->dtype].name,
                        fmt_shape(sb, sizeof sb, expected_shape, ndim));
    if (!f32_readable(t->dtype))
        return mxi_diag(diag, MX_EUNSUPPORTED,
                        "%s: tensor '%s' has dtype %s, which cannot be read as fp32 (allowed: " F32_READABLE
                        "; mx_st_read_raw gives its bytes)",
                        f->path, QNAME(qn, name), dtype_table[t->dtype].name);
    *out = t;
    return 0;
}

int mx_st_read_f32(mx_st_file *f, const char *name, const int64_t *expected_shape, int ndim, float *dst,
                   mx_diag *diag) {
    const mx_st_tensor *t;
    int rc = find_f32(f, name, expected_shape, ndim, &t, diag);
    return rc ? rc : read_f32_part(f, t, 0, t->numel, dst, diag);
}

int mx_st_read_f32_part(mx_st_file *f, const char *name, const int64_t *expected_shape, int ndim, int64_t start,
                        int64_t count, float *dst, mx_diag *diag) {
    const mx_st_tensor *t;
    int rc = find_f32(f, name, expected_shape, ndim, &t, diag);
    if (rc) return rc;
    char qn[MXI_QUOTE_SIZE];
    if (start < 0 || count < 0 || start > t->numel || count > t->numel - start)
        return mxi_diag(diag, MX_EINVAL, "%s: tensor '%s': elements [%lld, %lld + %lld) are not within its %lld",
                        f->path, QNAME(qn, name), (long long)start, (long long)start, (long long)count,
                        (long long)t->numel);
    return read_f32_part(f, t, start, count, dst, diag);
}

int mx_st_read_raw(mx_st_file *f, const char *name, void *dst, uint64_t dst_bytes, mx_diag *diag) {
    if (!f || !name) return mxi_diag(diag, MX_ENULL, "mx_st_read_raw: file or name is NULL");
    const mx_st_tensor *t;
    int rc = lookup(f, name, &t, diag);
    if (rc) return rc;
    char qn[MXI_QUOTE_SIZE];
    if (dst_bytes != t->nbytes)
        return mxi_diag(diag, MX_ESIZE, "%s: tensor '%s' has %llu bytes, the buffer %llu", f->path, QNAME(qn, name),
                        (unsigned long long)t->nbytes, (unsigned long long)dst_bytes);
    if (t->nbytes == 0) return 0;
    if (!dst) return mxi_diag(diag, MX_ENULL, "mx_st_read_raw: dst is NULL");
    return read_at(f, t, dst, 0, (size_t)t->nbytes, diag);
}

const char *mx_st_metadata(const mx_st_file *f, const char *key) {
    if (!f || !key) return NULL;
    for (int lo = 0, hi = f->n_meta - 1; lo <= hi;) {
        int mid = lo + (hi - lo) / 2, c = strcmp(key, f->meta_keys[mid]);
        if (c == 0) return f->meta_values[mid];
        if (c < 0) hi = mid - 1;
        else lo = mid + 1;
    }
    return NULL;
}

int mx_st_metadata_count(const mx_st_file *f) { return f ? f->n_meta : 0; }

int mx_st_metadata_at(const mx_st_file *f, int i, const char **key, const char **value) {
    if (!f || !key || !value) return MX_ENULL;
    if (i < 0 || i >= f->n_meta) return MX_EINVAL;
    *key = f->meta_keys[i];
    *value = f->meta_values[i];
    return 0;
}

/* ---- writing -------------------------------------------------------------------------- */

typedef struct {
    char *name;
    mx_st_dtype dtype;
    int ndim;
    int64_t shape[MX_ST_MAX_NDIM]; /* (ndim) */
    int64_t numel;
    uint64_t nbytes;
    const void *data; /* borrowed; NULL for a reserved tensor */
    bool from_f32;    /* data is fp32, stored as dtype (F32 or BF16) */
    bool reserved;    /* mx_st_writer_reserve: bytes written later, into the file */
} st_entry;

struct mx_st_writer {
    st_entry *items;
    int n, cap;
    char **meta_keys, **meta_values;
    int n_meta, meta_cap;
};

int mxi_st_writer_new(mx_st_writer **out, mx_diag *diag) {
    if (!out) return mxi_diag(diag, MX_ENULL, "mx_st_writer_new: out is NULL");
    *out = calloc(1, sizeof **out);
    return *out ? 0 : mxi_diag(diag, MX_ENOMEM, "out of memory (%zu bytes for a safetensors writer)", sizeof **out);
}

int mx_st_writer_new(mx_st_writer **out) { return mxi_st_writer_new(out, NULL); }

void mx_st_writer_free(mx_st_writer *w) {
    if (!w) return;
    for (int i = 0; i < w->n; i++) free(w->items[i].name);
    free(w->items);
    for (int i = 0; i < w->n_meta; i++) {
        free(w->meta_keys[i]);
        free(w->meta_values[i]);
    }
    free(w->meta_keys);
    free(w->meta_values);
    free(w);
}

static bool valid_utf8(const char *s) {
    json_t *j = json_string(s); /* jansson validates UTF-8 */
    if (!j) return false;
    json_decref(j);
    return true;
}

static int writer_add(mx_st_writer *w, const char *name, mx_st_dtype dtype, const int64_t *shape, int ndim,
                      const void *data, bool from_f32, bool reserved, mx_diag *diag) {
    if (!w || !name) return mxi_diag(diag, MX_ENULL, "mx_st_writer_add: writer or name is NULL");
    char qn[MXI_QUOTE_SIZE], sh[256];
    QNAME(qn, name);
    if (!*name) return mxi_diag(diag, MX_EINVAL, "safetensors writer: empty tensor name (allowed: a non-empty name)");
    if (strcmp(name, "__metadata__") == 0)
        return mxi_diag(diag, MX_EINVAL, "safetensors writer: tensor name '__metadata__' is reserved for metadata");
    if (!valid_utf8(name))
        return mxi_diag(diag, MX_EINVAL, "safetensors writer: tensor name '%s' is not valid UTF-8", qn);
    if ((unsigned)dtype >= MX_ST_NDTYPES)
        return mxi_diag(diag, MX_EUNSUPPORTED, "safetensors writer: tensor '%s': dtype %d is not a dtype", qn, (int)dtype);
    if (from_f32 && dtype != MX_ST_F32 && dtype != MX_ST_BF16)
        return mxi_diag(diag, MX_EUNSUPPORTED,
                        "safetensors writer: tensor '%s': fp32 data can be stored as F32 or BF16, not %s", qn,
                        dtype_table[dtype].name);
    if (ndim < 0 || ndim > MX_ST_MAX_NDIM)
        return mxi_diag(diag, MX_EUNSUPPORTED, "safetensors writer: tensor '%s': ndim %d (allowed: 0 to %d)", qn, ndim,
                        MX_ST_MAX_NDIM);
    if (ndim > 0 && !shape) return mxi_diag(diag, MX_ENULL, "safetensors writer: tensor '%s': shape is NULL", qn);
    uint64_t numel = 1, bits;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return mxi_diag(diag, MX_EINVAL, "safetensors writer: tensor '%s': shape %s has a negative dimension", qn,
                            fmt_shape(sh, sizeof sh, shape, ndim));
        if (__builtin_mul_overflow(numel, (uint64_t)shape[i], &numel))
            return mxi_diag(diag, MX_ESIZE, "safetensors writer: tensor '%s': shape %s overflows", qn,
                            fmt_shape(sh, sizeof sh, shape, ndim));
    }
    if (numel > (uint64_t)INT64_MAX || __builtin_mul_overflow(numel, (uint64_t)dtype_table[dtype].bits, &bits))
        return mxi_diag(diag, MX_ESIZE, "safetensors writer: tensor '%s': shape %s overflows", qn,
                        fmt_shape(sh, sizeof sh, shape, ndim));
    if (bits % 8)
        return mxi_diag(diag, MX_EINVAL, "safetensors writer: tensor '%s': %s %s does not fill whole bytes", qn,
                        dtype_table[dtype].name, fmt_shape(sh, sizeof sh, shape, ndim));
    if (numel > 0 && !data && !reserved)
        return mxi_diag(diag, MX_ENULL, "safetensors writer: tensor '%s': data is NULL", qn);
    for (int i = 0; i < w->n; i++)
        if (strcmp(w->items[i].name, name) == 0)
            return mxi_diag(diag, MX_EINVAL, "safetensors writer: duplicate tensor name '%s'", qn);
    if (w->n == w->cap) {
        int cap = w->cap ? 2 * w->cap : 16;
        st_entry *items = realloc(w->items, (size_t)cap * sizeof *items);
        if (!items)
            return mxi_diag(diag, MX_ENOMEM, "safetensors writer: out of memory (%zu bytes for %d tensors)",
                            (size_t)cap * sizeof *items, cap);
        w->items = items;
        w->cap = cap;
    }
    st_entry *e = &w->items[w->n];
    memset(e, 0, sizeof *e);
    e->name = strdup(name);
    if (!e->name)
        return mxi_diag(diag, MX_ENOMEM, "safetensors writer: out of memory (%zu bytes for the name of '%s')",
                        strlen(name) + 1, qn);
    e->dtype = dtype;
    e->ndim = ndim;
    for (int i = 0; i < ndim; i++) e->shape[i] = shape[i];
    e->numel = (int64_t)numel;
    e->nbytes = bits / 8;
    e->data = data;
    e->from_f32 = from_f32;
    e->reserved = reserved;
    w->n++;
    return 0;
}

int mx_st_writer_add_f32(mx_st_writer *w, const char *name, mx_st_dtype dtype, const int64_t *shape, int ndim,
                         const float *data, mx_diag *diag) {
    return writer_add(w, name, dtype, shape, ndim, data, true, false, diag);
}

int mx_st_writer_add_raw(mx_st_writer *w, const char *name, mx_st_dtype dtype, const int64_t *shape, int ndim,
                         const void *data, mx_diag *diag) {
    return writer_add(w, name, dtype, shape, ndim, data, false, false, diag);
}

int mx_st_writer_reserve(mx_st_writer *w, const char *name, mx_st_dtype dtype, const int64_t *shape, int ndim,
                         mx_diag *diag) {
    return writer_add(w, name, dtype, shape, ndim, NULL, false, true, diag);
}

int mx_st_writer_set_metadata(mx_st_writer *w, const char *key, const char *value, mx_diag *diag) {
    if (!w || !key || !value) return mxi_diag(diag, MX_ENULL, "mx_st_writer_set_metadata: NULL argument");
    char qk[MXI_QUOTE_SIZE];
    if (!valid_utf8(key) || !valid_utf8(value))
        return mxi_diag(diag, MX_EINVAL, "safetensors writer: metadata '%s' is not valid UTF-8", QNAME(qk, key));
    char *v = strdup(value);
    if (!v)
        return mxi_diag(diag, MX_ENOMEM, "safetensors writer: out of memory (%zu bytes for metadata '%s')",
                        strlen(value) + 1, QNAME(qk, key));
    for (int i = 0; i < w->n_meta; i++)
        if (strcmp(w->meta_keys[i], key) == 0) {
            free(w->meta_values[i]);
            w->meta_values[i] = v;
            return 0;
        }
    if (w->n_meta == w->meta_cap) {
        int cap = w->meta_cap ? 2 * w->meta_cap : 8;
        char **k2 = realloc(w->meta_keys, (size_t)cap * sizeof *k2);
        if (k2) w->meta_keys = k2;
        char **v2 = k2 ? realloc(w->meta_values, (size_t)cap * sizeof *v2) : NULL;
        if (v2) w->meta_values = v2;
        if (!k2 || !v2) {
            free(v);
            return mxi_diag(diag, MX_ENOMEM,
                            "safetensors writer: out of memory (2 x %zu bytes for %d metadata entries)",
                            (size_t)cap * sizeof *k2, cap);
        }
        w->meta_cap = cap;
    }
    char *k = strdup(key);
    if (!k) {
        free(v);
        return mxi_diag(diag, MX_ENOMEM, "safetensors writer: out of memory (%zu bytes for metadata '%s')",
                        strlen(key) + 1, QNAME(qk, key));
    }
    w->meta_keys[w->n_meta] = k;
    w->meta_values[w->n_meta] = v;
    w->n_meta++;
    return 0;
}

static int cmp_entry_ptr(const void *a, const void *b) {
    return strcmp((*(const st_entry *const *)a)->name, (*(const st_entry *const *)b)->name);
}

/* The JSON header for entries in data order; NULL when out of memory. */
static char *build_header(const mx_st_writer *w, const st_entry *const *order) {
    json_t *root = json_object();
    bool ok = root != NULL;
    uint64_t off = 0;
    for (int i = 0; ok && i < w->n; i++) {
        const st_entry *e = order[i];
        json_t *shape = json_array();
        ok = shape != NULL;
        for (int d = 0; ok && d < e->ndim; d++) ok = json_array_append_new(shape, json_integer(e->shape[d])) == 0;
        if (!ok) {
            json_decref(shape);
            break;
        }
        json_t *t = json_pack("{s:s, s:o, s:[I, I]}", "dtype", dtype_table[e->dtype].name, "shape", shape,
                              "data_offsets", (json_int_t)off, (json_int_t)(off + e->nbytes));
        ok = ok && t && json_object_set_new(root, e->name, t) == 0;
        off += e->nbytes;
    }
    if (ok && w->n_meta > 0) {
        json_t *meta = json_object();
        ok = meta != NULL;
        for (int i = 0; ok && i < w->n_meta; i++)
            ok = json_object_set_new(meta, w->meta_keys[i], json_string(w->meta_values[i])) == 0;
        ok = ok && json_object_set_new(root, "__metadata__", meta) == 0;
    }
    char *text = ok ? json_dumps(root, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(root);
    return text;
}

/* Where everything goes in the file: the entries in data order, the header and its padded
 * length n (the data section starts at 8 + n). */
typedef struct {
    const st_entry **order;
    char *header;
    size_t len;
    uint64_t n;
} st_layout;

static void layout_free(st_layout *l) {
    free(l->order);
    free(l->header);
}

static int layout_of(const mx_st_writer *w, const char *path, st_layout *l, mx_diag *diag) {
    memset(l, 0, sizeof *l);
    l->order = malloc((size_t)(w->n ? w->n : 1) * sizeof *l->order);
    if (!l->order)
        return mxi_diag(diag, MX_ENOMEM, "%s: out of memory (%zu bytes to order %d tensors)", path,
                        (size_t)(w->n ? w->n : 1) * sizeof *l->order, w->n);
    for (int i = 0; i < w->n; i++) l->order[i] = &w->items[i];
    qsort(l->order, (size_t)w->n, sizeof *l->order, cmp_entry_ptr);
    l->header = build_header(w, l->order);
    if (!l->header) {
        layout_free(l);
        return mxi_diag(diag, MX_ENOMEM, "%s: out of memory building the JSON header of %d tensors (jansson)", path,
                        w->n);
    }
    /* Pad with spaces (valid JSON whitespace) so the data section starts 8-byte aligned. */
    l->len = strlen(l->header);
    l->n = (uint64_t)l->len + (8 - (8 + l->len) % 8) % 8;
    if (l->n > MX_ST_MAX_HEADER) {
        layout_free(l);
        return mxi_diag(diag, MX_ESIZE, "%s: the header would be %llu bytes (allowed: at most %llu, what readers accept)",
                        path, (unsigned long long)l->n, MX_ST_MAX_HEADER);
    }
    return 0;
}

int mx_st_writer_data_offsets(const mx_st_writer *w, uint64_t *offsets, mx_diag *diag) {
    if (!w || !offsets) return mxi_diag(diag, MX_ENULL, "mx_st_writer_data_offsets: NULL argument");
    st_layout l;
    int rc = layout_of(w, "safetensors writer", &l, diag);
    if (rc) return rc;
    uint64_t off = 8 + l.n;
    for (int i = 0; i < w->n; i++) {
        offsets[l.order[i] - w->items] = off;
        off += l.order[i]->nbytes;
    }
    layout_free(&l);
    return 0;
}

int mx_st_write(const mx_st_writer *w, const char *path, mx_diag *diag) {
    if (!w || !path) return mxi_diag(diag, MX_ENULL, "mx_st_write: writer or path is NULL");
    st_layout l;
    int rc = layout_of(w, path, &l, diag);
    if (rc) return rc;
    uint16_t *conv = malloc(1 << 16);
    if (!conv) {
        layout_free(&l);
        return mxi_diag(diag, MX_ENOMEM, "%s: out of memory (%d bytes to convert tensors)", path, 1 << 16);
    }
    static const char spaces[8] = "        ";
    mxi_atomic a;
    rc = mxi_atomic_begin(&a, path, diag);
    if (rc == 0) rc = mxi_atomic_write(&a, &l.n, 8, diag);
    if (rc == 0) rc = mxi_atomic_write(&a, l.header, l.len, diag);
    if (rc == 0) rc = mxi_atomic_write(&a, spaces, (size_t)(l.n - l.len), diag);
    for (int i = 0; rc == 0 && i < w->n; i++) {
        const st_entry *e = l.order[i];
        if (e->reserved) {
            rc = mxi_atomic_skip(&a, e->nbytes, diag);
        } else if (e->from_f32 && e->dtype == MX_ST_BF16) {
            const float *x = e->data; // (numel)
            enum { PER = (1 << 16) / 2 };
            for (int64_t i0 = 0; rc == 0 && i0 < e->numel; i0 += PER) {
                int64_t m = e->numel - i0 < PER ? e->numel - i0 : PER;
                for (int64_t j = 0; j < m; j++) conv[j] = mx_st_f32_to_bf16(x[i0 + j]);
                rc = mxi_atomic_write(&a, conv, (size_t)m * 2, diag);
            }
        } else if (e->nbytes > 0) {
            rc = mxi_atomic_write(&a, e->data, (size_t)e->nbytes, diag);
        }
    }
    if (rc == 0) rc = mxi_atomic_commit(&a, diag);
    else mxi_atomic_abort(&a); /* safe after a failed begin too */
    layout_free(&l);
    free(conv);
    return rc;
}
