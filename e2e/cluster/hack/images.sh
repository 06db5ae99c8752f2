#!/usr/bin/env bash
# Builds the images the node runs into $S/images, one OCI archive each,
# named as up.sh loads them ($IMAGE_REGISTRY/<name>:$IMAGE_TAG): the
# project's proxy-server, proxy-agent and servercount images with `make
# images` (buildah, the Dockerfile), and the sandbox's pause image. No
# registry is reached: every image is FROM scratch. buildah keeps its
# storage under the state directory, not in /var/lib/containers.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/env.sh"
PROJECT=$(cd "$here/../../.." && pwd)
t0=$(date +%s)
log() { echo "[images +$(($(date +%s) - t0))s] $*" >&2; }
out=$S/images
mkdir -p "$out" "$S/buildah/root" "$S/buildah/run"
buildah="buildah --storage-driver=vfs --root $S/buildah/root --runroot $S/buildah/run"

# The project's images, for this machine's platform only.
nice -n 19 make -C "$PROJECT" --no-print-directory images PLATFORMS=linux/amd64 REGISTRY="$IMAGE_REGISTRY" \
  IMAGE_TAG="$IMAGE_TAG" OCI_DIR="$S/oci" BUILDAH="$buildah" CONTAINER_TOOL=buildah >&2
for img in proxy-server proxy-agent servercount; do
  mv "$S/oci/$img.oci.tar" "$out/$img.tar"
done
log "project images built"

# The pause image: one static binary on an empty base.
mkdir -p "$S/pause-root"
(cd "$PROJECT/e2e" && CGO_ENABLED=0 nice -n 19 go build -trimpath -ldflags='-s -w' -o "$S/pause-root/pause" ./cluster/pause)
c=$($buildah from scratch)
$buildah copy "$c" "$S/pause-root/pause" /pause >/dev/null
$buildah config --entrypoint '["/pause"]' --user 65535:65535 "$c"
$buildah commit --quiet --timestamp 0 "$c" "$PAUSE_IMAGE" >/dev/null
$buildah rm "$c" >/dev/null
rm -f "$out/pause.tar"
$buildah push --quiet "$PAUSE_IMAGE" "oci-archive:$out/pause.tar:$PAUSE_IMAGE"
log "pause image built"

# The test workload: Debian's static busybox on an empty base (a shell
# for exec, output for logs, httpd for port-forward).
mkdir -p "$S/busybox-root/bin"
cp /bin/busybox "$S/busybox-root/bin/busybox"
for a in sh ls cat echo sleep httpd wget hostname env id true; do ln -sf busybox "$S/busybox-root/bin/$a"; done
c=$($buildah from scratch)
$buildah copy "$c" "$S/busybox-root" / >/dev/null
$buildah config --entrypoint '["/bin/sh"]' --env PATH=/bin "$c"
$buildah commit --quiet --timestamp 0 "$c" "$IMAGE_REGISTRY/busybox:$IMAGE_TAG" >/dev/null
$buildah rm "$c" >/dev/null
rm -f "$out/busybox.tar"
$buildah push --quiet "$IMAGE_REGISTRY/busybox:$IMAGE_TAG" "oci-archive:$out/busybox.tar:$IMAGE_REGISTRY/busybox:$IMAGE_TAG"
log "busybox image built"
