/* Model weights in and out as safetensors with Hugging Face names (SPEC §8). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/diag.h"
#include "mxtrain/model.h"
#include "mxtrain/safetensors.h"

/* Tensors a Hugging Face checkpoint may hold that carry no parameter here. */
static bool ignorable(const char *name, const mx_model *m) {
    if (strstr(name, "rotary_emb.inv_freq")) return true;
    if (strcmp(name, "lm_head.weight") == 0) {
        for (int i = 0; i < mx_model_num_hf_tensors(m); i++)
            if (strcmp(mx_model_hf_tensor(m, i).name, "lm_head.weight") == 0) return false;
        return true;   // tied: lm_head is the embedding
    }
    return false;
}

static int model_tensor_index(const mx_model *m, const char *name) {
    for (int i = 0; i < mx_model_num_hf_tensors(m); i++)
        if (strcmp(mx_model_hf_tensor(m, i).name, name) == 0) return i;
    return -1;
}

/* Read the model's tensors that file holds into the model, marking them in loaded[];
 * a tensor the model does not know is an error. */
static int load_file(mx_model *m, const char *path, bool *loaded, mx_diag *diag) {
    mx_st_file *f = NULL;
    int rc = mx_st_open(path, &f, diag);
    if (rc) return rc;
    for (int i = 0; i < mx_st_count(f) && !rc; i++) {
        const mx_st_tensor *t = mx_st_get(f, i);
        int idx = model_tensor_index(m, t->name);
        if (idx < 0) {
            if (!ignorable(t->name, m))
                rc = mxi_diag(diag, MX_EFORMAT, "%s: tensor '%s' is not a parameter of this model (check model_type, "
                              "num_hidden_layers, num_experts and tie_word_embeddings)", path, t->name);
            continue;
        }
        mx_tensor_view v = mx_model_hf_tensor(m, idx);
        rc = mx_st_read_f32(f, t->name, v.shape, v.ndim, v.data, diag);
        if (!rc) loaded[idx] = true;
    }
    mx_st_close(f);
    return rc;
}

/* The files of a sharded checkpoint: the distinct values of index.json's weight_map. */
static int load_index(mx_model *m, const char *dir, const char *index_path, bool *loaded, mx_diag *diag) {
    json_error_t jerr;
    json_t *root = json_load_file(index_path, 0, &jerr);
    if (!root) return mxi_diag(diag, MX_EFORMAT, "%s:%d: %s", index_path, jerr.line, jerr.text);
    json_t *map = json_object_get(root, "weight_map");
    int rc = MX_OK;
    if (!json_is_object(map)) {
        rc = mxi_diag(diag, MX_EFORMAT, "%s: no \"weight_map\" object (allowed: a Hugging Face "
                      "model.safetensors.index.json)", index_path);
    } else {
        // visit each shard once, in order of first mention
        const char *key;
        json_t *val;
        json_t *seen = json_object();
        json_object_foreach(map, key, val) {
            if (rc) break;
            const char *file = json_string_value(val);
            if (!file || strchr(file, '/')) {
                rc = mxi_diag(diag, MX_EFORMAT, "%s: weight_map['%s'] is not a file name in the same directory",
                              index_path, key);
                break;
            }
            if (json_object_get(seen, file)) continue;
            json_object_set_new(seen, file, json_true());
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", dir, file);
            rc = load_file(m, path, loaded, diag);
        }
        json_decref(seen);
    }
    json_decref(root);
    return rc;
}

int mx_model_load(mx_model *m, const char *path, mx_diag *diag) {
    if (!m || !path) return mxi_diag(diag, MX_ENULL, "mx_model_load: NULL argument");
    int n = mx_model_num_hf_tensors(m);
    bool *loaded = calloc((size_t)n, sizeof *loaded);
    if (!loaded) return mxi_diag(diag, MX_ENOMEM, "out of memory");
    struct stat st;
    int rc;
    char file[4096], where[4096];
    snprintf(where, sizeof where, "%s", path);
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        snprintf(file, sizeof file, "%s/model.safetensors", path);
        char index[4096];
        snprintf(index, sizeof index, "%s/model.safetensors.index.json", path);
        if (stat(file, &st) == 0) {
            rc = load_file(m, file, loaded, diag);
            snprintf(where, sizeof where, "%s", file);
        } else if (stat(index, &st) == 0) {
            rc = load_index(m, path, index, loaded, diag);
            snprintf(where, sizeof where, "%s", index);
        } else {
            rc = mxi_diag(diag, MX_EIO, "%s: no model.safetensors or model.safetensors.index.json in this directory", path);
        }
    } else {
        rc = load_file(m, path, loaded, diag);
    }
    for (int i = 0; i < n && !rc; i++)
        if (!loaded[i])
            rc = mxi_diag(diag, MX_EFORMAT, "%s: tensor '%s' is missing (the model needs every parameter)", where,
                          mx_model_hf_tensor(m, i).name);
    free(loaded);
    return rc;
}

int mx_model_save(const mx_model *m, const char *path, bool grads, const char *const *extra_names,
                  const float *extra_values, int n_extra, mx_diag *diag) {
    if (!m || !path) return mxi_diag(diag, MX_ENULL, "mx_model_save: NULL argument");
    mx_st_writer *w = NULL;
    int rc = mx_st_writer_new(&w);
    if (rc) return mxi_diag(diag, rc, "out of memory");
    for (int i = 0; i < n_extra && !rc; i++)
        rc = mx_st_writer_add_f32(w, extra_names[i], MX_ST_F32, NULL, 0, &extra_values[i], diag);
    for (int i = 0; i < mx_model_num_hf_tensors(m) && !rc; i++) {
        mx_tensor_view v = mx_model_hf_tensor(m, i);
        char name[160];
        snprintf(name, sizeof name, "%s%s", grads ? "grad." : "", v.name);
        rc = mx_st_writer_add_f32(w, name, MX_ST_F32, v.shape, v.ndim, grads ? v.grad : v.data, diag);
    }
    if (!rc) rc = mx_st_write(w, path, diag);
    mx_st_writer_free(w);
    return rc;
}
