#!/bin/bash
# FSDP over MPI end to end (SPEC §6), under mpirun as CI runs it (mpi_run: as root,
# --oversubscribe; with MPICH's mpiexec in its build):
#  - the gathered MX planes equal the unsharded quantization and the gather bytes are exact
#    (build/tests/mpi_fsdp, on 1 and 3 ranks);
#  - the same global batch on N = 1, 2, 3, 4 ranks gives the same losses over 10 steps
#    (fp32 compute, no quantization; llama and qwen3_moe with sizes that divide by nothing;
#    with tied embeddings on 1 and 3 ranks, the root unit then holding the embedding),
#    and with MXFP8 on N = 1 and N = 3 agree too, all at 1 row per rank and micro-batch;
#    dense fp32 agrees at any split, dense MXFP8 at the same rows per rank, and MXFP8 or the
#    MoE aux loss at other rows per rank differ, as docs/distributed.md says;
#  - recompute gives bit-identical losses and final weights to no recompute (MXFP8, dense
#    and MoE blocks, 1 and 2 ranks), on-demand gathering the rowwise plane in forward and both in a
#    recomputed block's backward: the bytes `mxtrain plan` predicts, fewer than `all`'s;
#    neither reshard_after_forward: false nor other prefetch depths change the losses;
#  - 4 accumulation steps of 1 row equal 1 step of 4 rows; training.global_batch_size sets
#    the accumulation from the ranks (the same runs, bit for bit) or is an error;
#  - kill -9 of one rank mid-step ends the job within 30 s; a restart with training.load
#    resumes from the last checkpoint bit-identically; a different N loads it too; a save
#    killed half-way (a leftover temporary directory) does not disturb loading; checkpoint
#    files written by every rank (save_parallel) equal those rank 0 writes alone, which it
#    does, saying so, when the ranks do not share the save directory;
#  - bad parallel settings fail at start with one line.
# tests/run: launches MPI ranks
. "$(dirname "$0")/common.bash"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
# Under mpirun, Open MPI's plugins keep allocations until exit and are unloaded before the
# leak check, which cannot then tell them from ours: leaks are checked by the tests that run
# the same code on one process without MPI; addresses and undefined behaviour are checked here.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
# Containers often forbid the cross-process memory reads Open MPI's shared-memory transport
# uses for large messages; plain copies work everywhere.
export OMPI_MCA_btl_vader_single_copy_mechanism=none

for n in 1 3; do
    out=$(mpi_run -np $n "$build/tests/mpi_fsdp" 2>&1) || { echo "$out"; fail "mpi_fsdp on $n ranks failed"; }
    [ "$(grep -c '^# tally [0-9]* 0$' <<<"$out")" -eq $n ] || { echo "$out"; fail "mpi_fsdp on $n ranks: not every rank passed"; }
done

prep=$("$bin" prepare --out "$tmp/data" 2>&1) || fail "prepare failed: $prep"

# write_config FILE TYPE ACCUM MICRO STEPS EXTRA_TRAINING EXTRA_PARALLEL
LR_WARMUP=0.1 LR_DECAY=linear
write_config() {
    cat > "$1" <<YAML
$(uneven_model "$2" 3)
data:
  data_path: $tmp/data/train_*.bin
  seq_length: 37
parallel:
  fsdp_plan:
    param_dtype: fp32
$7
training:
  micro_batch_size: $4
  gradient_accumulation_steps: $3
  seed: 11
  lr: 3.0e-3
  lr_warmup_ratio: $LR_WARMUP
  lr_decay_style: $LR_DECAY
  weight_decay: 0.1
  train_iters: $5
  clip_grad: 1.0
  log_interval: 100
  metrics_path: $1.jsonl
$6
YAML
}
# fp64 reductions: the sums do not depend on how rows are split over ranks, so the master
# weights, and with them every FP8 code, stay the same on any number of ranks
fp64="    reduce_dtype: fp64"
mxfp8_plan="  quantization_plan:
    recipe_name: mxfp8
    apply_modules: ['model.layers.{*}']
    ignored_modules: ['*gate']"
save_to() { printf '%s\n  save: %s' "$mxfp8_plan" "$1"; }   # the MXFP8 plan, and the final weights to DIR

run() {   # run N CONFIG: train on N ranks, quietly
    local log="$2.log"
    mpi_run -np "$1" "$bin" train "$2" >"$log" 2>&1 || { tail -5 "$log"; fail "training $2 on $1 ranks failed"; }
}

# N = 1, 2, 3, 4 on one global batch of 12 rows
for type in llama qwen3_moe; do
    for n in 1 2 3 4; do
        write_config "$tmp/$type-$n.yaml" $type $((12 / n)) 1 10 "" ""
        run $n "$tmp/$type-$n.yaml"
        [ $n = 1 ] || compare_runs "$tmp/$type-1.yaml.jsonl" "$tmp/$type-$n.yaml.jsonl" 1e-5 ||
            fail "$type: N=$n losses differ from N=1"
    done
done
# tie_word_embeddings: lm_head shares the embedding, so the root unit holds it (no unit of its
# own): the same losses on 3 ranks, and the root (embedding, final norm) gathered once a
# micro-batch, each block twice (4 x 12 rows of 3 ranks' pieces, from the checkpoint's shapes)
for n in 1 3; do
    write_config "$tmp/tied-$n.yaml" llama $((12 / n)) 1 3 "  save: $tmp/ck-tied-$n" ""
    sed -i 's/^  max_position_embeddings: 64$/&\n  tie_word_embeddings: true/' "$tmp/tied-$n.yaml"
    run $n "$tmp/tied-$n.yaml"
done
compare_runs "$tmp/tied-1.yaml.jsonl" "$tmp/tied-3.yaml.jsonl" 1e-5 || fail "tied embeddings: N=3 losses differ from N=1"
$py - "$tmp/ck-tied-3/iter_0000003/optimizer.safetensors" "$tmp/tied-3.yaml.jsonl" <<'PY' || fail "tied embeddings: the gathered bytes are not the root once and each block twice"
import json, math, struct, sys
f = open(sys.argv[1], "rb")
shapes = {k[len("exp_avg."):]: v["shape"] for k, v in json.loads(f.read(struct.unpack("<Q", f.read(8))[0])).items()
          if k.startswith("exp_avg.")}
assert "lm_head.weight" not in shapes and "model.embed_tokens.weight" in shapes, sorted(shapes)
F, micro = 3, 4
piece = lambda s: 32 * math.ceil(s[0] / (32 * F)) * (s[1] if len(s) > 1 else 1)
root = sum(piece(s) for k, s in shapes.items() if not k.startswith("model.layers."))
blocks = sum(piece(s) for k, s in shapes.items() if k.startswith("model.layers."))
for r in map(json.loads, open(sys.argv[2])):
    assert r["ag_param_bytes"] == micro * F * 4 * (root + 2 * blocks), (r["step"], r["ag_param_bytes"], root, blocks)
PY
for n in 1 3; do
    write_config "$tmp/mx-$n.yaml" qwen3_moe $((12 / n)) 1 10 "$(save_to "$tmp/ck-mx-$n")" "$fp64"
    run $n "$tmp/mx-$n.yaml"
done
compare_runs "$tmp/mx-1.yaml.jsonl" "$tmp/mx-3.yaml.jsonl" 1e-5 || fail "MXFP8: N=3 losses differ from N=1"
grep -q "weights gathered as on-demand" "$tmp/mx-3.yaml.log" || fail "MXFP8 run did not gather on-demand"

# checkpoint files (docs/distributed.md, "Checkpoints"): each rank writing its own rows into
# them (save_parallel, the default: ck-mx-3 above) and rank 0 writing them alone give the
# same bytes; ranks that do not share the save directory (here rank 0 in one working
# directory, ranks 1 and 2 in another, `save` relative) fall back to rank 0's, and say so
write_config "$tmp/mxr-3.yaml" qwen3_moe 4 1 10 "$(save_to "$tmp/ck-mxr-3")
  save_parallel: false" "$fp64"
run 3 "$tmp/mxr-3.yaml"
write_config "$tmp/mxs-3.yaml" qwen3_moe 4 1 10 "$(save_to ck-mxs)" "$fp64"
mkdir "$tmp/wd0" "$tmp/wd1"
mpi_run -np 1 -wdir "$tmp/wd0" "$bin" train "$tmp/mxs-3.yaml" : -np 2 -wdir "$tmp/wd1" "$bin" train "$tmp/mxs-3.yaml" \
    > "$tmp/mxs-3.log" 2>&1 || { tail -5 "$tmp/mxs-3.log"; fail "training with a save directory per host failed"; }
grep -q "^note: training.save_parallel: not every rank sees the files rank 0 writes in 'ck-mxs'" "$tmp/mxs-3.log" ||
    fail "ranks that do not share the save directory: no note that rank 0 writes the checkpoints alone"
[ -e "$tmp/wd1/ck-mxs" ] && fail "ranks 1 and 2 wrote into their own save directory"
for f in model optimizer; do
    for ck in "$tmp/ck-mxr-3" "$tmp/wd0/ck-mxs"; do
        cmp "$tmp/ck-mx-3/iter_0000010/$f.safetensors" "$ck/iter_0000010/$f.safetensors" ||
            fail "$f.safetensors written by every rank differs from rank 0's in $ck"
    done
done
grep -q "^note: training.save_parallel" "$tmp/mx-3.yaml.log" && fail "ranks sharing the save directory got the fallback note"
grep -q "^saved $tmp/ck-mx-3/iter_0000010 in [0-9]*\.[0-9][0-9] s$" "$tmp/mx-3.yaml.log" || fail "no 'saved DIR in S s' line"

# What the rank count may change, exactly (docs/distributed.md, "Same losses on any number
# of ranks"): the global batch of 12 rows as 1 x 12 rows or 3 ranks x 4 rows.
#  - dense, fp32: any split gives the same losses (the mean does not care how rows are split);
#  - dense MXFP8 at the same per-rank micro-batch (2 rows; accumulation 6 on 1 rank, 2 on 3): the same;
#  - MXFP8 at another per-rank micro-batch: other losses (the gradients carry the mean's
#    1/(rows x seq_length) of the micro-batch, and power-of-two MX scales do not absorb a
#    factor 3; in MoE layers the expert groups, and with them the token-axis MX blocks, are
#    per micro-batch);
#  - MoE with the load-balancing loss, even in fp32, at another per-rank micro-batch: other
#    losses (the loss is computed over each micro-batch's routing).
# differ A B: some step's losses differ by more than 1e-5 (relative)
differ() { ! compare_runs "$1" "$2" 1e-5 >/dev/null 2>&1; }
write_config "$tmp/dn-1.yaml" llama 1 12 10 "" ""
write_config "$tmp/dn-3.yaml" llama 1 4 10 "" ""
run 1 "$tmp/dn-1.yaml"; run 3 "$tmp/dn-3.yaml"
compare_runs "$tmp/dn-1.yaml.jsonl" "$tmp/dn-3.yaml.jsonl" 1e-5 || fail "dense fp32: 3 x 4 rows differ from 1 x 12"
write_config "$tmp/dmx-1.yaml" llama 6 2 10 "$(save_to "$tmp/ck-dmx-1")" "$fp64"
write_config "$tmp/dmx-3.yaml" llama 2 2 10 "$mxfp8_plan" "$fp64"
run 1 "$tmp/dmx-1.yaml"; run 3 "$tmp/dmx-3.yaml"
compare_runs "$tmp/dmx-1.yaml.jsonl" "$tmp/dmx-3.yaml.jsonl" 1e-5 || fail "dense MXFP8, 2 rows per rank: N=3 differs from N=1"
write_config "$tmp/dmxb-1.yaml" llama 1 12 10 "$mxfp8_plan" "$fp64"
write_config "$tmp/dmxb-3.yaml" llama 1 4 10 "$mxfp8_plan" "$fp64"
run 1 "$tmp/dmxb-1.yaml"; run 3 "$tmp/dmxb-3.yaml"
differ "$tmp/dmxb-1.yaml.jsonl" "$tmp/dmxb-3.yaml.jsonl" || fail "dense MXFP8: 3 x 4 rows equal 1 x 12 (docs/distributed.md says they differ)"
write_config "$tmp/mxb-1.yaml" qwen3_moe 1 12 10 "$mxfp8_plan" "$fp64"
write_config "$tmp/mxb-3.yaml" qwen3_moe 1 4 10 "$mxfp8_plan" "$fp64"
run 1 "$tmp/mxb-1.yaml"; run 3 "$tmp/mxb-3.yaml"
differ "$tmp/mxb-1.yaml.jsonl" "$tmp/mxb-3.yaml.jsonl" || fail "MoE MXFP8: 3 x 4 rows equal 1 x 12 (docs/distributed.md says they differ)"
write_config "$tmp/aux-1.yaml" qwen3_moe 1 12 10 "" ""
write_config "$tmp/aux-3.yaml" qwen3_moe 1 4 10 "" ""
run 1 "$tmp/aux-1.yaml"; run 3 "$tmp/aux-3.yaml"
differ "$tmp/aux-1.yaml.jsonl" "$tmp/aux-3.yaml.jsonl" || fail "MoE with the aux loss: 3 x 4 rows equal 1 x 12 (docs/distributed.md says they differ)"

# recompute (docs/distributed.md, "Activation recompute"): the losses bit for bit, and the
# final weights byte for byte, of not recomputing, with MXFP8 on-demand: on 2 ranks the MoE
# model (qwen3_moe: layer 0 a dense block, layers 1 and 2 MoE with fused experts), on 1 rank
# dense (llama) and MoE.
# On-demand gathers the rowwise plane in forward and both planes in the backward of a
# recomputed block (whose forward runs again there): exactly the bytes `mxtrain plan`
# predicts, fewer than `all`, which stays selectable and gives the same losses too.
rc_on="features:
  recompute: true"
# same_run A B: the same losses (exactly) and the same final weights and optimizer state
same_run() {
    compare_runs "$1.jsonl" "$2.jsonl" 0 || fail "recompute changed the losses: $2"
    local a b
    a=$(ls -d "$3"/iter_*) b=$(ls -d "$4"/iter_*)
    cmp -s "$a/model.safetensors" "$b/model.safetensors" || fail "recompute changed the final weights: $2"
    cmp -s "$a/optimizer.safetensors" "$b/optimizer.safetensors" || fail "recompute changed the optimizer state: $2"
}
write_config "$tmp/norc.yaml" qwen3_moe 6 1 10 "$(save_to "$tmp/ck-norc")" ""
write_config "$tmp/rc.yaml" qwen3_moe 6 1 10 "$(save_to "$tmp/ck-rc")" "$rc_on"
for c in norc rc; do run 2 "$tmp/$c.yaml"; done
same_run "$tmp/norc.yaml" "$tmp/rc.yaml" "$tmp/ck-norc" "$tmp/ck-rc"
# shorter runs (3 steps of 2 micro-batches): `all` under recompute, and one block recomputed
# with other prefetch depths, against their own baseline
write_config "$tmp/norcs.yaml" qwen3_moe 2 1 3 "$(save_to "$tmp/ck-norcs")" ""
write_config "$tmp/rca.yaml" qwen3_moe 2 1 3 "$mxfp8_plan
    fsdp_low_precision_all_gather_mode: all
  save: $tmp/ck-rca" "$rc_on"
write_config "$tmp/rcp.yaml" qwen3_moe 2 1 3 "$(save_to "$tmp/ck-rcp")" "    num_to_forward_prefetch: 0
    num_to_backward_prefetch: 3
$rc_on
  recompute_plan:
    apply_modules: model.layers.1"
for c in norcs rca rcp; do run 2 "$tmp/$c.yaml"; done
same_run "$tmp/norcs.yaml" "$tmp/rca.yaml" "$tmp/ck-norcs" "$tmp/ck-rca"
same_run "$tmp/norcs.yaml" "$tmp/rcp.yaml" "$tmp/ck-norcs" "$tmp/ck-rcp"
write_config "$tmp/drc-1.yaml" llama 6 2 10 "$(save_to "$tmp/ck-drc-1")" "$fp64
$rc_on"
write_config "$tmp/mxrc-1.yaml" qwen3_moe 12 1 10 "$(save_to "$tmp/ck-mxrc-1")" "$fp64
$rc_on"
run 1 "$tmp/drc-1.yaml"; run 1 "$tmp/mxrc-1.yaml"
same_run "$tmp/dmx-1.yaml" "$tmp/drc-1.yaml" "$tmp/ck-dmx-1" "$tmp/ck-drc-1"
same_run "$tmp/mx-1.yaml" "$tmp/mxrc-1.yaml" "$tmp/ck-mx-1" "$tmp/ck-mxrc-1"
grep -q "weights gathered as on-demand" "$tmp/rc.yaml.log" || fail "recompute did not keep on-demand"
grep -q "note: features.recompute: on-demand gathers the rowwise MX plane in forward; in backward the 3 recomputed blocks gather both planes" \
    "$tmp/rc.yaml.log" || fail "recompute did not say what on-demand gathers"
grep -q "in backward the 1 recomputed block gathers both planes .*, the other blocks the colwise one" "$tmp/rcp.yaml.log" ||
    fail "recomputing one block did not say what on-demand gathers"
grep -q "weights gathered as all" "$tmp/rca.yaml.log" || fail "recompute did not keep all"
# the MX bytes of every step against the plan's prediction for the run's config and mode
for c in norc rc norcs rca rcp; do
    "$bin" plan "$tmp/$c.yaml" --json --ranks 2 >"$tmp/$c.plan" 2>/dev/null || fail "plan $c.yaml failed"
done
$py - "$tmp" <<'PY' || fail "recompute: MX gather bytes are not what plan predicts"
import json, sys
t = sys.argv[1]
def mx(c):   # the MX bytes gathered at each step of run c
    return [m["ag_mx_data_bytes"] + m["ag_mx_scale_bytes"] for m in map(json.loads, open(f"{t}/{c}.yaml.jsonl"))]
def plan(c):
    return json.load(open(f"{t}/{c}.plan"))["gather_bytes_per_step"]
for c, mode in [("norc", "on_demand"), ("rc", "on_demand"), ("norcs", "on_demand"), ("rca", "all"),
                ("rcp", "on_demand")]:
    assert len(set(mx(c))) == 1 and mx(c)[0] == plan(c)[mode], (c, mx(c), plan(c))
    p = json.load(open(f"{t}/{c}.plan"))["per_step"]   # the step prediction, in the run's own mode
    assert p["gather_mode"] == mode.replace("_", "-") and p["ag_mx_data_bytes"] + p["ag_mx_scale_bytes"] == mx(c)[0], (c, p)
assert plan("rc")["recompute"] and not plan("norc")["recompute"]
assert plan("rc")["all"] == plan("norc")["all"]   # `all` moves both planes in every gather anyway
assert plan("rca")["all"] == plan("norcs")["all"] == 2 * plan("rc")["all"] / 6   # 2 micro-batches, not 6
norc, rc, rca = (mx(c)[0] for c in ("norc", "rc", "rca"))
assert norc < rc < plan("rc")["all"], (norc, rc, plan("rc")["all"])
norcs, rcp = mx("norcs")[0], mx("rcp")[0]
assert norcs < rcp < rca / 2 + norcs / 2, (norcs, rcp, rca)   # one block of three: its rowwise plane only
PY
# selective recompute (features.recompute_granularity: selective): the same losses, weights
# and optimizer state; no product runs again, so on-demand gathers what it gathers without
# recompute (no note); the activations between none's and full's, what plan predicts and
# the run reports
write_config "$tmp/rcs.yaml" qwen3_moe 6 1 10 "$(save_to "$tmp/ck-rcs")" "$rc_on
  recompute_granularity: selective"
run 2 "$tmp/rcs.yaml"
same_run "$tmp/norc.yaml" "$tmp/rcs.yaml" "$tmp/ck-norc" "$tmp/ck-rcs"
grep -q "note: features.recompute" "$tmp/rcs.yaml.log" && fail "selective recompute: a note on what on-demand gathers"
"$bin" plan "$tmp/rcs.yaml" --json --ranks 2 >"$tmp/rcs.plan" 2>/dev/null || fail "plan rcs.yaml failed"
$py - "$tmp" <<'PY' || fail "selective recompute: gather bytes or activations are not what plan predicts"
import json, sys
t = sys.argv[1]
def steps(c):
    return list(map(json.loads, open(f"{t}/{c}.yaml.jsonl")))
def act(c):   # what plan predicts, and that every step of the run reports it
    want = json.load(open(f"{t}/{c}.plan"))["per_step"]["mem_activation_bytes"]
    assert all(m["mem_activation_bytes"] == want for m in steps(c)), (c, want, steps(c)[0]["mem_activation_bytes"])
    return want
mx = lambda c: {m["ag_mx_data_bytes"] + m["ag_mx_scale_bytes"] for m in steps(c)}
assert mx("rcs") == mx("norc"), (mx("rcs"), mx("norc"))
assert act("rc") < act("rcs") < act("norc"), (act("rc"), act("rcs"), act("norc"))
PY
# what the note says in the other layouts, and their bytes: blocks kept after forward (one
# gather with both planes, recompute or not) and 32x32 tiles (one plane serves every GEMM)
write_config "$tmp/rck.yaml" llama 1 1 2 "$mxfp8_plan" "    reshard_after_forward: false
$rc_on"
write_config "$tmp/rct.yaml" llama 1 1 2 "${mxfp8_plan/recipe_name: mxfp8/recipe_name: dynamic_mx-1-32-32_E4M3_E4M3_E4M3}" "$rc_on"
run 1 "$tmp/rck.yaml"; run 1 "$tmp/rct.yaml"
grep -q "note: features.recompute: without reshard_after_forward each block is gathered once, with both MX planes, and the 3 recomputed blocks run their forward again from them" \
    "$tmp/rck.yaml.log" || fail "recompute without reshard: no note"
grep -q "note: features.recompute: one 32x32-tiled MX plane serves every GEMM, so the 3 recomputed blocks gather it in backward as in forward" \
    "$tmp/rct.yaml.log" || fail "recompute with tiles: no note"
for c in rck rct; do
    "$bin" plan "$tmp/$c.yaml" --json >"$tmp/$c.plan" 2>/dev/null || fail "plan $c.yaml failed"
    $py - "$tmp/$c" <<'PY' || fail "$c: MX gather bytes are not what plan predicts"
import json, sys
g = json.load(open(sys.argv[1] + ".plan"))["gather_bytes_per_step"]
for m in map(json.loads, open(sys.argv[1] + ".yaml.jsonl")):
    assert m["ag_mx_data_bytes"] + m["ag_mx_scale_bytes"] == g["on_demand"] == g["all"], (m, g)
PY
done

# keeping weights after forward, and prefetching nothing or 3 units ahead, change when
# weights arrive, not what is computed: the losses of the MXFP8 run above, exactly
write_config "$tmp/keep.yaml" qwen3_moe 6 1 10 "$mxfp8_plan" "    reshard_after_forward: false"
run 2 "$tmp/keep.yaml"
compare_runs "$tmp/norc.yaml.jsonl" "$tmp/keep.yaml.jsonl" 0 || fail "reshard_after_forward: false changed the losses"
write_config "$tmp/pf.yaml" qwen3_moe 6 1 10 "$mxfp8_plan" "    num_to_forward_prefetch: 0
    num_to_backward_prefetch: 3"
run 2 "$tmp/pf.yaml"
compare_runs "$tmp/norc.yaml.jsonl" "$tmp/pf.yaml.jsonl" 0 || fail "prefetch settings changed the losses"
$py - "$tmp/norc.yaml.jsonl" "$tmp/keep.yaml.jsonl" <<'PY' || fail "without reshard the blocks were gathered twice"
import json, sys
a, b = (json.loads(open(p).readline()) for p in sys.argv[1:3])
mx = lambda m: m["ag_mx_data_bytes"] + m["ag_mx_scale_bytes"]
# one gather per block with both planes instead of two with one each: the same MX bytes,
# half the bytes of the unconverted block weights
assert mx(a) == mx(b) and b["ag_param_bytes"] < a["ag_param_bytes"], (a, b)
PY

# bf16 reduce-scatters: half the bytes of fp32, and a loss that stays close
write_config "$tmp/rbf16.yaml" qwen3_moe 6 1 10 "$mxfp8_plan" "    reduce_dtype: bf16"
run 2 "$tmp/rbf16.yaml"
$py - "$tmp/norc.yaml.jsonl" "$tmp/rbf16.yaml.jsonl" <<'PY' || fail "reduce_dtype bf16: bytes or losses off"
import json, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
assert 2 * b[0]["rs_bytes"] == a[0]["rs_bytes"], (a[0]["rs_bytes"], b[0]["rs_bytes"])
for x, y in zip(a, b):
    assert abs(x["loss"] - y["loss"]) < 2e-2 * x["loss"], (x["loss"], y["loss"])
PY

# gradient accumulation: 4 x 1 row == 1 x 4 rows (a dense model: no per-micro-batch aux loss)
write_config "$tmp/acc4.yaml" llama 4 1 6 "" ""
write_config "$tmp/mb4.yaml" llama 1 4 6 "" ""
run 1 "$tmp/acc4.yaml"
run 1 "$tmp/mb4.yaml"
compare_runs "$tmp/acc4.yaml.jsonl" "$tmp/mb4.yaml.jsonl" 1e-5 || fail "4 x 1 micro-batches differ from 1 x 4"

# global_batch_size 12 (Megatron's) in place of the accumulation: 6 steps of 2 rows on 1
# rank, 2 on 3 ranks, the same runs bit for bit as dmx-1 and dmx-3 above; 5 ranks do not
# divide it, and a gradient_accumulation_steps that disagrees is an error
for n in 1 3; do
    sed -e '/gradient_accumulation_steps/d' -e "s|^  micro_batch_size: .*|&\n  global_batch_size: 12|" \
        -e "s|metrics_path: .*|metrics_path: $tmp/gbs-$n.yaml.jsonl|" -e "s|ck-dmx-1|ck-gbs-1|" "$tmp/dmx-$n.yaml" > "$tmp/gbs-$n.yaml"
    run $n "$tmp/gbs-$n.yaml"
    grep -q "^mxtrain train: .* x micro-batch 2 x 37 tokens, $((6 / n)) accumulation steps" "$tmp/gbs-$n.yaml.log" ||
        fail "global_batch_size 12 on $n ranks: not $((6 / n)) accumulation steps: $(head -1 "$tmp/gbs-$n.yaml.log")"
    compare_runs "$tmp/gbs-$n.yaml.jsonl" "$tmp/dmx-$n.yaml.jsonl" 0 ||
        fail "global_batch_size 12 on $n ranks differs from gradient_accumulation_steps $((6 / n))"
done
out=$("$bin" plan "$tmp/gbs-3.yaml" --ranks 5 2>&1) && fail "global_batch_size 12 on 5 ranks was accepted"
[ "$out" = "mxtrain plan: $tmp/gbs-3.yaml:$(grep -n global_batch_size "$tmp/gbs-3.yaml" | cut -d: -f1): training.global_batch_size: 12 is not a multiple of micro_batch_size 2 x 5 ranks = 10 (allowed: a multiple of 10)" ] ||
    fail "global_batch_size on 5 ranks: $out"
sed -i "s|^  global_batch_size: 12|&\n  gradient_accumulation_steps: 3|" "$tmp/gbs-3.yaml"
out=$(mpi_run -np 3 "$bin" train "$tmp/gbs-3.yaml" 2>&1) && fail "global_batch_size with a disagreeing gradient_accumulation_steps was accepted"
grep -q "^mxtrain train: rank 0: .*: training.global_batch_size: 12 is micro_batch_size 2 x 3 ranks x 2 accumulation steps, but gradient_accumulation_steps is 3" <<<"$out" ||
    fail "global_batch_size against gradient_accumulation_steps: $out"

# checkpoints: an uninterrupted run of 8 steps, and one killed after its step-4 checkpoint
# (a constant learning rate, so that train_iters does not change the first steps)
LR_WARMUP=0 LR_DECAY=constant
ck="  save: $tmp/ckpt
  save_interval: 4"
write_config "$tmp/full.yaml" qwen3_moe 3 1 8 "$mxfp8_plan" ""
run 2 "$tmp/full.yaml"
write_config "$tmp/killed.yaml" qwen3_moe 3 1 400 "$mxfp8_plan
$ck" ""
mpi_run -np 2 "$bin" train "$tmp/killed.yaml" >"$tmp/killed.log" 2>&1 &
job=$!
for _ in $(seq 600); do
    grep -q "saved .*iter_0000004" "$tmp/killed.log" && break
    sleep 0.1
done
grep -q "saved .*iter_0000004" "$tmp/killed.log" || { kill -9 $job; fail "no checkpoint at step 4: $(tail -3 "$tmp/killed.log")"; }
victim=""
for p in $(pgrep -f "mxtrain train $tmp/killed.yaml"); do
    [ "$(mpi_rank_of "$p")" = 1 ] && victim=$p
done
[ -n "$victim" ] || fail "could not find rank 1"
t0=$(date +%s)
kill -9 "$victim"
for _ in $(seq 300); do kill -0 $job 2>/dev/null || break; sleep 0.1; done
if kill -0 $job 2>/dev/null; then pkill -9 -f "mxtrain train $tmp/killed.yaml"; fail "the job still runs 30 s after rank 1 was killed"; fi
wait $job && fail "the job exited 0 after rank 1 was killed"
echo "    job ended $(( $(date +%s) - t0 )) s after kill -9 of rank 1"
last=$(cat "$tmp/ckpt/latest_checkpointed_iteration.txt")
[ "$last" -ge 4 ] || fail "latest checkpoint is $last"
# a save killed half-way leaves a temporary directory: loading must not care
mkdir -p "$tmp/ckpt/.tmp_iter_9999999" && echo garbage > "$tmp/ckpt/.tmp_iter_9999999/model.safetensors"
write_config "$tmp/resume.yaml" qwen3_moe 3 1 8 "$mxfp8_plan
  load: $tmp/ckpt/iter_0000004" ""
run 2 "$tmp/resume.yaml"
grep -q "resumed from .*iter_0000004 at step 4" "$tmp/resume.yaml.log" || fail "no resume line"
$py - "$tmp/full.yaml.jsonl" "$tmp/resume.yaml.jsonl" <<'PY' || fail "resume is not bit-identical"
import json, sys
full = [json.loads(l) for l in open(sys.argv[1])]
res = [json.loads(l) for l in open(sys.argv[2])]
assert [r["step"] for r in res] == [5, 6, 7, 8], [r["step"] for r in res]
for r in res:
    f = full[r["step"] - 1]
    assert (r["loss"], r["grad_norm"]) == (f["loss"], f["grad_norm"]), (r, f)
PY
# a different N (3 ranks x 1 accumulation step: the same global batch) loads it too
write_config "$tmp/resume3.yaml" qwen3_moe 2 1 8 "$mxfp8_plan
  load: $tmp/ckpt/iter_0000004" ""
sed -i 's/gradient_accumulation_steps: 2/gradient_accumulation_steps: 1/; s/micro_batch_size: 1/micro_batch_size: 2/' "$tmp/resume3.yaml"
run 3 "$tmp/resume3.yaml"
$py - "$tmp/full.yaml.jsonl" "$tmp/resume3.yaml.jsonl" <<'PY' || fail "resume on 3 ranks drifted"
import json, sys
full = [json.loads(l) for l in open(sys.argv[1])]
res = [json.loads(l) for l in open(sys.argv[2])]
assert [r["step"] for r in res] == [5, 6, 7, 8]
for r in res:
    f = full[r["step"] - 1]["loss"]
    assert abs(r["loss"] - f) < 1e-4 * abs(f), (r["loss"], f)
PY
# resuming at the last step with the same save directory runs nothing and writes nothing:
# the checkpoint it loaded stays as it was
before=$(cksum < "$tmp/ckpt/iter_0000004/model.safetensors")
write_config "$tmp/atend.yaml" qwen3_moe 3 1 4 "$mxfp8_plan
  load: $tmp/ckpt/iter_0000004
$ck" ""
run 2 "$tmp/atend.yaml"
[ "$(cksum < "$tmp/ckpt/iter_0000004/model.safetensors")" = "$before" ] || fail "a resume with no steps left rewrote the checkpoint"
grep -q "^saved" "$tmp/atend.yaml.log" && fail "a resume with no steps left saved a checkpoint"
# the consolidated weights load in `mxtrain grads` and in PyTorch
"$bin" grads "$tmp/full.yaml" --weights "$tmp/ckpt/iter_0000004/model.safetensors" \
    --tokens "$tmp/data/train_000000.bin" --out "$tmp/g.safetensors" >/dev/null 2>&1 || fail "grads could not use the checkpoint"
$py -c "
import json, struct, sys
h = open(sys.argv[1], 'rb'); n = struct.unpack('<Q', h.read(8))[0]; hdr = json.loads(h.read(n))
assert 'model.layers.2.mlp.experts.4.down_proj.weight' in hdr and 'model.embed_tokens.weight' in hdr
" "$tmp/ckpt/iter_0000004/model.safetensors" || fail "checkpoint tensor names are not Hugging Face's"

# bad parallel settings
write_config "$tmp/bad.yaml" llama 1 1 2 "" "  fully_shard_parallel_size: 3"
out=$(mpi_run -np 2 "$bin" train "$tmp/bad.yaml" 2>&1) && fail "FSDP size 3 on 2 ranks was accepted"
grep -q "parallel.data_parallel_size: auto x parallel.fully_shard_parallel_size: 3 does not fit this job of 2 ranks (3 does not divide 2;" <<<"$out" || { echo "$out"; fail "no clear message for the FSDP size"; }
write_config "$tmp/bad2.yaml" qwen3_moe 1 1 2 "$mxfp8_plan
    fsdp_low_precision_all_gather_mode: sometimes" ""
out=$("$bin" train "$tmp/bad2.yaml" 2>&1) && fail "an unknown gather mode was accepted"
grep -q "fsdp_low_precision_all_gather_mode" <<<"$out" || { echo "$out"; fail "no clear message for the gather mode"; }
[ "$(wc -l <<<"$out")" -eq 1 ] || { echo "$out"; fail "the gather-mode error is not one line"; }
exit 0
