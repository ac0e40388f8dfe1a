# The ~33M-parameter Qwen3-MoE that bench_train.sh and bench_contention.sh train with
# `--model moe` (sourced by both): Qwen3-MoE's shape at hidden 512 (every layer an MoE
# block; 16 experts, top-2, renormalised weights, expert intermediate 0.375 x hidden as in
# Qwen3-30B-A3B; grouped-query attention with q/k norms; the load-balancing loss on), the
# sequence, micro-batch and byte vocabulary of the dense llama20m.sh. Its sizes, and the
# model:, data: and training: sections of its config (the run's own training keys follow,
# indented by two spaces).
. "$(dirname "${BASH_SOURCE[0]}")/llama20m.sh"   # bench_run_yaml
V=257 C=512 L=6 NH=8 NKV=4 HD=64 F=1536 E=16 K=2 FE=192 T=256 B=8 THETA=1000000.0 AUX=0.001

moe33m_yaml() {   # moe33m_yaml DATA_GLOB STEPS
    cat <<YAML
model:
  model_type: qwen3_moe
  vocab_size: $V
  hidden_size: $C
  intermediate_size: $F   # dense MLP layers: none here (every layer is MoE)
  num_hidden_layers: $L
  num_attention_heads: $NH
  num_key_value_heads: $NKV
  head_dim: $HD
  max_position_embeddings: $T
  rope_theta: $THETA
  tie_word_embeddings: false
  num_experts: $E
  num_experts_per_tok: $K
  moe_intermediate_size: $FE
  norm_topk_prob: true
  output_router_logits: true
  router_aux_loss_coef: $AUX
YAML
    bench_run_yaml "$1" "$2"
}
