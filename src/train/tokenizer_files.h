/* The tokenizer files of a model directory: copied into every checkpoint and export, with
 * the tokenizer's BOS and EOS ids in config.json, so that the directory is a whole Hugging
 * Face model (docs/files.md). */
#ifndef MXI_TOKENIZER_FILES_H
#define MXI_TOKENIZER_FILES_H

#include "mxtrain/config.h"

/* Where a run's tokenizer files come from: data.tokenizer, else model.model_name_or_path
 * when it holds a tokenizer.json, else NULL (*key names it for messages). */
const char *mxi_tokenizer_source(const mx_config *cfg, const char **key);

/* At the start of a run: MX_ECONFIG when data.tokenizer is given and no tokenizer.json is
 * there (naming the key and the path). */
int mxi_tokenizer_source_check(const mx_config *cfg, mx_diag *diag);

/* Copy tokenizer.json, and tokenizer_config.json and special_tokens_map.json when present,
 * from src (a tokenizer.json, or a directory holding one) into dir, and set bos_token_id /
 * eos_token_id of dir/config.json from the tokenizer (tokenizer_config.json's bos_token,
 * eos_token; a key without one is left out). Errors name key (e.g. "data.tokenizer"). */
int mxi_tokenizer_files_copy(const char *dir, const char *src, const char *key, mx_diag *diag);

#endif
