#!/usr/bin/env bash
# Makes a Vulkan adapter available for kiln's wgpu tests on a machine without a GPU: installs
# Debian's mesa-vulkan-drivers (lavapipe, a software Vulkan driver that runs on the CPU) and
# the Vulkan loader when missing, then checks that a driver manifest is there. Idempotent. Needs
# root (or sudo) the first time, to install packages.
set -euo pipefail

say() { echo "vulkan-up: $*"; }
die() { echo "vulkan-up: error: $*" >&2; exit 1; }

lavapipe() { ls /usr/share/vulkan/icd.d/lvp_icd.*.json >/dev/null 2>&1; }

if lavapipe && ldconfig -p | grep 'libvulkan\.so\.1' >/dev/null; then
  say "lavapipe and the Vulkan loader are installed"
else
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || die "run as root (or install sudo): it installs packages"
    SUDO="sudo"
  fi
  say "installing mesa-vulkan-drivers and libvulkan1 (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq mesa-vulkan-drivers libvulkan1 >/dev/null
  lavapipe || die "mesa-vulkan-drivers installed no lavapipe manifest under /usr/share/vulkan/icd.d"
fi
# wgpu's Vulkan loader warns without a runtime directory
if [ -z "${XDG_RUNTIME_DIR:-}" ]; then
  say "note: XDG_RUNTIME_DIR is unset; export XDG_RUNTIME_DIR=/tmp/runtime-\$(id -u) to quiet the loader"
fi
say "ready: $(ls /usr/share/vulkan/icd.d/lvp_icd.*.json | head -1)"
