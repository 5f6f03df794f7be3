#!/usr/bin/env bash
# One command on a lent TPU (or GPU) machine, offline: set up once, then run the named parts.
#
#   scripts/tpu_run.sh PART...
#
# PART:
#   stash        keep the model pieces carried in this call in $GYMLLM_STASH (first of two calls)
#   setup        install the carried wheels and the machine index's packages into $GYMLLM_SITE (every
#                other part runs it first; once); the parts that load the real model (quickstart, accel)
#                also reassemble the SmolLM2 GGUF into $GYMLLM_CACHE from the carried and stashed pieces
#   model        that reassembly on its own (once every piece has been carried or stashed)
#   tests        the default tier's model / engine / losses / learner / compute-dtype files and the
#                tolerance check, on the accelerator (GYMLLM_TEST_DEVICE=accelerator); $TPU_TESTS
#                replaces the file list (e.g. tests/test_models_decode.py tests/test_attention.py)
#   quickstart   `gymllm train` (the README Quickstart) cold then warm in a fresh compile cache
#                (benchmarks/compile.py, else benchmarks/quickstart.py twice); args: $QUICKSTART_ARGS;
#                the two runs' telemetry (no checkpoints) in $OUT/quickstart_runs.tar.gz
#   accel        benchmarks/accelerator_check.py (8-minute budget); args: $ACCEL_ARGS
#   learner_mfu  benchmarks/train.py --roofline-only (the Quickstart learner against the device's matmul
#                rate); args: $LEARNER_MFU_ARGS
#   selfplay     benchmarks/selfplay_learning.py (the self-play recipes end to end, then their checkpoints on
#                held-out games); args: $SELFPLAY_ARGS (e.g. --recipe tictactoe_selfplay -- --learner.num-steps 30)
#   suite        benchmarks/suite.py (one shared engine against one engine per env, the core suite) at SmolLM2-135M's
#                shape with random weights (needs no model pieces); args: $SUITE_ARGS (default: every engine as many
#                rows as its episodes in flight, the fixed program set, 512-token rows)
#   lockstep     benchmarks/selfplay.py (barrier-free self-play games against lock-step turns) at SmolLM2-135M's
#                shape with random weights (needs no model pieces); args: $LOCKSTEP_ARGS (default: the fixed
#                program set, 1024-token rows)
#   profile      benchmarks/chip_profile.py (a decode run and a learner step under jax.profiler, their
#                device ops summed by name; model load and checkpoint pieces timed); args: $PROFILE_ARGS
#   limits       benchmarks/chip_limits.py (decode against the bandwidth bound, learner model-FLOPs
#                utilisation, at SmolLM2 and 0.5B shapes; needs no model pieces); args: $LIMITS_ARGS
#   peers        gymllm against Tunix 0.1.7's batch and agentic GRPO (benchmarks/peers.py --sizes smollm2,
#                random weights: needs no model pieces): installs the carried .offline/peer-tunix into
#                $GYMLLM_TUNIX_SITE (/tmp/gymllm-tunix-site; once), then runs the peer from there;
#                args: $PEERS_ARGS (default --rounds 1 --steps 8 --sides tunix_batch and the engine settings
#                measured best on the chip, docs/tpu.md: a call has 10 minutes, which fit one Tunix side)
#
# Logs go to $OUT (one file per part, at most 8 files with the records): setup.log, tests.log, ...;
# benchmark records to $OUT/records/*.jsonl (append them to benchmarks/results/ and re-render the page;
# GYMLLM_BENCH_COMMIT=<sha> names the commit in them, the copy on the machine has no git history).
# The bundle (.offline/, from `python scripts/offline_bundle.py build`) is what the calls carry.
# PYTHONPATH is appended to, never replaced (the machine's JAX and libtpu stay first). Exit status: the
# number of parts that failed (0: all passed).
set -uo pipefail
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 100
PY="${PYTHON:-python3}"
OUT="${OUT:-$ROOT/.offline/out}"
BUNDLE="${GYMLLM_BUNDLE:-$ROOT/.offline}"
SITE="${GYMLLM_SITE:-/tmp/gymllm-site}"
TUNIX_SITE="${GYMLLM_TUNIX_SITE:-/tmp/gymllm-tunix-site}"
STASH="${GYMLLM_STASH:-/tmp/gymllm-pieces}"
export GYMLLM_CACHE="${GYMLLM_CACHE:-/tmp/gymllm-cache}"
export GYMLLM_BENCH_RECORDS="${GYMLLM_BENCH_RECORDS:-$OUT/records}"
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$ROOT:$SITE"
mkdir -p "$OUT" "$GYMLLM_CACHE"

if [ "$#" -eq 0 ]; then
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
  exit 2
fi

if [ -n "${GYMLLM_BENCH_COMMIT:-}" ] && ! [[ "$GYMLLM_BENCH_COMMIT" =~ ^[0-9a-f]{40}$ ]]; then
  echo "tpu_run: GYMLLM_BENCH_COMMIT must be a full 40-hex commit (records keep it), received '$GYMLLM_BENCH_COMMIT'. Fix: GYMLLM_BENCH_COMMIT=\$(git rev-parse HEAD)" >&2
  exit 2
fi

failed=0
setup_rc=""  # the setup's exit status once it ran

note() { echo "== tpu_run: $*"; }

setup() {
  [ -n "$setup_rc" ] && return "$setup_rc"
  (
    note "setup $(date -u +%FT%TZ) on $(hostname); PYTHONPATH=$PYTHONPATH"
    if [ -d "$BUNDLE/wheels" ]; then
      "$PY" scripts/offline_bundle.py install --wheels "$BUNDLE/wheels" --target "$SITE" || exit 1
    elif "$PY" -c "import flax, optax, orbax.checkpoint, tyro, math_verify" 2>/dev/null; then
      note "no $BUNDLE/wheels: gymllm's dependencies are importable already (pip install -e '.[tpu]')"
    else
      note "no $BUNDLE/wheels and gymllm's dependencies do not import. Fix: carry .offline/wheels (python scripts/offline_bundle.py build), or pip install -e '.[tpu]' where there is a network"
      exit 1
    fi
    "$PY" -c "import jax; d = jax.devices(); print('devices:', d[0].platform, d[0].device_kind, 'x', len(d))"
  ) 2>&1 | tee -a "$OUT/setup.log"
  setup_rc=$?
  return "$setup_rc"
}

model_rc=""  # the model's reassembly's exit status once it ran

# the SmolLM2 GGUF reassembled from the carried and stashed pieces (the parts that load the real model)
model() {
  [ -n "$model_rc" ] && return "$model_rc"
  setup || return 1
  (
    if [ -f "$BUNDLE/model/manifest.json" ]; then
      "$PY" scripts/offline_bundle.py reassemble --manifest "$BUNDLE/model/manifest.json" \
        --from "$BUNDLE/model" --from "$STASH" --cache "$GYMLLM_CACHE" || exit 1
      if [ -f "$GYMLLM_CACHE/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf" ]; then
        # the first load converts the GGUF to a cached safetensors directory: once, here, on the CPU
        JAX_PLATFORMS=cpu "$PY" -c "from gymllm.models import load; print('model:', load('smollm2-135m-instruct').source)" || exit 1
      fi
    else
      note "no $BUNDLE/model/manifest.json: SmolLM2 must already be in $GYMLLM_CACHE (or reachable) for the model parts"
    fi
  ) 2>&1 | tee -a "$OUT/setup.log"
  model_rc=$?
  return "$model_rc"
}

run_part() {
  local part="$1"
  case "$part" in
    stash)
      "$PY" scripts/offline_bundle.py stash --manifest "$BUNDLE/model/manifest.json" --from "$BUNDLE/model" \
        --to "$STASH" 2>&1 | tee -a "$OUT/setup.log"
      ;;
    setup)
      setup
      ;;
    model)
      model
      ;;
    tests)
      setup || return 1
      # shellcheck disable=SC2086
      GYMLLM_TEST_DEVICE=accelerator "$PY" -m pytest -p no:cacheprovider -q -rs ${TPU_TESTS:-tests/test_models.py \
        tests/test_engine.py tests/test_losses.py tests/test_learner.py tests/test_compute_dtype.py \
        tests/test_accel_tolerances.py tests/test_engine_fixed_shapes.py tests/test_kv_write.py tests/test_copy_rows.py} 2>&1 | tee "$OUT/tests.log"
      ;;
    quickstart)
      model || return 1
      if [ -f benchmarks/compile.py ]; then
        # shellcheck disable=SC2086
        local keep
        keep="$(mktemp -d /tmp/gymllm-qs-XXXXXX)"
        "$PY" benchmarks/compile.py --keep-runs "$keep" ${QUICKSTART_ARGS:-} 2>&1 | tee "$OUT/quickstart.log"
        local rc=${PIPESTATUS[0]}
        # the runs' telemetry (not their checkpoints) in one file: summaries, metrics, traces, compiles
        (cd "$keep" && tar czf "$OUT/quickstart_runs.tar.gz" --exclude='*/checkpoints' --exclude='xla' \
          --exclude='*/trajectories*' cold warm 2>/dev/null)
        return "$rc"
      else
        local cache
        cache="$(mktemp -d /tmp/gymllm-xla-XXXXXX)"
        (
          rc=0
          for temp in cold warm; do
            note "quickstart ($temp compile cache $cache)"
            # shellcheck disable=SC2086
            GYMLLM_COMPILE_CACHE="$cache" "$PY" benchmarks/quickstart.py ${QUICKSTART_ARGS:-} || rc=1
          done
          exit "$rc"
        ) 2>&1 | tee "$OUT/quickstart.log"
      fi
      ;;
    accel)
      model || return 1
      # shellcheck disable=SC2086
      "$PY" benchmarks/accelerator_check.py ${ACCEL_ARGS:-} 2>&1 | tee "$OUT/accel.log"
      ;;
    learner_mfu)
      setup || return 1
      # shellcheck disable=SC2086
      "$PY" benchmarks/train.py --roofline-only ${LEARNER_MFU_ARGS:-} 2>&1 | tee "$OUT/learner_mfu.log"
      ;;
    selfplay)
      model || return 1
      # shellcheck disable=SC2086
      "$PY" benchmarks/selfplay_learning.py --run-root /tmp/gymllm-selfplay ${SELFPLAY_ARGS:-} 2>&1 \
        | tee "$OUT/selfplay.log"
      ;;
    suite)
      setup || return 1
      # shellcheck disable=SC2086
      "$PY" benchmarks/suite.py ${SUITE_ARGS:---model shape:smollm2-135m --num-slots inflight --max-len 512 --engine shapes=fixed --engine decode_lengths=1 --engine kv_write=chunk --engine prefill_tokens=1024 --engine max_prefill_batch=16 --engine decode_chunk=16} \
        2>&1 | tee "$OUT/suite.log"
      ;;
    lockstep)
      setup || return 1
      # shellcheck disable=SC2086
      "$PY" benchmarks/selfplay.py ${LOCKSTEP_ARGS:---model shape:smollm2-135m --max-len 1024 --engine shapes=fixed --engine decode_lengths=1 --engine kv_write=chunk --engine prefill_tokens=1024 --engine max_prefill_batch=16 --engine decode_chunk=16} \
        2>&1 | tee "$OUT/lockstep.log"
      ;;
    profile)
      setup || return 1
      local pdir
      pdir="$(mktemp -d /tmp/gymllm-profile-XXXXXX)"
      # shellcheck disable=SC2086
      "$PY" benchmarks/chip_profile.py --out "$pdir" ${PROFILE_ARGS:-} 2>&1 | tee "$OUT/profile.log"
      local prc=${PIPESTATUS[0]}
      cp "$pdir"/*_ops.json "$OUT"/ 2>/dev/null  # the op tables (the traces stay on the machine)
      return "$prc"
      ;;
    limits)
      setup || return 1
      # shellcheck disable=SC2086
      "$PY" benchmarks/chip_limits.py ${LIMITS_ARGS:-} 2>&1 | tee "$OUT/limits.log"
      ;;
    peers)
      setup || return 1
      (
        if [ -f "$BUNDLE/peer-tunix/manifest.json" ]; then
          "$PY" scripts/offline_bundle.py install-peer --bundle "$BUNDLE/peer-tunix" --target "$TUNIX_SITE" || exit 1
        elif [ ! -f "$TUNIX_SITE/.gymllm-peer-installed" ]; then
          note "no $BUNDLE/peer-tunix and nothing installed in $TUNIX_SITE. Fix: carry .offline/peer-tunix (python scripts/offline_bundle.py build --peer tunix)"
          exit 1
        fi
        # shellcheck disable=SC2086
        "$PY" benchmarks/peers.py --peers tunix --sizes smollm2 --peer-site "tunix=$TUNIX_SITE" \
          ${PEERS_ARGS:---rounds 1 --steps 8 --sides tunix_batch --gymllm-engine prefill_tokens=1024 --gymllm-engine max_prefill_batch=16 --gymllm-engine decode_chunk=32}
      ) 2>&1 | tee "$OUT/peers.log"
      ;;
    *)
      note "unknown part '$part': expected stash, setup, model, tests, quickstart, accel, learner_mfu, selfplay, suite, lockstep, profile, limits or peers"
      return 2
      ;;
  esac
}

for part in "$@"; do
  start=$(date +%s)
  run_part "$part"
  rc=$?
  note "$part: exit $rc after $(( $(date +%s) - start )) s" | tee -a "$OUT/setup.log"
  [ "$rc" = 0 ] || failed=$((failed + 1))
done
exit "$failed"
