#!/usr/bin/env bash
# The container check: both images built from docker/*.Dockerfile, every compose service run end to end.
#
#   scripts/container_check.sh            # the whole check (as root, with podman, buildah-backed builds)
#   scripts/container_check.sh base       # only the base image (debian:bookworm-slim from debootstrap)
#   scripts/container_check.sh build      # base (when missing) and both images
#   scripts/container_check.sh refuse     # base, images, and only the bad inputs (step 5)
#
# On a host with podman, podman-compose 1.x, debootstrap and PyPI, but no image registry:
#   1. the base image: debootstrap --variant=minbase of the Debian release the Dockerfiles name, trimmed
#      as the slim image is, tagged debian:bookworm-slim (kept when it exists: REBUILD_BASE=1 remakes it);
#   2. both images from the repository's Dockerfiles, unchanged, with the tags the compose file gives;
#   3. a small labelled dataset (convert.synth) in the layout docker/.env describes, then, through the
#      compose file itself (podman-compose), convert, convert-val, train on the CPU (docker/compose.cpu.yml),
#      stopped by SIGTERM mid-run and started again (it resumes), and device-check --smoke;
#   4. from the host: python -m convert verify on both outputs, python -m train eval on the checkpoint,
#      every file in OUT owned by the services' user (1000:1000), nothing written outside OUT;
#   5. the bad inputs (missing or empty DATA, unwritable OUT, NODE_RANK without MASTER_ADDR, no GPU / more
#      GPUs than present): each one line and a non-zero status, nothing written to OUT;
#   6. one line per step with its time, and the image sizes.
# WORK (default /var/tmp/videoclips-container-check) holds the dataset, OUT and the logs; it is remade on
# every run. Engine settings for this host go in a containers.conf of its own (CONTAINERS_CONF); see
# docs/docker.md, "The container check".
# PYTHON (default: python on PATH) runs the host-side steps (the dataset, verify, eval); it needs the
# project's dependencies installed, which the whole check confirms before anything else. sudo resets PATH,
# dropping an active virtualenv: sudo env PATH="$PATH" scripts/container_check.sh keeps it.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WORK=${WORK:-/var/tmp/videoclips-container-check}
RELEASE=bookworm                       # the Dockerfiles' FROM debian:bookworm-slim
BASE=debian:${RELEASE}-slim
CONVERT_IMAGE=videoclips-convert:latest
TRAIN_IMAGE=videoclips-train:latest
COMPOSE=${COMPOSE:-podman-compose}
PYTHON=${PYTHON:-python}               # the host's Python, with the project's dependencies installed
STEPS=${STEPS:-16}                     # CPU optimizer steps of the small C3D (SIGTERM comes after STOP_AT)
STOP_AT=${STOP_AT:-4}
# Process limits for the containers, at most this host's hard limits: a runtime without CAP_SYS_RESOURCE
# (a VM's or a nested container's root) cannot raise them, and podman refuses to start the container.
cap() {  # cap WANTED HARD [UNIT]: WANTED, or the hard limit (in UNIT bytes) when that is lower; -1 unlimited
    local wanted=$1 hard=$2 unit=${3:-1}
    if [ "$hard" = unlimited ]; then echo "$wanted"
    elif [ "$wanted" = -1 ] || [ "$wanted" -gt $((hard * unit)) ]; then echo $((hard * unit))
    else echo "$wanted"; fi
}
NOFILE=$(cap 65536 "$(ulimit -Hn)")
NPROC=$(cap 4096 "$(ulimit -Hu)")

# The Debian mirror apt uses on this host (the same archive the host trusts), else Debian's own.
mirror() {
    local uri
    uri=$(grep -rhoE '^(URIs:|deb)\s+https?://[^ ]+/debian/?(\s|$)' /etc/apt/sources.list /etc/apt/sources.list.d/ \
          2>/dev/null | grep -oE 'https?://[^ ]+' | head -n1 || true)
    echo "${uri:-http://deb.debian.org/debian}"
}

T0=$(date +%s)
STEP_START=$T0
step() {  # step NAME: close the previous step's line, start timing this one
    STEP_START=$(date +%s)
    STEP_NAME=$1
}
ok() {  # ok DETAIL: one line for the finished step
    local now
    now=$(date +%s)
    printf 'container_check: %-22s ok  %4ds  %s\n' "$STEP_NAME" $((now - STEP_START)) "$*"
}
fail() {
    printf 'container_check: %-22s FAILED: %s\n' "${STEP_NAME:-setup}" "$*" >&2
    exit 1
}

engine_conf() {
    # runc and cgroupfs: what runs on a VM without systemd's cgroup delegation; ulimits under the host's.
    mkdir -p "$WORK"
    if [ -z "${CONTAINERS_CONF:-}" ]; then
        CONTAINERS_CONF=$WORK/containers.conf
        cat >"$CONTAINERS_CONF" <<EOF
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
[containers]
default_ulimits = ["nofile=$NOFILE:$NOFILE", "nproc=$NPROC:$NPROC"]
EOF
        export CONTAINERS_CONF
    fi
}

make_base() {
    step base-image
    if [ -z "${REBUILD_BASE:-}" ] && podman image exists "$BASE"; then
        ok "$BASE kept ($(podman image inspect --format '{{.Id}}' "$BASE" | cut -c1-12)); REBUILD_BASE=1 remakes it"
        return
    fi
    local rootfs=$WORK/rootfs src
    src=$(mirror)
    rm -rf "$rootfs"
    debootstrap --variant=minbase "$RELEASE" "$rootfs" "$src" >"$WORK/debootstrap.log" 2>&1 \
        || fail "debootstrap $RELEASE from $src (see $WORK/debootstrap.log)"
    # As the slim image: the release, its updates and security suites; no documentation (but the
    # copyright files), no manuals, no translations, no package lists or caches.
    rm -f "$rootfs/etc/apt/sources.list"
    cat >"$rootfs/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $src
Suites: $RELEASE $RELEASE-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: ${src%/debian*}/debian-security
Suites: $RELEASE-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    cat >"$rootfs/etc/dpkg/dpkg.cfg.d/slim" <<'EOF'
# Documentation is left out of the image; the licences stay.
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/lintian/*
EOF
    cat >"$rootfs/etc/apt/apt.conf.d/slim" <<'EOF'
APT::Install-Recommends "false";
Acquire::Languages "none";
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/*.bin || true"; };
EOF
    find "$rootfs/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
    find "$rootfs/usr/share/doc" -mindepth 1 -type d -empty -delete
    rm -rf "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* "$rootfs"/usr/share/locale/* \
        "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb \
        "$rootfs"/var/log/*.log "$rootfs"/tmp/* "$rootfs"/var/tmp/*
    tar --numeric-owner -C "$rootfs" -c . | podman import --change 'CMD ["bash"]' - "$BASE" >/dev/null
    # podman resolves the Dockerfiles' short name to docker.io: the same image under that name too.
    podman tag "$BASE" "docker.io/library/$BASE"
    rm -rf "$rootfs"
    ok "$BASE from debootstrap --variant=minbase $RELEASE ($src), $(size "$BASE")"
}

size() {  # an image's size in MB
    podman image inspect --format '{{.Size}}' "$1" | awk '{printf "%.0f MB", $1 / 1e6}'
}

# The host's CA bundle for the builds' pip (a TLS-intercepting proxy's CA, say), mounted for the build only:
# nothing of it stays in the images. BUILD_CA= (empty) builds without it.
BUILD_CA=${BUILD_CA-/etc/ssl/certs/ca-certificates.crt}
build_image() {  # build_image DOCKERFILE TAG: the compose file's build (context: the repository root)
    local name=${2%%:*}
    step "build-${name#videoclips-}"
    local args=(--isolation chroot --network host --layers -f "$ROOT/docker/$1" -t "$2")
    if [ -n "$BUILD_CA" ] && [ -f "$BUILD_CA" ]; then
        printf '[global]\ncert = /etc/pip-build-ca.crt\n' >"$WORK/pip.conf"
        args+=(-v "$BUILD_CA:/etc/pip-build-ca.crt:ro" -v "$WORK/pip.conf:/etc/pip.conf:ro")
    fi
    podman build "${args[@]}" "$ROOT" >"$LOGS/build-${2%%:*}.log" 2>&1 \
        || fail "podman build -f docker/$1 (see $LOGS/build-${2%%:*}.log)"
    ok "$2, $(size "$2")"
}

# Python on the host, with the repository's own code (verify, eval and the dataset maker run here).
host_python() { PYTHONPATH=$ROOT PYTHONDONTWRITEBYTECODE=1 "$PYTHON" "$@"; }

check_host_python() {  # stop at once, in one line, unless PYTHON can run the host-side steps
    step host-python
    local path why
    local fix="run it with the Python the project is installed in: sudo env PATH=\"\$PATH\" scripts/container_check.sh (sudo drops a virtualenv from PATH), or PYTHON=/path/to/bin/python"
    path=$(command -v "$PYTHON") || fail "PYTHON=$PYTHON is not a command here: $fix"
    # The modules of the host-side steps: they import PyAV, numpy, lmdb and torch, as the steps will.
    if ! why=$(host_python -c 'import convert.synth, convert.tools, train.evalcmd, train.metrics' 2>&1 >/dev/null); then
        fail "$path cannot import the project (${why##*$'\n'}): $fix"
    fi
    ok "$path ($(host_python -c 'import platform, torch; print("Python", platform.python_version(), "torch", torch.__version__)'))"
}

# The services' ulimits (docker-compose.yml) capped at this host's, as an override file given last. nofile
# and nproc are named in each: podman, as root, sets the ones a container's ulimits leave out to its maxima.
# Every service is named, whether a Compose applies extends before merging the files or after.
limits_override() {
    LIMITS=$WORK/compose.limits.yml
    cat >"$LIMITS" <<EOF
# This host's hard limits: nofile $(ulimit -Hn), nproc $(ulimit -Hu), memlock $(ulimit -Hl) KiB, stack $(ulimit -Hs) KiB.
services:
  convert: &convert
    ulimits: {nofile: $NOFILE, nproc: $NPROC}
  convert-val: *convert
  train: &train
    ulimits: {nofile: $NOFILE, nproc: $NPROC, memlock: $(cap -1 "$(ulimit -Hl)" 1024), stack: $(cap 67108864 "$(ulimit -Hs)" 1024)}
  device-check: *train
EOF
}

compose() {  # compose [-cpu] ARGS...: the compose file (and the CPU override) from the repository root
    local files=(-f docker/docker-compose.yml)
    if [ "$1" = -cpu ]; then files+=(-f docker/compose.cpu.yml); shift; fi
    (cd "$ROOT" && "$COMPOSE" "${files[@]}" -f "$LIMITS" "$@")
}

make_dataset() {
    step dataset
    # Kinetics layout (docker/.env): annotations/{train,validate}.csv and videos/{train,val}/<label>/<stem>.mp4,
    # the stem being youtube_id_start_end as Kinetics names its clips.
    host_python - "$DATA" <<'EOF'
import csv, os, sys
from convert.synth import make_dataset

root = sys.argv[1]
os.makedirs(os.path.join(root, "annotations"))
for split, csv_name, per_class, seed in (("train", "train.csv", 6, 0), ("val", "validate.csv", 2, 1)):
    rows = []
    for path in make_dataset(os.path.join(root, "videos", split), per_class=per_class, seconds=2.0, seed=seed,
                             workers=2):
        label, name = os.path.basename(os.path.dirname(path)), os.path.basename(path)[:-4]
        os.rename(path, os.path.join(os.path.dirname(path), f"{name}_000000_000002.mp4"))
        rows.append({"label": label, "youtube_id": name, "time_start": 0, "time_end": 2, "split": split})
    with open(os.path.join(root, "annotations", csv_name), "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"{split}: {len(rows)} videos", end="; ")
EOF
}

outside() {  # what the services must never change: DATA, the repository, WORK outside OUT and the logs
    {
        find "$WORK" \( -path "$OUT" -o -path "$LOGS" -o -path "$WORK/eval" \) -prune -o -printf '%p %s %T@ %U:%G %m\n'
        git -C "$ROOT" status --porcelain --ignored --untracked-files=all
    } | sort
}

# expect_refusal NAME PATTERN COMMAND...: non-zero status, PATTERN in the last line of its output, OUT unchanged
expect_refusal() {
    local name=$1 pattern=$2 rc=0 last before
    shift 2
    step "refuse-$name"
    # What is in them (the folders' own times move: the entry point's write probe is made and removed).
    before=$(find "$OUT" "$BAD_OUT" -mindepth 1 -printf '%p %s %T@\n' 2>/dev/null | sort)
    "$@" >"$LOGS/refuse-$name.log" 2>&1 || rc=$?
    # The last line, without podman-compose's coloured "[service] |" prefix.
    last=$(sed -E 's/\x1b\[[0-9;]*m//g; s/^\[[a-z-]+\] *\| *//' "$LOGS/refuse-$name.log" | grep -v -E '^\s*$' | tail -n1)
    [ "$rc" -ne 0 ] || fail "exit status 0 (see $LOGS/refuse-$name.log)"
    grep -q -E "$pattern" <<<"$last" || fail "last line is not /$pattern/: $last (see $LOGS/refuse-$name.log)"
    [ "$before" = "$(find "$OUT" "$BAD_OUT" -mindepth 1 -printf '%p %s %T@\n' 2>/dev/null | sort)" ] \
        || fail "wrote to OUT (see $LOGS/refuse-$name.log)"
    ok "status $rc: $last"
}

with() {  # with NAME=VALUE... -- COMMAND...: COMMAND (a function too) with these variables exported
    local vars=()
    while [ "$1" != -- ]; do vars+=("$1"); shift; done
    shift
    (export "${vars[@]}"; "$@")
}

last_step() {  # the newest optimizer step in a run's metrics.jsonl (0 before the first)
    host_python -c "import sys; from train.metrics import read_metrics
print(max([r.get('step', 0) for r in read_metrics(sys.argv[1])] or [0]))" "$1/metrics.jsonl"
}

prepare() {  # the base image, both images, and fresh folders
    make_base
    build_image convert.Dockerfile "$CONVERT_IMAGE"
    build_image train.Dockerfile "$TRAIN_IMAGE"
    compose -cpu down >"$LOGS/down.log" 2>&1 || true  # a previous run's containers (and podman-compose's pod)
    rm -rf "$DATA" "$OUT" "$BAD_OUT" "$WORK/eval" "$WORK/empty" "$WORK/root-out" "$WORK/stub-data" "$LOGS"/*.log
    # eval: python -m train eval's report (the host's, not the services'); stub-data: a DATA that is there.
    mkdir -p "$WORK/empty" "$WORK/eval" "$WORK/stub-data/annotations"
    install -d -o 1000 -g 1000 "$OUT" "$BAD_OUT"  # the services' user (docker/.env: VIDEOCLIPS_USER)
    install -d -o 0 -g 0 -m 755 "$WORK/root-out"
}

sequence() {  # the documented sequence on a synthetic dataset, and what it leaves
    make_dataset >"$LOGS/dataset.log" 2>&1 || fail "convert.synth (see $LOGS/dataset.log)"
    ok "$(cat "$LOGS/dataset.log")under $DATA"
    local before
    before=$(outside)

    step convert
    compose run --rm convert >"$LOGS/convert.log" 2>&1 || fail "compose run convert (see $LOGS/convert.log)"
    ok "$(grep -E '^clips:' "$LOGS/convert.log" | tail -n1)"
    step convert-val
    compose run --rm convert-val >"$LOGS/convert-val.log" 2>&1 || fail "compose run convert-val (see $LOGS/convert-val.log)"
    ok "$(grep -E '^clips:' "$LOGS/convert-val.log" | tail -n1)"
    step verify
    for split in train val; do
        host_python -m convert verify "$OUT/clips_$split" >"$LOGS/verify-$split.log" 2>&1 \
            || fail "python -m convert verify $OUT/clips_$split (see $LOGS/verify-$split.log)"
    done
    ok "clips_train: $(tail -n1 "$LOGS/verify-train.log"); clips_val: $(tail -n1 "$LOGS/verify-val.log")"

    # train on the CPU, SIGTERM'd (compose stop: the engine's SIGTERM, then its grace period) after STOP_AT steps.
    step train-sigterm
    export CPU_STEPS=$STEPS
    compose -cpu up --exit-code-from train train >"$LOGS/train-1.log" 2>&1 &
    local up=$! waited=0
    until [ "$(last_step "$OUT/run")" -ge "$STOP_AT" ]; do
        kill -0 "$up" 2>/dev/null || fail "train ended before step $STOP_AT (see $LOGS/train-1.log)"
        sleep 1; waited=$((waited + 1))
        [ "$waited" -lt 900 ] || fail "train reached no step $STOP_AT in 900 s (see $LOGS/train-1.log)"
    done
    compose -cpu stop train >"$LOGS/train-stop.log" 2>&1 || fail "compose stop train (see $LOGS/train-stop.log)"
    local rc=0 stopped
    wait "$up" || rc=$?
    stopped=$(grep -oE 'stopped by SIGTERM at step [0-9]+: checkpoint saved' "$LOGS/train-1.log") \
        || fail "no 'stopped by SIGTERM ... checkpoint saved' (see $LOGS/train-1.log)"
    [ "$rc" = 143 ] || fail "up train ended with status $rc after SIGTERM, not 143 (see $LOGS/train-1.log)"
    ! grep -q Traceback "$LOGS/train-1.log" || fail "a traceback after SIGTERM (see $LOGS/train-1.log)"
    ok "$stopped; status $rc"
    step train-resume
    compose -cpu up --exit-code-from train train >"$LOGS/train-2.log" 2>&1 || fail "second up train (see $LOGS/train-2.log)"
    local resumed
    resumed=$(grep -oE 'resumed from \S+ at step [0-9]+' "$LOGS/train-2.log") || fail "no 'resumed from' (see $LOGS/train-2.log)"
    [ "${resumed##* }" = "${stopped//[^0-9]/}" ] || fail "$resumed, but the first run stopped at ${stopped//[^0-9]/}"
    grep -qE "trained $STEPS steps" "$LOGS/train-2.log" || fail "did not reach step $STEPS (see $LOGS/train-2.log)"
    ok "$resumed, trained to step $STEPS"
    step eval
    host_python -m train eval --checkpoint "$OUT/run/checkpoint.pt" --data "$OUT/clips_val" --device cpu \
        --out "$WORK/eval" --no-progress >"$LOGS/eval.log" 2>&1 || fail "python -m train eval (see $LOGS/eval.log)"
    ok "$(grep -v -E '^\s*$' "$LOGS/eval.log" | head -n1)"

    step device-check
    compose -cpu run --rm device-check --smoke >"$LOGS/device-check.log" 2>&1 \
        || fail "compose run device-check --smoke (see $LOGS/device-check.log)"
    [ -s "$OUT/device_check/device_check.json" ] || fail "no $OUT/device_check/device_check.json"
    ok "$OUT/device_check/device_check.json"

    step ownership
    local foreign
    foreign=$(find "$OUT" \( ! -uid 1000 -o ! -gid 1000 \) -printf '%p %U:%G\n' | head -n3)
    [ -z "$foreign" ] || fail "files in OUT not owned by 1000:1000: $foreign"
    [ "$before" = "$(outside)" ] || fail "written outside OUT: $(diff <(echo "$before") <(outside) | head -n5)"
    ok "$(find "$OUT" | wc -l) paths in OUT, all 1000:1000; DATA, the repository and WORK unchanged"

}

refusals() {  # the bad inputs, each against the built images through the compose file
    expect_refusal data-missing "$WORK/absent" with DATA="$WORK/absent" OUT="$BAD_OUT" -- compose run --rm convert
    [ ! -e "$WORK/absent" ] || fail "the engine created the missing DATA $WORK/absent"
    expect_refusal data-empty "^videoclips convert: error: DATA \(mounted at /data\) is empty" \
        with DATA="$WORK/empty" OUT="$BAD_OUT" -- compose run --rm convert
    expect_refusal out-unwritable "^videoclips convert: error: OUT \(mounted at /out\) is not writable by uid 1000" \
        with DATA="$WORK/stub-data" OUT="$WORK/root-out" -- compose run --rm convert
    [ -z "$(ls -A "$WORK/root-out")" ] || fail "the refused convert wrote to $WORK/root-out"
    expect_refusal no-master "videoclips train: error: NODE_RANK=1 of NNODES=2 needs MASTER_ADDR" \
        with OUT="$BAD_OUT" NNODES=2 NODE_RANK=1 -- compose -cpu up --exit-code-from train train
    expect_refusal gpu-compose "nvidia|GPU|CDI|cdi" with OUT="$BAD_OUT" -- compose up --exit-code-from train train
    expect_refusal no-gpu "^videoclips train: error: no GPU visible in the container: the host needs an NVIDIA driver" \
        podman run --rm -v "$BAD_OUT:/out" -e GPUS=1 -e NPROC_PER_NODE=gpu "$TRAIN_IMAGE" --data=/out/clips_train
    expect_refusal more-gpus "^videoclips train: error: no GPU visible in the container" \
        podman run --rm -v "$BAD_OUT:/out" -e GPUS=2 -e NPROC_PER_NODE=2 "$TRAIN_IMAGE" --data=/out/clips_train

}

finish() {
    compose -cpu down >"$LOGS/down.log" 2>&1 || true
    step images
    ok "$CONVERT_IMAGE $(size "$CONVERT_IMAGE"), $TRAIN_IMAGE $(size "$TRAIN_IMAGE"), $BASE $(size "$BASE")"
    step total
    STEP_START=$T0
    ok "$("$COMPOSE" --version 2>/dev/null | head -n1), $(podman --version)"
}

DATA=$WORK/data OUT=$WORK/out LOGS=$WORK/logs BAD_OUT=$WORK/bad-out
export DATA OUT
# The whole check runs Python on the host (the dataset, verify, eval): checked first, before anything is
# built or written, rather than failing at the dataset step after the builds.
if [ "${1:-all}" = all ]; then check_host_python; fi
mkdir -p "$LOGS"
engine_conf
limits_override
case "${1:-all}" in
    base) make_base ;;
    build) make_base; build_image convert.Dockerfile "$CONVERT_IMAGE"; build_image train.Dockerfile "$TRAIN_IMAGE" ;;
    refuse) prepare; refusals; finish ;;
    all) prepare; sequence; refusals; finish ;;
    *) echo "usage: scripts/container_check.sh [all|base|build|refuse]" >&2; exit 2 ;;
esac
