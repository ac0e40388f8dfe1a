/* Internal: the transformer's non-GEMM layers, forward and backward, in fp32 with Hugging
 * Face semantics (Llama / Qwen3 / Qwen3-MoE). Shape letters: see include/mxtrain/model.h;
 * N = B*T is the number of token rows. Backward functions accumulate (+=) into weight
 * gradients and overwrite input gradients unless stated otherwise.
 */
#ifndef MXI_LAYERS_H
#define MXI_LAYERS_H

#include <stdbool.h>
#include <stdint.h>

/* out[n] = wte[tokens[n]]. */
void mxi_embedding_forward(float *out /* (N, C) */, const int32_t *tokens /* (N) */,
                       const float *wte /* (V, C) */, int N, int C);
/* The same from a table of bf16 bits, widened. */
void mxi_embedding_forward_bf16(float *out /* (N, C) */, const int32_t *tokens /* (N) */,
                                const uint16_t *wte /* (V, C) */, int N, int C);
/* dwte[tokens[n]] += dout[n]. */
void mxi_embedding_backward(float *dwte /* (V, C) */, const float *dout /* (N, C) */,
                        const int32_t *tokens /* (N) */, int N, int C);

/* out = inp / sqrt(mean(inp^2) + eps) * weight, per row; rstd keeps 1/sqrt(...) for backward. */
void mxi_rmsnorm_forward(float *out /* (N, C) */, float *rstd /* (N) */, const float *inp /* (N, C) */,
                     const float *weight /* (C) */, int N, int C, float eps);
void mxi_rmsnorm_backward(float *dinp /* (N, C) */, float *dweight /* (C), += */, const float *dout /* (N, C) */,
                      const float *inp /* (N, C) */, const float *weight /* (C) */, const float *rstd /* (N) */,
                      int N, int C);

/* Rotary tables for positions 0..T-1 (HF: inv_freq_i = theta^(-2i/HD), emb = cat(freqs, freqs)). */
void mxi_rope_tables(float *cos_t /* (T, HD/2) */, float *sin_t /* (T, HD/2) */, int T, int HD, float theta);
/* In place on x viewed as (B, T, H, HD): x = x*cos + rotate_half(x)*sin (HF's convention), at
 * position pos[b][t] (Megatron's reset_position_ids: positions restart in each document), or
 * t where pos is NULL. */
void mxi_rope_forward(float *x /* (B, T, H, HD) */, const float *cos_t, const float *sin_t,
                      const int32_t *pos /* (B, T) or NULL */, int B, int T, int H, int HD);
/* In place: the transpose of rope_forward applied to the gradient. */
void mxi_rope_backward(float *dx /* (B, T, H, HD) */, const float *cos_t, const float *sin_t, const int32_t *pos,
                       int B, int T, int H, int HD);

/* out = silu(gate) * up, over rows x F; gate and up (and dgate, dup) rows are ld floats
 * apart, so they may be the two halves of one (rows, 2F) gate|up buffer (ld = 2F). */
void mxi_swiglu_forward(float *out /* (rows, F) */, const float *gate /* (rows, ld) */, const float *up /* (rows, ld) */,
                    int64_t rows, int F, int ld);
void mxi_swiglu_backward(float *dgate /* (rows, ld) */, float *dup /* (rows, ld) */, const float *dout /* (rows, F) */,
                     const float *gate, const float *up, int64_t rows, int F, int ld);

/* y += x. */
void mxi_add_inplace(float *y, const float *x, int64_t n);

/* Mean cross-entropy over N rows of logits; writes dlogits = (softmax - onehot(target)) * dscale
 * when dlogits is not NULL (dscale = 1/N for the mean loss). Returns the mean loss. */
double mxi_cross_entropy_forward_backward(float *dlogits /* (N, V) or NULL */, const float *logits /* (N, V) */,
                                      const int32_t *targets /* (N) */, int N, int V, float dscale);

/* MoE router (Qwen3-MoE): probs = softmax(logits) in fp32; each row's K most probable experts
 * (descending, like torch.topk) and their probabilities as routing weights, renormalised to
 * sum 1 when norm is set. */
void mxi_moe_route_forward(int32_t *expert_idx /* (N, K) */, float *route_w /* (N, K) */, float *probs /* (N, E) */,
                       const float *logits /* (N, E) */, int N, int E, int K, bool norm);
/* dlogits (overwritten) from the routing weights' gradient, plus aux_dprob[e] added to every
 * row's dprobs[e] (the load-balancing loss's gradient; NULL for none). */
void mxi_moe_route_backward(float *dlogits /* (N, E) */, const float *droute_w /* (N, K) */, const float *probs /* (N, E) */,
                        const int32_t *expert_idx /* (N, K) */, const float *aux_dprob /* (E) or NULL */,
                        int N, int E, int K, bool norm);

/* Hugging Face's load_balancing_loss_func over all MoE layers' router outputs together:
 * with Ntot routed rows, count[e] rows choosing e (any slot) and prob_sum[e] the sum of their
 * probabilities, loss = E * sum_e (count[e] / Ntot) * (prob_sum[e] / Ntot). The statistics
 * accumulate per layer with moe_aux_accumulate. */
void mxi_moe_aux_accumulate(double *count /* (E), += */, double *prob_sum /* (E), += */, const int32_t *expert_idx /* (N, K) */,
                        const float *probs /* (N, E) */, int N, int E, int K);
double mxi_moe_aux_loss(const double *count /* (E) */, const double *prob_sum /* (E) */, int E, double ntot);
/* d(coef * loss)/d probs[n][e], the same for every row n: coef * E * count[e] / Ntot^2. */
void mxi_moe_aux_dprob(float *aux_dprob /* (E) */, const double *count /* (E) */, int E, double ntot, double coef);

/* The router z-loss (ST-MoE; Megatron-LM's moe_z_loss_coeff): z[n] = logsumexp(logits[n]),
 * the loss coef * mean_n z^2 per layer. moe_z_forward returns sum_n z[n]^2; moe_z_backward
 * adds its gradient, scale * 2 z[n] softmax(logits[n]), to dlogits (probs: the softmax). */
double mxi_moe_z_forward(float *z /* (N) */, const float *logits /* (N, E) */, int N, int E);
void mxi_moe_z_backward(float *dlogits /* (N, E), += */, const float *probs /* (N, E) */, const float *z /* (N) */, int N,
                    int E, float scale);

#endif
