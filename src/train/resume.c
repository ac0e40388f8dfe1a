/* What a resumed run is held to (see resume.h): the model must be the checkpoint's, the data
 * the same files, and the rows in the same order; the rest may change, with a note. */
#include "train/resume.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/diag.h"
#include "core/file.h"
#include "io/io_internal.h"

/* The model keys that make the weights mean what they mean: any difference is refused. */
static const char *const ARCHITECTURE[] = {
    "model.model_type", "model.vocab_size", "model.hidden_size", "model.intermediate_size",
    "model.num_hidden_layers", "model.num_attention_heads", "model.num_key_value_heads", "model.head_dim",
    "model.rms_norm_eps", "model.rope_theta", "model.tie_word_embeddings", "model.attention_bias",
    "model.num_experts", "model.num_experts_per_tok", "model.moe_intermediate_size", "model.norm_topk_prob",
    "model.decoder_sparse_step", "model.mlp_only_layers",
};
/* Model keys a run may change (the longest sequence allowed, the load-balancing loss). */
static const char *const MODEL_MAY_CHANGE[] = {
    "model.max_position_embeddings", "model.output_router_logits", "model.router_aux_loss_coef",
};
/* Settings a run may change: each change is a note. */
static const char *const SETTINGS[] = {
    "training.micro_batch_size", "training.gradient_accumulation_steps", "training.global_batch_size",
    "data.seq_length", "training.lr", "training.min_lr", "training.lr_decay_style", "training.lr_warmup_ratio",
    "training.lr_warmup_iters", "training.lr_decay_iters", "training.lr_wsd_decay_style",
    "training.lr_wsd_decay_iters", "training.weight_decay", "training.moe_z_loss_coeff", "training.adam_beta1",
    "training.adam_beta2", "training.adam_eps", "training.exp_avg_dtype", "training.exp_avg_sq_dtype",
    "training.main_grads_dtype", "data.reset_attention_mask", "data.reset_position_ids", "data.eod_mask_loss",
    "data.eod_token_id",
    "training.clip_grad", "parallel.fsdp_plan.param_dtype",
    "parallel.fsdp_plan.reduce_dtype", "parallel.ep_plan.dispatch_dtype",
};
#define COUNT(a) (int)(sizeof(a) / sizeof(a)[0])

void mxi_resume_note(mxi_resume_notes *notes, const char *fmt, ...) {
    if (notes->n == MXI_RESUME_MAX_NOTES) {
        notes->more++;
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(notes->lines[notes->n++], sizeof notes->lines[0], fmt, ap);
    va_end(ap);
}

/* Differences gathered into one line: "A; B; C". */
typedef struct {
    char text[1400];
    size_t used;
    int n;
} diffs;

static void differ(diffs *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void differ(diffs *d, const char *fmt, ...) {
    if (d->used + 8 >= sizeof d->text) return;
    if (d->n++) d->used += (size_t)snprintf(d->text + d->used, sizeof d->text - d->used, "; ");
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(d->text + d->used, sizeof d->text - d->used, fmt, ap);
    va_end(ap);
    d->used = w < 0 ? d->used : d->used + (size_t)w < sizeof d->text ? d->used + (size_t)w : sizeof d->text - 1;
}

static void recipe_text(const mx_config *c, char *buf, size_t size) {
    if (c->training.quantization_plan.enabled) mx_recipe_format(&c->training.quantization_plan.recipe, buf, size);
    else snprintf(buf, size, "off");
}

int mxi_resume_record(const mx_config *c, const mx_loader *loader, char **out, mx_diag *diag) {
    *out = NULL;
    json_t *run = json_pack("{s:[], s:b, s:{}}", "data_files", "shuffle", c->data.shuffle, "settings");
    json_t *files = json_object_get(run, "data_files"), *settings = json_object_get(run, "settings");
    bool ok = run != NULL;
    for (int s = 0; ok && s < mx_loader_shard_count(loader); s++) {
        const char *path = mx_loader_shard_path(loader, s);
        struct stat st;
        json_int_t bytes = stat(path, &st) == 0 ? (json_int_t)st.st_size : -1;
        ok = !json_array_append_new(files, json_pack("{s:s, s:I}", "path", path, "bytes", bytes));
    }
    char value[256];
    for (int k = 0; ok && k < COUNT(SETTINGS); k++)
        if (mx_config_format_value(c, SETTINGS[k], value, sizeof value) >= 0)
            ok = !json_object_set_new(settings, SETTINGS[k], json_string(value));
    recipe_text(c, value, sizeof value);
    if (ok) ok = !json_object_set_new(settings, "training.quantization_plan", json_string(value));
    if (ok) *out = json_dumps(run, JSON_COMPACT);
    json_decref(run);
    return *out ? MX_OK
                : mxi_diag(diag, MX_ENOMEM, "out of memory building the run's record for its checkpoints (jansson; %d "
                           "data files)", mx_loader_shard_count(loader));
}

int mxi_resume_check_model(const mx_config *c, const char *dir, mxi_resume_notes *notes, mx_diag *diag) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s/config.json", dir) >= (int)sizeof path)
        return mxi_diag(diag, MX_EINVAL, "path too long: %s", dir);
    mx_diag sub = {{0}};
    mx_config ck = *c;   // the run's config with the checkpoint's model, for formatting its values
    int rc = mx_hf_config_load(path, &ck.model, &sub);
    if (rc) return mxi_diag(diag, rc, "training.load: the checkpoint's model: %s", sub.msg);
    diffs d = {.n = 0};
    char mine[512], theirs[512];
    for (int k = 0; k < COUNT(ARCHITECTURE); k++) {
        if (mx_config_format_value(c, ARCHITECTURE[k], mine, sizeof mine) < 0 ||
            mx_config_format_value(&ck, ARCHITECTURE[k], theirs, sizeof theirs) < 0 || !strcmp(mine, theirs))
            continue;
        differ(&d, "%s %s (checkpoint: %s)", ARCHITECTURE[k], mine, theirs);
    }
    if (d.n)
        return mxi_diag(diag, MX_ECONFIG, "training.load: the model is not the checkpoint's (%s): %s (allowed: the "
                        "checkpoint's values; its weights mean nothing in another architecture)", path, d.text);
    for (int k = 0; k < COUNT(MODEL_MAY_CHANGE); k++)
        if (mx_config_format_value(c, MODEL_MAY_CHANGE[k], mine, sizeof mine) >= 0 &&
            mx_config_format_value(&ck, MODEL_MAY_CHANGE[k], theirs, sizeof theirs) >= 0 && strcmp(mine, theirs))
            mxi_resume_note(notes, "resuming with %s %s (checkpoint: %s)", MODEL_MAY_CHANGE[k], mine, theirs);
    return MX_OK;
}

/* The data files of the run against those recorded (files: [{path, bytes}]). */
static void compare_data(const mx_loader *loader, const json_t *files, diffs *d) {
    int n = mx_loader_shard_count(loader), saved = (int)json_array_size(files);
    if (!json_is_array(files)) {
        differ(d, "trainer_state.json's run.data_files is not a list");
        return;
    }
    for (int s = 0; s < n || s < saved; s++) {
        const json_t *f = json_array_get(files, (size_t)s);
        const char *was = json_string_value(json_object_get(f, "path"));
        json_int_t was_bytes = json_integer_value(json_object_get(f, "bytes"));
        if (s >= n) {
            differ(d, "data file %d '%s' is not among this run's", s + 1, was ? was : "?");
            continue;
        }
        const char *path = mx_loader_shard_path(loader, s);
        struct stat st;
        long long bytes = stat(path, &st) == 0 ? (long long)st.st_size : -1;
        if (s >= saved) differ(d, "data file %d '%s' was not the checkpoint's", s + 1, path);
        else if (!was || strcmp(was, path)) differ(d, "data file %d is '%s' (checkpoint: '%s')", s + 1, path, was ? was : "?");
        else if (bytes != (long long)was_bytes)
            differ(d, "'%s' is %lld bytes (checkpoint: %lld)", path, bytes, (long long)was_bytes);
    }
}

/* dir's trainer_state.json (path) and its "run" object (NULL in an older checkpoint). */
static int read_run(const char *dir, char *path, size_t size, json_t **j, const json_t **run, mx_diag *diag) {
    *j = NULL, *run = NULL;
    if (snprintf(path, size, "%s/trainer_state.json", dir) >= (int)size)
        return mxi_diag(diag, MX_EINVAL, "path too long: %s", dir);
    // mxi_checkpoint_read_state parsed it before; a failure now (memory, the file replaced
    // since) is an error, never taken for an older checkpoint's missing "run"
    int rc = mxi_read_json(path, "a checkpoint's trainer_state.json", MXI_MAX_STATE_BYTES, j, diag);
    if (rc) return rc;
    *run = json_object_get(*j, "run");
    return MX_OK;
}

static int refuse_data(const char *path, const char *dir, const diffs *d, mx_diag *diag) {
    return mxi_diag(diag, MX_ECONFIG, "training.load: the data is not the checkpoint's (%s): %s (allowed: the files, "
                    "data.shuffle and seed the checkpoint was saved with; to train on other data from these weights, "
                    "start a new run with model.model_name_or_path: %s)", path, d->text, dir);
}

int mxi_resume_check_order(const mx_config *c, const char *dir, const mxi_train_state *st, mx_diag *diag) {
    char path[4096];
    json_t *j;
    const json_t *run;
    int rc = read_run(dir, path, sizeof path, &j, &run, diag);
    if (rc || !run) {
        json_decref(j);
        return rc;
    }
    diffs d = {.n = 0};
    const json_t *sh = json_object_get(run, "shuffle");
    bool shuffled = json_is_true(sh);
    if (json_is_boolean(sh) && shuffled != c->data.shuffle)
        differ(&d, "data.shuffle %s (checkpoint: %s): the rows would come in another order", c->data.shuffle ? "true"
               : "false", shuffled ? "true" : "false");
    else if (c->data.shuffle && st->seed != c->training.seed)
        differ(&d, "training.seed %llu (checkpoint: %llu) with data.shuffle: the rows would come in another order",
               (unsigned long long)c->training.seed, (unsigned long long)st->seed);
    json_decref(j);
    return d.n ? refuse_data(path, dir, &d, diag) : MX_OK;
}

int mxi_resume_check_run(const mx_config *c, const char *dir, const mxi_train_state *st, const mx_loader *loader,
                         int world, mxi_resume_notes *notes, mx_diag *diag) {
    char path[4096];
    json_t *j;
    const json_t *run;
    int rc = read_run(dir, path, sizeof path, &j, &run, diag);
    if (rc) return rc;
    if (!run) {
        mxi_resume_note(notes, "%s records no data files or settings (an older mxtrain's checkpoint): they are not "
                        "compared", path);
        json_decref(j);
        return MX_OK;
    }
    diffs d = {.n = 0};
    compare_data(loader, json_object_get(run, "data_files"), &d);
    if (d.n) {
        json_decref(j);
        return refuse_data(path, dir, &d, diag);
    }
    if (st->seed != c->training.seed)   // with shuffle, refused by mxi_resume_check_order
        mxi_resume_note(notes, "resuming with training.seed %llu (checkpoint: %llu): no effect (the weights come from "
                        "the checkpoint and data.shuffle is off)", (unsigned long long)c->training.seed,
                        (unsigned long long)st->seed);
    const json_t *settings = json_object_get(run, "settings");
    char mine[256];
    for (int k = 0; k < COUNT(SETTINGS); k++) {
        const char *was = json_string_value(json_object_get(settings, SETTINGS[k]));
        if (was && mx_config_format_value(c, SETTINGS[k], mine, sizeof mine) >= 0 && strcmp(was, mine))
            mxi_resume_note(notes, "resuming with %s %s (checkpoint: %s)", SETTINGS[k], mine, was);
    }
    const char *was = json_string_value(json_object_get(settings, "training.quantization_plan"));
    recipe_text(c, mine, sizeof mine);
    if (was && strcmp(was, mine))
        mxi_resume_note(notes, "resuming with training.quantization_plan %s (checkpoint: %s)", mine, was);
    if (st->world != world)
        mxi_resume_note(notes, "resuming on %d rank%s (checkpoint: %d)", world, world == 1 ? "" : "s", st->world);
    json_decref(j);
    return MX_OK;
}
