# The ~20M-parameter Llama that bench_train.sh and bench_fsdp.sh train (sourced by both, and
# by moe33m.sh for bench_run_yaml):
# its sizes, and the model:, data: and training: sections of its config (the run's own
# training keys follow, indented by two spaces).
V=257 C=512 L=6 NH=8 NKV=8 F=1536 T=256 B=8

llama20m_yaml() {   # llama20m_yaml DATA_GLOB STEPS
    cat <<YAML
model:
  model_type: llama
  vocab_size: $V
  hidden_size: $C
  intermediate_size: $F
  num_hidden_layers: $L
  num_attention_heads: $NH
  num_key_value_heads: $NKV
  max_position_embeddings: $T
  tie_word_embeddings: false
YAML
    bench_run_yaml "$1" "$2"
}

bench_run_yaml() {   # bench_run_yaml DATA_GLOB STEPS: the data: and training: sections of both models
    cat <<YAML
data:
  data_path: $1
  seq_length: $T
training:
  micro_batch_size: $B
  seed: 1234
  lr: 3.0e-4
  lr_decay_style: constant
  weight_decay: 0.1
  train_iters: $2
  clip_grad: 1.0
YAML
}
